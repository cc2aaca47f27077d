#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "backend/sampling_math.h"
#include "core/log.h"

namespace shoal {

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  seed_ = params.seed;
  if (seed_ == kRandomSeed) {  // random: never the marker itself, so the logged seed repeats the run
    std::random_device rd;
    do seed_ = rd();
    while (seed_ == kRandomSeed);
  }
  // A random seed is logged so that a run can be repeated with --seed (as llama.cpp does).
  if (params.seed == kRandomSeed && !greedy()) spdlog::info("sampler seed: {}", seed_);
}

bool Sampler::needs_full_logits(int max_device_k) const {
  if (penalties()) return true;
  return !greedy() && (params_.top_k <= 0 || params_.top_k > max_device_k);
}

void Sampler::accept(int32_t id) {
  if (params_.repeat_last_n == 0) return;
  ++seen_[id];
  if (params_.repeat_last_n < 0) return;  // the whole context: nothing leaves the window
  history_.push_back(id);
  while (int(history_.size()) > params_.repeat_last_n) {
    if (auto it = seen_.find(history_.front()); it != seen_.end() && --it->second == 0) seen_.erase(it);
    history_.pop_front();
  }
}

int32_t Sampler::sample(std::span<const float> logits) {
  std::vector<Candidate> c(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c[i] = {int32_t(i), logits[i]};
  if (penalties()) {  // (llama.cpp's llama_sampler_penalties_apply: the repeat penalty, then the others)
    for (const auto& [id, count] : seen_) {
      if (id < 0 || size_t(id) >= c.size()) continue;
      float& l = c[size_t(id)].logit;
      l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
      l -= float(count) * params_.frequency_penalty + params_.presence_penalty;
    }
  }
  return sample(std::move(c));
}

int32_t Sampler::sample(std::vector<Candidate> c) {
  if (c.empty()) return 0;
  auto by_logit = [](const Candidate& a, const Candidate& b) {
    return a.logit > b.logit || (a.logit == b.logit && a.id < b.id);
  };
  if (greedy()) return std::min_element(c.begin(), c.end(), by_logit)->id;
  // top-k
  if (params_.top_k > 0 && size_t(params_.top_k) < c.size()) {
    std::partial_sort(c.begin(), c.begin() + params_.top_k, c.end(), by_logit);
    c.resize(size_t(params_.top_k));
  } else {
    std::sort(c.begin(), c.end(), by_logit);
  }
  std::vector<int32_t> ids(c.size());
  std::vector<float> l(c.size());
  for (size_t i = 0; i < c.size(); ++i) ids[i] = c[i].id, l[i] = c[i].logit;
  std::vector<double> e;  // top-p's terms, each computed once
  if (params_.top_p < 1.0f)
    for (size_t i = 0; i < c.size(); ++i) e.push_back(top_p_term(l.data(), int(i)));
  DeviceSampling s{params_.temperature, params_.top_p, params_.min_p, 0, seed_, draws_};
  const int32_t id = draw_token(ids.data(), l.data(), int(c.size()), s, e.empty() ? nullptr : e.data());
  draws_ = s.draw;
  return id;
}

}  // namespace shoal
