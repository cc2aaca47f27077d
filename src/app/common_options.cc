#include "app/common_options.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>

#include "core/log.h"
#include "pool/host_local.h"

namespace shoal::app {

CLI::Validator finite_range(double lo, double hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        double v = 0;
        try {
          size_t used = 0;
          v = std::stod(text, &used);
          if (used != text.size()) return "'" + text + "' is not a number";
        } catch (const std::exception&) {
          return "'" + text + "' is not a number";
        }
        if (!std::isfinite(v) || v < lo || v > hi) return fmt::format("{} is not in [{}, {}]", text, lo, hi);
        return {};
      },
      fmt::format("in [{}, {}]", lo, hi));
}

namespace {

// The whole of `text` as a decimal integer ('-' the only sign, no spaces) into v: std::errc() when
// it is one, result_out_of_range past int64, invalid_argument otherwise. (CLI11's own conversion
// wraps values past 2^63 and reads a leading 0 as octal.)
std::errc parse_decimal(const std::string& text, int64_t& v) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec == std::errc() && ptr != end) return std::errc::invalid_argument;
  return ec;
}

}  // namespace

CLI::Validator int_range(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        int64_t v = 0;
        const std::errc ec = parse_decimal(text, v);
        if (ec == std::errc::result_out_of_range) return fmt::format("{} is not in [{}, {}]", text, lo, hi);
        if (ec != std::errc()) return "'" + text + "' is not an integer";
        if (v < lo || v > hi) return fmt::format("{} is not in [{}, {}]", text, lo, hi);
        text = std::to_string(v);  // CLI11 would read a leading 0 as octal
        return {};
      },
      fmt::format("in [{}, {}]", lo, hi));
}

namespace {

// --seed's text as a decimal number in [-1, 2^63 - 1], or nullopt (parse_decimal, not CLI11).
std::optional<int64_t> parse_seed(const std::string& text) {
  int64_t v = 0;
  if (parse_decimal(text, v) != std::errc() || v < -1) return std::nullopt;
  return v;
}

}  // namespace

void add_model_flags(CLI::App* cmd, ModelFlags& f, const std::string& default_kv) {
  f.kv = default_kv;
  cmd->add_option("-m,--model", f.model, "Model: a .gguf file or a Hugging Face checkpoint folder")->required();
  cmd->add_option("--device", f.device,
                  "Where the layers run: cpu, cpu-ref (the slow reference path), cuda:N. `run` and `check` also "
                  "take a list, cuda:0,cuda:1: a local pool, process i (the host first) on entry i mod the "
                  "list's length; without --pool, one process per entry")
      ->capture_default_str()
      ->check([](const std::string& text) {  // a device name, or a list of them (else a usage error)
        const Result<std::vector<std::string>> list = pool::device_list(text);
        if (!list.ok()) return list.status().message();
        for (const std::string& d : *list)
          if (Status st = check_device_name(d); !st.ok()) return st.message();
        return std::string();
      });
  add_threads_flag(cmd, f.threads);
  cmd->add_option("-c,--ctx-size", f.ctx, "Context length in tokens (0: the model's, at most 4096)")
      ->capture_default_str()
      ->transform(int_range(0, kMaxContext));
  cmd->add_option("--kv", f.kv, "KV cache type: f32, f16 or q8_0")
      ->capture_default_str()
      ->check([](const std::string& text) {
        const Result<DType> kv = parse_kv_dtype(text);
        return kv.ok() ? std::string() : kv.status().message();
      });
  cmd->add_option("-b,--batch-size", f.batch, "Prompt tokens processed per step (prefill chunk)")
      ->capture_default_str()
      ->transform(int_range(1, 4096));
  add_prefill_precision_flag(cmd, f.prefill_precision);
  add_no_warmup_flag(cmd, f.no_warmup);
}

void add_threads_flag(CLI::App* cmd, int& threads) {
  // (CLI11 runs the last transform added first: the range check, which writes the number in its
  // plain form, then -1, llama.cpp's spelling of "all of them", as 0.)
  cmd->add_option("-t,--threads", threads, "CPU threads (0 or -1: one per hardware thread)")
      ->capture_default_str()
      ->transform(CLI::Validator(
          [](std::string& text) {
            if (text == "-1") text = "0";
            return std::string();
          },
          ""))
      ->transform(int_range(-1, 1024));
}

void add_no_warmup_flag(CLI::App* cmd, bool& no_warmup) {
  cmd->add_flag("--no-warmup", no_warmup,
                "On a GPU, skip the load-time warm-up: the largest step (-b tokens; a pool worker's 16-token "
                "frames) at the end of the context and one decode step, on throw-away input, which take the "
                "memory first use needs, so that running out of it fails the load, not a request");
}

void add_prefill_precision_flag(CLI::App* cmd, std::string& value) {
  cmd->add_option("--prefill-precision", value,
                  "Prompt products on a GPU, and prompt attention over f16 KV caches: exact (activations as two or "
                  "three 16-bit parts, ~1e-7 relative error) or half (one part, as llama.cpp does for F16 weights: "
                  "faster prefill, ~3e-4 error; ~2e-3 for BF16 weights). Q8_0 / Q4_0 weights take it on Hopper GPUs "
                  "only; decode is exact either way. It covers this process's layers: --pool passes it to its "
                  "workers, a `shoal join` worker takes its own")
      ->capture_default_str()
      ->check(CLI::IsMember({"exact", "half"}));
}

Status check_one_device(const std::string& device) {
  if (device.find(',') == std::string::npos) return Status::Ok();
  return make_error(Code::kInvalidArgument,
                    "--device '{}' lists several devices: only `shoal run` and `shoal check` take a list (a local "
                    "pool, one process per device); give one device here",
                    device);
}

Result<LocalModelOptions> local_options(const ModelFlags& f) {
  SHOAL_RETURN_IF_ERROR(check_one_device(f.device));
  LocalModelOptions o;
  o.device = f.device;
  o.threads = f.threads;
  if (const unsigned hw = std::thread::hardware_concurrency(); hw > 0 && unsigned(f.threads) > hw) {
    spdlog::warn("--threads {} is more than the {} hardware threads: expect it to be slower", f.threads, hw);
  }
  if (f.ctx < 0) return make_error(Code::kInvalidArgument, "-c must be >= 0");
  o.n_ctx = f.ctx;
  SHOAL_ASSIGN_OR_RETURN(o.kv_dtype, parse_kv_dtype(f.kv));
  o.max_tokens = f.batch;
  o.half_prefill = f.prefill_precision == "half";
  o.warm_up = !f.no_warmup;
  return o;
}

void add_sampling_flags(CLI::App* cmd, SamplingParams& p) {
  cmd->add_option("--temp", p.temperature, "Temperature; 0 (or less, as in llama.cpp) picks the most likely token (greedy)")
      ->capture_default_str()
      ->check(finite_range(-1000, 1000));
  cmd->add_option("--top-k", p.top_k, "Keep the K most likely tokens (0 or less: off)")
      ->capture_default_str()
      ->transform(int_range(-(1 << 30), 1 << 30));
  cmd->add_option("--top-p", p.top_p, "Keep the smallest set of tokens whose probability reaches P (1: off)")
      ->capture_default_str()
      ->check(finite_range(0, 1));
  cmd->add_option("--min-p", p.min_p, "Drop tokens less likely than P times the most likely one (0: off)")
      ->capture_default_str()
      ->check(finite_range(0, 1));
  cmd->add_option("--repeat-penalty", p.repeat_penalty, "Penalise tokens seen in the last --repeat-last-n (1: off)")
      ->capture_default_str()
      ->check(finite_range(1e-6, 1000));
  cmd->add_option("--frequency-penalty", p.frequency_penalty,
                  "Subtract F times its count in the last --repeat-last-n from a token's logit (0: off)")
      ->capture_default_str()
      ->check(finite_range(-100, 100));
  cmd->add_option("--presence-penalty", p.presence_penalty,
                  "Subtract P from the logit of a token seen in the last --repeat-last-n (0: off)")
      ->capture_default_str()
      ->check(finite_range(-100, 100));
  cmd->add_option("--repeat-last-n", p.repeat_last_n,
                  "How many recent tokens the penalties look at (0: none; -1: the whole context)")
      ->capture_default_str()
      ->transform(int_range(-1, 1 << 24));
  // llama.cpp's convention: -1 (the default) asks for a random seed, and so does 4294967295
  // (kRandomSeed).
  cmd->add_option_function<std::string>(
         "-s,--seed",
         [&p](const std::string& text) {
           const int64_t v = parse_seed(text).value_or(-1);  // (checked below)
           p.seed = v < 0 ? kRandomSeed : uint64_t(v);
         },
         "Random seed, a decimal number up to 2^63-1: the same seed gives the same output; -1 (the default) "
         "and 4294967295 pick a random seed")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            return parse_seed(text) ? ""
                                    : "'" + text +
                                          "' is not a seed: a decimal number from -1 to 2^63-1 (-1 and 4294967295: "
                                          "random)";
          },
          "SEED"));
}

int fail(const Status& s) {
  std::fprintf(stderr, "shoal: %s\n", s.to_string().c_str());
  return 1;
}

int usage_error(const std::string& message) {
  std::fprintf(stderr, "shoal: %s\nRun with --help for more information.\n", message.c_str());
  return 2;
}

}  // namespace shoal::app
