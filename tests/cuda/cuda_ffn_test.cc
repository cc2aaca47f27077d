// Backend::gated_ffn on CUDA against the reference's composition: prefill FFNs of F16 / BF16
// weights hand act(gate) * up to the down product as 16-bit parts written by the GLU
// (cuda::glu_parts); f16 rows whose values leave the parts' unscaled range are rescaled by the
// kernel. And MatmulOut::next: residual adds hand the next block its input parts.
#include <cmath>
#include <vector>

#include "backend/cuda/cuda_probe.h"
#include "cuda/cuda_test_util.h"

namespace shoal::test {
namespace {

class CudaFfnTest : public CudaVsRef {
 protected:
  struct Case {
    int64_t ff, in, n;
    bool together = true;  // gate and up from one alloc_weights block
    bool bias = false;
    bool residual_is_input = false;  // x both the (normed) input and the sum, as model/forward.cc
    bool norm = true;                // the input RMSNorm'ed (InputNorm)
    Activation act = Activation::kSilu;
    std::vector<float> row_scale = {};  // per token: x's row times this (empty: 1)
    DType t = DType::kF16;
  };

  // Runs gated_ffn on both backends; returns x's rows on the GPU and the reference.
  void run(const Case& c, std::vector<float>& got, std::vector<float>& want, int64_t& parts_ffns) {
    const std::array<std::array<int64_t, 2>, 2> shapes{{{c.ff, c.in}, {c.ff, c.in}}};
    const std::array<std::array<int64_t, 2>, 3> apart{{{c.ff, c.in}, {1, c.in}, {c.ff, c.in}}};
    auto block = c.together ? gpu_->alloc_weights(c.t, shapes) : gpu_->alloc_weights(c.t, apart);
    ASSERT_TRUE(block.ok()) << block.status().to_string();
    std::vector<Tensor> gw = *block;
    Tensor gap;  // (apart: a one-row weight between gate and up, held to the end)
    if (!c.together) gap = gw[1], gw.erase(gw.begin() + 1);
    Dual w[2];
    for (int i = 0; i < 2; ++i) {
      const auto bytes = encode(c.t, randn(c.ff * c.in, 0.1f));
      auto cw = cpu_->alloc_weight(c.t, {c.ff, c.in});
      ASSERT_TRUE(cw.ok());
      w[i] = Dual{*cw, gw[size_t(i)]};
      ASSERT_TRUE(cpu_->upload_weight(w[i].c, bytes.data(), w[i].c.nbytes()).ok());
      ASSERT_TRUE(gpu_->upload_weight(w[i].g, bytes.data(), w[i].g.nbytes()).ok());
      owned_.push_back(w[i]);
    }
    Dual down = make_weight(c.t, {c.in, c.ff}, 0.1f);
    std::vector<float> xv = randn(c.n * c.in, 2.0f);
    for (size_t t = 0; t < c.row_scale.size(); ++t)
      for (int64_t i = 0; i < c.in; ++i) xv[t * size_t(c.in) + size_t(i)] *= c.row_scale[t];
    Dual in = make_f32({c.n, c.in}, xv);
    Dual x = c.residual_is_input ? in : make_f32({c.n, c.in}, std::vector<float>(size_t(c.n * c.in), 0.0f));
    Dual nw = make_f32({c.in}, randn(c.in)), h = output(DType::kF32, {c.n, c.in});
    Dual b = make_f32({c.in}, randn(c.in)), tmp = output(DType::kF32, {c.n, c.in});
    Dual gate = output(DType::kF32, {c.n, c.ff}), up = output(DType::kF32, {c.n, c.ff});
    const int64_t before = cuda_probe::glu_part_ffns(*gpu_);
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool gp = be == gpu_.get();
      auto pick = [gp](Dual& d) -> Tensor& { return gp ? d.g : d.c; };
      MatmulOut glu{&pick(w[0]), &pick(gate), nullptr, &pick(w[1]), c.act};
      glu.tmp = &pick(up);
      const InputNorm norm = c.norm ? InputNorm{&pick(nw), 1e-6f, &pick(h)} : InputNorm{};
      MatmulOut dp{&pick(down), &pick(x), c.bias ? &pick(b) : nullptr};
      dp.accumulate = true;
      dp.tmp = &pick(tmp);
      be->gated_ffn(pick(in), norm, glu, dp);
    }
    parts_ffns = cuda_probe::glu_part_ffns(*gpu_) - before;
    got = floats(*gpu_, x.g);
    want = floats(*cpu_, x.c);
    if (gap.data) gpu_->free(gap);
  }

  // The largest normalised error of one token's row.
  static double worst_row(const std::vector<float>& got, const std::vector<float>& want, int64_t n, int64_t d) {
    double worst = 0;
    for (int64_t t = 0; t < n; ++t) {
      double num = 0, den = 0;
      for (int64_t i = t * d; i < (t + 1) * d; ++i) {
        if (!std::isfinite(got[size_t(i)])) return INFINITY;
        num += (double(got[size_t(i)]) - want[size_t(i)]) * (double(got[size_t(i)]) - want[size_t(i)]);
        den += double(want[size_t(i)]) * want[size_t(i)];
      }
      worst = std::max(worst, den > 0 ? std::sqrt(num / den) : std::sqrt(num));
    }
    return worst;
  }
};

TEST_F(CudaFfnTest, PrefillGluHandsDownItsInputParts) {
  // Gate and up in one GEMM (small) or two (apart), a bias on down, GELU, the residual as input
  // (model/forward.cc: x normed into the products, then added to), 9 to 300 tokens, d_ff not a
  // multiple of a block's 1024 values.
  for (const Case& c :
       {Case{200, 256, 12, true, true}, Case{1028, 512, 9, false, false, true},
        Case{96, 128, 40, true, false, false, true, Activation::kGeluTanh}, Case{4096, 256, 300, true},
        Case{200, 258, 12, true, true}}) {  // (d_model % 4 != 0: down's sum one element per thread)
    SCOPED_TRACE(fmt::format("ff={} in={} n={} together={} bias={} act={}", c.ff, c.in, c.n, c.together, c.bias,
                             int(c.act)));
    std::vector<float> got, want;
    int64_t handed = 0;
    run(c, got, want, handed);
    EXPECT_EQ(handed, 1);
    EXPECT_LT(worst_row(got, want, c.n, c.in), c.act == Activation::kSilu ? 2e-5 : 5e-5);
  }
}

TEST_F(CudaFfnTest, Bf16GluHandsDownThreeParts) {
  // BF16 weights (HF checkpoints): three unshifted bf16 parts, no row scale, tiny and huge rows
  // alike (bf16 has f32's exponent range).
  Case c{1028, 256, 21, true, true, true};
  c.t = DType::kBF16;
  c.norm = false;
  c.row_scale.assign(21, 1.0f);
  c.row_scale[2] = 400.0f, c.row_scale[7] = 1e-6f;
  std::vector<float> got, want;
  int64_t handed = 0;
  run(c, got, want, handed);
  EXPECT_EQ(handed, 1);
  EXPECT_LT(worst_row(got, want, c.n, c.in), 2e-5);
}

TEST_F(CudaFfnTest, LongPromptsOnReusedScratch) {
  // More rows than an H200 holds blocks at once (4 x 132), twice, so the second call reuses the
  // first one's scratch: down's parts must not land on gate / up's input scales while blocks
  // still read them.
  for (int round = 0; round < 2; ++round) {
    std::vector<float> got, want;
    int64_t handed = 0;
    run(Case{1024, 256, 2100}, got, want, handed);
    EXPECT_EQ(handed, 1);
    EXPECT_LT(worst_row(got, want, 2100, 256), 2e-5) << "round " << round;
  }
}

TEST_F(CudaFfnTest, RowsOutsideTheUnscaledRangeAreRescaled) {
  // Tokens whose act(gate) * up reaches 2^15 (x times 400: |h| ~ 1e6) or stays below 2^-14 (x
  // times 1e-3: |h| ~ 1e-5 and 1e-6: ~ 1e-11), among ordinary rows (no input norm, which would
  // undo the scales): every row within 2e-5 of the reference, each measured against its own size.
  std::vector<float> scales(33, 1.0f);
  scales[0] = 400.0f, scales[5] = 1e-3f, scales[6] = 1e-6f, scales[20] = 400.0f, scales[32] = 1e-6f;
  for (const bool residual : {false, true}) {
    Case c{1024, 256, 33, true, false, residual, false};
    c.row_scale = scales;
    std::vector<float> got, want;
    int64_t handed = 0;
    run(c, got, want, handed);
    EXPECT_EQ(handed, 1);
    EXPECT_LT(worst_row(got, want, c.n, c.in), 2e-5) << "residual " << residual;
  }
}

TEST_F(CudaFfnTest, NonFiniteGluReachesTheOutput) {
  // An inf in x: its token's output is not finite, as the reference's; the other rows are exact.
  Case c{256, 128, 16};
  c.row_scale.assign(16, 1.0f);
  c.row_scale[3] = INFINITY;
  std::vector<float> got, want;
  int64_t handed = 0;
  run(c, got, want, handed);
  EXPECT_EQ(handed, 1);
  bool nonfinite = false;
  for (int64_t i = 3 * c.in; i < 4 * c.in; ++i) nonfinite = nonfinite || !std::isfinite(got[size_t(i)]);
  EXPECT_TRUE(nonfinite);
  for (int64_t i = 3 * c.in; i < 4 * c.in; ++i) got[size_t(i)] = want[size_t(i)] = 0.0f;
  EXPECT_LT(worst_row(got, want, c.n, c.in), 2e-5);
}

TEST_F(CudaFfnTest, DecodeTakesTheComposedOps) {
  // One to 8 tokens: the GEMVs (with their own fragment handoff for quantized weights).
  std::vector<float> got, want;
  int64_t handed = 0;
  run(Case{200, 256, 8}, got, want, handed);
  EXPECT_EQ(handed, 0);
  EXPECT_LT(worst_row(got, want, 8, 256), 2e-5);
}

// MatmulOut::next: a prefill residual add (F16 / BF16) writes the next block's input parts in the
// same pass (cuda::combine_split), which that block's products take when they read the same x
// through the same norm right after; any other next op splits x itself.
class CudaHandoffTest : public CudaVsRef {
 protected:
  // x += a · woᵀ (with `next` as the hint; a [n, in_w], in_w 0: d), then q = rms_norm(x, taken) ·
  // wqᵀ: x and q against the reference within tol; returns the handoffs taken.
  int64_t run(DType t, int64_t d, int64_t n, bool same_norm, bool through_ffn, int64_t in_w = 0, double tol = 2e-5) {
    if (in_w == 0) in_w = d;
    Dual wo = make_weight(t, {d, through_ffn ? 2 * in_w : in_w}, 0.1f), wq = make_weight(t, {96, d}, 0.1f);
    Dual a = make_f32({n, in_w}, randn(n * in_w));
    Dual x = make_f32({n, d}, randn(n * d, 2.0f)), tmp = output(DType::kF32, {n, d});
    Dual g1 = make_f32({d}, randn(d)), g2 = make_f32({d}, randn(d)), h = output(DType::kF32, {n, d});
    Dual q = output(DType::kF32, {n, 96});
    // For through_ffn: a gated FFN (gate / up from x itself, no norm) hands its down product the hint.
    Dual wg, wu, gate, up;
    if (through_ffn) {
      wg = make_weight(t, {2 * in_w, in_w}, 0.1f), wu = make_weight(t, {2 * in_w, in_w}, 0.1f);
      gate = output(DType::kF32, {n, 2 * in_w}), up = output(DType::kF32, {n, 2 * in_w});
    }
    const int64_t before = cuda_probe::split_handoffs(*gpu_);
    for (Backend* be : {cpu_.get(), gpu_.get()}) {
      const bool gp = be == gpu_.get();
      auto pick = [gp](Dual& v) -> Tensor& { return gp ? v.g : v.c; };
      const InputNorm next{&pick(g1), 1e-6f, &pick(h)};
      MatmulOut o{&pick(wo), &pick(x)};
      o.accumulate = true;
      o.tmp = &pick(tmp);
      o.next = &next;
      if (through_ffn) {
        MatmulOut glu{&pick(wg), &pick(gate), nullptr, &pick(wu), Activation::kSilu};
        glu.tmp = &pick(up);
        be->gated_ffn(pick(a), InputNorm{}, glu, o);
      } else {
        be->matmuls(pick(a), InputNorm{}, {&o, 1});
      }
      const MatmulOut qo{&pick(wq), &pick(q)};
      be->matmuls(pick(x), InputNorm{same_norm ? &pick(g1) : &pick(g2), 1e-6f, &pick(h)}, {&qo, 1});
    }
    EXPECT_LT(nerr(x), tol);
    EXPECT_LT(nerr(q), tol);
    return cuda_probe::split_handoffs(*gpu_) - before;
  }
};

TEST_F(CudaHandoffTest, ResidualAddHandsTheNextBlockItsInputParts) {
  for (DType t : {DType::kF16, DType::kBF16})
    for (int64_t d : {256, 1028, 2052}) {  // (a float4 per thread and row: 1, 2, 3 -> 4)
      SCOPED_TRACE(fmt::format("{} d={}", dtype_name(t), d));
      EXPECT_EQ(run(t, d, 40, true, false), 1);   // taken
      EXPECT_EQ(run(t, d, 40, false, false), 0);  // another norm: x split again
    }
}

TEST_F(CudaHandoffTest, GatedFfnHandsTheNextBlockItsInputParts) {
  EXPECT_EQ(run(DType::kF16, 512, 33, true, true), 1);
  EXPECT_EQ(run(DType::kF16, 512, 33, false, true), 0);
  EXPECT_EQ(run(DType::kF16, 512, 8, true, true), 0);  // decode: the GEMVs
}

TEST_F(CudaHandoffTest, NextInputWiderThanTheProductsInput) {
  // The residual add's rows (1280) wider than its product's input (1024: wo of a model whose
  // heads span less than d_model) at more rows than fit at once, twice on the same scratch: the
  // next input's parts must not cover the scales the pass still reads.
  for (int round = 0; round < 2; ++round) {
    EXPECT_EQ(run(DType::kF16, 1280, 1100, true, false, 1024), 1) << "round " << round;
    EXPECT_EQ(run(DType::kF16, 1280, 1100, true, true, 1024), 1) << "round " << round;
  }
}

// The same with one activation part (--prefill-precision half): handed over as one part; the
// error is the f16 rounding of x (CudaHalfPrefillTest's bound).
class CudaHalfHandoffTest : public CudaHandoffTest {
 protected:
  void SetUp() override {
    CudaHandoffTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    use_half_prefill();
  }
};

TEST_F(CudaHalfHandoffTest, OnePartHandedOver) {
  EXPECT_EQ(run(DType::kF16, 512, 40, true, false, 0, 1e-3), 1);
  EXPECT_EQ(run(DType::kF16, 512, 40, true, true, 0, 1e-3), 1);
  EXPECT_EQ(run(DType::kBF16, 512, 40, true, true, 0, 8e-3), 1);
}

}  // namespace
}  // namespace shoal::test
