// Options shared by the subcommands that load a model (llama.cpp-style flags).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "runtime/local_model.h"
#include "runtime/sampler.h"

namespace shoal::app {

struct ModelFlags {
  std::string model;
  std::string device = "cpu";
  int threads = 0;
  int ctx = 0;
  std::string kv = "";
  int batch = 512;  // prompt tokens per step, as llama.cpp's and Ollama's default micro-batch
  std::string prefill_precision = "exact";
  bool no_warmup = false;
};

/// -m, --device, --threads/-t, -c/--ctx-size, --kv, -b/--batch-size, --prefill-precision,
/// --no-warmup.
void add_model_flags(CLI::App* cmd, ModelFlags& f, const std::string& default_kv);
/// -t/--threads into `threads`: 0 (the default) or -1, one thread per hardware thread.
void add_threads_flag(CLI::App* cmd, int& threads);
/// --prefill-precision exact|half (BackendOptions::half_prefill) into value.
void add_prefill_precision_flag(CLI::App* cmd, std::string& value);
/// --no-warmup (SliceOptions::warm_up off) into no_warmup.
void add_no_warmup_flag(CLI::App* cmd, bool& no_warmup);
/// Options for load_local_model from the flags. Errors: kInvalidArgument (bad --kv).
Result<LocalModelOptions> local_options(const ModelFlags& f);
/// Ok when `device` names one device; kInvalidArgument for a list ("cuda:0,cuda:1"), which only
/// `run` and `check` take (a local pool, one process per entry: pool_flags.h).
Status check_one_device(const std::string& device);

/// --temp, --top-k, --top-p, --min-p, --repeat-penalty, --repeat-last-n, --seed.
void add_sampling_flags(CLI::App* cmd, SamplingParams& p);

/// A CLI11 check that the number is finite and within [lo, hi] (CLI::Range lets NaN through).
CLI::Validator finite_range(double lo, double hi);

/// A CLI11 check that the text is a decimal integer (no sign but '-', no spaces) within [lo, hi];
/// says "'x' is not an integer" where CLI::Range would say "Value x not in range". Rewrites the
/// text in plain decimal, so use it with ->transform (CLI11 reads "010" as octal).
CLI::Validator int_range(int64_t lo, int64_t hi);

/// Prints "shoal: <message>" to stderr and returns exit status 1.
int fail(const Status& s);
/// For what the parser cannot see (flags that contradict each other): prints "shoal: <message>"
/// and the --help hint, as a parse error does, and returns exit status 2.
int usage_error(const std::string& message);

}  // namespace shoal::app
