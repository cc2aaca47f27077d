// shoal bench: prefill and decode speed of one model on one device (llama-bench's pp / tg tests).
// Decode is bound by memory bandwidth, so it also reports GB/s of weights streamed; prefill is
// bound by matmul throughput, so it reports TFLOP/s (matmuls only).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <numeric>

#include <nlohmann/json.hpp>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/signal_watch.h"
#include "core/log.h"
#include "pool/planner.h"  // format_bytes

namespace shoal::app {

namespace {

struct BenchOptions {
  ModelFlags model;
  int n_prompt = 512;
  int n_gen = 128;
  int reps = 3;
  std::string output = "md";  // -o: md (llama-bench's default table) or json
};

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The rates `tokens` / t of the repetitions' times t (seconds).
std::vector<double> rates(int tokens, const std::vector<double>& times) {
  std::vector<double> r;
  for (double t : times) r.push_back(t > 0 ? tokens / t : 0);
  return r;
}

// The sample standard deviation of `r` (n - 1; 0 for one value), as llama-bench gives its rate with
// one (about its mean); and "median ± sd".
double sd_of(const std::vector<double>& r) {
  double mean = 0, var = 0;
  for (double x : r) mean += x / double(r.size());
  for (double x : r) var += (x - mean) * (x - mean);
  return r.size() > 1 ? std::sqrt(var / double(r.size() - 1)) : 0;
}
std::string median_sd(const std::vector<double>& r) { return fmt::format("{:.1f} ± {:.1f}", median(r), sd_of(r)); }

int bench(const BenchOptions& o) {
  if (o.n_prompt == 0 && o.n_gen == 0) {
    return usage_error("nothing to measure: -p and -n are both 0");
  }
  // SIGINT / SIGTERM / SIGHUP: the stop said on stderr, then the process dies by the signal (as run).
  SignalWatch signals([](int sig) {
    spdlog::warn("{}: stopped", signal_name(sig));
    std::fflush(stdout);
    die_by_signal(sig);
  });
  auto opts = local_options(o.model);
  if (!opts.ok()) return fail(opts.status());
  opts->tokenizer = false;
  if (opts->n_ctx == 0) opts->n_ctx = std::max(1, o.n_prompt + o.n_gen);
  if (int64_t(o.n_prompt) + o.n_gen > opts->n_ctx)  // before the load: it may take minutes
    return fail(make_error(Code::kOutOfRange, "-p {} and -n {} need {} positions; the context (-c) has {}", o.n_prompt,
                           o.n_gen, int64_t(o.n_prompt) + o.n_gen, opts->n_ctx));
  auto loaded = load_local_model(o.model.model, *opts);
  if (!loaded.ok()) return fail(loaded.status());
  LocalModel& m = *loaded;
  auto cost = token_cost(m.config, m.weights);
  if (!cost.ok()) return fail(cost.status());
  Pipeline& p = *m.pipeline;
  const int V = m.config.vocab_size;
  std::vector<int32_t> prompt(size_t(std::max(o.n_prompt, 1)));
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t((i * 7919 + 17) % size_t(V));

  std::vector<double> pp_s, tg_s;
  for (int r = 0; r < o.reps + 1; ++r) {  // the first round warms up and is not counted
    if (Status s = p.rewind(0); !s.ok()) return fail(s);
    StepOutput out;
    out.mode = HeadMode::kArgmaxLast;
    double t0 = now_s();
    if (o.n_prompt > 0) {
      if (Status s = p.forward(prompt, 0, out); !s.ok()) return fail(s);
    }
    double t1 = now_s();
    const int32_t id = o.n_prompt > 0 ? out.ids.at(0) : 1;
    if (o.n_gen > 0) {  // greedy, as generation decodes it (chained on the device)
      auto steps = p.decode(id, int64_t(o.n_prompt), o.n_gen, DecodeSampling{}, [](int32_t) { return true; });
      if (!steps.ok()) return fail(steps.status());
    }
    double t2 = now_s();
    if (r > 0) {
      pp_s.push_back(t1 - t0);
      tg_s.push_back(t2 - t1);
    }
  }
  // Every column from the median rate (with an even -r, the median time's repetition may be another).
  const std::vector<double> pp_r = rates(o.n_prompt, pp_s), tg_r = rates(o.n_gen, tg_s);
  const double pp_tps = median(pp_r), tg_tps = median(tg_r);
  const std::string name = m.config.name, dev = m.backend->name();
  // (CPU backends compute in f32 whatever the flag.)
  const bool half = o.model.prefill_precision == "half" && m.backend->kind() == DeviceKind::kCuda;
  if (o.output == "json") {
    nlohmann::json tests = nlohmann::json::array();
    auto test = [&](const char* kind, int n, const std::vector<double>& r) {
      nlohmann::json t = {{"model", name},          {"model_path", o.model.model}, {"device", dev},
                          {"weight_bytes", cost->weight_bytes},
                          {"test", fmt::format("{}{}", kind, n)},
                          {"n_prompt", o.n_prompt}, {"n_gen", kind[0] == 't' ? o.n_gen : 0},
                          {"median_ts", median(r)}, {"stddev_ts", sd_of(r)},   {"samples_ts", r}};
      if (kind[0] == 'p') {
        t["prefill_precision"] = half ? "half" : "exact";
        t["tflops"] = median(r) * cost->flops / 1e12;
      } else {
        t["gbps"] = median(r) * double(cost->weight_bytes) / 1e9;
      }
      tests.push_back(std::move(t));
    };
    if (o.n_prompt > 0) test("pp", o.n_prompt, pp_r);
    if (o.n_gen > 0) test("tg", o.n_gen, tg_r);
    std::printf("%s\n", tests.dump(2).c_str());
    std::fflush(stdout);
    return 0;
  }
  std::printf("| model | device | weights | test | tokens/s (median ± sd) | GB/s | TFLOP/s |\n");
  std::printf("|---|---|---|---|---|---|---|\n");
  const std::string weights = pool::format_bytes(cost->weight_bytes);
  if (o.n_prompt > 0)
    std::printf("| %s | %s | %s | pp%d%s | %s | - | %.3f |\n", name.c_str(), dev.c_str(), weights.c_str(),
                o.n_prompt, half ? " (half)" : "", median_sd(pp_r).c_str(), pp_tps * cost->flops / 1e12);
  if (o.n_gen > 0)
    std::printf("| %s | %s | %s | tg%d | %s | %.1f | - |\n", name.c_str(), dev.c_str(), weights.c_str(),
                o.n_gen, median_sd(tg_r).c_str(), tg_tps * double(cost->weight_bytes) / 1e9);
  std::fflush(stdout);
  return 0;
}

}  // namespace

CommandFn add_bench_command(CLI::App& app) {
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = app.add_subcommand("bench", "Measure prefill and decode speed (tokens/s, GB/s, TFLOP/s)");
  o->model.batch = 512;  // pp512 in one step by default
  add_model_flags(cmd, o->model, "f16");
  cmd->add_option("-p,--n-prompt", o->n_prompt, "Prompt tokens for the prefill test (pp)")
      ->capture_default_str()
      ->transform(int_range(0, 1 << 20));
  cmd->add_option("-n,--n-gen", o->n_gen, "Tokens for the decode test (tg), after the prompt")
      ->capture_default_str()
      ->transform(int_range(0, 1 << 20));
  cmd->add_option("-r,--repetitions", o->reps,
                  "Timed repetitions after one untimed warm-up (tokens/s: their median and standard deviation)")
      ->capture_default_str()
      ->transform(int_range(1, 1000));
  cmd->add_option("-o,--output", o->output,
                  "md: a Markdown table; json: an array of tests (test, n_prompt, n_gen, median_ts, stddev_ts, "
                  "samples_ts in tokens/s, tflops or gbps, model, device, weight_bytes), as llama-bench's -o json")
      ->capture_default_str()
      ->check(CLI::IsMember({"md", "json"}));
  return [o] { return bench(*o); };
}

}  // namespace shoal::app
