// Out of device memory in the middle of a step: an op whose scratch cannot be allocated fails
// that step with kOutOfMemory (the bytes asked and free named), once, eager or recorded; the
// backend then serves the next step, exact against the CPU reference, and records the step it
// could not record before. The test takes all of the device's free memory for a while:
// scripts/gpu-check.sh runs it alone.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cuda/cuda_probe.h"
#include "cuda/cuda_test_util.h"

namespace shoal {
namespace {

class CudaScratchOutOfMemory : public test::CudaVsRef {
 protected:
  /// Allocates device memory until not even 1 MiB more fits; held until release().
  void exhaust() {
    for (int64_t chunk = int64_t(1) << 30; chunk >= (int64_t(1) << 20);) {
      auto t = gpu_->alloc(DType::kF32, {chunk / 4});
      if (t.ok()) {
        hog_.push_back(*t);
      } else {
        chunk /= 2;
      }
    }
  }
  void release() {
    for (Tensor& t : hog_) gpu_->free(t);
    hog_.clear();
  }
  void TearDown() override {
    release();
    CudaVsRef::TearDown();
  }
  std::vector<Tensor> hog_;
};

TEST_F(CudaScratchOutOfMemory, FailsOneStepAndTheBackendServesTheNext) {
  // Llama-3-8B heads over an f16 cache of 2048 rows. One token at the end takes 32 splits (~0.5 MB
  // of partial results: the 1 MiB first scratch); 16 tokens at the end take 24 (~6.4 MB).
  const int H = 32, KV = 8, D = 128;
  const int64_t ctx = 2048, n = 16, kvw = int64_t(KV) * D, qw = int64_t(H) * D;
  std::vector<uint8_t> nan(*dtype_bytes(DType::kF16, ctx * kvw), 0xff);
  test::Dual kc = make(DType::kF16, {ctx, kvw}, nan.data()), vc = make(DType::kF16, {ctx, kvw}, nan.data());
  std::vector<int32_t> all(static_cast<size_t>(ctx));
  std::iota(all.begin(), all.end(), 0);
  test::Dual k = make_f32({ctx, kvw}, randn(ctx * kvw)), v = make_f32({ctx, kvw}, randn(ctx * kvw));
  test::Dual p = make_i32(all);
  cpu_->kv_write(kc.c, vc.c, k.c, v.c, p.c);
  gpu_->kv_write(kc.g, vc.g, k.g, v.g, p.g);
  const AttentionSpec spec{H, KV, D, 1.0f / std::sqrt(float(D)), 0, 0.0f};
  test::Dual q1 = make_f32({1, qw}, randn(qw, 2.0f)), out1 = output(DType::kF32, {1, qw});
  test::Dual pos1 = make_i32({int32_t(ctx - 1)});
  test::Dual q = make_f32({n, qw}, randn(n * qw, 2.0f)), out = output(DType::kF32, {n, qw});
  test::Dual pos = make_i32(std::vector<int32_t>(all.end() - n, all.end()));
  gpu_->attention(q1.g, kc.g, vc.g, pos1.g, spec, out1.g);
  ASSERT_TRUE(gpu_->synchronize().ok());
  const int64_t scratch = cuda_probe::scratch_allocations(*gpu_);

  exhaust();
  ASSERT_FALSE(hog_.empty());
  gpu_->attention(q.g, kc.g, vc.g, pos.g, spec, out.g);  // more scratch than the 1 MiB there
  const Status eager = gpu_->synchronize();
  EXPECT_EQ(eager.code(), Code::kOutOfMemory) << eager.to_string();
  EXPECT_NE(eager.message().find("scratch: cannot allocate"), std::string::npos) << eager.to_string();
  EXPECT_NE(eager.message().find("MiB free of"), std::string::npos) << eager.to_string();
  EXPECT_TRUE(gpu_->synchronize().ok());  // returned once
  auto step = [&] { gpu_->attention(q.g, kc.g, vc.g, pos.g, spec, out.g); };
  const Status recorded = gpu_->run_graph(42, step);
  EXPECT_EQ(recorded.code(), Code::kOutOfMemory) << recorded.to_string();
  EXPECT_EQ(cuda_probe::recorded_graphs(*gpu_), 0);  // a step with a skipped op is not kept
  EXPECT_TRUE(gpu_->synchronize().ok());
  EXPECT_EQ(cuda_probe::scratch_allocations(*gpu_), scratch);

  release();
  cpu_->attention(q.c, kc.c, vc.c, pos.c, spec, out.c);
  const Status again = gpu_->run_graph(42, step);  // recorded now, and replayed
  ASSERT_TRUE(again.ok()) << again.to_string();
  EXPECT_EQ(cuda_probe::recorded_graphs(*gpu_), 1);
  EXPECT_LT(nerr(out), 1e-5);
  poison(out);
  ASSERT_TRUE(gpu_->run_graph(42, step).ok());
  EXPECT_LT(nerr(out), 1e-5);
  // The one-token call still runs, exactly.
  cpu_->attention(q1.c, kc.c, vc.c, pos1.c, spec, out1.c);
  poison(out1);
  gpu_->attention(q1.g, kc.g, vc.g, pos1.g, spec, out1.g);
  EXPECT_LT(nerr(out1), 1e-5);
}

}  // namespace
}  // namespace shoal
