// shoal check: validate a model against a reference (the format of
// ../shared/fixtures/hf/*/reference.safetensors): prefill logits at every prompt position, then a
// teacher-forced greedy decode whose logits and argmax ids are compared step by step; then the
// prompt again in two chunks with a head that reads only the last row (last_row_err, counted in
// max_abs_err).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <optional>
#include <span>

#include <fmt/ranges.h>

#include "app/commands.h"
#include "app/common_options.h"
#include "app/pool_flags.h"
#include "app/signal_watch.h"
#include "core/log.h"
#include "core/mmap_file.h"
#include "format/safetensors.h"

namespace shoal::app {

namespace {

struct CheckOptions {
  ModelFlags model;
  std::string reference;
  double tol = 1e-3;
  bool per_position = false;
  PoolFlags pool;
};

/// A tensor of the reference file, copied out (validated rank and dtype; `shape`, if given, gets
/// its shape).
template <typename T>
Result<std::vector<T>> ref_tensor(const MappedFile& f, const SafetensorsFile& st, const std::string& name, DType dt,
                                  size_t rank, std::vector<int64_t>* shape = nullptr) {
  for (const auto& t : st.tensors) {
    if (t.name != name) continue;
    if (t.dtype != dt || t.shape.size() != rank)
      return make_error(Code::kCorrupt, "reference tensor '{}' should be {} of rank {}, is {} {}", name, dtype_name(dt),
                        rank, dtype_name(t.dtype), t.shape_string());
    if (shape) *shape = t.shape;
    std::vector<T> v(t.nbytes / sizeof(T));
    if (!v.empty()) std::memcpy(v.data(), f.data() + t.offset, v.size() * sizeof(T));  // (an empty one: no data)
    return v;
  }
  return make_error(Code::kNotFound, "reference has no tensor '{}'", name);
}

double max_abs_diff(const float* a, const float* b, size_t n) {
  double m = 0;
  for (size_t i = 0; i < n; ++i) {
    const double d = std::fabs(double(a[i]) - double(b[i]));
    if (!(d <= m)) m = d;  // NaN propagates as the maximum
  }
  return m;
}

int32_t argmax(const float* x, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; ++i)
    if (x[i] > x[best]) best = i;
  return int32_t(best);
}

int check(const CheckOptions& o) {
  auto mf = MappedFile::open(o.reference);
  if (!mf.ok()) return fail(mf.status());
  auto st = parse_safetensors(mf->data(), mf->size(), o.reference);
  if (!st.ok()) return fail(st.status());
  auto input = ref_tensor<int32_t>(*mf, *st, "input_ids", DType::kI32, 1);
  std::vector<int64_t> logits_shape, decode_shape;
  auto logits = ref_tensor<float>(*mf, *st, "logits", DType::kF32, 2, &logits_shape);
  auto gen = ref_tensor<int32_t>(*mf, *st, "generated_ids", DType::kI32, 1);
  for (const Status* s : {&input.status(), &logits.status(), &gen.status()})
    if (!s->ok()) return fail(*s);
  auto decode_logits = ref_tensor<float>(*mf, *st, "decode_logits", DType::kF32, 2, &decode_shape);  // optional
  if (!decode_logits.ok() && decode_logits.status().code() != Code::kNotFound) return fail(decode_logits.status());

  const size_t T = input->size(), G = gen->size();
  if (T == 0) return fail(make_error(Code::kInvalidArgument, "{}: input_ids is empty", o.reference));
  if (G == 0)
    return fail(make_error(Code::kInvalidArgument, "{}: generated_ids is empty (nothing to check decoding with)",
                           o.reference));
  ModelFlags flags = o.model;
  if (flags.ctx == 0) flags.ctx = int(T + G + 1);
  // Positions 0 .. T - 1 for the prompt, then one per generated id but the last.
  if (const size_t need = T + (G > 0 ? G - 1 : 0); int64_t(need) > flags.ctx)  // before the load: it may take minutes
    return fail(make_error(Code::kOutOfRange, "the reference needs {} positions ({} prompt ids, {} generated); the "
                           "context (-c) has {}", need, T, G, flags.ctx));
  std::optional<HostSignals> signals;  // with --pool: SIGINT / SIGTERM / SIGHUP say bye (goes last)
  Result<LocalModel> loaded = make_error(Code::kFailedPrecondition, "not loaded");
  Result<std::unique_ptr<LocalPool>> pool = make_error(Code::kFailedPrecondition, "not started");
  std::optional<HostSignals::Hold> held;  // (goes first)
  auto pool_flags = local_pool_flags(flags, o.pool);  // a --device list without --pool: one process per entry
  if (!pool_flags.ok()) return fail(pool_flags.status());
  if (pool_flags->pool > 1) {
    signals.emplace();  // before the pool's threads start
    pool = start_local_pool(flags, *pool_flags, /*tokenizer=*/false);
    if (!pool.ok()) return fail(pool.status());
    held.emplace(*signals, *(*pool)->host);
  } else {
    if (Status st = check_pool_flags_alone(o.pool); !st.ok()) return fail(st);
    auto opts = local_options(flags);
    if (!opts.ok()) return fail(opts.status());
    opts->tokenizer = false;
    opts->progress = false;
    loaded = load_local_model(o.model.model, *opts);
    if (!loaded.ok()) return fail(loaded.status());
  }
  Pipeline& p = pool.ok() ? (*pool)->host->pipeline() : *loaded->pipeline;
  const size_t V = size_t(p.config().vocab_size);
  if (logits_shape != std::vector<int64_t>{int64_t(T), int64_t(V)})
    return fail(make_error(Code::kInvalidArgument, "reference logits are [{}], expected [{}, {}] (input ids, vocab)",
                           fmt::join(logits_shape, ", "), T, V));
  if (decode_logits.ok() && decode_shape != std::vector<int64_t>{int64_t(G), int64_t(V)})
    return fail(make_error(Code::kInvalidArgument, "reference decode_logits are [{}], expected [{}, {}] (one row per "
                           "generated id, vocab)", fmt::join(decode_shape, ", "), G, V));

  StepOutput out;
  out.mode = HeadMode::kLogitsAll;
  if (Status s = p.forward(*input, 0, out); !s.ok()) return fail(s);
  double err = max_abs_diff(out.logits.data(), logits->data(), T * V);
  if (o.per_position)
    for (size_t t = 0; t < T; ++t)
      std::printf("prefill position %zu: max_abs_err=%.3g\n", t,
                  max_abs_diff(out.logits.data() + t * V, logits->data() + t * V, V));
  // Greedy decode, teacher-forced with the reference ids so that one miss does not cascade.
  size_t matched = 0;
  int32_t next = argmax(out.logits.data() + (T - 1) * V, V);
  for (size_t g = 0; g < G; ++g) {
    if (next == (*gen)[g]) ++matched;
    if (decode_logits.ok() && g > 0)
      err = std::max(err, max_abs_diff(out.logits.data(), decode_logits->data() + g * V, V));
    if (g + 1 == G) break;
    StepOutput step;
    step.mode = HeadMode::kLogitsAll;
    const int32_t id = (*gen)[g];
    if (Status s = p.forward(std::span<const int32_t>(&id, 1), int64_t(T + g), step); !s.ok()) return fail(s);
    out = std::move(step);
    next = argmax(out.logits.data(), V);
  }
  // The prompt again from position 0, with a head that reads only its last row (forward_layers'
  // keep: the last layer's output projection and FFN for that row alone), in two chunks, the
  // first with no head at all (keep 0: its K/V still written).
  {
    const size_t half = T / 2;
    const std::span<const int32_t> ids(*input);
    StepOutput none, last;
    none.mode = HeadMode::kNone;
    last.mode = HeadMode::kLogitsLast;
    if (half > 0)
      if (Status s = p.forward(ids.first(half), 0, none); !s.ok()) return fail(s);
    if (Status s = p.forward(ids.subspan(half), int64_t(half), last); !s.ok()) return fail(s);
    const double last_err = last.logits.size() == V ? max_abs_diff(last.logits.data(), logits->data() + (T - 1) * V, V)
                                                    : INFINITY;
    std::printf("last_row_err=%.3g (the prompt in two chunks, the head reading only the last row)\n", last_err);
    if (!(last_err <= err)) err = last_err;  // (NaN too)
  }
  std::printf("max_abs_err=%.3g greedy=%zu/%zu\n", err, matched, G);
  const bool ok = err <= o.tol && matched == G;
  if (!ok) spdlog::error("check failed: tolerance {} ({})", o.tol, matched == G ? "logits differ" : "greedy ids differ");
  if (!ok && matched == G && pool.ok() && o.pool.hop_dtype == "f16") {
    // Measured on the hf/llama and hf/qwen3 fixtures: one f16 rounding of the hidden state alone moves
    // the logits by about 2e-3, so f16 hops cannot meet 1e-3; f32 hops give the one-process result.
    spdlog::warn("f16 hops round the hidden state to 11 significant bits at every hop (about 2e-3 of logit on "
                 "small models); --hop-dtype f32 checks the pool at the one-process precision");
  }
  return ok ? 0 : 1;
}

}  // namespace

CommandFn add_check_command(CLI::App& app) {
  auto o = std::make_shared<CheckOptions>();
  CLI::App* cmd = app.add_subcommand("check", "Compare a model's logits and greedy ids with a reference file");
  add_model_flags(cmd, o->model, "f32");
  cmd->add_option("--reference", o->reference,
                  "Reference .safetensors with input_ids, logits, generated_ids (and decode_logits)")
      ->required();
  cmd->add_option("--tol", o->tol, "Largest allowed |logit difference|")
      ->capture_default_str()
      ->check(finite_range(0, 1e30));
  cmd->add_flag("--per-position", o->per_position, "Also print the error at every prompt position");
  add_pool_flags(cmd, o->pool, /*local_pool=*/true);
  return [o] { return check(*o); };
}

}  // namespace shoal::app
