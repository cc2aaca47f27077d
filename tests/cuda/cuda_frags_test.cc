// The activation-fragment handoff of the quantized GEMVs (cuda::GemvOpts::frags_out / frags_in):
// a gate / up GLU writes its output also as the MMA fragments of the down projection that reads
// it next. The FFN's results must equal, bit for bit, those of the same launches without the
// handoff (the down GEMV building its fragments from x), and the CPU reference within the
// GEMV tolerance.
#include <cmath>
#include <limits>
#include <vector>

#include "backend/cuda/cuda_probe.h"
#include "cuda/cuda_test_util.h"

namespace shoal::test {
namespace {

class CudaFragsTest : public CudaVsRef {
 protected:
  struct FfnRun {
    std::vector<float> act, y;  // act(gate) * up and the residual stream after down
    int64_t handoffs = 0;
  };

  // x [n, in] -> matmuls(RMSNorm, gate / up GLU [ff]) -> matmuls(down [out], accumulated into y)
  // on `be`, y starting from y0.
  FfnRun run_ffn(Backend& be, bool gp, Dual& x, Dual& g, Dual& h, Dual& wg, Dual& wu, Dual& wd, Dual& act, Dual& up,
                 Dual& y, Dual& tmp, const std::vector<float>& y0) {
    const int64_t h0 = gp ? cuda_probe::fragment_handoffs(be) : 0;
    EXPECT_TRUE(be.to_device(gp ? y.g : y.c, y0.data(), y0.size() * 4, 0).ok());
    MatmulOut glu{gp ? &wg.g : &wg.c, gp ? &act.g : &act.c, nullptr, gp ? &wu.g : &wu.c, Activation::kSilu};
    glu.tmp = gp ? &up.g : &up.c;
    be.matmuls(gp ? x.g : x.c, InputNorm{gp ? &g.g : &g.c, 1e-5f, gp ? &h.g : &h.c}, {&glu, 1});
    MatmulOut down{gp ? &wd.g : &wd.c, gp ? &y.g : &y.c};
    down.accumulate = true;
    down.tmp = gp ? &tmp.g : &tmp.c;
    be.matmuls(gp ? act.g : act.c, InputNorm{}, {&down, 1});
    FfnRun r;
    r.act = floats(be, gp ? act.g : act.c);
    r.y = floats(be, gp ? y.g : y.c);
    if (gp) r.handoffs = cuda_probe::fragment_handoffs(be) - h0;
    return r;
  }

  // gate / up of kind t, down of kind td.
  void check(DType t, int64_t in, int64_t ff, int64_t out, int64_t n, DType td) {
    SCOPED_TRACE(fmt::format("{} / {} in={} ff={} out={} n={}", dtype_name(t), dtype_name(td), in, ff, out, n));
    Dual x = make_f32({n, in}, randn(n * in, 2.0f)), g = make_f32({in}, randn(in));
    Dual h = output(DType::kF32, {n, in});
    Dual wg = make_weight(t, {ff, in}), wu = make_weight(t, {ff, in}), wd = make_weight(td, {out, ff});
    Dual act = output(DType::kF32, {n, ff}), up = output(DType::kF32, {n, ff});
    Dual y = output(DType::kF32, {n, out}), tmp = output(DType::kF32, {n, out});
    const std::vector<float> y0 = randn(n * out);
    run_ffn(*cpu_, false, x, g, h, wg, wu, wd, act, up, y, tmp, y0);
    cuda_probe::set_fragment_handoff(*gpu_, false);
    const FfnRun built = run_ffn(*gpu_, true, x, g, h, wg, wu, wd, act, up, y, tmp, y0);
    cuda_probe::set_fragment_handoff(*gpu_, true);
    poison(act);
    const FfnRun handed = run_ffn(*gpu_, true, x, g, h, wg, wu, wd, act, up, y, tmp, y0);
    EXPECT_EQ(built.handoffs, 0);
    // (A Q4_0 down projection takes them only for whole 64-value chunks.)
    const bool takes = n == 1 && td != DType::kF16 && (td != DType::kQ4_0 || ff % 64 == 0);
    EXPECT_EQ(handed.handoffs, takes ? 1 : 0);
    EXPECT_EQ(handed.act, built.act);
    EXPECT_EQ(handed.y, built.y);
    // The handoff run's results against the reference (nerr reads the tensors as left by it).
    EXPECT_LT(nerr(act), 2e-5);
    EXPECT_LT(nerr(y), 2e-5);
  }
};

TEST_F(CudaFragsTest, DownTakesTheGluFragmentsBitForBit) {
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    // 10 words of gate / up rows (a block per word); more tokens: no handoff, same results.
    for (int64_t n : {1, 2, 5}) check(t, 256, 320, 96, n, t);
    // 448 words: blocks take several words in turn; down's 14336 columns fit one stage of
    // fragments, 25600 do not (stages copied one after another).
    check(t, 512, 14336, 64, 1, t);
    check(t, 256, 25600, 48, 1, t);
    // Gate / up inputs too wide for one stage of fragments (the producer's word pairs over
    // stages, one word per block).
    check(t, 25600, 64, 48, 1, t);
    // 11 words: a Q4_0 down projection (64-value chunks) builds its own; Q8_0 takes them.
    check(t, 256, 352, 96, 1, t);
    // The other quantized kind downstream: the fragments do not depend on the weights.
    check(t, 256, 320, 96, 1, t == DType::kQ4_0 ? DType::kQ8_0 : DType::kQ4_0);
    // Gate / up rows that are not whole words (down in F16): no fragments written or taken.
    check(t, 256, 208, 96, 1, DType::kF16);
  }
}

TEST_F(CudaFragsTest, NonFiniteInputReachesEveryOutputThroughTheHandoff) {
  // An inf or NaN in x: every GLU output and every residual output after down is inf or NaN
  // (the handed fragments carry it), never a finite value.
  const int64_t in = 256, ff = 320, out = 96;
  for (DType t : {DType::kQ8_0, DType::kQ4_0})
    for (float bad : {std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
      SCOPED_TRACE(fmt::format("{} {}", dtype_name(t), bad));
      std::vector<float> xv = randn(in);
      xv[77] = bad;
      Dual x = make_f32({1, in}, xv), g = make_f32({in}, randn(in));
      Dual h = output(DType::kF32, {1, in});
      Dual wg = make_weight(t, {ff, in}), wu = make_weight(t, {ff, in}), wd = make_weight(t, {out, ff});
      Dual act = output(DType::kF32, {1, ff}), up = output(DType::kF32, {1, ff});
      Dual y = output(DType::kF32, {1, out}), tmp = output(DType::kF32, {1, out});
      const FfnRun r = run_ffn(*gpu_, true, x, g, h, wg, wu, wd, act, up, y, tmp, randn(out));
      EXPECT_EQ(r.handoffs, 1);
      for (float v : r.act) EXPECT_FALSE(std::isfinite(v));
      for (float v : r.y) EXPECT_FALSE(std::isfinite(v));
    }
}

}  // namespace
}  // namespace shoal::test
