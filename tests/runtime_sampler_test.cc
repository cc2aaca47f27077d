// Sampler: hand-computed cases for each stage of the chain.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "backend/sampling_math.h"
#include "runtime/sampler.h"

namespace shoal {
namespace {

TEST(Sampler, GreedyPicksTheLargestLogitLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0;
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{0.1f, 3.0f, -1.0f, 3.0f}), 1);
}

TEST(Sampler, TopKOfOneIsGreedy) {
  SamplingParams p;
  p.temperature = 1.5f;
  p.top_k = 1;
  p.seed = 7;
  Sampler s(p);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(s.sample(std::vector<float>{0.0f, 0.5f, 2.0f, 1.9f}), 2);
}

TEST(Sampler, SameSeedSameDraws) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 1234;
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[size_t(i)] = std::sin(float(i));
  Sampler a(p), b(p);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(a.sample(logits), b.sample(logits));
}

TEST(Sampler, DrawFrequenciesFollowTheSoftmax) {
  // logits log(1), log(2), log(3) -> probabilities 1/6, 2/6, 3/6 at temperature 1.
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 99;
  Sampler s(p);
  std::map<int, int> count;
  const int n = 60000;
  for (int i = 0; i < n; ++i) count[s.sample(std::vector<float>{0.0f, std::log(2.0f), std::log(3.0f)})]++;
  EXPECT_NEAR(count[0] / double(n), 1.0 / 6, 0.01);
  EXPECT_NEAR(count[1] / double(n), 2.0 / 6, 0.01);
  EXPECT_NEAR(count[2] / double(n), 3.0 / 6, 0.01);
}

// The shared pick (backend/sampling_math.h) by hand: logits log 3, log 2, log 1 (sorted) are
// probabilities 1/2, 1/3, 1/6; the draw u picks where u * sum(w) falls in the running sum.
TEST(SamplingMath, PickCandidateByHand) {
  const float l[3] = {std::log(3.0f), std::log(2.0f), 0.0f};
  // No cut: w = 1, 2/3, 1/3 (sum 2); u 0.4 -> 0.8 < 1; u 0.6 -> 1.2 in [1, 5/3); u 0.9 -> 1.8.
  EXPECT_EQ(pick_candidate(l, 3, 1.0f, 1.0f, 0.0f, 0.4), 0);
  EXPECT_EQ(pick_candidate(l, 3, 1.0f, 1.0f, 0.0f, 0.6), 1);
  EXPECT_EQ(pick_candidate(l, 3, 1.0f, 1.0f, 0.0f, 0.9), 2);
  // top_p 0.4: the first candidate alone reaches it; 0.8 needs two (0.5 + 0.33).
  EXPECT_EQ(pick_candidate(l, 3, 1.0f, 0.4f, 0.0f, 0.99), 0);
  EXPECT_EQ(pick_candidate(l, 3, 1.0f, 0.8f, 0.0f, 0.99), 1);
  // min_p 0.5 keeps l >= log 3 + log 0.5 = log 1.5: two candidates.
  EXPECT_EQ(pick_candidate(l, 3, 1.0f, 1.0f, 0.5f, 0.99), 1);
  // Temperature 0.5 squares the ratios: w = 1, 4/9, 1/9 (sum 14/9); u 0.7 -> 1.089 in [1, 13/9).
  EXPECT_EQ(pick_candidate(l, 3, 0.5f, 1.0f, 0.0f, 0.7), 1);
  EXPECT_EQ(pick_candidate(l, 3, 0.5f, 1.0f, 0.0f, 0.6), 0);
  // Precomputed terms give the same picks.
  double e[3], w[3];
  for (int i = 0; i < 3; ++i) e[i] = top_p_term(l, i), w[i] = draw_term(l, i, 0.5f);
  EXPECT_EQ(pick_candidate(l, 3, 0.5f, 1.0f, 0.0f, 0.7, e, w), 1);
  EXPECT_EQ(pick_candidate(l, 3, 0.5f, 0.4f, 0.0f, 0.7, e, w), 0);
}

TEST(SamplingMath, UniformDrawsAreCounterBasedAndInRange) {
  std::map<double, int> seen;
  for (uint64_t i = 0; i < 1000; ++i) {
    const double u = uniform_draw(42, i);
    EXPECT_GE(u, 0.0);
    EXPECT_LT(u, 1.0);
    EXPECT_EQ(u, uniform_draw(42, i));  // the same index, the same number
    seen[u]++;
  }
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_NE(uniform_draw(42, 0), uniform_draw(43, 0));
  // splitmix64 of 42 + golden gamma, by hand: 0xBDD732262FEB6E95 >> 11, times 2^-53.
  EXPECT_EQ(uniform_draw(42, 0), double(0xBDD732262FEB6E95ull >> 11) * 0x1.0p-53);
  // A sampler's draws: uniform_draw(seed, 0), (seed, 1), ...; skip_draws moves past some.
  SamplingParams p;
  p.seed = 5;
  Sampler s(p);
  EXPECT_EQ(s.draws(), 0u);
  s.skip_draws(3);
  EXPECT_EQ(s.draws(), 3u);
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  // probabilities 0.5, 0.3, 0.2: top_p 0.7 keeps {0, 1} (0.5 < 0.7 <= 0.8).
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 0.7f;
  p.min_p = 0.0f;
  p.seed = 5;
  Sampler s(p);
  for (int i = 0; i < 2000; ++i) {
    int id = s.sample(std::vector<float>{std::log(0.5f), std::log(0.3f), std::log(0.2f)});
    EXPECT_NE(id, 2);
  }
}

TEST(Sampler, MinPDropsUnlikelyTokens) {
  // p = 0.6, 0.3, 0.1; min_p 0.2 keeps tokens with p >= 0.12: {0, 1}.
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.2f;
  p.seed = 11;
  Sampler s(p);
  for (int i = 0; i < 2000; ++i)
    EXPECT_NE(s.sample(std::vector<float>{std::log(0.6f), std::log(0.3f), std::log(0.1f)}), 2);
}

TEST(Sampler, RepeatPenaltyDividesPositiveAndMultipliesNegativeLogits) {
  // Token 0 (logit 2.0) seen -> 2.0 / 4 = 0.5 < token 1's 1.0: greedy now picks 1.
  SamplingParams p;
  p.temperature = 0;
  p.repeat_penalty = 4.0f;
  Sampler s(p);
  EXPECT_EQ(s.sample(std::vector<float>{2.0f, 1.0f, -1.0f}), 0);  // nothing seen yet
  s.accept(0);
  EXPECT_EQ(s.sample(std::vector<float>{2.0f, 1.0f, -1.0f}), 1);  // greedy sees the penalty too
  p.temperature = 0.0001f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = 3;
  Sampler t(p);
  t.accept(0);
  EXPECT_EQ(t.sample(std::vector<float>{2.0f, 1.0f, -1.0f}), 1);
  t.accept(1);
  // now 0.5 vs 0.25: token 0 again
  EXPECT_EQ(t.sample(std::vector<float>{2.0f, 1.0f, -1.0f}), 0);
}

// llama.cpp's penalties sampler: logit -= count * frequency + presence, after the repeat penalty.
TEST(Sampler, FrequencyAndPresencePenaltiesSubtractFromSeenTokens) {
  const std::vector<float> logits{2.0f, 1.5f, -1.0f};
  SamplingParams p;
  p.temperature = 0;
  p.frequency_penalty = 0.3f;
  Sampler f(p);
  EXPECT_TRUE(f.needs_full_logits(64));
  f.accept(0);
  EXPECT_EQ(f.sample(logits), 0);  // 2.0 - 0.3 = 1.7 > 1.5
  f.accept(0);
  EXPECT_EQ(f.sample(logits), 1);  // 2.0 - 0.6 = 1.4 < 1.5
  p.frequency_penalty = 0;
  p.presence_penalty = 0.6f;
  Sampler pr(p);
  EXPECT_TRUE(pr.needs_full_logits(64));
  pr.accept(0);
  EXPECT_EQ(pr.sample(logits), 1);  // 2.0 - 0.6 = 1.4 < 1.5, once however often seen
  pr.accept(1);
  EXPECT_EQ(pr.sample(logits), 0);  // 1.4 > 1.5 - 0.6 = 0.9
  p.presence_penalty = 0.2f;
  p.repeat_penalty = 2.0f;
  Sampler both(p);
  both.accept(0);
  both.accept(2);
  EXPECT_EQ(both.sample(logits), 1);  // 2.0 / 2 - 0.2 = 0.8 < 1.5
  const std::vector<float> negative{-1.0f, -1.9f, -3.0f};
  EXPECT_EQ(both.sample(negative), 1);  // a negative logit is multiplied: -1.0 * 2 - 0.2 = -2.2 < -1.9
}

// With a window of 1 only the last token is penalised: the count leaves with the token.
TEST(Sampler, PenaltiesForgetTokensThatLeaveTheWindow) {
  SamplingParams p;
  p.temperature = 0;
  p.presence_penalty = 1.0f;
  p.repeat_last_n = 1;
  Sampler s(p);
  const std::vector<float> logits{2.0f, 1.5f, 0.0f};
  s.accept(0);
  EXPECT_EQ(s.sample(logits), 1);  // 2.0 - 1 = 1.0 < 1.5
  s.accept(2);
  EXPECT_EQ(s.sample(logits), 0);  // 0 left the window
}

}  // namespace
}  // namespace shoal
