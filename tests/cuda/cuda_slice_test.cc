// A pool's last worker on CUDA (a slice that ends the model without the head) keeps only the rows
// the host's head reads: keep_rows 1 gives the CPU reference's last row of the all-rows step (f32
// and f16 hops), keep_rows 0 only fills the cache and writes nothing. Slices sharing one CUDA
// backend (the pool's host; a worker given a new plan) never replay each other's step graphs, and
// a slice's graphs go with it. stories260K.
#include <gtest/gtest.h>

#include <cmath>

#include "backend/cuda/cuda_probe.h"
#include "core/half.h"
#include "kept_rows.h"
#include "runtime/local_model.h"
#include "runtime/slice.h"
#include "test_util.h"

namespace shoal {
namespace {

/// stories260K and both backends; load() gives a slice of it (nullptr and a failure on error).
class CudaSliceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto g = create_backend("cuda:0");
    if (!g.ok()) GTEST_SKIP() << "no CUDA device";
    gpu_ = std::move(*g);
    auto c = create_backend("cpu");
    ASSERT_TRUE(c.ok());
    cpu_ = std::move(*c);
    auto m = open_model(test::fixture("models/stories260K.gguf"), false);
    ASSERT_TRUE(m.ok()) << m.status().to_string();
    m_ = std::move(*m);
  }
  std::unique_ptr<Slice> load(SliceSpec spec, Backend& be) {
    auto s = Slice::load(*m_.file, m_.config, m_.weights, spec, {}, be);
    EXPECT_TRUE(s.ok()) << s.status().to_string();
    return s.ok() ? std::move(*s) : nullptr;
  }
  std::unique_ptr<Backend> gpu_, cpu_;
  LocalModel m_;
};

TEST_F(CudaSliceTest, LastSliceWithoutTheHeadKeepsTheRowsTheHeadReads) {
  const int L = m_.config.n_layers, d = m_.config.d_model;
  auto a = load({0, 2, true, false}, *cpu_), ref = load({2, L, false, false}, *cpu_);
  auto b = load({2, L, false, false}, *gpu_);
  ASSERT_TRUE(a && ref && b);
  // More than 8 tokens: the prompt takes the GEMM path, the kept row the one-token GEMV.
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 29, 411, 302, 66, 290, 455};
  const int n = int(ids.size());
  const test::ChainedRows c = test::run_chained(*a, *ref, ids, d);
  ASSERT_TRUE(c.st.ok()) << c.st.to_string();
  const std::vector<float>& mid = c.mid;
  const float* want = c.all.data() + size_t(n - 1) * d;
  StepInput hop;
  hop.n = n;
  hop.hidden = mid.data();
  auto expect_last_row = [&](const std::vector<float>& got, float tol) {
    ASSERT_EQ(got.size(), size_t(d));
    for (int i = 0; i < d; ++i) ASSERT_NEAR(got[size_t(i)], want[i], tol * (1.0f + std::fabs(want[i]))) << i;
  };
  // The first rows with keep_rows 0 (only their K/V), then the rest with the last row kept.
  const test::KeptRows r = test::run_kept_rows(*b, mid, n, d, 7);
  ASSERT_TRUE(r.first.ok() && r.rest.ok()) << r.first.to_string() << r.rest.to_string();
  EXPECT_EQ(r.untouched, std::vector<float>(size_t(d), -7.0f));
  expect_last_row(r.kept, 1e-4f);
  // f16 hop out, the whole prompt again: the kept row is converted from its place in the step.
  std::vector<uint16_t> kept16(static_cast<size_t>(d), 0);
  StepOutput last16;
  last16.hidden = kept16.data();
  last16.hidden_dtype = DType::kF16;
  last16.keep_rows = 1;
  ASSERT_TRUE(b->forward(hop, last16).ok());
  std::vector<float> got16(static_cast<size_t>(d));
  for (int i = 0; i < d; ++i) got16[size_t(i)] = f16_to_f32(kept16[size_t(i)]);
  expect_last_row(got16, 2e-3f);
}

TEST_F(CudaSliceTest, SlicesOnOneBackendKeepTheirOwnGraphs) {
  const int L = m_.config.n_layers, d = m_.config.d_model, V = m_.config.vocab_size;
  // The CPU reference: the first two layers give the hidden state, the rest the logits.
  auto a = load({0, 2, true, false}, *cpu_), ref = load({2, L, false, true}, *cpu_);
  ASSERT_TRUE(a && ref);
  auto logits_of = [&](Slice& s, const StepInput& in) {
    StepOutput o;
    o.mode = HeadMode::kLogitsAll;
    s.rewind(0);
    const Status st = s.forward(in, o);
    EXPECT_TRUE(st.ok()) << st.to_string();
    EXPECT_EQ(o.logits.size(), size_t(in.n) * size_t(V));
    return o.logits;
  };
  auto hidden_of = [&](const std::vector<int32_t>& ids) {
    std::vector<float> h(ids.size() * size_t(d));
    StepInput in;
    in.n = int(ids.size());
    in.ids = ids.data();
    StepOutput o;
    o.hidden = h.data();
    a->rewind(0);
    EXPECT_TRUE(a->forward(in, o).ok());
    return h;
  };
  auto expect_near = [](const std::vector<float>& got, const std::vector<float>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-3f * (1.0f + std::fabs(want[i]))) << i;
  };
  // The whole model on the GPU records a 3-token step; then the second half, whose step has the
  // same size and head output, runs on another prompt's hidden state: it must record its own.
  auto whole = load({0, L, true, true}, *gpu_);
  ASSERT_TRUE(whole);
  const std::vector<int32_t> ids = {1, 403, 407}, other = {1, 261, 378};
  StepInput in;
  in.n = 3;
  in.ids = ids.data();
  (void)logits_of(*whole, in);
  const std::vector<float> h = hidden_of(other);
  StepInput hop;
  hop.n = 3;
  hop.hidden = h.data();
  const std::vector<float> want = logits_of(*ref, hop);
  auto half = load({2, L, false, true}, *gpu_);
  ASSERT_TRUE(half);
  expect_near(logits_of(*half, hop), want);
  expect_near(logits_of(*half, hop), want);  // replayed
  // Replaced (a worker's new plan): its graphs go with it, the new slice records its own.
  const int64_t held = cuda_probe::recorded_graphs(*gpu_);
  half.reset();
  EXPECT_LT(cuda_probe::recorded_graphs(*gpu_), held);
  auto again = load({2, L, false, true}, *gpu_);
  ASSERT_TRUE(again);
  expect_near(logits_of(*again, hop), want);
}

}  // namespace
}  // namespace shoal
