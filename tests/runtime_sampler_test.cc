// Sampler: hand-computed cases for each stage of the chain.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

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

}  // namespace
}  // namespace shoal
