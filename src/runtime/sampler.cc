#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace shoal {

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  seed_ = params.seed == 0xFFFFFFFFu ? std::random_device{}() : params.seed;
  rng_.seed(seed_);
}

bool Sampler::needs_full_logits(int max_device_k) const {
  if (params_.repeat_penalty != 1.0f) return true;
  return !greedy() && (params_.top_k <= 0 || params_.top_k > max_device_k);
}

void Sampler::accept(int32_t id) {
  if (params_.repeat_last_n <= 0) return;
  history_.push_back(id);
  while (int(history_.size()) > params_.repeat_last_n) history_.pop_front();
}

int32_t Sampler::sample(std::span<const float> logits) {
  std::vector<Candidate> c(logits.size());
  for (size_t i = 0; i < logits.size(); ++i) c[i] = {int32_t(i), logits[i]};
  if (params_.repeat_penalty != 1.0f && !history_.empty()) {
    std::unordered_set<int32_t> seen(history_.begin(), history_.end());
    for (int32_t id : seen) {
      if (id < 0 || size_t(id) >= c.size()) continue;
      float& l = c[size_t(id)].logit;
      l = l > 0 ? l / params_.repeat_penalty : l * params_.repeat_penalty;
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
  // softmax of the (untempered) logits for top-p and min-p
  auto probs = [&] {
    std::vector<double> p(c.size());
    const double mx = c[0].logit;
    double sum = 0;
    for (size_t i = 0; i < c.size(); ++i) sum += (p[i] = std::exp(double(c[i].logit) - mx));
    for (double& x : p) x /= sum;
    return p;
  };
  if (params_.top_p < 1.0f) {
    auto p = probs();
    double cum = 0;
    size_t keep = c.size();
    for (size_t i = 0; i < c.size(); ++i) {
      cum += p[i];
      if (cum >= params_.top_p) {
        keep = i + 1;
        break;
      }
    }
    c.resize(std::max<size_t>(1, keep));
  }
  if (params_.min_p > 0.0f) {
    const double cut = double(c[0].logit) + std::log(double(params_.min_p));
    size_t keep = 1;
    while (keep < c.size() && double(c[keep].logit) >= cut) ++keep;
    c.resize(keep);
  }
  // temperature, then a draw from the softmax
  std::vector<double> w(c.size());
  const double t = params_.temperature;
  double sum = 0;
  for (size_t i = 0; i < c.size(); ++i) sum += (w[i] = std::exp((double(c[i].logit) - c[0].logit) / t));
  const double u = double(rng_() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    acc += w[i];
    if (u < acc) return c[i].id;
  }
  return c.back().id;
}

}  // namespace shoal
