// The load-time warm-up (Slice::warm_up): a device backend runs the largest step and a top-k
// decode step while the slice loads, leaves the cache empty (greedy output still equals
// llama.cpp's), and a failure there fails the load, naming the step; the CPU backend and
// SliceOptions::warm_up = false (--no-warmup) skip it.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <fstream>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "runtime/local_model.h"
#include "runtime/slice.h"
#include "test_util.h"

namespace shoal {
namespace {

/// The CPU backend posing as a backend of `kind`; logs the tokens of each recorded step
/// (Slice::step_key's bits 0..15) and each top-k's k, and fails every step while `fail` is set.
class WarmUpDevice : public CpuBackend {
 public:
  explicit WarmUpDevice(DeviceKind kind) : CpuBackend(BackendOptions{1, false, false}), kind_(kind) {}
  DeviceKind kind() const override { return kind_; }
  std::string name() const override { return "warm:0"; }
  uint64_t free_memory() const override { return 0; }  // unknown: the load's memory check is skipped
  Status run_graph(uint64_t key, const std::function<void()>& record, uint64_t owner) override {
    steps.push_back(int(key & 0xffff));
    if (fail) return make_error(Code::kOutOfMemory, "cannot allocate 64.00 MiB of scratch");
    return CpuBackend::run_graph(key, record, owner);
  }
  void top_k(const Tensor& logits, int k, Tensor& ids, Tensor& vals) override {
    top_ks.push_back(k);
    CpuBackend::top_k(logits, k, ids, vals);
  }
  std::vector<int> steps, top_ks;
  bool fail = false;

 private:
  DeviceKind kind_;
};

class WarmUp : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = open_model(test::fixture("models/stories260K.gguf"), false);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    model_ = std::make_unique<LocalModel>(std::move(*m));
  }
  Result<std::unique_ptr<Slice>> load(const SliceSpec& spec, const SliceOptions& so, Backend& be) const {
    return Slice::load(*model_->file, model_->config, model_->weights, spec, so, be);
  }
  std::unique_ptr<LocalModel> model_;
};

TEST_F(WarmUp, ADeviceRunsTheLargestStepsAtLoadAndLeavesTheCacheEmpty) {
  // A context of one prefill chunk: the warm-up writes every cache row (48 tokens at 0..47, then
  // one at 47), so the generation below runs over rows the warm-up left behind, to the last.
  SliceOptions so;
  so.n_ctx = 48;
  so.max_tokens = 48;
  WarmUpDevice be(DeviceKind::kCuda);
  const int L = model_->config.n_layers;
  auto s = load(SliceSpec{0, L, true, true}, so, be);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(be.steps, (std::vector<int>{48, 1}));
  EXPECT_EQ(be.top_ks, (std::vector<int>{256}));  // the device path's largest top-k (vocab 512)
  EXPECT_EQ((*s)->n_past(), 0);
  std::ifstream f(test::fixture("expected/stories260K_greedy.json"));
  const nlohmann::json want = nlohmann::json::parse(f);
  for (const auto& c : want["cases"]) {
    SCOPED_TRACE(c["prompt"].get<std::string>());
    const auto ids = c["prompt_ids"].get<std::vector<int32_t>>();
    const auto gen = c["generated_ids"].get<std::vector<int32_t>>();
    const int n = int(ids.size()), steps = int(so.n_ctx) - n;  // to the end of the context
    ASSERT_LT(steps, int(gen.size()));
    StepOutput am;
    am.mode = HeadMode::kArgmaxLast;
    ASSERT_TRUE((*s)->forward(StepInput{n, 0, ids.data()}, am).ok());
    std::vector<int32_t> got = am.ids;
    auto r = (*s)->decode(got[0], n, steps, DecodeSampling{}, [&](int32_t id) {
      got.push_back(id);
      return true;
    });
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(got, std::vector<int32_t>(gen.begin(), gen.begin() + steps + 1));
  }
}

TEST_F(WarmUp, SlicesWithoutTheEmbeddingOrTheHeadWarmUpOnHiddenStates) {
  SliceOptions so;
  so.n_ctx = 256;
  so.max_tokens = 32;
  const int L = model_->config.n_layers;
  for (const SliceSpec spec : {SliceSpec{0, 2, true, false}, SliceSpec{2, L, false, true}, SliceSpec{L, L, false, true},
                               SliceSpec{1, 3, false, false}}) {
    SCOPED_TRACE(fmt::format("layers {}-{}", spec.first, spec.end - 1));
    WarmUpDevice be(DeviceKind::kCuda);
    auto s = load(spec, so, be);
    ASSERT_TRUE(s.ok()) << s.status().to_string();
    EXPECT_EQ(be.steps, (std::vector<int>{32, 1}));
    EXPECT_EQ(be.top_ks, spec.head ? std::vector<int>{256} : std::vector<int>{});
    EXPECT_EQ((*s)->n_past(), 0);
  }
}

TEST_F(WarmUp, TheCpuBackendAndWarmUpOffSkipIt) {
  const int L = model_->config.n_layers;
  WarmUpDevice cpu(DeviceKind::kCpu);
  ASSERT_TRUE(load(SliceSpec{0, L, true, true}, SliceOptions{}, cpu).ok());
  EXPECT_TRUE(cpu.steps.empty());
  SliceOptions off;
  off.warm_up = false;
  WarmUpDevice device(DeviceKind::kCuda);
  ASSERT_TRUE(load(SliceSpec{0, L, true, true}, off, device).ok());
  EXPECT_TRUE(device.steps.empty());
}

TEST_F(WarmUp, AFailedWarmUpFailsTheLoadNamingTheStep) {
  SliceOptions so;
  so.n_ctx = 256;
  so.max_tokens = 64;
  WarmUpDevice be(DeviceKind::kCuda);
  be.fail = true;
  auto s = load(SliceSpec{0, model_->config.n_layers, true, true}, so, be);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), Code::kOutOfMemory);
  EXPECT_EQ(s.status().message(),
            "warm-up at load (64 tokens at positions 192..255): cannot allocate 64.00 MiB of scratch");
  EXPECT_EQ(be.steps, (std::vector<int>{64}));  // no second step after the first failed
}

TEST_F(WarmUp, AContextShorterThanTheChunkWarmsUpOnTheWholeContext) {
  SliceOptions so;
  so.n_ctx = 20;
  so.max_tokens = 128;
  WarmUpDevice be(DeviceKind::kCuda);
  auto s = load(SliceSpec{0, model_->config.n_layers, true, true}, so, be);
  ASSERT_TRUE(s.ok()) << s.status().to_string();
  EXPECT_EQ(be.steps, (std::vector<int>{20, 1}));
}

}  // namespace
}  // namespace shoal
