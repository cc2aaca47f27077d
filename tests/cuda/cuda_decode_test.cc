// Chained decoding on CUDA with a real model (stories260K): the pipelined steps (step k + 1
// queued before step k's id is read) give llama.cpp's greedy output from the fixtures, a stop in
// the middle leaves the cache where the next call resumes, and greedy or sampled ids equal
// those of one forward() per step with the host drawing.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>

#include "backend/cuda/cuda_probe.h"
#include "runtime/local_model.h"
#include "runtime/session.h"
#include "stepwise_pipeline.h"
#include "test_util.h"

namespace shoal {
namespace {

class CudaDecodeTest : public ::testing::TestWithParam<DType> {
 protected:
  void SetUp() override {
    if (!create_backend("cuda:0").ok()) GTEST_SKIP() << "no CUDA device";
    auto m = load(256);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::make_unique<LocalModel>(std::move(*m));
    std::ifstream in(test::fixture("expected/stories260K_greedy.json"));
    want_ = nlohmann::json::parse(in)["cases"];
  }
  /// stories260K on cuda:0 with the test's KV type and a context of n_ctx tokens.
  Result<LocalModel> load(int n_ctx) const {
    LocalModelOptions o;
    o.device = "cuda:0";
    o.kv_dtype = GetParam();
    o.n_ctx = n_ctx;
    o.progress = false;
    return load_local_model(test::fixture("models/stories260K.gguf"), o);
  }
  std::unique_ptr<LocalModel> model_;
  nlohmann::json want_;
};

TEST_P(CudaDecodeTest, SessionGreedyMatchesLlamaCpp) {
  Session session(*model_->pipeline, [&](int32_t id) { return model_->tokenizer->is_eog(id); });
  for (const auto& c : want_) {
    const auto prompt = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = c["generated_ids"].get<std::vector<int32_t>>();
    GenerateOptions g;
    g.n_predict = int(want.size());
    g.sampling.temperature = 0;
    auto out = session.generate(prompt, g, {});
    ASSERT_TRUE(out.ok()) << out.status().to_string();
    EXPECT_EQ(*out, want) << c["prompt"];
  }
}

// The caller stops after 5 tokens (the device has run the step after), then sends the prompt
// with those tokens: the session reuses its cache and the two answers make the fixture's.
TEST_P(CudaDecodeTest, SessionStoppedByTheCallerResumesFromItsCache) {
  Session session(*model_->pipeline, [&](int32_t id) { return model_->tokenizer->is_eog(id); });
  const auto prompt = want_[0]["prompt_ids"].get<std::vector<int32_t>>();
  const auto want = want_[0]["generated_ids"].get<std::vector<int32_t>>();
  ASSERT_GT(want.size(), 6u);
  GenerateOptions g;
  g.n_predict = int(want.size());
  g.sampling.temperature = 0;
  int seen = 0;
  auto first = session.generate(prompt, g, [&](int32_t) { return ++seen < 5; });
  ASSERT_TRUE(first.ok()) << first.status().to_string();
  ASSERT_EQ(first->size(), 5u);
  std::vector<int32_t> more = prompt;
  more.insert(more.end(), first->begin(), first->end());
  g.n_predict = int(want.size()) - 5;
  GenerateStats st;
  auto rest = session.generate(more, g, {}, &st);
  ASSERT_TRUE(rest.ok()) << rest.status().to_string();
  EXPECT_EQ(st.n_reused, int(more.size()) - 1);
  std::vector<int32_t> both = *first;
  both.insert(both.end(), rest->begin(), rest->end());
  EXPECT_EQ(both, want);
}

TEST_P(CudaDecodeTest, StopAndResumeEqualsOneForwardPerStep) {
  Pipeline& p = *model_->pipeline;
  const auto prompt = want_[0]["prompt_ids"].get<std::vector<int32_t>>();
  const int32_t first = test::prefill_argmax(p, prompt);
  ASSERT_GE(first, 0);
  const int64_t pos0 = int64_t(prompt.size());
  using test::collect;
  for (bool greedy : {true, false}) {
    SCOPED_TRACE(greedy ? "greedy" : "sampled");
    auto how = [&](size_t first_draw) { return greedy ? DecodeSampling{} : test::sampled(77, first_draw); };
    std::vector<int32_t> stepwise, resumed;
    auto r = p.Pipeline::decode(first, pos0, 40, how(0), collect(stepwise, 99));
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    // Calls that deliver 1, 2, 17 and 20 ids; the first three stop early, after the device has
    // already run the step after (and, sampling, made its draw).
    size_t stop = 0;
    for (size_t at : {size_t(1), size_t(3), size_t(20), size_t(40)}) {
      const int32_t id = resumed.empty() ? first : resumed.back();
      r = p.decode(id, pos0 + int64_t(resumed.size()), int(40 - resumed.size()), how(resumed.size()),
                   collect(resumed, at));
      ASSERT_TRUE(r.ok()) << r.status().to_string();
      EXPECT_EQ(*r, int(at - stop));
      stop = at;
    }
    EXPECT_EQ(resumed, stepwise);
  }
}

// A chain that crosses decode attention's plan limit (1792 keys, plan_attention_keys) records a
// graph for each plan (sm_90; one plan without clusters), the second while steps of the first are
// still running, and its ids equal those of one forward() per step (which switch at the same
// position). (stories260K's head_dim 8 takes the tiled attention kernel under both plans; the
// plans themselves are checked in cuda_attention_test.cc.)
TEST_P(CudaDecodeTest, ChainAcrossTheAttentionPlanLimitEqualsOneForwardPerStep) {
  auto m = load(1900);
  ASSERT_TRUE(m.ok()) << m.status().to_string();
  Pipeline& p = *m->pipeline;
  const auto base = want_[0]["prompt_ids"].get<std::vector<int32_t>>();
  std::vector<int32_t> prompt;
  while (prompt.size() < 1780) prompt.insert(prompt.end(), base.begin(), base.end());
  prompt.resize(1780);
  const int32_t first = test::prefill_argmax(p, prompt);
  ASSERT_GE(first, 0);
  using test::collect;
  std::vector<int32_t> stepwise, chained;
  auto r = p.Pipeline::decode(first, 1780, 40, DecodeSampling{}, collect(stepwise, 99));  // positions 1780..1819
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  const int64_t graphs = cuda_probe::recorded_graphs(*m->backend);
  r = p.decode(first, 1780, 40, DecodeSampling{}, collect(chained, 99));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  EXPECT_EQ(chained, stepwise);
  const bool clusters = cuda_probe::set_clusters(false);  // (the backend's setting, restored)
  cuda_probe::set_clusters(clusters);
  EXPECT_EQ(cuda_probe::recorded_graphs(*m->backend) - graphs, clusters ? 2 : 1) << "one chained step graph per plan";
}

// Sampled generation (the CLI's defaults, top-k on the device): the device's draws give the
// tokens the host's draws give from the same candidates.
TEST_P(CudaDecodeTest, SampledGenerationIsTheSameChainedOrStepwise) {
  test::StepwisePipeline stepwise_p(*model_->pipeline);
  Session chained(*model_->pipeline, {}), stepwise(stepwise_p, {});
  GenerateOptions g;
  g.n_predict = 100;
  g.stop_at_eog = false;
  const auto prompt = want_[0]["prompt_ids"].get<std::vector<int32_t>>();
  for (uint64_t seed : {1u, 2u, 3u}) {
    g.sampling.seed = seed;
    auto a = chained.generate(prompt, g, {});
    auto b = stepwise.generate(prompt, g, {});
    ASSERT_TRUE(a.ok() && b.ok());
    EXPECT_EQ(*a, *b) << "seed " << seed;
  }
}

INSTANTIATE_TEST_SUITE_P(Kv, CudaDecodeTest, ::testing::Values(DType::kF16, DType::kQ8_0),
                         [](const auto& i) { return std::string(dtype_name(i.param)); });

}  // namespace
}  // namespace shoal
