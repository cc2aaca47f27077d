// Session and pipeline behaviour on real fixture models: thread-count independence, prompt-cache
// reuse, context limits, load-time conversions.
#include <gtest/gtest.h>

#include <cstring>

#include "runtime/local_model.h"
#include "runtime/pipeline.h"
#include "stepwise_pipeline.h"
#include "runtime/sampler.h"
#include "runtime/session.h"
#include "test_util.h"

namespace shoal {
namespace {

LocalModel load(const std::string& rel, const std::string& device, int threads, int n_ctx = 0) {
  LocalModelOptions o;
  o.device = device;
  o.threads = threads;
  o.n_ctx = n_ctx;
  o.progress = false;
  auto m = load_local_model(test::fixture(rel), o);
  EXPECT_TRUE(m.ok()) << m.status().to_string();
  return std::move(*m);
}

std::vector<float> all_logits(LocalModel& m, const std::vector<int32_t>& ids) {
  StepOutput out;
  out.mode = HeadMode::kLogitsAll;
  Status s = m.pipeline->forward(ids, 0, out);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return out.logits;
}

TEST(Determinism, LogitsAreBitIdenticalForAnyThreadCount) {
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298, 315};
  for (const char* model : {"models/stories260K.gguf", "hf/qwen3/model-bf16.gguf", "quant/q-Q4_0.gguf",
                            "quant/q-Q8_0.gguf"}) {
    auto one = load(model, "cpu", 1);
    const auto ref = all_logits(one, ids);
    for (int threads : {2, 3}) {
      auto many = load(model, "cpu", threads);
      const auto got = all_logits(many, ids);
      ASSERT_EQ(got.size(), ref.size());
      EXPECT_EQ(std::memcmp(got.data(), ref.data(), ref.size() * 4), 0) << model << " with " << threads << " threads";
    }
  }
}

TEST(Determinism, BatchSizeDoesNotChangeLogits) {
  // The same prompt prefilled in one step or in steps of 3 tokens gives the same bits.
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 432, 383, 286};
  LocalModelOptions o;
  o.progress = false;
  o.max_tokens = 3;
  auto small = load_local_model(test::fixture("models/stories260K.gguf"), o);
  ASSERT_TRUE(small.ok());
  auto big = load("models/stories260K.gguf", "cpu", 0);
  const auto a = all_logits(*small, ids), b = all_logits(big, ids);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * 4), 0);
}

TEST(Session, ReusedPrefixGivesTheSameContinuation) {
  auto m = load("models/stories260K.gguf", "cpu", 0);
  Session s(*m.pipeline, {});
  GenerateOptions g;
  g.n_predict = 12;
  g.sampling.temperature = 0;
  const std::vector<int32_t> a = {1, 403, 407, 261, 378};
  auto first = s.generate(a, g, {});
  ASSERT_TRUE(first.ok());
  // Follow-up turn: the old prompt + answer + more text. Only the new part is prefilled.
  std::vector<int32_t> b = a;
  b.insert(b.end(), first->begin(), first->end());
  b.push_back(426);
  GenerateStats st;
  auto cached = s.generate(b, g, {}, &st);
  ASSERT_TRUE(cached.ok());
  EXPECT_GE(st.n_reused, int(a.size()));
  Session fresh(*m.pipeline, {});
  fresh.reset();
  auto clean = fresh.generate(b, g, {});
  ASSERT_TRUE(clean.ok());
  EXPECT_EQ(*cached, *clean);
}

TEST(Session, PromptLongerThanTheContextIsAClearError) {
  auto m = load("models/stories260K.gguf", "cpu", 0, 16);
  Session s(*m.pipeline, {});
  std::vector<int32_t> prompt(40, 300);
  auto r = s.generate(prompt, {}, {});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kOutOfRange);
  EXPECT_NE(r.status().message().find("40 tokens"), std::string::npos) << r.status().message();
}

TEST(Session, PromptFitsWithOnePositionLeftForTheAnswer) {
  EXPECT_TRUE(check_prompt_fits(15, 16).ok());
  EXPECT_EQ(check_prompt_fits(16, 16).code(), Code::kOutOfRange);
  EXPECT_EQ(check_prompt_fits(17, 16).code(), Code::kOutOfRange);
  EXPECT_EQ(check_prompt_fits(0, 16).code(), Code::kInvalidArgument);
}

TEST(Session, GenerationStopsWhenTheContextIsFull) {
  auto m = load("models/stories260K.gguf", "cpu", 0, 16);
  Session s(*m.pipeline, {});
  GenerateOptions g;
  g.sampling.temperature = 0;
  g.stop_at_eog = false;
  GenerateStats st;
  auto r = s.generate(std::vector<int32_t>{1, 403, 407}, g, {}, &st);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(st.hit_context);
  EXPECT_EQ(r->size(), 16u - 3u + 1u);  // the last token needs no cache slot
}

TEST(Session, NPredictZeroEvaluatesThePromptOnly) {
  auto m = load("models/stories260K.gguf", "cpu", 0, 64);
  Session s(*m.pipeline, {});
  GenerateOptions g;
  g.sampling.temperature = 0;
  g.n_predict = 0;
  GenerateStats st;
  auto r = s.generate(std::vector<int32_t>{1, 403, 407}, g, {}, &st);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_TRUE(r->empty());
  EXPECT_EQ(st.n_generated, 0);
  g.n_predict = 2;  // the cached prompt is reused by the next request
  r = s.generate(std::vector<int32_t>{1, 403, 407}, g, {}, &st);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(r->size(), 2u);
  EXPECT_EQ(st.n_reused, 2);  // all but the last prompt token, which runs again for its logits
}

TEST(Session, BadTokenIdIsRejected) {
  auto m = load("models/stories260K.gguf", "cpu", 0);
  StepOutput out;
  const std::vector<int32_t> ids = {1, 99999};
  Status st = m.pipeline->forward(ids, 0, out);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
}

// Decoding chained in the slice (Slice::decode) gives the ids of one forward() per step
// (Pipeline's default), greedy and sampled, and a stop leaves the cache (and the draws) where
// the next call continues.
TEST(Session, ChainedDecodingEqualsOneForwardPerStep) {
  auto m = load("models/stories260K.gguf", "cpu", 0, 32);
  Pipeline& p = *m.pipeline;
  test::StepwisePipeline stepwise_p(p);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  const int32_t first = test::prefill_argmax(p, prompt);
  ASSERT_GE(first, 0);
  const int64_t pos0 = int64_t(prompt.size());
  using test::collect;
  for (bool greedy : {true, false}) {
    SCOPED_TRACE(greedy ? "greedy" : "sampled");
    const DecodeSampling how = greedy ? DecodeSampling{} : test::sampled(1234, 0);
    std::vector<int32_t> stepwise, chained, resumed;
    auto r = stepwise_p.decode(first, pos0, 12, how, collect(stepwise, 99));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, 12);
    r = p.decode(first, pos0, 12, how, collect(chained, 99));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, 12);
    EXPECT_EQ(chained, stepwise);
    r = p.decode(first, pos0, 12, how, collect(resumed, 5));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(*r, 5);
    const DecodeSampling rest = greedy ? DecodeSampling{} : test::sampled(1234, 5);
    r = p.decode(resumed.back(), pos0 + 5, 7, rest, collect(resumed, 99));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(resumed, stepwise);
    if (!greedy) {
      EXPECT_NE(chained, std::vector<int32_t>(12, chained[0]));  // it samples something
    }
  }
  // Past the context (32 positions), no steps, a top-k the device path cannot give, no
  // temperature: clear errors.
  std::vector<int32_t> v;
  for (Pipeline* q : {static_cast<Pipeline*>(&stepwise_p), &p}) {
    EXPECT_EQ(q->decode(first, pos0, 28, {}, collect(v, 99)).status().code(), Code::kOutOfRange);
    EXPECT_EQ(q->decode(first, pos0, 0, {}, collect(v, 99)).status().code(), Code::kInvalidArgument);
    DecodeSampling bad = test::sampled(1234, 0);
    bad.top_k = 300;
    EXPECT_EQ(q->decode(first, pos0, 4, bad, collect(v, 99)).status().code(), Code::kInvalidArgument);
  }
  DecodeSampling cold = test::sampled(1234, 0);
  cold.draw.temperature = 0;
  for (Pipeline* q : {static_cast<Pipeline*>(&stepwise_p), &p})
    EXPECT_EQ(q->decode(first, pos0, 4, cold, collect(v, 99)).status().code(), Code::kInvalidArgument);
}

// A sampled generation (top-k on the device) draws the same tokens whether the pipeline chains
// the steps, runs one forward per step, or the caller steps by hand with a Sampler (the path
// before chaining: the device's top-k, then Sampler::sample), and the same seed gives the same
// text twice.
TEST(Session, SampledGenerationIsTheSameChainedOrStepwise) {
  auto m = load("models/stories260K.gguf", "cpu", 0, 128);
  test::StepwisePipeline stepwise_p(*m.pipeline);
  GenerateOptions g;
  g.n_predict = 40;
  g.stop_at_eog = false;
  g.sampling.seed = 99;
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
  Session chained(*m.pipeline, {}), stepwise(stepwise_p, {});
  auto a = chained.generate(prompt, g, {});
  auto b = stepwise.generate(prompt, g, {});
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(*a, *b);
  Sampler sampler(g.sampling);
  std::vector<int32_t> by_hand, fed = prompt;
  int64_t pos = 0;
  while (by_hand.size() < a->size()) {
    StepOutput out;
    out.mode = HeadMode::kTopKLast;
    out.top_k = g.sampling.top_k;
    ASSERT_TRUE(m.pipeline->forward(fed, pos, out).ok());
    std::vector<Candidate> c;
    for (size_t i = 0; i < out.ids.size(); ++i) c.push_back({out.ids[i], out.logits[i]});
    pos += int64_t(fed.size());
    fed = {sampler.sample(std::move(c))};
    by_hand.push_back(fed[0]);
  }
  EXPECT_EQ(by_hand, *a);
  chained.reset();
  auto again = chained.generate(prompt, g, {});
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *a);
}

class QuantGenerate : public ::testing::TestWithParam<std::string> {};

TEST_P(QuantGenerate, EveryLoadableTypeGeneratesText) {
  auto m = load("quant/q-" + GetParam() + ".gguf", "cpu", 0);
  Session s(*m.pipeline, [&](int32_t id) { return m.tokenizer->is_eog(id); });
  GenerateOptions g;
  g.n_predict = 8;
  g.sampling.seed = 42;
  auto ids = m.tokenizer->encode("Once upon a time", true, false);
  auto r = s.generate(ids, g, {});
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_FALSE(r->empty());
  for (int32_t id : *r) EXPECT_TRUE(id >= 0 && id < m.config.vocab_size);
}

INSTANTIATE_TEST_SUITE_P(Types, QuantGenerate,
                         ::testing::Values("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_M", "Q4_K_M",
                                           "Q5_K_M", "Q6_K"));

}  // namespace
}  // namespace shoal
