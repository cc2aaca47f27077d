// Token sampling, as llama.cpp's default chain orders it (common/sampling.cpp): penalties
// (repetition, CTRL-style, Keskar et al. 2019; frequency and presence, as OpenAI's API defines
// them and llama.cpp's penalties sampler applies them), top-k, top-p (nucleus, Holtzman et al. 2019), min-p, temperature, then a draw.
// Greedy when temperature <= 0. The same seed gives the same draws; draws are counter-based so
// that a device sampling for a chained decode (Backend::sample) draws the same numbers.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <vector>

namespace shoal {

/// The seed that asks for a random one (llama.cpp's LLAMA_DEFAULT_SEED).
constexpr uint64_t kRandomSeed = 0xFFFFFFFFu;

struct SamplingParams {
  float temperature = 0.8f;     // <= 0: greedy (argmax)
  int top_k = 40;               // 0: off
  float top_p = 0.95f;          // 1: off
  float min_p = 0.05f;          // 0: off; keeps tokens with p >= min_p * p_max
  float repeat_penalty = 1.0f;  // 1: off; CTRL-style (Keskar et al. 2019), as llama.cpp
  float frequency_penalty = 0;  // 0: off; minus this times a token's count in the window
  float presence_penalty = 0;   // 0: off; minus this once for a token in the window
  int repeat_last_n = 64;       // how many recent tokens the penalties look at (0: none; -1: all, the context)
  uint64_t seed = kRandomSeed;
};

/// One candidate token and its logit.
struct Candidate {
  int32_t id;
  float logit;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);

  bool greedy() const { return params_.temperature <= 0.0f; }
  /// Whether a penalty is on, over a window of at least one token (penalties need every logit).
  bool penalties() const {
    return params_.repeat_last_n != 0 &&
           (params_.repeat_penalty != 1.0f || params_.frequency_penalty != 0 || params_.presence_penalty != 0);
  }
  /// True when sampling needs every logit (a penalty on, or top-k off / larger than a device top-k
  /// can give); otherwise the argmax (greedy) or the k best candidates from the device suffice.
  bool needs_full_logits(int max_device_k) const;
  const SamplingParams& params() const { return params_; }
  uint64_t seed() const { return seed_; }
  /// Draws are counter-based (uniform_draw(seed, index), backend/sampling_math.h): the index of
  /// the next one, and a skip past n draws made elsewhere (by a device sampling for us).
  uint64_t draws() const { return draws_; }
  void skip_draws(uint64_t n) { draws_ += n; }

  /// Picks a token from full logits [vocab].
  int32_t sample(std::span<const float> logits);
  /// Picks a token from candidates (e.g. the device's top-k, sorted or not).
  int32_t sample(std::vector<Candidate> candidates);
  /// Records a token of the context (prompt or generated) for the penalties.
  void accept(int32_t id);
  /// Forgets the recorded context (new conversation).
  void reset_history() {
    history_.clear();
    seen_.clear();
  }

 private:
  SamplingParams params_;
  uint64_t seed_;
  uint64_t draws_ = 0;
  std::deque<int32_t> history_;               // a window of repeat_last_n > 0 tokens, oldest first
  std::unordered_map<int32_t, int> seen_;      // each id in the window and how often (one pass a token)
};

}  // namespace shoal
