// The quantized prefill GEMM on Hopper's wgmma (gemm_quant.cu): matmuls of 5 tokens or more
// with Q8_0 / Q4_0 weights against the CPU reference, on shapes at the edges of its tiles (rows
// of part of a 16-row tile or of a 128-row block, tokens of part of a 64 / 128-token block, a Q4_0
// row ending in half a 64-value chunk, a Q8_0 row of an odd chunk count), with and without it
// (the cuBLAS path on dequantized parts), three products of one input in one launch, gate / up
// with act(gate) * up in one launch, and launches of more work items than a GPU has SMs (each
// block of the persistent grid carries its ring and exchange buffers into further items). On a
// device without sm_90a code it must not run. Calls of few tokens (a pool's 16-token frames) take
// narrower items (32 / 64 MMA columns), exact calls of many items wider ones (128 tokens in two
// parts: 256). Every case runs twice: exact (two activation parts), and with
// BackendOptions::half_prefill, where gemm_quant takes one f16 part of up to 128 tokens per work
// item (x's rounding, 2^-11 relative: ~3e-4 normalised error, held to 1e-3) and the cuBLAS path
// on dequantized parts stays exact.
#include <cuda_runtime.h>

#include "backend/cuda/cuda_probe.h"
#include "cuda/cuda_test_util.h"

namespace shoal::test {
namespace {

class CudaGemmQuantTest : public CudaVsRef, public ::testing::WithParamInterface<bool> {
 protected:
  void SetUp() override {
    CudaVsRef::SetUp();
    if (IsSkipped() || HasFatalFailure() || !GetParam()) return;
    use_half_prefill();
  }
  // As the GEMV and cuBLAS paths: f32 sums of exact products, against the double reference;
  // with one part (gemm_quant on, half_prefill) x's f16 rounding.
  double tol(bool qgemm_on) { return GetParam() && qgemm_on && cuda_probe::quant_gemm_available(*gpu_) ? 1e-3 : 2e-5; }

  // y = x W^T (+ bias) on both paths of the GPU; returns the wgmma launches the first one made.
  int64_t check(DType t, int64_t out, int64_t in, int64_t n, bool with_bias) {
    SCOPED_TRACE(fmt::format("{} [{}, {}] x n={} bias={}", dtype_name(t), out, in, n, with_bias));
    Dual w = make_weight(t, {out, in});
    Dual x = make_f32({n, in}, randn(n * in, 3.0f));
    Dual b = make_f32({out}, randn(out));
    Dual y = output(DType::kF32, {n, out});
    cpu_->matmul(w.c, x.c, y.c, with_bias ? &b.c : nullptr);
    const int64_t before = cuda_probe::quant_gemm_launches(*gpu_), halves = cuda_probe::half_prefill_inputs(*gpu_);
    // (One part for prefill products only: calls of up to 8 tokens stay exact wherever they run.)
    const int64_t one_part = GetParam() && cuda_probe::quant_gemm_available(*gpu_) && n > 8 ? 1 : 0;
    gpu_->matmul(w.g, x.g, y.g, with_bias ? &b.g : nullptr);
    const int64_t launches = cuda_probe::quant_gemm_launches(*gpu_) - before;
    EXPECT_LT(nerr(y), tol(true));
    EXPECT_EQ(cuda_probe::half_prefill_inputs(*gpu_) - halves, one_part);
    cuda_probe::set_quant_gemm(*gpu_, false);
    poison(y);
    gpu_->matmul(w.g, x.g, y.g, with_bias ? &b.g : nullptr);
    EXPECT_LT(nerr(y), tol(false)) << "cuBLAS path";
    EXPECT_EQ(cuda_probe::quant_gemm_launches(*gpu_) - before, launches);
    EXPECT_EQ(cuda_probe::half_prefill_inputs(*gpu_) - halves, one_part) << "cuBLAS path: two parts";
    cuda_probe::set_quant_gemm(*gpu_, true);
    return launches;
  }

  // matmuls() of one product behind the RMSNorm (x normed with g into h) on the GPU (gp) or the
  // reference copies: y += w x (accumulate), or with up y = act(w x) * (up x); tmp as MatmulOut's.
  void one_product(bool gp, Dual& x, Dual& g, Dual& h, Dual& w, Dual& y, Dual& tmp, bool accumulate,
                   Dual* up = nullptr, Activation act = Activation::kSilu) {
    MatmulOut o;
    o.w = gp ? &w.g : &w.c;
    o.up = up ? (gp ? &up->g : &up->c) : nullptr;
    o.act = act;
    o.y = gp ? &y.g : &y.c;
    o.tmp = gp ? &tmp.g : &tmp.c;
    o.accumulate = accumulate;
    (gp ? *gpu_ : *cpu_).matmuls(gp ? x.g : x.c, InputNorm{gp ? &g.g : &g.c, 1e-5f, gp ? &h.g : &h.c}, {&o, 1});
  }

  // matmuls() of three products of kind t over `in` columns (q / k / v: a tall one and two short
  // ones) behind the RMSNorm, with a bias on the second and a residual add on the third, on both
  // backends; each output against the reference.
  void qkv_products(DType t, int64_t in, int64_t n) {
    const int64_t rows[3] = {272, 40, 130};
    Dual x = make_f32({n, in}, randn(n * in, 2.0f)), g = make_f32({in}, randn(in));
    Dual h = output(DType::kF32, {n, in}), b = make_f32({rows[1]}, randn(rows[1]));
    Dual w[3], y[3], tmp[3];
    for (int i = 0; i < 3; ++i) {
      w[i] = make_weight(t, {rows[i], in});
      y[i] = make_f32({n, rows[i]}, randn(n * rows[i]));
      tmp[i] = output(DType::kF32, {n, rows[i]});
    }
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool gp = be == gpu_.get();
      MatmulOut outs[3];
      for (int i = 0; i < 3; ++i) {
        outs[i].w = gp ? &w[i].g : &w[i].c;
        outs[i].y = gp ? &y[i].g : &y[i].c;
        outs[i].tmp = gp ? &tmp[i].g : &tmp[i].c;
      }
      outs[1].bias = gp ? &b.g : &b.c;
      outs[2].accumulate = true;
      be->matmuls(gp ? x.g : x.c, InputNorm{gp ? &g.g : &g.c, 1e-5f, gp ? &h.g : &h.c}, outs);
    }
    for (int i = 0; i < 3; ++i) EXPECT_LT(nerr(y[i]), tol(true)) << "product " << i;
  }
};

TEST_P(CudaGemmQuantTest, RunsOnHopper) {
  // A build with the sm_90a code must use it on a compute capability 9.0 device.
  int dev = 0, major = 0, minor = 0;
  ASSERT_EQ(cudaGetDevice(&dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), cudaSuccess);
#if defined(SHOAL_CUDA_SM90A)
  if (major == 9 && minor == 0) {
    EXPECT_TRUE(cuda_probe::quant_gemm_available(*gpu_));
  }
#endif
  RecordProperty("quant_gemm", cuda_probe::quant_gemm_available(*gpu_) ? "yes" : "no");
}

TEST_P(CudaGemmQuantTest, EdgesOfTilesAndBlocks) {
  const int64_t expect = cuda_probe::quant_gemm_available(*gpu_) ? 1 : 0;
  struct Shape {
    int64_t out, in, n;
  };
  // (out: part of a tile, whole blocks, part of a block; in: one chunk, half a Q4_0 chunk at the
  // end, several stages; n: above the GEMV's 8 tokens, part of a 16 / 32 / 64 / 128-token block, several.)
  const Shape shapes[] = {{7, 64, 9}, {128, 96, 64}, {300, 4128, 65}, {515, 768, 40}, {1100, 256, 130}, {16, 32, 9}};
  for (DType t : {DType::kQ8_0, DType::kQ4_0})
    for (const Shape& s : shapes) EXPECT_EQ(check(t, s.out, s.in, s.n, s.out % 2 == 1), expect);
}

TEST_P(CudaGemmQuantTest, FewTokensOnNarrowItems) {
  // Calls of few tokens take items of 32 or 64 MMA columns (16 / 32 tokens with two parts, 32 / 64
  // with one) and a deeper ring: each width full and just past it, a pool's 16-token frame through
  // Llama-3-8B-like widths (several stages, half a Q4_0 chunk at the end), and more row blocks than
  // any GPU here holds blocks at 32 columns (two per SM; 34000 rows: 266 blocks), so a block carries
  // the narrow ring into further items.
  const int64_t expect = cuda_probe::quant_gemm_available(*gpu_) ? 1 : 0;
  struct Shape {
    int64_t out, in, n;
  };
  const Shape shapes[] = {{300, 4128, 16}, {515, 768, 17}, {128, 96, 32}, {40, 2048, 33},
                          {4096, 4096, 16}, {34000, 64, 16}, {200, 14336, 24}};
  const int64_t splits_before = cuda_probe::quant_gemm_split_launches(*gpu_);
  const int64_t two_before = cuda_probe::quant_gemm_two_block_launches(*gpu_);
  for (DType t : {DType::kQ8_0, DType::kQ4_0})
    for (const Shape& s : shapes) EXPECT_EQ(check(t, s.out, s.in, s.n, s.out % 2 == 0), expect);
  // At least 300 x 4128, 4096 x 4096 (3 and 32 items of 65 / 64 stages) and 200 x 14336 split
  // their K on any Hopper GPU (64 SMs or more), per kind.
  EXPECT_GE(cuda_probe::quant_gemm_split_launches(*gpu_) - splits_before, 2 * 3 * expect);
  // Q4_0's calls of 32 MMA columns (up to 16 tokens; with one part up to 32) run two blocks per
  // SM: at least the three of 16 tokens (300 x 4128, 4096 x 4096, 34000 x 64).
  EXPECT_GE(cuda_probe::quant_gemm_two_block_launches(*gpu_) - two_before, 3 * expect)
      << "a ring that no longer fits two blocks per SM";
}

TEST_P(CudaGemmQuantTest, FiveToEightTokensTakeItWhereItRuns) {
  // From kQuantGemmMinTokens (5) tokens quantized products leave the GEMV for gemm_quant where it
  // runs (with it off, check's second pass, the GEMV); 4 tokens stay on the GEMV.
  const int64_t expect = cuda_probe::quant_gemm_available(*gpu_) ? 1 : 0;
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    EXPECT_EQ(check(t, 4096, 4096, 5, false), expect);
    EXPECT_EQ(check(t, 300, 4128, 8, true), expect);
    EXPECT_EQ(check(t, 515, 768, 6, false), expect);
    EXPECT_EQ(check(t, 515, 768, 4, true), 0);
  }
}

TEST_P(CudaGemmQuantTest, PromptSizedProducts) {
  // A 512-token prompt through Llama-3-8B-like widths, in fewer rows: the ring over many stages.
  const int64_t expect = cuda_probe::quant_gemm_available(*gpu_) ? 1 : 0;
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    EXPECT_EQ(check(t, 384, 4096, 512, false), expect);
    EXPECT_EQ(check(t, 256, 14336, 100, true), expect);
  }
  EXPECT_EQ(check(DType::kQ4_0, 2300, 16384, 12, false), expect);  // (cuBLAS: 64 MiB dequantized tiles)
}

TEST_P(CudaGemmQuantTest, MoreWorkItemsThanSMs) {
  // matmuls() behind the RMSNorm with more (row block, token block) items than any GPU here has
  // SMs, so each block of the persistent grid runs several, with items of 128 tokens (one part,
  // or two where gemm_quant takes them) at least 2 where the H200 has 132 SMs: a residual add
  // (4096 rows x 1100 tokens: 32 x 18 items of 64 tokens, 32 x 9 of 128) and a gate / up pair
  // (2048 rows x 1100 tokens: 32 x 18, 32 x 9).
  const int64_t expect = cuda_probe::quant_gemm_available(*gpu_) ? 1 : 0;
  const int64_t in = 128, n = 1100;
  for (DType t : {DType::kQ8_0, DType::kQ4_0})
    for (const bool glu : {false, true}) {
      const int64_t rows = glu ? 2048 : 4096;
      SCOPED_TRACE(fmt::format("{} glu={}", dtype_name(t), glu));
      Dual x = make_f32({n, in}, randn(n * in, 2.0f)), g = make_f32({in}, randn(in));
      Dual h = output(DType::kF32, {n, in}), tmp = output(DType::kF32, {n, rows});
      Dual w = make_weight(t, {rows, in}), u = make_weight(t, {rows, in});
      Dual y = make_f32({n, rows}, randn(n * rows));
      const int64_t before = cuda_probe::quant_gemm_launches(*gpu_);
      for (const bool gp : {false, true}) one_product(gp, x, g, h, w, y, tmp, !glu, glu ? &u : nullptr);
      EXPECT_EQ(cuda_probe::quant_gemm_launches(*gpu_) - before, expect);
      EXPECT_LT(nerr(y), tol(true));
    }
}

TEST_P(CudaGemmQuantTest, SplitKAddsToTheResidualOnceAndTwiceInARow) {
  // A 16-token residual add over few row blocks splits K over several blocks (32 row blocks of
  // 4096 columns, two blocks per SM at 32 columns: 4 to 8 ranges); the last range adds the
  // partial sums in order, then y's old values once. Twice in a row on the same y: the counters
  // the first launch left must be zero again (a stale count would make a block add too early or
  // never).
  const int64_t expect = cuda_probe::quant_gemm_available(*gpu_) ? 1 : 0;
  const int64_t in = 4096, rows = 4096, n = 16;
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    SCOPED_TRACE(dtype_name(t));
    Dual x = make_f32({n, in}, randn(n * in, 2.0f)), g = make_f32({in}, randn(in));
    Dual h = output(DType::kF32, {n, in}), tmp = output(DType::kF32, {n, rows});
    Dual w = make_weight(t, {rows, in});
    Dual y = make_f32({n, rows}, randn(n * rows));
    const int64_t before = cuda_probe::quant_gemm_launches(*gpu_);
    const int64_t splits_before = cuda_probe::quant_gemm_split_launches(*gpu_);
    for (int rep = 0; rep < 2; ++rep)
      for (const bool gp : {false, true}) one_product(gp, x, g, h, w, y, tmp, true);
    EXPECT_EQ(cuda_probe::quant_gemm_launches(*gpu_) - before, 2 * expect);
    EXPECT_EQ(cuda_probe::quant_gemm_split_launches(*gpu_) - splits_before, 2 * expect) << "both launches split";
    EXPECT_LT(nerr(y), tol(true));
  }
}

TEST_P(CudaGemmQuantTest, QkvProductsInOneLaunch) {
  // matmuls() of three products of one quantized kind (q / k / v: a tall one and two short ones)
  // behind the RMSNorm, with a bias and a residual add: one launch, each output as the reference.
  // Also at 16 tokens over 2048 columns: 6 row blocks, each split into 4 K ranges, so the last
  // range of each item finds its own weight's bias and residual add.
  const int64_t expect = cuda_probe::quant_gemm_available(*gpu_) ? 1 : 0;
  for (DType t : {DType::kQ8_0, DType::kQ4_0})
    for (const auto& [in, n] : {std::pair<int64_t, int64_t>{320, 70}, {2048, 16}}) {
      SCOPED_TRACE(fmt::format("{} in={} n={}", dtype_name(t), in, n));
      const int64_t before = cuda_probe::quant_gemm_launches(*gpu_);
      const int64_t splits_before = cuda_probe::quant_gemm_split_launches(*gpu_);
      qkv_products(t, in, n);
      EXPECT_EQ(cuda_probe::quant_gemm_launches(*gpu_) - before, expect);
      EXPECT_EQ(cuda_probe::quant_gemm_split_launches(*gpu_) - splits_before, n == 16 ? expect : 0)
          << "split K at 16 tokens over 2048 columns only";
    }
}

TEST_P(CudaGemmQuantTest, GateUpProductsInOneLaunch) {
  // matmuls() of a gate / up pair behind the RMSNorm: act(gate) * up in the epilogue of one
  // launch where both are of one quantized kind; a pair of mixed kinds runs the quantized product
  // alone (its parts summed in the kernel) and combine_glu adds cuBLAS's two parts of the other.
  // Each on both paths (gemm_quant off: cuBLAS), against the reference.
  const int64_t avail = cuda_probe::quant_gemm_available(*gpu_) ? 1 : 0;
  struct Case {
    DType gate, up;
    int64_t rows, in, n;
    Activation act;
  };
  // (rows: part of a 64-row block, several blocks, more blocks than two per SM of any GPU here
  // (17000: 266); in: half a Q4_0 chunk at the end, many stages; n: part of a 64 / 128-token
  // block, a prompt, a pool's 16-token frame, 6 tokens: below the GEMV's 8.)
  const Case cases[] = {{DType::kQ4_0, DType::kQ4_0, 300, 4128, 65, Activation::kSilu},
                        {DType::kQ8_0, DType::kQ8_0, 1100, 256, 130, Activation::kGeluTanh},
                        {DType::kQ8_0, DType::kQ8_0, 64, 4096, 512, Activation::kSilu},
                        {DType::kQ4_0, DType::kF16, 136, 320, 40, Activation::kSilu},
                        {DType::kF16, DType::kQ8_0, 136, 320, 40, Activation::kGeluErf},
                        {DType::kQ4_0, DType::kQ4_0, 300, 4128, 16, Activation::kSilu},
                        {DType::kQ8_0, DType::kQ8_0, 1100, 256, 30, Activation::kGeluErf},
                        {DType::kQ4_0, DType::kQ4_0, 17000, 96, 16, Activation::kSilu},
                        {DType::kQ4_0, DType::kQ4_0, 300, 4128, 6, Activation::kSilu},
                        {DType::kQ8_0, DType::kQ8_0, 17000, 64, 9, Activation::kSilu}};
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("{} / {} [{}, {}] x n={}", dtype_name(c.gate), dtype_name(c.up), c.rows, c.in, c.n));
    Dual x = make_f32({c.n, c.in}, randn(c.n * c.in, 2.0f)), g = make_f32({c.in}, randn(c.in));
    Dual h = output(DType::kF32, {c.n, c.in}), tmp = output(DType::kF32, {c.n, c.rows});
    Dual wg = make_weight(c.gate, {c.rows, c.in}), wu = make_weight(c.up, {c.rows, c.in});
    Dual y = output(DType::kF32, {c.n, c.rows});
    auto run = [&](bool gp) { one_product(gp, x, g, h, wg, y, tmp, false, &wu, c.act); };
    run(false);
    for (bool on : {true, false}) {
      cuda_probe::set_quant_gemm(*gpu_, on);
      poison(y);
      const int64_t before = cuda_probe::quant_gemm_launches(*gpu_);
      run(true);
      EXPECT_EQ(cuda_probe::quant_gemm_launches(*gpu_) - before, on ? avail : 0) << "gemm_quant " << on;
      EXPECT_LT(nerr(y), tol(on)) << "gemm_quant " << on;
    }
  }
}

TEST_P(CudaGemmQuantTest, ItemsOf128TokensInTwoParts) {
  // Exact calls (two parts) of enough work items take items of 128 tokens: two stacked m64n128
  // products per k-step, a ring of 3 to 5 stages. Forced on the edge shapes (tokens of part of an
  // item and of several, rows of part of a tile and of a block, half a Q4_0 chunk at the end, many
  // stages), on gate / up pairs with each activation (their 64 KiB exchange beside the ring) and
  // on q / k / v in one launch (items crossing from one weight to the next); chosen by gemm_quant
  // for 1100 tokens over 4096 rows (32 x 9 items against 32 x 18 of 64 tokens: fewer rounds on
  // any GPU here) but not for 512 over 384 rows (3 x 4 items: one round either way).
  if (GetParam()) GTEST_SKIP() << "one part: items of at most 128 MMA columns";
  const int64_t expect = cuda_probe::quant_gemm_available(*gpu_) ? 1 : 0;
  struct Shape {
    int64_t out, in, n;
  };
  const Shape shapes[] = {{7, 64, 9}, {300, 4128, 65}, {515, 768, 140}, {1100, 256, 130}, {128, 96, 300}};
  struct GluShape {
    int64_t out, in, n;
    Activation act;
  };
  const GluShape glu_shapes[] = {{300, 4128, 65, Activation::kSilu},
                                 {1100, 256, 300, Activation::kGeluErf},
                                 {200, 320, 140, Activation::kGeluTanh}};
  const int64_t wide_before = cuda_probe::quant_gemm_wide_launches(*gpu_);
  cuda_probe::set_quant_gemm_item_tokens(*gpu_, 128);
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    for (const Shape& s : shapes) EXPECT_EQ(check(t, s.out, s.in, s.n, s.out % 2 == 1), expect);
    for (const GluShape& s : glu_shapes) {
      SCOPED_TRACE(fmt::format("{} gate / up [{}, {}] x n={}", dtype_name(t), s.out, s.in, s.n));
      Dual x = make_f32({s.n, s.in}, randn(s.n * s.in, 2.0f)), g = make_f32({s.in}, randn(s.in));
      Dual h = output(DType::kF32, {s.n, s.in}), tmp = output(DType::kF32, {s.n, s.out});
      Dual wg = make_weight(t, {s.out, s.in}), wu = make_weight(t, {s.out, s.in});
      Dual y = output(DType::kF32, {s.n, s.out});
      for (const bool gp : {false, true}) one_product(gp, x, g, h, wg, y, tmp, false, &wu, s.act);
      EXPECT_LT(nerr(y), tol(true));
    }
    SCOPED_TRACE(fmt::format("{} q / k / v", dtype_name(t)));
    qkv_products(t, 320, 200);
  }
  EXPECT_EQ(cuda_probe::quant_gemm_wide_launches(*gpu_) - wide_before, 2 * 9 * expect);
  cuda_probe::set_quant_gemm_item_tokens(*gpu_, 0);
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    const int64_t before = cuda_probe::quant_gemm_wide_launches(*gpu_);
    EXPECT_EQ(check(t, 4096, 256, 1100, false), expect);
    EXPECT_EQ(cuda_probe::quant_gemm_wide_launches(*gpu_) - before, expect) << "1100 tokens over 4096 rows";
    EXPECT_EQ(check(t, 384, 4096, 512, true), expect);
    EXPECT_EQ(cuda_probe::quant_gemm_wide_launches(*gpu_) - before, expect) << "512 tokens over 384 rows";
  }
}

INSTANTIATE_TEST_SUITE_P(Parts, CudaGemmQuantTest, ::testing::Values(false, true),
                         [](const auto& i) { return i.param ? std::string("HalfPrefill") : std::string("Exact"); });

}  // namespace
}  // namespace shoal::test
