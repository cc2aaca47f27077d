// The math of drawing a token from sorted candidates, in one place for the host Sampler
// (src/runtime/sampler.cc), the CPU backend's sample op and the CUDA sampling kernels
// (src/backend/cuda/sampling.cu: the terms and the draw from here; pick_candidate's walk as
// pick_on_device, the same sums in the same order spread over a warp, which must change with
// it): every path picks the same token for the same draw (up to the last-ulp rounding of exp and
// log, which differs between the C library and CUDA's: a pick can differ only where a draw falls
// within an ulp of a boundary, ~1e-15 per draw). The chain is
// llama.cpp's (common/sampling.cpp): top-k (done before: the candidates), top-p (nucleus,
// Holtzman et al. 2019), min-p, temperature, then a draw. Doubles throughout, as the host did.
// Compiled by the C++ compiler and by nvcc (SHOAL_HD functions run on both).
#pragma once

#include <math.h>

#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define SHOAL_HD __host__ __device__
#else
#define SHOAL_HD
#endif

namespace shoal {

/// The settings a device reads when it samples (Backend::sample): a tensor of
/// sizeof(DeviceSampling) bytes, written by the host before a chained decode.
struct DeviceSampling {
  float temperature = 1.0f;  // > 0
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
  uint32_t reserved = 0;
  uint64_t seed = 0;
  uint64_t draw = 0;  // index of the next uniform draw; each sample() uses one and adds 1
};
static_assert(sizeof(DeviceSampling) == 32, "DeviceSampling is a tensor of 8 i32 words");

/// The index-th uniform draw in [0, 1) of `seed`: splitmix64 (Steele, Lea and Flood 2014) of
/// seed + (index + 1) * golden gamma, top 53 bits. Counter-based, so a device draws exactly the
/// numbers the host would. (Shoal's earlier Sampler drew from mt19937_64: a seed gives other
/// text than in versions before the chained decode.)
SHOAL_HD inline double uniform_draw(uint64_t seed, uint64_t index) {
  uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return double(z >> 11) * 0x1.0p-53;
}

/// The softmax terms of candidate i of logits l (sorted descending): exp(l[i] - l[0]) for
/// top-p (untempered), and exp((l[i] - l[0]) / temperature) for the draw.
SHOAL_HD inline double top_p_term(const float* l, int i) { return exp(double(l[i]) - double(l[0])); }
SHOAL_HD inline double draw_term(const float* l, int i, float temperature) {
  return exp((double(l[i]) - double(l[0])) / double(temperature));
}

/// Which of k >= 1 candidates (logits l sorted descending) to pick for the uniform draw u in
/// [0, 1): keep the smallest prefix whose softmax(l) mass reaches top_p (top_p < 1; at least
/// one), then those with l >= l[0] + log(min_p) (min_p > 0), then pick by softmax(l /
/// temperature) of the kept. e, w: top_p_term / draw_term of every candidate, computed ahead,
/// or null: computed here, only where needed. (The CUDA backend runs this walk as pick_on_device
/// in sampling.cu: keep the two in step.)
SHOAL_HD inline int pick_candidate(const float* l, int k, float temperature, float top_p, float min_p, double u,
                                   const double* e = nullptr, const double* w = nullptr) {
  if (top_p < 1.0f) {  // (the mass compared unnormalised: no division per candidate)
    double sum = 0;
    for (int i = 0; i < k; ++i) sum += e ? e[i] : top_p_term(l, i);
    const double reach = double(top_p) * sum;
    double cum = 0;
    for (int i = 0; i < k; ++i) {
      cum += e ? e[i] : top_p_term(l, i);
      if (cum >= reach) {
        k = i + 1;
        break;
      }
    }
  }
  if (min_p > 0.0f) {
    const double cut = double(l[0]) + log(double(min_p));
    int keep = 1;
    while (keep < k && double(l[keep]) >= cut) ++keep;
    k = keep;
  }
  double sum = 0;
  for (int i = 0; i < k; ++i) sum += w ? w[i] : draw_term(l, i, temperature);
  const double x = u * sum;
  double acc = 0;
  for (int i = 0; i < k; ++i) {
    acc += w ? w[i] : draw_term(l, i, temperature);
    if (x < acc) return i;
  }
  return k - 1;
}

/// The token drawn from k candidates (ids, logits vals sorted descending) with the settings and
/// the next draw of s, which then moves on by one: what the host Sampler, Backend::sample and a
/// pipeline sampling per step all do with a device's top-k. e, w as in pick_candidate.
SHOAL_HD inline int32_t draw_token(const int32_t* ids, const float* vals, int k, DeviceSampling& s,
                                   const double* e = nullptr, const double* w = nullptr) {
  const int i = pick_candidate(vals, k, s.temperature, s.top_p, s.min_p, uniform_draw(s.seed, s.draw), e, w);
  ++s.draw;
  return ids[i];
}

}  // namespace shoal
