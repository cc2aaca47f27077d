// CUDA matmul (GEMV for n <= 8 tokens, cuBLAS GEMM above; Q8_0 / Q4_0 weights of 5 or more
// tokens take gemm_quant where it runs, so the GEMV cases of 5-8 tokens run with it off too), the
// fused gate/up GLU, and weight upload through the staging buffer, against the CPU reference
// backend on fresh random inputs.
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cuda/cuda_probe.h"
#include "backend/cuda/kernels.h"
#include "cuda/cuda_test_util.h"

namespace shoal::test {
namespace {

class CudaMatmulTest : public CudaVsRef {
 protected:
  // Normalised-error bound: f32 accumulation against the double reference. The GEMM path
  // (n > 8) splits operands into 16-bit parts for the tensor cores and stays as close.
  virtual double tolerance(DType, int64_t) const { return 2e-5; }

  void check(DType t, int64_t out, int64_t in, int64_t n, bool with_bias) {
    SCOPED_TRACE(fmt::format("{} [{}, {}] x n={} bias={}", dtype_name(t), out, in, n, with_bias));
    Dual w = make_weight(t, {out, in});
    Dual x = make_f32({n, in}, randn(n * in));
    Dual b = make_f32({out}, randn(out));
    Dual y = output(DType::kF32, {n, out});
    cpu_->matmul(w.c, x.c, y.c, with_bias ? &b.c : nullptr);
    gpu_->matmul(w.g, x.g, y.g, with_bias ? &b.g : nullptr);
    EXPECT_LT(nerr(y), tolerance(t, n));
  }
};

constexpr DType kWeightTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0};

TEST_F(CudaMatmulTest, GemvEveryDtypeSeveralShapes) {
  // Odd row counts add a bias, except the single row: one output that its bias can nearly
  // cancel makes the normalised error ill-conditioned (seed 3222037728: 5.3e-5 for F16 [1, 32]).
  for (DType t : kWeightTypes)
    for (auto [out, in] : {std::pair<int64_t, int64_t>{1, 32}, {67, 96}, {300, 1024}, {1001, 4096}, {4096, 160}})
      check(t, out, in, 1, out > 1 && out % 2 == 1);
}

TEST_F(CudaMatmulTest, GemvOddWidthsOfPlainTypes) {
  // Rows that are not whole 16-byte vectors take the element-wise kernel.
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16})
    for (int64_t in : {1, 3, 33, 101, 4099})
      for (int64_t n : {1, 5}) check(t, 37, in, n, true);
}

TEST_F(CudaMatmulTest, TallGemvOfWideRows) {
  // One product of 16384+ rows of 512+ 16-byte vectors (an LM head) takes 4 rows per block with
  // 4 vectors per lane in flight (gemv.cu); 16387 rows end in a block with one spare row, 4104
  // F16 columns in a pass of one vector.
  check(DType::kF32, 16387, 2056, 1, true);
  for (DType t : {DType::kF16, DType::kBF16}) check(t, 16387, 4104, 1, false);
}

TEST_F(CudaMatmulTest, SmallBatchesReadWeightsOnce) {
  for (const bool qgemm : {true, false}) {  // (off: the quantized GEMV at 5 and 8 tokens too)
    cuda_probe::set_quant_gemm(*gpu_, qgemm);
    for (DType t : kWeightTypes)
      for (int64_t n : {2, 3, 4, 5, 8}) check(t, 259, 512, n, n == 3);
  }
}

// matmuls(): several products of one input in one launch, with the input RMSNorm and the
// residual add fused in, against the reference's composition (rms_norm, matmul, add, glu).
class CudaMatmulsTest : public CudaMatmulTest {
 protected:
  // One product of matmuls() on the GPU (gp) or reference copies of w, y and tmp.
  static MatmulOut out_for(bool gp, Dual& w, Dual& y, Dual& tmp, bool accumulate) {
    MatmulOut o;
    o.w = gp ? &w.g : &w.c;
    o.y = gp ? &y.g : &y.c;
    o.accumulate = accumulate;
    o.tmp = gp ? &tmp.g : &tmp.c;
    return o;
  }

  void check_fused(DType t, int64_t in, int64_t n, bool norm, bool accumulate,
                   std::array<int64_t, 3> rows = {96, 33, 160}) {
    SCOPED_TRACE(fmt::format("{} in={} n={} norm={} accumulate={} rows={}/{}/{}", dtype_name(t), in, n, norm,
                             accumulate, rows[0], rows[1], rows[2]));
    Dual x = make_f32({n, in}, randn(n * in, 4.0f));
    Dual g = make_f32({in}, randn(in));
    Dual h = output(DType::kF32, {n, in});
    Dual w[3] = {make_weight(t, {rows[0], in}), make_weight(t, {rows[1], in}), make_weight(t, {rows[2], in})};
    Dual b = make_f32({rows[1]}, randn(rows[1]));
    Dual y[3], tmp[3];
    for (int i = 0; i < 3; ++i) {
      y[i] = make_f32({n, rows[i]}, randn(n * rows[i]));  // accumulated into
      tmp[i] = output(DType::kF32, {n, rows[i]});
    }
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool gp = be == gpu_.get();
      MatmulOut outs[3];
      for (int i = 0; i < 3; ++i) outs[i] = out_for(gp, w[i], y[i], tmp[i], accumulate);
      outs[1].bias = gp ? &b.g : &b.c;
      InputNorm nrm;
      if (norm) nrm = InputNorm{gp ? &g.g : &g.c, 1e-5f, gp ? &h.g : &h.c};
      be->matmuls(gp ? x.g : x.c, nrm, outs);
    }
    for (int i = 0; i < 3; ++i) EXPECT_LT(nerr(y[i]), tolerance(t, n)) << "product " << i;
  }

  void check_glu(DType t, int64_t in, int64_t n, int64_t ff = 200) {
    SCOPED_TRACE(fmt::format("GLU {} in={} n={} ff={}", dtype_name(t), in, n, ff));
    Dual x = make_f32({n, in}, randn(n * in, 2.0f));
    Dual g = make_f32({in}, randn(in));
    Dual h = output(DType::kF32, {n, in});
    Dual wg = make_weight(t, {ff, in}), wu = make_weight(t, {ff, in});
    Dual y = output(DType::kF32, {n, ff}), up = output(DType::kF32, {n, ff});
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool gp = be == gpu_.get();
      MatmulOut o{gp ? &wg.g : &wg.c, gp ? &y.g : &y.c, nullptr, gp ? &wu.g : &wu.c, Activation::kSilu};
      o.tmp = gp ? &up.g : &up.c;
      be->matmuls(gp ? x.g : x.c, InputNorm{gp ? &g.g : &g.c, 1e-6f, gp ? &h.g : &h.c}, {&o, 1});
    }
    EXPECT_LT(nerr(y), tolerance(t, n));
  }

  // Weights back to back in device memory (here views of one allocation; q / k / v as their
  // allocations usually fall) take one GEMM over all their rows and a sum of the parts per
  // product, each with its own bias and residual add; a gap (the third view a row further on)
  // ends the run. Checked against the reference on the same views.
  void check_stacked(DType t, bool gap, double tol, std::array<int64_t, 3> rows) {
    SCOPED_TRACE(fmt::format("{} gap={} rows={}/{}/{}", dtype_name(t), gap, rows[0], rows[1], rows[2]));
    const int64_t in = 264, n = 12;
    Dual all = make_weight(t, {rows[0] + rows[1] + rows[2] + 1, in});
    const int64_t row_bytes = int64_t(*dtype_bytes(t, in));
    const int64_t first[3] = {0, rows[0], rows[0] + rows[1] + (gap ? 1 : 0)};
    Dual w[3];
    for (int i = 0; i < 3; ++i) {
      w[i].c = Tensor::make(static_cast<uint8_t*>(all.c.data) + first[i] * row_bytes, t, {rows[i], in});
      w[i].g = Tensor::make(static_cast<uint8_t*>(all.g.data) + first[i] * row_bytes, t, {rows[i], in});
    }
    Dual x = make_f32({n, in}, randn(n * in, 3.0f));
    Dual g = make_f32({in}, randn(in)), h = output(DType::kF32, {n, in});
    Dual b = make_f32({rows[1]}, randn(rows[1]));
    Dual y[3], tmp[3];
    for (int i = 0; i < 3; ++i) {
      y[i] = make_f32({n, rows[i]}, randn(n * rows[i]));  // the third is accumulated into
      tmp[i] = output(DType::kF32, {n, rows[i]});
    }
    const int64_t before = cuda_probe::stacked_products(*gpu_);
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool gp = be == gpu_.get();
      MatmulOut outs[3];
      for (int i = 0; i < 3; ++i) outs[i] = out_for(gp, w[i], y[i], tmp[i], i == 2);
      outs[1].bias = gp ? &b.g : &b.c;
      be->matmuls(gp ? x.g : x.c, InputNorm{gp ? &g.g : &g.c, 1e-5f, gp ? &h.g : &h.c}, outs);
    }
    EXPECT_EQ(cuda_probe::stacked_products(*gpu_) - before, gap ? 2 : 3);
    for (int i = 0; i < 3; ++i) EXPECT_LT(nerr(y[i]), tol) << "product " << i;
  }

  // Outputs of different weight kinds, and accumulate next to plain outputs, in one call.
  void check_mixed(const std::vector<DType>& kinds, int64_t n) {
    SCOPED_TRACE(fmt::format("mixed kinds n={}", n));
    const int64_t in = 256;
    const size_t count = kinds.size();
    Dual x = make_f32({n, in}, randn(n * in));
    Dual g = make_f32({in}, randn(in));
    Dual h = output(DType::kF32, {n, in});
    std::vector<Dual> w(count), y(count), tmp(count);
    for (size_t i = 0; i < count; ++i) {
      const int64_t rows = 64 + 16 * int64_t(i);
      w[i] = make_weight(kinds[i], {rows, in});
      y[i] = make_f32({n, rows}, randn(n * rows));
      tmp[i] = output(DType::kF32, {n, rows});
    }
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool gp = be == gpu_.get();
      std::vector<MatmulOut> outs(count);
      for (size_t i = 0; i < count; ++i) outs[i] = out_for(gp, w[i], y[i], tmp[i], i % 3 != 0);
      be->matmuls(gp ? x.g : x.c, InputNorm{gp ? &g.g : &g.c, 1e-5f, gp ? &h.g : &h.c}, outs);
    }
    for (size_t i = 0; i < count; ++i) EXPECT_LT(nerr(y[i]), tolerance(kinds[i], n)) << "product " << i;
  }
};

TEST_F(CudaMatmulsTest, NormAndResidualFusedIntoOneLaunch) {
  for (const bool qgemm : {true, false}) {  // (off: the quantized GEMV at 8 tokens too)
    cuda_probe::set_quant_gemm(*gpu_, qgemm);
    for (DType t : kWeightTypes)
      for (int64_t n : {1, 3, 8}) {
        check_fused(t, 512, n, true, false);
        check_fused(t, 512, n, true, true);
        check_fused(t, 256, n, false, true);
      }
  }
}

TEST_F(CudaMatmulsTest, QuantizedUnitsLoopsAndStages) {
  // The tensor-core Q8_0 / Q4_0 GEMV (gemv_quant.cu): 9448 rows are enough 16-row tiles for
  // units of two tiles and for blocks that loop over several units (fragments built once,
  // next unit prefetched, reduction buffers alternating); 16384 columns fit one stage beside a
  // weight ring of 2 slots but not of 4 (the launch takes 2); 25632 columns (Q4_0: a half-padded
  // last chunk) and 8 tokens at 4096 columns do not fit one stage of activation fragments
  // (gemm_quant off: where it runs it takes 8 tokens).
  cuda_probe::set_quant_gemm(*gpu_, false);
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    check_fused(t, 1024, 1, true, true, {9000, 48, 400});
    check_fused(t, 1024, 2, false, false, {3000, 5000, 17});
    check_fused(t, 16384, 1, true, false, {9000, 17, 64});
    check_fused(t, 25632, 1, true, false, {40, 17, 64});
    check_fused(t, 4096, 8, true, true, {40, 17, 64});
  }
}

TEST_F(CudaMatmulTest, OneTokenQuantizedWordsAtEveryScale) {
  // Each 32-value word of the input gets its own power of two before the f16 split
  // (gemv_quant.cu). A row of words scaled by 2^-6 .. 2^6, every third with one value 1000 times
  // the others, at row scales 1, 2^-40 (all of it below the f16 subnormals unscaled) and 2^40
  // (far above 65504). (The normalised error cannot tell a scale per word from one per row: the
  // outlier words dominate the result, so the smallest words weigh below the bound.)
  const int64_t out = 300, in = 2592;
  std::vector<float> base = randn(in);
  for (int64_t w = 0; w < in / 32; ++w) {
    const float s = std::ldexp(1.0f, int(w % 13) - 6);
    for (int64_t k = 0; k < 32; ++k) base[size_t(w * 32 + k)] *= s;
    if (w % 3 == 0) base[size_t(w * 32 + w % 32)] *= 1000.0f;
  }
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    Dual w = make_weight(t, {out, in});
    for (int e : {0, -40, 40}) {
      SCOPED_TRACE(fmt::format("{} row scale 2^{}", dtype_name(t), e));
      std::vector<float> xv = base;
      for (float& v : xv) v = std::ldexp(v, e);
      Dual x = make_f32({1, in}, xv);
      Dual y = output(DType::kF32, {1, out});
      cpu_->matmul(w.c, x.c, y.c, nullptr);
      gpu_->matmul(w.g, x.g, y.g, nullptr);
      EXPECT_LT(nerr(y), 2e-5);
    }
  }
}

TEST_F(CudaMatmulTest, OneTokenQuantizedNonFiniteInputGivesNonFiniteOutputs) {
  // An inf or NaN in x reaches every output (the reference: inf or NaN), never a finite value.
  const int64_t out = 70, in = 512;
  for (DType t : {DType::kQ8_0, DType::kQ4_0})
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      SCOPED_TRACE(fmt::format("{} {}", dtype_name(t), bad));
      std::vector<float> xv = randn(in);
      xv[37] = bad;
      Dual w = make_weight(t, {out, in});
      Dual x = make_f32({1, in}, xv);
      Dual y = output(DType::kF32, {1, out});
      gpu_->matmul(w.g, x.g, y.g, nullptr);
      const auto g = floats(*gpu_, y.g);
      for (int64_t o = 0; o < out; ++o) EXPECT_FALSE(std::isfinite(g[size_t(o)])) << "output " << o;
    }
}

TEST_F(CudaMatmulsTest, WideRowsOfPlainTypes) {
  // Rows of 512 or more 16-byte vectors (F16 from 4096 columns) take one vector per lane and row
  // over several passes (gemv.cu); 4104 F16 columns end in a pass of one vector.
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    check_fused(t, 4104, 1, true, true);
    check_fused(t, 8192, 1, false, false, {9, 300, 31});
    check_glu(t, 4104, 1, 77);
  }
}

TEST_F(CudaMatmulsTest, TallProductBehindTheNormAccumulated) {
  // An LM head's path in a decode step: the final RMSNorm fused into one product of 16387 rows
  // of 4104 columns (4-row blocks, gemv.cu), here also accumulated into y.
  for (DType t : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t in = 4104, rows = 16387;
    Dual x = make_f32({1, in}, randn(in, 4.0f)), g = make_f32({in}, randn(in)), h = output(DType::kF32, {1, in});
    Dual w = make_weight(t, {rows, in}), y = make_f32({1, rows}, randn(rows)), tmp = output(DType::kF32, {1, rows});
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool gp = be == gpu_.get();
      const MatmulOut o = out_for(gp, w, y, tmp, true);
      be->matmuls(gp ? x.g : x.c, InputNorm{gp ? &g.g : &g.c, 1e-5f, gp ? &h.g : &h.c}, {&o, 1});
    }
    EXPECT_LT(nerr(y), tolerance(t, 1));
  }
}

TEST_F(CudaMatmulsTest, ResidualReadEarlyOnlyWhereThePreviousOpLeftIt) {
  // A GEMV reads its bias and old y before its PDL wait only when the op launched just before
  // recorded writes that miss them (CudaBackend::wrote; cuda_probe::early_epilogue_launches
  // counts such launches). The op before: an activation of another tensor (early), of the
  // tensor whose rows y is a view of (a partial overlap: not early, that kernel may still be
  // writing y), or of the bias (not early). Three outputs, the bias on the middle one; 20000
  // quantized rows make blocks loop over units (later units load theirs at the unit's start).
  // (gemm_quant off: where it runs it takes quantized products of 5 tokens or more.)
  enum class Before { kOther, kParentOfY, kBias };
  cuda_probe::set_quant_gemm(*gpu_, false);
  for (DType t : kWeightTypes)
    for (auto [in, rows0] : {std::pair<int64_t, int64_t>{256, 200}, {4096, 200}, {1024, 20000}})
      for (int64_t n : {1, 3, 8})
        for (Before before : {Before::kOther, Before::kParentOfY, Before::kBias}) {
          const bool quant = t == DType::kQ8_0 || t == DType::kQ4_0;
          if (rows0 == 20000 && (!quant || n != 1)) continue;
          SCOPED_TRACE(fmt::format("{} in={} rows={} n={} before={}", dtype_name(t), in, rows0, n, int(before)));
          const int64_t rows[3] = {rows0, 33, 96};
          Dual x = make_f32({n, in}, randn(n * in));
          Dual b = make_f32({rows[1]}, randn(rows[1]));
          Dual other = make_f32({1, 64}, randn(64));
          Dual w[3], parent[3], y[3], tmp[3];
          for (int i = 0; i < 3; ++i) {
            w[i] = make_weight(t, {rows[i], in});
            parent[i] = make_f32({2 * n, rows[i]}, randn(2 * n * rows[i]));  // y: its rows n .. 2n - 1
            y[i] = Dual{parent[i].c.rows_view(n, n), parent[i].g.rows_view(n, n)};
            tmp[i] = output(DType::kF32, {n, rows[i]});
          }
          const int64_t early0 = cuda_probe::early_epilogue_launches(*gpu_);
          for (Backend* be : {cpu_.get(), gpu_.get()}) {
            const bool gp = be == gpu_.get();
            Dual& first = before == Before::kOther ? other : before == Before::kBias ? b : parent[0];
            be->activation(gp ? first.g : first.c, Activation::kSilu, gp ? first.g : first.c);
            MatmulOut outs[3];
            for (int i = 0; i < 3; ++i) outs[i] = out_for(gp, w[i], y[i], tmp[i], true);
            outs[1].bias = gp ? &b.g : &b.c;
            be->matmuls(gp ? x.g : x.c, InputNorm{}, outs);
          }
          EXPECT_EQ(cuda_probe::early_epilogue_launches(*gpu_) - early0, before == Before::kOther ? 1 : 0);
          for (int i = 0; i < 3; ++i) EXPECT_LT(nerr(parent[i]), tolerance(t, n)) << "product " << i;
        }
}

TEST_F(CudaMatmulsTest, MixedKindsAndModesSplitIntoLaunches) {
  check_mixed({DType::kQ4_0, DType::kQ4_0, DType::kF16, DType::kQ8_0}, 2);
}

TEST_F(CudaMatmulsTest, MisalignedInputRowsCompose) {
  // A row view at row 1 of a 37-wide input is not 16-byte aligned: the composition runs.
  const int64_t in = 37, rows = 45;
  Dual x = make_f32({3, in}, randn(3 * in));
  Dual g = make_f32({in}, randn(in));
  Dual h = output(DType::kF32, {2, in});
  Dual w = make_weight(DType::kF16, {rows, in});
  Dual y = output(DType::kF32, {2, rows});
  for (Backend* be : {cpu_.get(), gpu_.get()}) {
    const bool gp = be == gpu_.get();
    const MatmulOut o{gp ? &w.g : &w.c, gp ? &y.g : &y.c};
    Tensor xv = (gp ? x.g : x.c).rows_view(1, 2);
    be->matmuls(xv, InputNorm{gp ? &g.g : &g.c, 1e-5f, gp ? &h.g : &h.c}, {&o, 1});
  }
  EXPECT_LT(nerr(y), 2e-5);
}

TEST_F(CudaMatmulsTest, OddWidthsAndLargeBatchesCompose) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) check_fused(t, 101, 2, true, true);  // element-wise kernel
  for (DType t : {DType::kF16, DType::kQ4_0}) check_fused(t, 256, 12, true, true);             // prefill path
}

TEST_F(CudaMatmulsTest, PrefillSplitsOnceWithFusedEpilogues) {
  // More than 8 tokens: matmuls() splits the (normed) input once for all its cuBLAS products and
  // sums each product's parts with its epilogue (bias, residual add, act(gate) * up) in one
  // kernel (cuda_gemm.cc); F32 weights, BF16 beside other kinds and GLUs of rows % 4 != 0 compose.
  for (DType t : kWeightTypes) {
    check_fused(t, 512, 12, true, false);
    check_fused(t, 256, 40, true, true);
    check_fused(t, 256, 9, false, true);
    check_glu(t, 384, 12);
    check_glu(t, 384, 33, 203);
  }
  check_mixed({DType::kQ4_0, DType::kF16, DType::kQ8_0, DType::kQ4_0}, 12);
  check_mixed({DType::kBF16, DType::kF16, DType::kF32}, 20);
}

TEST_F(CudaMatmulsTest, PrefillInputRowsOfEveryWidth) {
  // The input split (gemm_prep.cu), with and without the norm: rows held in registers (k % 4 ==
  // 0, up to 16384 values: 1, 2, 4, 8 or 16 float4 steps per thread, the last partly used or
  // full) and the generic loop (k % 4 != 0, wider rows); f16 parts (F16) and bf16 parts (BF16).
  for (DType t : {DType::kF16, DType::kBF16})
    for (int64_t in : {258, 1024, 1028, 2052, 4100, 16384, 16388}) {
      check_fused(t, in, 12, true, false, {64, 8, 24});
      check_fused(t, in, 10, false, true, {64, 8, 24});
    }
}

TEST_F(CudaMatmulsTest, PrefillProductsOfAdjacentWeightsShareOneGemm) {
  for (DType t : {DType::kF16, DType::kBF16})
    for (bool gap : {false, true}) {
      check_stacked(t, gap, tolerance(t, 12), {96, 32, 32});
      check_stacked(t, gap, tolerance(t, 12), {96, 33, 31});  // the part sums one element per thread
    }
}

TEST_F(CudaMatmulsTest, PrefillProductsOfAdjacentWeightsShareOneGemmOfOnePart) {
  use_half_prefill();
  for (bool gap : {false, true}) check_stacked(DType::kF16, gap, 2e-3, {96, 32, 32});
}

TEST_F(CudaMatmulsTest, WeightsAllocatedTogetherShareOneGemm) {
  // Backend::alloc_weights (a layer's q / k / v from the loader) places F16 weights back to back,
  // so matmuls() computes them in one GEMM; repacked Q8_0 weights in one block compute as when
  // allocated alone.
  for (DType t : {DType::kF16, DType::kQ8_0}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t in = 256, n = 12;
    const std::array<std::array<int64_t, 2>, 3> shapes{{{64, in}, {32, in}, {32, in}}};
    auto block = gpu_->alloc_weights(t, shapes);
    ASSERT_TRUE(block.ok()) << block.status().to_string();
    ASSERT_EQ(block->size(), 3u);
    Dual w[3];
    for (int i = 0; i < 3; ++i) {
      const auto bytes = encode(t, randn(shapes[size_t(i)][0] * in));
      auto c = cpu_->alloc_weight(t, {shapes[size_t(i)][0], in});
      ASSERT_TRUE(c.ok());
      w[i].c = *c;
      w[i].g = (*block)[size_t(i)];
      ASSERT_TRUE(cpu_->upload_weight(w[i].c, bytes.data(), w[i].c.nbytes()).ok());
      const Status s = gpu_->upload_weight(w[i].g, bytes.data(), w[i].g.nbytes());
      ASSERT_TRUE(s.ok()) << s.to_string();
    }
    if (t == DType::kF16) {
      EXPECT_EQ(w[1].g.data, static_cast<uint8_t*>(w[0].g.data) + w[0].g.nbytes());
      EXPECT_EQ(w[2].g.data, static_cast<uint8_t*>(w[1].g.data) + w[1].g.nbytes());
    }
    Dual x = make_f32({n, in}, randn(n * in, 3.0f));
    Dual y[3], tmp[3];
    for (int i = 0; i < 3; ++i) {
      y[i] = output(DType::kF32, {n, shapes[size_t(i)][0]});
      tmp[i] = output(DType::kF32, {n, shapes[size_t(i)][0]});
    }
    const int64_t before = cuda_probe::stacked_products(*gpu_);
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool gp = be == gpu_.get();
      MatmulOut outs[3];
      for (int i = 0; i < 3; ++i) outs[i] = out_for(gp, w[i], y[i], tmp[i], false);
      be->matmuls(gp ? x.g : x.c, InputNorm{}, outs);
    }
    EXPECT_EQ(cuda_probe::stacked_products(*gpu_) - before, t == DType::kF16 ? 3 : 0);
    for (int i = 0; i < 3; ++i) EXPECT_LT(nerr(y[i]), tolerance(t, n)) << "product " << i;
    ASSERT_TRUE(gpu_->synchronize().ok());
    for (Dual& d : w) {
      cpu_->free(d.c);
      gpu_->free(d.g);
    }
  }
}

TEST_F(CudaMatmulsTest, GateAndUpAllocatedTogetherShareOneGemmWhereSmall) {
  // A layer's gate and up from one alloc_weights block (as the loader allocates them): the
  // prefill GLU takes one GEMM over both (F16 / BF16) up to 16M output values, else two; repacked
  // Q8_0 weights, and weights allocated apart, compute as before. Against the reference either way.
  struct Case {
    DType t;
    int64_t ff, in, n;
    bool together, stacked;
    Activation act = Activation::kSilu;
  };
  for (const Case c : {Case{DType::kF16, 200, 256, 12, true, true}, Case{DType::kBF16, 96, 128, 40, true, true},
                       Case{DType::kF16, 64, 256, 12, true, true, Activation::kGeluTanh},
                       Case{DType::kF16, 4096, 32, 2100, true, false}, Case{DType::kF16, 200, 256, 12, false, false},
                       Case{DType::kQ8_0, 64, 256, 12, true, false}}) {
    SCOPED_TRACE(fmt::format("{} ff={} in={} n={} together={} act={}", dtype_name(c.t), c.ff, c.in, c.n, c.together,
                             int(c.act)));
    // Apart: gate and up are the first and third weights of one block, a one-row weight between
    // them (cudaMalloc alone may place two allocations back to back).
    const std::array<std::array<int64_t, 2>, 2> together{{{c.ff, c.in}, {c.ff, c.in}}};
    const std::array<std::array<int64_t, 2>, 3> apart{{{c.ff, c.in}, {1, c.in}, {c.ff, c.in}}};
    auto block = c.together ? gpu_->alloc_weights(c.t, together) : gpu_->alloc_weights(c.t, apart);
    ASSERT_TRUE(block.ok()) << block.status().to_string();
    std::vector<Tensor> gw = *block;
    Tensor gap;  // (apart: the weight between gate and up, held to the end)
    if (!c.together) {
      gap = gw[1];
      gw.erase(gw.begin() + 1);
    }
    Dual w[2];
    for (int i = 0; i < 2; ++i) {
      const auto bytes = encode(c.t, randn(c.ff * c.in));
      auto cw = cpu_->alloc_weight(c.t, {c.ff, c.in});
      ASSERT_TRUE(cw.ok());
      w[i].c = *cw;
      w[i].g = gw[size_t(i)];
      ASSERT_TRUE(cpu_->upload_weight(w[i].c, bytes.data(), w[i].c.nbytes()).ok());
      ASSERT_TRUE(gpu_->upload_weight(w[i].g, bytes.data(), w[i].g.nbytes()).ok());
    }
    Dual x = make_f32({c.n, c.in}, randn(c.n * c.in, 2.0f));
    Dual g = make_f32({c.in}, randn(c.in)), h = output(DType::kF32, {c.n, c.in});
    Dual y = output(DType::kF32, {c.n, c.ff}), up = output(DType::kF32, {c.n, c.ff});
    const int64_t before = cuda_probe::stacked_products(*gpu_);
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool gp = be == gpu_.get();
      MatmulOut o{gp ? &w[0].g : &w[0].c, gp ? &y.g : &y.c, nullptr, gp ? &w[1].g : &w[1].c, c.act};
      o.tmp = gp ? &up.g : &up.c;
      be->matmuls(gp ? x.g : x.c, InputNorm{gp ? &g.g : &g.c, 1e-6f, gp ? &h.g : &h.c}, {&o, 1});
    }
    EXPECT_EQ(cuda_probe::stacked_products(*gpu_) - before, c.stacked ? 2 : 0);
    EXPECT_LT(nerr(y), c.act == Activation::kSilu ? tolerance(c.t, c.n) : 5e-5);  // (as FusedGateUpGlu)
    ASSERT_TRUE(gpu_->synchronize().ok());
    for (Dual& d : w) {
      cpu_->free(d.c);
      gpu_->free(d.g);
    }
    if (gap.data) gpu_->free(gap);
  }
}

TEST_F(CudaMatmulsTest, WeightsAllocatedTogetherFreeTheirBlockWithTheLast) {
  // Each weight of alloc_weights' block is freed on its own; the block (64 MiB here) stays until
  // the last one goes, also when the first (at the block's start) goes first.
  ASSERT_TRUE(gpu_->synchronize().ok());
  const uint64_t before = gpu_->free_memory();
  const std::array<std::array<int64_t, 2>, 2> shapes{{{6144, 4096}, {2048, 4096}}};
  auto block = gpu_->alloc_weights(DType::kF16, shapes);
  ASSERT_TRUE(block.ok()) << block.status().to_string();
  const uint64_t mib = 1 << 20;
  EXPECT_LE(gpu_->free_memory() + 60 * mib, before);
  gpu_->free((*block)[0]);
  EXPECT_LE(gpu_->free_memory() + 60 * mib, before);  // the block is still there
  gpu_->free((*block)[1]);
  EXPECT_GE(gpu_->free_memory() + 4 * mib, before);
}

TEST_F(CudaMatmulsTest, GluBehindTheNorm) {
  for (DType t : kWeightTypes) {
    for (int64_t n : {1, 5}) check_glu(t, 384, n);
    cuda_probe::set_quant_gemm(*gpu_, false);  // (the quantized GEMV at 5 tokens too)
    check_glu(t, 384, 5);
    cuda_probe::set_quant_gemm(*gpu_, true);
    // One-vector rows (F16: 1024 columns) take 8 rows per block (gemv.cu); 203 rows end in a
    // partly used block.
    check_glu(t, 1024, 1, 203);
  }
}

TEST_F(CudaMatmulTest, GemmAboveEightTokens) {
  for (DType t : kWeightTypes)
    for (int64_t n : {9, 40}) check(t, 515, 768, n, n == 9);
}

TEST_F(CudaMatmulTest, GemmQuantizedInSeveralTiles) {
  // The cuBLAS path's 64 MiB dequantized tiles of 128-row multiples: 16384 columns give 2048-row
  // tiles (on Hopper quantized products take gemm_quant unless turned off).
  cuda_probe::set_quant_gemm(*gpu_, false);  // (gpu_ is this test's own backend)
  check(DType::kQ4_0, 2300, 16384, 12, false);
}

TEST_F(CudaMatmulTest, GemmActivationsBeyondTheF16Range) {
  // Rows scaled by powers of two before the f16 split: large and tiny rows both stay accurate.
  for (DType t : {DType::kF16, DType::kQ8_0}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t out = 130, in = 256, n = 11;
    Dual w = make_weight(t, {out, in});
    std::vector<float> xv = randn(n * in);
    for (int64_t k = 0; k < in; ++k) {
      xv[size_t(k)] *= 1e6f;        // row 0: far above 65504
      xv[size_t(in + k)] *= 1e-9f;  // row 1: far below the f16 subnormals
    }
    Dual x = make_f32({n, in}, xv);
    Dual y = output(DType::kF32, {n, out});
    cpu_->matmul(w.c, x.c, y.c, nullptr);
    gpu_->matmul(w.g, x.g, y.g, nullptr);
    const auto g = floats(*gpu_, y.g), c = floats(*cpu_, y.c);
    for (int64_t row = 0; row < n; ++row) {
      double num = 0, den = 0;
      for (int64_t o = 0; o < out; ++o) {
        const double d = double(g[size_t(row * out + o)]) - c[size_t(row * out + o)];
        num += d * d;
        den += double(c[size_t(row * out + o)]) * c[size_t(row * out + o)];
      }
      EXPECT_LT(std::sqrt(num / den), 2e-5) << "row " << row;
    }
  }
}

TEST_F(CudaMatmulTest, FusedGateUpGlu) {
  for (const bool qgemm : {true, false}) {  // (off: the quantized GEMV at 7 tokens too)
    cuda_probe::set_quant_gemm(*gpu_, qgemm);
    for (DType t : kWeightTypes)
      for (int64_t n : {1, 2, 4, 7, 12})
        for (Activation act : {Activation::kSilu, Activation::kGeluTanh, Activation::kGeluErf}) {
          SCOPED_TRACE(fmt::format("{} n={} act={} gemm_quant={}", dtype_name(t), n, int(act), qgemm));
          const int64_t d = 256, ff = 333;
          Dual wg = make_weight(t, {ff, d}), wu = make_weight(t, {ff, d});
          Dual x = make_f32({n, d}, randn(n * d, 0.5f));
          Dual gb = output(DType::kF32, {n, ff}), ub = output(DType::kF32, {n, ff});
          Dual out = output(DType::kF32, {n, ff});
          cpu_->matmul_glu(wg.c, wu.c, x.c, act, gb.c, ub.c, out.c);
          gpu_->matmul_glu(wg.g, wu.g, x.g, act, gb.g, ub.g, out.g);
          EXPECT_LT(nerr(out), 5e-5);
        }
  }
}

TEST_F(CudaMatmulTest, UploadLargerThanStagingIsExact) {
  // Weights above the 32 MiB staging half go up in several chunks; embed reads rows back exactly.
  for (auto [t, rows, cols] : {std::tuple<DType, int64_t, int64_t>{DType::kQ8_0, 2201, 16384},
                               {DType::kQ4_0, 4100, 16384},
                               {DType::kF16, 4100, 4352}}) {
    SCOPED_TRACE(dtype_name(t));
    Dual w = make_weight(t, {rows, cols});
    const std::vector<int32_t> id_values = {0, int32_t(rows - 1), int32_t(rows / 2), 1, int32_t(rows / 3 + 7)};
    Dual ids = make_i32(id_values);
    Dual out = output(DType::kF32, {5, cols});
    cpu_->embed(w.c, ids.c, out.c);
    gpu_->embed(w.g, ids.g, out.g);
    EXPECT_EQ(nerr(out), 0.0);
  }
}

// BackendOptions::half_prefill: prefill products (n > 8) of F16 / BF16 weights, and of Q8_0 /
// Q4_0 weights where gemm_quant runs them, take x as one 16-bit part. The error is then x's
// rounding: each value off by at most 2^-11 (f16, under the split's power-of-two scale) or 2^-8
// (bf16) relative, uniformly, so a product's normalised error is about the rms of that, 2^-11 /
// sqrt(3) = 2.8e-4 (bf16: 2.3e-3); bounds 1e-3 / 8e-3. Decode (n <= 8), and calls with a
// quantized product on the dequantized cuBLAS path, stay exact (2e-5).
class CudaHalfPrefillTest : public CudaMatmulsTest {
 protected:
  void SetUp() override {
    CudaMatmulsTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    use_half_prefill();
  }
  double tolerance(DType t, int64_t n) const override {
    if (n <= 8 || exact_) return 2e-5;
    return t == DType::kBF16 ? 8e-3 : 1e-3;
  }
  int64_t halves() { return cuda_probe::half_prefill_inputs(*gpu_); }
  bool exact_ = false;  // every product held to 2e-5
};

TEST_F(CudaHalfPrefillTest, SixteenBitWeightsTakeOnePart) {
  for (DType t : {DType::kF16, DType::kBF16}) {
    int64_t before = halves();
    check(t, 515, 768, 40, true);  // gemm: one split
    check_fused(t, 512, 12, true, true);    // matmuls: one split for the three products
    check_fused(t, 256, 33, false, false);  // (one)
    check_glu(t, 384, 33);                  // gate / up fused: one
    check_glu(t, 384, 33, 203);             // rows % 4 != 0: composed of two matmuls, two
    EXPECT_EQ(halves(), before + 6) << dtype_name(t);
    before = halves();
    check(t, 515, 768, 8, false);  // one to 8 tokens: the GEMV, exact
    check_fused(t, 512, 5, true, true);
    EXPECT_EQ(halves(), before) << dtype_name(t);
  }
}

TEST_F(CudaHalfPrefillTest, QuantizedProductsTakeOnePartOnlyOnGemmQuant) {
  // Where the device runs gemm_quant (Hopper), quantized products and calls mixing them with F16
  // take one part; on the dequantized cuBLAS path (gemm_quant off, or other GPUs) every product of
  // the call keeps the exact parts.
  for (const bool qgemm : {true, false}) {
    cuda_probe::set_quant_gemm(*gpu_, qgemm);
    const bool one = qgemm && cuda_probe::quant_gemm_available(*gpu_);
    SCOPED_TRACE(fmt::format("gemm_quant {}", one ? "on" : "off"));
    exact_ = !one;
    const int64_t before = halves();
    for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
      check(t, 515, 768, 40, true);
      check_fused(t, 256, 40, true, true);
      check_glu(t, 384, 12);
    }
    check_mixed({DType::kQ4_0, DType::kF16, DType::kQ8_0}, 12);  // one split for all
    EXPECT_EQ(halves(), before + (one ? 7 : 0));
  }
  cuda_probe::set_quant_gemm(*gpu_, true);
}

TEST_F(CudaMatmulTest, UnsupportedWeightTypeIsAnError) {
  auto r = gpu_->alloc_weight(DType::kQ4_K, {16, 256});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), Code::kUnsupported);
}

TEST(CudaGemvQuantArgs, RejectsWhatItsIndicesOrLoadsCannotTake) {
  // gemv_quant's own checks (kernels.h), made before it touches memory or the device, so they
  // need no GPU: columns not a multiple of 32 or not below 2^30 (the fragment build's 32-bit
  // indices), x not 16-byte aligned. The pointers are never dereferenced.
  const auto* x = reinterpret_cast<const float*>(uintptr_t{256});
  float* y = reinterpret_cast<float*>(uintptr_t{512});
  const auto* q = reinterpret_cast<const void*>(uintptr_t{1024});
  const auto* s = reinterpret_cast<const uint16_t*>(uintptr_t{2048});
  for (cuda::WKind kind : {cuda::WKind::kQ8_0, cuda::WKind::kQ4_0})
    for (int64_t cols : {int64_t{1} << 30, (int64_t{1} << 30) + 32, int64_t{1} << 40, int64_t{4096 + 16}}) {
      SCOPED_TRACE(fmt::format("kind {} cols {}", int(kind), cols));
      cuda::GemvOut o{cuda::WeightRef{kind, q, s, 16, cols}};
      o.y = y;
      EXPECT_EQ(cuda::gemv_quant(&o, 1, x, 1, cuda::GemvOpts{}, nullptr), cudaErrorInvalidValue);
    }
  cuda::GemvOut o{cuda::WeightRef{cuda::WKind::kQ4_0, q, s, 16, 4096}};
  o.y = y;
  EXPECT_EQ(cuda::gemv_quant(&o, 1, x + 1, 1, cuda::GemvOpts{}, nullptr), cudaErrorInvalidValue);
}

}  // namespace
}  // namespace shoal::test
