#include "runtime/session.h"

#include <algorithm>
#include <chrono>

namespace shoal {

namespace {
constexpr int kDeviceTopK = 256;  // the largest top-k the slice computes on the device
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}
}  // namespace

void Session::reset() {
  cached_.clear();
  (void)pipeline_.rewind(0);
}

Status Session::step(std::span<const int32_t> ids, int64_t pos0, Sampler& sampler, int32_t& next) {
  StepOutput out;
  if (sampler.needs_full_logits(kDeviceTopK)) {
    out.mode = HeadMode::kLogitsLast;
  } else if (sampler.greedy()) {
    out.mode = HeadMode::kArgmaxLast;
  } else {
    out.mode = HeadMode::kTopKLast;
    out.top_k = sampler.params().top_k;
  }
  SHOAL_RETURN_IF_ERROR(pipeline_.forward(ids, pos0, out));
  switch (out.mode) {
    case HeadMode::kArgmaxLast:
      next = out.ids.at(0);
      break;
    case HeadMode::kLogitsLast:
      next = sampler.sample(std::span<const float>(out.logits));
      break;
    default: {
      std::vector<Candidate> c(out.ids.size());
      for (size_t i = 0; i < c.size(); ++i) c[i] = {out.ids[i], out.logits[i]};
      next = sampler.sample(std::move(c));
    }
  }
  return Status::Ok();
}

Status check_prompt_fits(size_t n_prompt, int64_t n_ctx) {
  if (n_prompt == 0) return make_error(Code::kInvalidArgument, "the prompt is empty");
  if (int64_t(n_prompt) >= n_ctx)
    return make_error(Code::kOutOfRange,
                      "the prompt is {} tokens; a context of {} holds at most {} (one position is kept for the answer): "
                      "raise -c or shorten the prompt",
                      n_prompt, n_ctx, std::max<int64_t>(0, n_ctx - 1));
  return Status::Ok();
}

Result<std::vector<int32_t>> Session::generate(std::span<const int32_t> prompt, const GenerateOptions& opts,
                                               const TokenCallback& on_token, GenerateStats* stats) {
  GenerateStats st;
  st.n_prompt = int(prompt.size());
  const int64_t n_ctx = pipeline_.n_ctx();
  SHOAL_RETURN_IF_ERROR(check_prompt_fits(prompt.size(), n_ctx));
  // Reuse the cached prefix, but always run at least the last prompt token to get its logits.
  size_t keep = 0;
  while (keep < cached_.size() && keep + 1 < prompt.size() && cached_[keep] == prompt[keep]) ++keep;
  st.n_reused = int(keep);
  cached_.resize(keep);
  SHOAL_RETURN_IF_ERROR(pipeline_.rewind(int64_t(keep)));

  Sampler sampler(opts.sampling);
  for (int32_t id : prompt) sampler.accept(id);
  std::vector<int32_t> generated;
  auto t0 = std::chrono::steady_clock::now();
  int32_t next = -1;
  Status s = step(prompt.subspan(keep), int64_t(keep), sampler, next);
  if (!s.ok()) {
    reset();
    return s;
  }
  cached_.assign(prompt.begin(), prompt.end());
  st.prefill_s = seconds_since(t0);
  t0 = std::chrono::steady_clock::now();
  // Hands `id` to the caller; true when decoding should go on (room left, not stopped).
  auto deliver = [&](int32_t id) {
    if (opts.stop_at_eog && is_eog_ && is_eog_(id)) {
      st.hit_eog = true;
      return false;
    }
    generated.push_back(id);
    sampler.accept(id);
    const bool more = on_token ? on_token(id) : true;
    if (!more || (opts.n_predict >= 0 && int(generated.size()) >= opts.n_predict)) return false;
    if (int64_t(cached_.size()) >= n_ctx) {  // no room for the next position
      st.hit_context = true;
      return false;
    }
    return true;
  };
  bool more = opts.n_predict != 0 && deliver(next);  // -n 0: the prompt only
  if (more && !sampler.needs_full_logits(kDeviceTopK)) {
    // The argmax or a draw from the device's top-k: the pipeline feeds each token back itself
    // (on one device, without the host), drawing the numbers the sampler would.
    DecodeSampling how;
    how.greedy = sampler.greedy();
    if (!how.greedy) {
      const SamplingParams& sp = sampler.params();
      how.top_k = sp.top_k;
      how.draw = DeviceSampling{sp.temperature, sp.top_p, sp.min_p, 0, sampler.seed(), sampler.draws()};
    }
    int64_t steps = n_ctx - int64_t(cached_.size());
    if (opts.n_predict >= 0) steps = std::min<int64_t>(steps, opts.n_predict - int64_t(generated.size()));
    int32_t fed = next;
    auto r = pipeline_.decode(next, int64_t(cached_.size()), int(steps), how, [&](int32_t id) {
      cached_.push_back(fed);
      fed = id;
      if (!how.greedy) sampler.skip_draws(1);  // the draw the device made for this id
      return deliver(id);
    });
    if (!r.ok()) {
      reset();
      return r.status();
    }
    more = false;
  }
  while (more) {
    const int32_t id = next;
    s = step(std::span<const int32_t>(&id, 1), int64_t(cached_.size()), sampler, next);
    if (!s.ok()) {
      reset();
      return s;
    }
    cached_.push_back(id);
    more = deliver(next);
  }
  st.n_generated = int(generated.size());
  st.decode_s = seconds_since(t0);
  if (stats) *stats = st;
  return generated;
}

}  // namespace shoal
