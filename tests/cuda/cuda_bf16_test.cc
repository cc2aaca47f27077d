// BF16 weights held as F16 (Backend::settle_weights on CUDA): a group rewritten after its upload
// where F16 keeps every row of every weight to 2^-20 normalised, so prefill products take two f16
// activation parts instead of three bf16 ones; kept as BF16 otherwise, all of the group. The
// values against a host conversion, the products and the embedding against the CPU reference
// (which keeps the BF16 weights).
#include <cstring>
#include <limits>

#include "backend/cuda/cuda_probe.h"
#include "cuda_test_util.h"

namespace shoal {
namespace {

class CudaBf16Test : public test::CudaVsRef {
 protected:
  void SetUp() override {
    CudaVsRef::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    cuda_probe::set_bf16_as_f16(*gpu_, true);
  }
  /// A BF16 weight [rows, cols] of the values v (rounded to bf16) on both backends, settled on
  /// its own (settle = false: not yet).
  test::Dual weight(int64_t rows, int64_t cols, const std::vector<float>& v, bool settle = true) {
    const auto bytes = encode(DType::kBF16, v);
    test::Dual d = make(DType::kBF16, {rows, cols}, bytes.data(), true);
    if (settle) {
      Tensor* const g[] = {&d.g};
      const auto n = gpu_->settle_weights(g);
      EXPECT_TRUE(n.ok()) << n.status().to_string();
    }
    return d;
  }
  /// Products of w with n random tokens (GEMV for n <= 8, the exact prefill GEMM above) against
  /// the reference.
  void check_products(const test::Dual& w, int64_t n) {
    SCOPED_TRACE(n);
    const int64_t rows = w.c.rows(), cols = w.c.cols();
    test::Dual x = make_f32({n, cols}, randn(n * cols));
    test::Dual y = output(DType::kF32, {n, rows});
    cpu_->matmul(w.c, x.c, y.c);
    gpu_->matmul(w.g, x.g, y.g);
    EXPECT_LT(nerr(y), 2e-5);
  }
};

TEST_F(CudaBf16Test, OrdinaryWeightsAreHeldAsF16ValueForValue) {
  const int64_t rows = 300, cols = 264;
  std::vector<float> v = randn(rows * cols, 0.02f);
  for (int64_t c = 0; c < cols; ++c) v[size_t(7 * cols + c)] = 0.0f;  // a row of zeros
  v[5] = 60000.0f;                                                  // large, still an f16
  const int64_t before = cuda_probe::bf16_as_f16_weights(*gpu_);
  test::Dual w = weight(rows, cols, v);
  EXPECT_EQ(w.g.dtype, DType::kF16);
  EXPECT_EQ(w.c.dtype, DType::kBF16);
  EXPECT_EQ(cuda_probe::bf16_as_f16_weights(*gpu_), before + 1);
  const auto got = bytes_of(*gpu_, w.g);
  const auto src = encode(DType::kBF16, v);
  ASSERT_EQ(got.size(), src.size());
  int64_t differ = 0;
  for (size_t i = 0; i < src.size() / 2; ++i) {
    uint16_t b, h;
    std::memcpy(&b, src.data() + 2 * i, 2);
    std::memcpy(&h, got.data() + 2 * i, 2);
    ASSERT_EQ(h, f32_to_f16(bf16_to_f32(b))) << i;
    if (f16_to_f32(h) != bf16_to_f32(b)) ++differ;
  }
  // Only values below 2^-17 (~3e-4 of N(0, 0.02) values, ~24 here) can lose bits.
  EXPECT_LE(differ, 100);
  v[5] = 0.0f;
  test::Dual w2 = weight(rows, cols, v);
  ASSERT_EQ(w2.g.dtype, DType::kF16);
  for (int64_t n : {1, 5, 40, 300}) check_products(w2, n);
}

TEST_F(CudaBf16Test, WeightsF16CannotHoldStayBf16) {
  const int64_t rows = 48, cols = 160;
  struct Case {
    const char* what;
    int64_t at;       // the value changed (-1: none)
    float value;      // its value
    float row_scale;  // row 3 scaled by this
    float scale;      // the whole tensor's scale
  };
  const Case cases[] = {
      {"a value above f16's largest", 17, 70000.0f, 1.0f, 0.02f},
      {"an infinity", 100, std::numeric_limits<float>::infinity(), 1.0f, 0.02f},
      {"a NaN", 200, std::numeric_limits<float>::quiet_NaN(), 1.0f, 0.02f},
      {"a row of values near 1e-8 among ordinary rows", -1, 0.0f, 5e-7f, 0.02f},
      {"every value near 1e-7", -1, 0.0f, 1.0f, 1e-7f},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    std::vector<float> v = randn(rows * cols, k.scale);
    for (int64_t c = 0; c < cols; ++c) v[size_t(3 * cols + c)] *= k.row_scale;
    if (k.at >= 0) v[size_t(k.at)] = k.value;
    const int64_t before = cuda_probe::bf16_as_f16_weights(*gpu_);
    test::Dual w = weight(rows, cols, v);
    EXPECT_EQ(w.g.dtype, DType::kBF16);
    EXPECT_EQ(cuda_probe::bf16_as_f16_weights(*gpu_), before);
    EXPECT_EQ(bytes_of(*gpu_, w.g), encode(DType::kBF16, v));  // untouched
    if (k.at < 0 || std::isfinite(k.value))
      for (int64_t n : {1, 20}) check_products(w, n);
  }
}

TEST_F(CudaBf16Test, AGroupIsHeldWholeOrNotAtAll) {
  // A layer's matrices are one group: one that F16 cannot hold keeps all of them BF16, so the
  // fused paths (stacked q / k / v, gate / up) see one kind.
  const int64_t rows = 64, cols = 128;
  std::vector<float> tiny = randn(rows * cols, 1e-7f);
  test::Dual a = weight(rows, cols, randn(rows * cols, 0.02f), false);
  test::Dual b = weight(rows, cols, tiny, false);
  test::Dual c = weight(rows, cols, randn(rows * cols, 0.02f), false);
  test::Dual q8 = make_weight(DType::kQ8_0, {rows, cols});
  // Settles {x, y, q8}; expects `held` rewritten and x, y then of dtype `want`.
  auto settle = [&](test::Dual& x, test::Dual& y, int held, DType want) {
    Tensor* const group[] = {&x.g, &y.g, &q8.g};
    const auto n = gpu_->settle_weights(group);
    ASSERT_TRUE(n.ok()) << n.status().to_string();
    EXPECT_EQ(*n, held);
    EXPECT_EQ(x.g.dtype, want);
    EXPECT_EQ(y.g.dtype, want);
    EXPECT_EQ(q8.g.dtype, DType::kQ8_0);
  };
  settle(a, b, 0, DType::kBF16);
  settle(a, c, 2, DType::kF16);
  for (test::Dual* w : {&a, &b, &c}) check_products(*w, 20);
}

TEST_F(CudaBf16Test, EmbeddingRowsOfAHeldTable) {
  // A tied embedding table is both the lookup table and the LM head (Slice::load aliases it after
  // the upload, when its dtype is known).
  const int64_t rows = 1000, cols = 96;
  test::Dual w = weight(rows, cols, randn(rows * cols, 0.05f));
  ASSERT_EQ(w.g.dtype, DType::kF16);
  test::Dual ids = make_i32({0, 999, 17, 500});
  test::Dual out = output(DType::kF32, {4, cols});
  cpu_->embed(w.c, ids.c, out.c);
  gpu_->embed(w.g, ids.g, out.g);
  EXPECT_LT(nerr(out), 1e-7);
  check_products(w, 1);
}

TEST_F(CudaBf16Test, OffKeepsBf16) {
  cuda_probe::set_bf16_as_f16(*gpu_, false);
  test::Dual w = weight(64, 128, randn(64 * 128, 0.02f));
  EXPECT_EQ(w.g.dtype, DType::kBF16);
}

}  // namespace
}  // namespace shoal
