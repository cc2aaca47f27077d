// RoPE, the KV cache write and attention (decode with sequence splits, prefill batches, GQA,
// sliding window, softcap; f32 / f16 / Q8_0 caches) on CUDA against the CPU reference backend.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <utility>

#include "backend/cuda/cuda_probe.h"
#include "cuda/cuda_test_util.h"

namespace shoal::test {
namespace {

// Decode attention's cluster plan set for the scope (calls planned from now on); the setting before
// (the backend's choice for its device) comes back at its end.
struct ClusterSetting {
  explicit ClusterSetting(bool on) : before(cuda_probe::set_clusters(on)) {}
  ~ClusterSetting() { cuda_probe::set_clusters(before); }
  const bool before;
};

class CudaAttentionTest : public CudaVsRef {
 protected:
  // Two pairs of caches [rows, width] of type t, NaN but for rows 0..filled-1 (random, written by
  // kv_write on both backends): the op under test's (kc, vc, reference copies too) and the CUDA
  // composition's (kc2, vc2).
  struct Caches {
    Dual kc, vc, kc2, vc2;
  };
  Caches caches(DType t, int64_t rows, int64_t width, int32_t filled) {
    std::vector<uint8_t> nan(*dtype_bytes(t, rows * width), 0xff);
    Caches c{make(t, {rows, width}, nan.data()), make(t, {rows, width}, nan.data()), make(t, {rows, width}, nan.data()),
             make(t, {rows, width}, nan.data())};
    if (filled > 0) {
      std::vector<int32_t> before(static_cast<size_t>(filled));
      std::iota(before.begin(), before.end(), 0);
      Dual k0 = make_f32({filled, width}, randn(filled * width)), v0 = make_f32({filled, width}, randn(filled * width));
      Dual p0 = make_i32(before);
      cpu_->kv_write(c.kc.c, c.vc.c, k0.c, v0.c, p0.c);
      gpu_->kv_write(c.kc.g, c.vc.g, k0.g, v0.g, p0.g);
      gpu_->kv_write(c.kc2.g, c.vc2.g, k0.g, v0.g, p0.g);
    }
    return c;
  }
  // One token's random q / k / v inputs for qkv_attention: x [1, d], the input norm's weight [d],
  // weights of type t ([qw, d], [kw, d], [kw, d]), biases and the q / k norms' weights [head_dim],
  // the token's position; and its f32 outputs: q [1, qw], k and v [1, kw], the normed input h
  // [1, d], two attention outputs out and out2 [1, qw].
  struct QkvInputs {
    Dual x, nw, wq, wk, wv, bq, bk, bv, qn, kn, pos;
    Dual q, k, v, h, out, out2;
    // The q / k / v products into yq, yk, yv on the CUDA (g) or the reference backend, with the
    // biases if `bias`.
    std::array<MatmulOut, 3> products(bool g, Dual& yq, Dual& yk, Dual& yv, bool bias) {
      return {MatmulOut{wq.on(g), yq.on(g), bias ? bq.on(g) : nullptr},
              MatmulOut{wk.on(g), yk.on(g), bias ? bk.on(g) : nullptr},
              MatmulOut{wv.on(g), yv.on(g), bias ? bv.on(g) : nullptr}};
    }
  };
  QkvInputs qkv_inputs(DType t, int64_t d, int64_t qw, int64_t kw, int head_dim, int32_t pos) {
    QkvInputs in;
    in.x = make_f32({1, d}, randn(d));
    in.nw = make_f32({d}, randn(d, 0.5f));
    in.wq = make_weight(t, {qw, d}, 0.05f);
    in.wk = make_weight(t, {kw, d}, 0.05f);
    in.wv = make_weight(t, {kw, d}, 0.05f);
    in.bq = make_f32({qw}, randn(qw));
    in.bk = make_f32({kw}, randn(kw));
    in.bv = make_f32({kw}, randn(kw));
    in.qn = make_f32({head_dim}, randn(head_dim));
    in.kn = make_f32({head_dim}, randn(head_dim));
    in.pos = make_i32({pos});
    in.q = output(DType::kF32, {1, qw});
    in.k = output(DType::kF32, {1, kw});
    in.v = output(DType::kF32, {1, kw});
    in.h = output(DType::kF32, {1, d});
    in.out = output(DType::kF32, {1, qw});
    in.out2 = output(DType::kF32, {1, qw});
    return in;
  }
};

// Positions first, first + 1, ... of n tokens.
std::vector<int32_t> positions(int32_t first, int n) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), first);
  return p;
}

std::vector<float> inv_freq(int rot_dims, double theta) {
  std::vector<float> f(static_cast<size_t>(rot_dims / 2));
  for (int i = 0; i < rot_dims / 2; ++i) f[size_t(i)] = float(std::pow(theta, -2.0 * i / rot_dims));
  return f;
}

TEST_F(CudaAttentionTest, RopeBothLayoutsPartialAndScaled) {
  struct Case {
    int n_heads, head_dim, rot_dims;
    bool interleaved;
    float attn_factor;
  };
  for (const Case& c : {Case{32, 128, 128, false, 1.0f}, Case{8, 64, 64, true, 1.0f}, Case{4, 80, 32, false, 1.0f},
                        Case{3, 96, 48, true, 1.2f}, Case{2, 256, 64, false, 1.0f}}) {
    SCOPED_TRACE(
        fmt::format("heads {} dim {} rot {} interleaved {}", c.n_heads, c.head_dim, c.rot_dims, c.interleaved));
    const int64_t n = 5, width = int64_t(c.n_heads) * c.head_dim;
    Dual x = make_f32({n, width}, randn(n * width));
    Dual pos = make_i32({0, 1, 17, 4095, 131071});
    Dual freq = make_f32({c.rot_dims / 2}, inv_freq(c.rot_dims, 500000.0));
    RopeSpec spec{c.n_heads, c.head_dim, c.rot_dims, c.interleaved, c.attn_factor};
    cpu_->rope(x.c, pos.c, freq.c, spec);
    gpu_->rope(x.g, pos.g, freq.g, spec);
    EXPECT_LT(nerr(x), 1e-6);
  }
}

TEST_F(CudaAttentionTest, KvWriteIsBitExact) {
  for (DType t : {DType::kF32, DType::kF16, DType::kQ8_0}) {
    SCOPED_TRACE(dtype_name(t));
    const int64_t n_ctx = 64, width = 256, n = 3;
    std::vector<uint8_t> zeros(*dtype_bytes(t, n_ctx * width), 0);
    Dual kc = make(t, {n_ctx, width}, zeros.data()), vc = make(t, {n_ctx, width}, zeros.data());
    Dual k = make_f32({n, width}, randn(n * width, 2.0f)), v = make_f32({n, width}, randn(n * width));
    Dual pos = make_i32({7, 8, 63});
    cpu_->kv_write(kc.c, vc.c, k.c, v.c, pos.c);
    gpu_->kv_write(kc.g, vc.g, k.g, v.g, pos.g);
    EXPECT_EQ(bytes_of(*cpu_, kc.c), bytes_of(*gpu_, kc.g));
    EXPECT_EQ(bytes_of(*cpu_, vc.c), bytes_of(*gpu_, vc.g));
  }
}

// Values of a cache tensor (f32, f16 or Q8_0 rows) as floats.
std::vector<float> cache_values(DType t, const std::vector<uint8_t>& bytes, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  const Status s = dequantize(t, bytes.data(), v.data(), n);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return v;
}

double rel_err(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    num += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num / den);
}

TEST_F(CudaAttentionTest, FusedRopeKvWriteMatchesTheComposition) {
  // The reference composes rms_norm (q_norm, k_norm), rope of q and k, and kv_write.
  struct Case {
    int n_heads, n_kv_heads, head_dim, rot_dims;
    bool interleaved, norms;
    DType cache;
    int64_t n = 4;  // tokens
  };
  for (const Case& c : {Case{32, 8, 128, 128, false, false, DType::kF16}, Case{16, 8, 128, 128, false, true, DType::kF16},
                        Case{12, 4, 128, 64, true, true, DType::kF16, 37} /* a prefill: heads in two groups of 8 */,
                        Case{12, 2, 128, 128, false, true, DType::kQ8_0, 37} /* 14 heads: the second group partial */,
                        Case{8, 2, 64, 64, true, true, DType::kF32}, Case{4, 4, 96, 32, false, false, DType::kF32},
                        Case{6, 2, 256, 256, false, true, DType::kQ8_0}, Case{3, 1, 80, 80, true, false, DType::kF16},
                        Case{4, 2, 80, 80, false, true, DType::kQ8_0} /* composed: 80 % 32 != 0 */}) {
    SCOPED_TRACE(fmt::format("heads {}/{} dim {} rot {} interleaved {} norms {} cache {} tokens {}", c.n_heads,
                             c.n_kv_heads, c.head_dim, c.rot_dims, c.interleaved, c.norms, dtype_name(c.cache), c.n));
    const int64_t n = c.n, n_ctx = n == 4 ? 32 : 64, qw = int64_t(c.n_heads) * c.head_dim,
                  kw = int64_t(c.n_kv_heads) * c.head_dim;
    Dual q = make_f32({n, qw}, randn(n * qw, 3.0f)), k = make_f32({n, kw}, randn(n * kw, 3.0f));
    Dual v = make_f32({n, kw}, randn(n * kw));
    Dual qn = make_f32({c.head_dim}, randn(c.head_dim)), kn = make_f32({c.head_dim}, randn(c.head_dim));
    std::vector<int32_t> pv = {3, 4, 30, 31};
    if (n != 4) {
      pv.resize(size_t(n));
      for (int64_t i = 0; i < n; ++i) pv[size_t(i)] = int32_t(20 + i);
    }
    Dual pos = make_i32(pv);
    Dual freq = make_f32({c.rot_dims / 2}, inv_freq(c.rot_dims, 1000000.0));
    std::vector<uint8_t> zeros(*dtype_bytes(c.cache, n_ctx * kw), 0);
    Dual kc = make(c.cache, {n_ctx, kw}, zeros.data()), vc = make(c.cache, {n_ctx, kw}, zeros.data());
    const RopeSpec spec{c.n_heads, c.head_dim, c.rot_dims, c.interleaved, 1.0f};
    for (Backend* b : {cpu_.get(), gpu_.get()}) {
      const bool g = b == gpu_.get();
      b->rope_kv_write(g ? q.g : q.c, g ? k.g : k.c, g ? v.g : v.c, c.norms ? (g ? &qn.g : &qn.c) : nullptr,
                       c.norms ? (g ? &kn.g : &kn.c) : nullptr, 1e-6f, g ? pos.g : pos.c, g ? freq.g : freq.c, spec,
                       c.n_kv_heads, g ? kc.g : kc.c, g ? vc.g : vc.c);
    }
    EXPECT_LT(nerr(q), 2e-6);
    EXPECT_LT(nerr(k), 2e-6);
    const double tol = c.cache == DType::kF32 ? 2e-6 : c.cache == DType::kF16 ? 1e-4 : 2e-3;
    for (Dual* cache : {&kc, &vc}) {
      const auto want = cache_values(c.cache, bytes_of(*cpu_, cache->c), n_ctx * kw);
      const auto got = cache_values(c.cache, bytes_of(*gpu_, cache->g), n_ctx * kw);
      EXPECT_LT(rel_err(got, want), tol);
    }
  }
}

TEST_F(CudaAttentionTest, RopeKvAttentionMatchesTheComposition) {
  // The reference composes rope_kv_write and attention; CUDA runs the prologue inside the decode
  // attention kernel (f16 or Q8_0 cache, head_dim 64 / 128, up to 8 tokens), else composes. The step's
  // rows land in a tile loaded before the PDL wait (cluster of 8 splits), in a later tile loaded
  // from the cache (2000 in a cluster's split of 256 keys from 1792, planned for 1792 keys: its
  // tile 3; 8000 in one from 7936 with the combine: its tile 1), or, with positions that are
  // not contiguous, over rows loaded first; or in a split of 65..128 keys (both 64-key tiles
  // loaded first, read in one pass: the step's rows in tile 1, or across both, with a window, or
  // in 2 row groups). Caches are NaN except the rows written before the call.
  struct Case {
    int n_heads, n_kv_heads, head_dim, rot_dims;
    bool interleaved, norms;
    int window;
    DType cache;
    int64_t n_ctx;
    std::vector<int32_t> pos;
    float attn_factor = 1.0f;
    int64_t planned = 0;  // keys announced by plan_attention_keys (0: none, a plan for the cache)
    bool fused = true;    // (f16 / Q8_0 caches) the prologue in the decode kernel, else composed
  };
  std::vector<Case> cases = {
      {16, 8, 128, 128, false, true, 0, DType::kF16, 1024, {576}},              // Qwen3-like
      {32, 8, 128, 128, false, false, 0, DType::kF16, 1024, {0}},               // first token
      {12, 4, 64, 32, true, true, 64, DType::kF16, 512, {511}},                 // partial, window, last row
      {32, 8, 128, 128, false, true, 0, DType::kF16, 512, {100, 101, 102, 103, 104}},  // 2 row groups
      {8, 8, 128, 128, false, true, 0, DType::kF16, 2048, {2000, 2001}, 1.0f, 1792},  // a later tile
      {16, 8, 128, 64, false, true, 0, DType::kF16, 256, {40, 45, 60}},          // not contiguous
      {8, 8, 128, 128, false, true, 0, DType::kF16, 8192, {8000, 8001}},         // tile 1 of 2 stages
      {12, 4, 64, 64, false, true, 0, DType::kF16, 512, {200, 201, 202, 203, 204, 205}},  // a token in 2 row groups
      {32, 8, 128, 128, false, true, 0, DType::kF16, 1024, {300, 301, 302, 303, 304, 305, 306, 307}},  // 8 tokens
      {16, 8, 128, 128, false, true, 0, DType::kF16, 16, {10}, 1.2f},            // one split, YaRN factor
      {32, 8, 128, 128, false, true, 0, DType::kF16, 1024, {630}},              // 2-tile splits: its tile 1
      {16, 8, 128, 128, false, true, 0, DType::kF16, 1024, {598, 600, 631}},    // not contiguous, 2-tile splits
      {32, 8, 128, 128, false, true, 0, DType::kF16, 1024, {639, 640}},         // rows 63 and 64 of a split
      {16, 8, 128, 128, false, true, 640, DType::kF16, 1024, {699, 700}},       // window, 2-tile splits
      {32, 8, 128, 128, false, true, 0, DType::kF16, 1024, {630, 631, 632, 633, 634, 635, 636, 637}},  // 2 row groups
      {16, 8, 128, 128, false, true, 0, DType::kF16, 4096, {700}},              // the combine (plan for the cache)
      {16, 8, 128, 128, false, true, 0, DType::kF16, 4096, {700}, 1.0f, 701},   // a cluster in a large cache
      {32, 8, 128, 128, false, true, 0, DType::kF16, 4096, {1790, 1791}, 1.0f, 1792},  // a cluster, its most keys
      {32, 8, 128, 128, false, true, 0, DType::kF16, 1024, positions(496, 16), 1.0f, 0, false},  // 16 tokens: composed
      {8, 8, 128, 128, false, true, 0, DType::kF32, 256, {77}},                  // composed
  };
  // Q8_0 caches: every f16 case again, the step's rows quantized in the prologue (as kv_write
  // does) into the cache and the staged rows.
  for (size_t i = 0, n = cases.size(); i < n; ++i)
    if (cases[i].cache == DType::kF16) {
      cases.push_back(cases[i]);
      cases.back().cache = DType::kQ8_0;
    }
  for (const Case& c : cases) {
    const int64_t n = int64_t(c.pos.size()), qw = int64_t(c.n_heads) * c.head_dim,
                  kw = int64_t(c.n_kv_heads) * c.head_dim;
    SCOPED_TRACE(fmt::format("heads {}/{} dim {} rot {} norms {} window {} cache {} pos {}..{} n {}", c.n_heads,
                             c.n_kv_heads, c.head_dim, c.rot_dims, c.norms, c.window, dtype_name(c.cache), c.pos[0],
                             c.pos.back(), n));
    std::vector<uint8_t> nan(*dtype_bytes(c.cache, c.n_ctx * kw), 0xff);
    Dual kc = make(c.cache, {c.n_ctx, kw}, nan.data()), vc = make(c.cache, {c.n_ctx, kw}, nan.data());
    const int32_t filled = c.pos.back();  // rows 0 .. last - 1 written before (the step's overwritten)
    if (filled > 0) {
      std::vector<int32_t> before(static_cast<size_t>(filled));
      std::iota(before.begin(), before.end(), 0);
      Dual k0 = make_f32({filled, kw}, randn(filled * kw)), v0 = make_f32({filled, kw}, randn(filled * kw));
      Dual p0 = make_i32(before);
      cpu_->kv_write(kc.c, vc.c, k0.c, v0.c, p0.c);
      gpu_->kv_write(kc.g, vc.g, k0.g, v0.g, p0.g);
    }
    const std::vector<float> q_raw = randn(n * qw, 2.0f);
    Dual q = make_f32({n, qw}, q_raw), k = make_f32({n, kw}, randn(n * kw, 2.0f));
    Dual v = make_f32({n, kw}, randn(n * kw));
    Dual qn = make_f32({c.head_dim}, randn(c.head_dim)), kn = make_f32({c.head_dim}, randn(c.head_dim));
    Dual pos = make_i32(c.pos);
    Dual freq = make_f32({c.rot_dims / 2}, inv_freq(c.rot_dims, 1000000.0));
    Dual out = output(DType::kF32, {n, qw});
    const RopeSpec rs{c.n_heads, c.head_dim, c.rot_dims, c.interleaved, c.attn_factor};
    const AttentionSpec as{c.n_heads, c.n_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim)), c.window, 0.0f};
    gpu_->plan_attention_keys(c.planned, int(n));
    for (Backend* b : {cpu_.get(), gpu_.get()}) {
      const bool g = b == gpu_.get();
      b->rope_kv_attention(g ? q.g : q.c, g ? k.g : k.c, g ? v.g : v.c, c.norms ? (g ? &qn.g : &qn.c) : nullptr,
                           c.norms ? (g ? &kn.g : &kn.c) : nullptr, 1e-6f, g ? pos.g : pos.c, g ? freq.g : freq.c, rs,
                           g ? kc.g : kc.c, g ? vc.g : vc.c, as, g ? out.g : out.c);
    }
    // Q8_0: the GPU norms and rotates k in f32, the reference in part in double, so a quantized
    // value of the step's k rows may round to the next integer (1 / 127 of its block's largest):
    // ~3e-4 on a context of 11 keys. A wrong or misplaced row gives ~1e-2 and more.
    EXPECT_LT(nerr(out), c.cache == DType::kQ8_0 ? 2e-3 : 1e-4);
    // f16 and Q8_0 caches take the fused kernel, which reads q and never writes it back (the
    // composition rotates it in place): a fallback to the composition would leave q rotated here.
    const bool fused = c.cache != DType::kF32 && c.fused;
    const std::vector<uint8_t> got = bytes_of(*gpu_, q.g);
    ASSERT_EQ(got.size(), q_raw.size() * sizeof(float));
    EXPECT_EQ(fused, std::memcmp(got.data(), q_raw.data(), got.size()) == 0)
        << (fused ? "q was written: not the fused kernel" : "q left raw: not the composition");
    // The caches (the step's rows included) equal the reference's.
    const int64_t rows = c.pos.back() + 1;
    for (Dual* cache : {&kc, &vc}) {
      const auto want = cache_values(c.cache, bytes_of(*cpu_, cache->c), rows * kw);
      const auto got = cache_values(c.cache, bytes_of(*gpu_, cache->g), rows * kw);
      EXPECT_LT(rel_err(got, want), 1e-3);
    }
  }
}

TEST_F(CudaAttentionTest, RopeKvAttentionRightAfterAFusedOneOnItsCachesComposes) {
  // The fused kernel loads the caches' older rows before its PDL wait, so it never runs right
  // after a kernel that writes them: a second call straight after a fused one on the same caches
  // (the next position) composes, as after kv_write. Both against the reference.
  const int nh = 32, nkv = 8, hd = 128;
  const int64_t qw = nh * hd, kw = nkv * hd;
  Caches c = caches(DType::kF16, 1024, kw, 300);
  Dual freq = make_f32({hd / 2}, inv_freq(hd, 500000.0));
  std::vector<float> q_raw[2];
  std::vector<Dual> q, k, v, pos, out;
  for (int i = 0; i < 2; ++i) {  // (every upload first: the two GPU calls follow each other)
    q_raw[i] = randn(qw, 2.0f);
    q.push_back(make_f32({1, qw}, q_raw[i]));
    k.push_back(make_f32({1, kw}, randn(kw, 2.0f)));
    v.push_back(make_f32({1, kw}, randn(kw)));
    pos.push_back(make_i32({300 + i}));
    out.push_back(output(DType::kF32, {1, qw}));
  }
  const RopeSpec rs{nh, hd, hd, false, 1.0f};
  const AttentionSpec as{nh, nkv, hd, 1.0f / std::sqrt(float(hd)), 0, 0.0f};
  for (int i = 0; i < 2; ++i)
    for (Backend* b : {cpu_.get(), gpu_.get()}) {
      const bool g = b == gpu_.get();
      auto on = [g](Dual& d) -> Tensor& { return g ? d.g : d.c; };
      b->rope_kv_attention(on(q[i]), on(k[i]), on(v[i]), nullptr, nullptr, 1e-6f, on(pos[i]), on(freq), rs, on(c.kc),
                           on(c.vc), as, on(out[i]));
    }
  for (int i = 0; i < 2; ++i) {
    EXPECT_LT(nerr(out[i]), 1e-4) << "call " << i;
    const std::vector<uint8_t> got = bytes_of(*gpu_, q[i].g);
    ASSERT_EQ(got.size(), q_raw[i].size() * sizeof(float));
    EXPECT_EQ(i == 0, std::memcmp(got.data(), q_raw[i].data(), got.size()) == 0)
        << "call " << i << (i == 0 ? ": q was written, not the fused kernel" : ": q left raw, not composed");
  }
}

TEST_F(CudaAttentionTest, QkvAttentionRopeAndCacheWriteInTheProducts) {
  // qkv_attention: the q / k / v products, RoPE, the cache write and attention. CUDA fuses RoPE
  // and the cache write into the GEMV's epilogue for one token of plain weights, interleaved
  // pairs, no q / k norms and f16 caches (every GEMV row shape: one-vector, two-vector, default
  // and wide rows), else composes. Checked against the reference backend's composition, and
  // bit for bit against the CUDA ops composed (matmuls, rope_kv_write, attention): q, k, v, both
  // caches and the output. Caches are NaN except the rows written before the call.
  struct Case {
    int n_heads, n_kv_heads, head_dim, rot_dims;
    bool interleaved, qk_norms;
    DType weight;
    int64_t d_model;
    bool bias, input_norm;
    int64_t n_ctx;
    int32_t pos;
    bool fused;
  };
  const std::vector<Case> cases = {
      {32, 8, 128, 128, true, false, DType::kF16, 4096, false, true, 1024, 576, true},  // Llama-3-8B: wide rows
      {12, 4, 64, 32, true, false, DType::kBF16, 768, true, true, 512, 0, true},      // partial, first token, 1 vector
      {8, 2, 128, 128, true, false, DType::kF32, 1024, true, false, 256, 255, true},   // last row, 2 vectors
      {16, 4, 64, 64, true, false, DType::kF16, 3072, false, true, 300, 77, true},     // default rows
      {32, 8, 128, 128, false, false, DType::kF16, 4096, false, true, 1024, 576, false},  // rotate_half: composed
      {16, 8, 128, 128, true, true, DType::kF16, 2048, false, true, 1024, 100, false},    // q / k norms: composed
      {32, 8, 128, 128, true, false, DType::kQ8_0, 4096, false, true, 1024, 576, false},  // quantized: split K
  };
  for (const Case& c : cases) {
    const int64_t qw = int64_t(c.n_heads) * c.head_dim, kw = int64_t(c.n_kv_heads) * c.head_dim, d = c.d_model;
    SCOPED_TRACE(fmt::format("heads {}/{} dim {} rot {} interleaved {} norms {} {} d_model {} bias {} pos {}", c.n_heads,
                             c.n_kv_heads, c.head_dim, c.rot_dims, c.interleaved, c.qk_norms, dtype_name(c.weight), d,
                             c.bias, c.pos));
    // Two sets of caches: the op under test (kc, vc) and the CUDA composition (kc2, vc2).
    auto [kc, vc, kc2, vc2] = caches(DType::kF16, c.n_ctx, kw, c.pos);
    QkvInputs in = qkv_inputs(c.weight, d, qw, kw, c.head_dim, c.pos);
    Dual &x = in.x, &nw = in.nw, &qn = in.qn, &kn = in.kn, &pos = in.pos;
    Dual &q = in.q, &k = in.k, &v = in.v, &h = in.h, &out = in.out, &out2 = in.out2;
    Dual freq = make_f32({c.rot_dims / 2}, inv_freq(c.rot_dims, 500000.0));
    Dual q2 = output(DType::kF32, {1, qw}), k2 = output(DType::kF32, {1, kw}), v2 = output(DType::kF32, {1, kw});
    const RopeSpec rs{c.n_heads, c.head_dim, c.rot_dims, c.interleaved, 1.0f};
    const AttentionSpec as{c.n_heads, c.n_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim)), 0, 0.0f};
    const int64_t fused0 = cuda_probe::rope_epilogue_launches(*gpu_);
    for (Backend* b : {cpu_.get(), gpu_.get()}) {
      const bool g = b == gpu_.get();
      const auto qkv = in.products(g, q, k, v, c.bias);
      const InputNorm norm{c.input_norm ? (g ? &nw.g : &nw.c) : nullptr, 1e-5f, g ? &h.g : &h.c};
      b->qkv_attention(g ? x.g : x.c, norm, qkv, c.qk_norms ? (g ? &qn.g : &qn.c) : nullptr,
                       c.qk_norms ? (g ? &kn.g : &kn.c) : nullptr, 1e-6f, g ? pos.g : pos.c, g ? freq.g : freq.c, rs,
                       g ? kc.g : kc.c, g ? vc.g : vc.c, as, g ? out.g : out.c);
    }
    EXPECT_EQ(cuda_probe::rope_epilogue_launches(*gpu_) - fused0, c.fused ? 1 : 0);
    // The step's k / v rows are f16 roundings of f32 values that differ from the reference's in
    // their last bits, so an element may land one f16 step (2^-11 relative) away; the output is
    // held to that step (1.06e-4 was seen against 1e-4, one key of 256, H200).
    EXPECT_LT(nerr(out), 5e-4);
    const int64_t rows = c.pos + 1;
    for (Dual* cache : {&kc, &vc}) {
      const auto want = cache_values(DType::kF16, bytes_of(*cpu_, cache->c), rows * kw);
      const auto got = cache_values(DType::kF16, bytes_of(*gpu_, cache->g), rows * kw);
      EXPECT_LT(rel_err(got, want), 1e-3);
    }
    if (!c.fused) continue;
    // The same values as the CUDA ops one after another.
    {
      const auto qkv = in.products(true, q2, k2, v2, c.bias);
      gpu_->matmuls(x.g, InputNorm{c.input_norm ? &nw.g : nullptr, 1e-5f, &h.g}, qkv);
      gpu_->rope_kv_write(q2.g, k2.g, v2.g, nullptr, nullptr, 1e-6f, pos.g, freq.g, rs, c.n_kv_heads, kc2.g, vc2.g);
      gpu_->attention(q2.g, kc2.g, vc2.g, pos.g, as, out2.g);
    }
    const std::pair<Dual*, Dual*> same[] = {{&q, &q2}, {&k, &k2}, {&v, &v2}, {&kc, &kc2}, {&vc, &vc2}, {&out, &out2}};
    for (const auto& [a, b] : same) EXPECT_EQ(bytes_of(*gpu_, a->g), bytes_of(*gpu_, b->g));
  }
}

TEST_F(CudaAttentionTest, QkvAttentionSplitKProductsForOneQuantizedToken) {
  // One token of Q8_0 q / k / v weights: the GEMV splits K in two column halves and
  // rope_kv_attention sums the partials and applies the input norm's 1 / rms as it reads q, k
  // and v (qkv_split_attention), where rows are a multiple of 16 chunks (halves of a multiple of
  // 8), there is no bias and the fused attention applies; else (and for Q4_0 weights) the ops
  // compose.
  // Against the reference backend's composition (out and both caches; caches NaN but the rows
  // written before), and against the same call with the split off.
  struct Case {
    DType weight, cache;
    int n_heads, n_kv_heads, head_dim;
    bool interleaved, qk_norms, bias, input_norm;
    int64_t d_model;
    int32_t pos;
    bool split;
  };
  const std::vector<Case> cases = {
      {DType::kQ8_0, DType::kF16, 32, 8, 128, true, false, false, true, 4096, 576, true},     // Llama-3-8B
      {DType::kQ4_0, DType::kF16, 32, 8, 128, true, false, false, true, 4096, 576, false},    // Q4_0: composed
      {DType::kQ8_0, DType::kQ8_0, 16, 8, 128, false, true, false, true, 2048, 100, true},   // Qwen3-like
      {DType::kQ8_0, DType::kQ8_0, 16, 8, 128, false, true, false, true, 2048, 0, true},     // first token
      {DType::kQ8_0, DType::kF16, 12, 2, 64, false, false, false, true, 512, 1023, true},    // 8 chunks a half, last row
      {DType::kQ8_0, DType::kF16, 12, 2, 64, false, false, true, true, 1024, 255, false},    // bias (Qwen2): composed
      {DType::kQ8_0, DType::kF16, 12, 2, 64, true, false, false, false, 1024, 37, true},     // no input norm
      {DType::kQ8_0, DType::kF32, 32, 8, 128, true, false, false, true, 4096, 576, false},   // f32 cache: composed
      {DType::kQ8_0, DType::kF16, 12, 4, 128, true, false, false, true, 1280, 9, false},     // 40 chunks: composed
  };
  for (const Case& c : cases) {
    const int64_t qw = int64_t(c.n_heads) * c.head_dim, kw = int64_t(c.n_kv_heads) * c.head_dim, d = c.d_model;
    SCOPED_TRACE(fmt::format("{} weights, {} cache, heads {}/{} dim {} norms {} bias {} input norm {} d_model {} pos {}",
                             dtype_name(c.weight), dtype_name(c.cache), c.n_heads, c.n_kv_heads, c.head_dim,
                             c.qk_norms, c.bias, c.input_norm, d, c.pos));
    const int64_t n_ctx = 1024;
    auto [kc, vc, kc2, vc2] = caches(c.cache, n_ctx, kw, c.pos);
    QkvInputs in = qkv_inputs(c.weight, d, qw, kw, c.head_dim, c.pos);
    Dual &x = in.x, &nw = in.nw, &qn = in.qn, &kn = in.kn, &pos = in.pos;
    Dual &q = in.q, &k = in.k, &v = in.v, &h = in.h, &out = in.out, &out2 = in.out2;
    Dual freq = make_f32({c.head_dim / 2}, inv_freq(c.head_dim, 1000000.0));
    const RopeSpec rs{c.n_heads, c.head_dim, c.head_dim, c.interleaved, 1.0f};
    const AttentionSpec as{c.n_heads, c.n_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim)), 0, 0.0f};
    auto call = [&](Backend& b, Dual& kcache, Dual& vcache, Dual& o) {
      const bool g = &b == gpu_.get();
      const auto qkv = in.products(g, q, k, v, c.bias);
      const InputNorm norm{c.input_norm ? nw.on(g) : nullptr, 1e-5f, h.on(g)};
      b.qkv_attention(*x.on(g), norm, qkv, c.qk_norms ? qn.on(g) : nullptr, c.qk_norms ? kn.on(g) : nullptr, 1e-6f,
                      *pos.on(g), *freq.on(g), rs, *kcache.on(g), *vcache.on(g), as, *o.on(g));
    };
    const int64_t split0 = cuda_probe::qkv_split_launches(*gpu_);
    call(*cpu_, kc, vc, out);
    call(*gpu_, kc, vc, out);
    EXPECT_EQ(cuda_probe::qkv_split_launches(*gpu_) - split0, c.split ? 1 : 0);
    // (As QkvAttentionRopeAndCacheWriteInTheProducts: the step's k / v rows may land one f16 or
    // Q8_0 step away from the reference's.)
    const bool q8 = c.cache == DType::kQ8_0;
    EXPECT_LT(nerr(out), q8 ? 2e-3 : 5e-4);
    // The step's own rows (the op's result; the rows before it were written by kv_write).
    const int64_t rows = c.pos + 1;
    auto step_row = [&](Backend& b, const Tensor& t) {
      const auto all = cache_values(c.cache, bytes_of(b, t), rows * kw);
      return std::vector<float>(all.end() - kw, all.end());
    };
    for (Dual* cache : {&kc, &vc})
      EXPECT_LT(rel_err(step_row(*gpu_, cache->g), step_row(*cpu_, cache->c)), q8 ? 1e-2 : 1e-3);
    // The split off: the same call composes (matmuls, rope_kv_attention) to within the caches'
    // rounding of the step's rows.
    cuda_probe::set_qkv_split(*gpu_, false);
    call(*gpu_, kc2, vc2, out2);
    cuda_probe::set_qkv_split(*gpu_, true);
    EXPECT_EQ(cuda_probe::qkv_split_launches(*gpu_) - split0, c.split ? 1 : 0);
    const auto a = floats(*gpu_, out.g), b = floats(*gpu_, out2.g);
    EXPECT_LT(rel_err(a, b), q8 ? 2e-3 : 5e-4);
    EXPECT_LT(rel_err(step_row(*gpu_, kc.g), step_row(*gpu_, kc2.g)), q8 ? 1e-2 : 1e-3);
    EXPECT_LT(rel_err(step_row(*gpu_, vc.g), step_row(*gpu_, vc2.g)), q8 ? 1e-2 : 1e-3);
  }
}

TEST_F(CudaAttentionTest, PrefillQkvPartsSummedByTheRopeKernel) {
  // qkv_attention for a prefill (more than 8 tokens) whose q / k / v weights lie back to back
  // (views of one allocation, as the loader allocates them): one GEMM, then the RoPE + KV-write
  // kernel sums q, k and v from its partial products. Against the reference backend's
  // composition, and bit for bit against the CUDA ops composed (matmuls, rope_kv_write,
  // attention): q, k, v, both caches and the output. A gap between the weights composes.
  struct Case {
    int n_heads, n_kv_heads, head_dim, rot_dims;
    bool interleaved, qk_norms;
    DType weight, cache;
    int64_t d_model;
    bool bias, gap;
    int32_t pos0;
    int64_t n = 40;  // tokens
  };
  const std::vector<Case> cases = {
      {32, 8, 128, 128, true, false, DType::kF16, DType::kF16, 512, false, false, 0},     // Llama
      {32, 8, 128, 128, true, false, DType::kF16, DType::kF16, 512, true, false, 30, 9},  // the fewest tokens
      {16, 8, 128, 128, false, true, DType::kBF16, DType::kF16, 384, true, false, 100},  // Qwen3 + bias, later chunk
      {12, 4, 64, 32, true, false, DType::kF16, DType::kQ8_0, 256, true, false, 7},      // partial, Q8_0 cache
      {8, 8, 80, 80, false, false, DType::kF16, DType::kF32, 320, false, false, 0},      // head_dim 80, f32 cache
      {32, 8, 128, 128, true, false, DType::kF16, DType::kF16, 512, false, true, 0},     // gap: composed
  };
  for (const Case& c : cases) {
    const int64_t qw = int64_t(c.n_heads) * c.head_dim, kw = int64_t(c.n_kv_heads) * c.head_dim, d = c.d_model;
    const int64_t n = c.n, n_ctx = c.pos0 + n + 8;
    SCOPED_TRACE(fmt::format("heads {}/{} dim {} rot {} interleaved {} norms {} {} cache {} bias {} gap {} n {}",
                             c.n_heads, c.n_kv_heads, c.head_dim, c.rot_dims, c.interleaved, c.qk_norms,
                             dtype_name(c.weight), dtype_name(c.cache), c.bias, c.gap, c.n));
    auto [kc, vc, kc2, vc2] = caches(c.cache, n_ctx, kw, c.pos0);
    Dual all = make_weight(c.weight, {qw + 2 * kw + 1, d}, 0.05f);
    const int64_t row_bytes = int64_t(*dtype_bytes(c.weight, d));
    const int64_t first[3] = {0, qw, qw + kw + (c.gap ? 1 : 0)}, rows[3] = {qw, kw, kw};
    Dual w[3];
    for (int i = 0; i < 3; ++i) {
      w[i].c = Tensor::make(static_cast<uint8_t*>(all.c.data) + first[i] * row_bytes, c.weight, {rows[i], d});
      w[i].g = Tensor::make(static_cast<uint8_t*>(all.g.data) + first[i] * row_bytes, c.weight, {rows[i], d});
    }
    Dual x = make_f32({n, d}, randn(n * d)), nw = make_f32({d}, randn(d, 0.5f));
    Dual bq = make_f32({qw}, randn(qw)), bk = make_f32({kw}, randn(kw)), bv = make_f32({kw}, randn(kw));
    Dual qn = make_f32({c.head_dim}, randn(c.head_dim)), kn = make_f32({c.head_dim}, randn(c.head_dim));
    std::vector<int32_t> at(static_cast<size_t>(n));
    std::iota(at.begin(), at.end(), c.pos0);
    Dual pos = make_i32(at);
    Dual freq = make_f32({c.rot_dims / 2}, inv_freq(c.rot_dims, 500000.0));
    Dual q = output(DType::kF32, {n, qw}), k = output(DType::kF32, {n, kw}), v = output(DType::kF32, {n, kw});
    Dual q2 = output(DType::kF32, {n, qw}), k2 = output(DType::kF32, {n, kw}), v2 = output(DType::kF32, {n, kw});
    Dual h = output(DType::kF32, {n, d}), out = output(DType::kF32, {n, qw}), out2 = output(DType::kF32, {n, qw});
    const RopeSpec rs{c.n_heads, c.head_dim, c.rot_dims, c.interleaved, 1.0f};
    const AttentionSpec as{c.n_heads, c.n_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim)), 0, 0.0f};
    auto products = [&](bool g, Dual& yq, Dual& yk, Dual& yv) {
      return std::array<MatmulOut, 3>{MatmulOut{w[0].on(g), yq.on(g), c.bias ? bq.on(g) : nullptr},
                                      MatmulOut{w[1].on(g), yk.on(g), c.bias ? bk.on(g) : nullptr},
                                      MatmulOut{w[2].on(g), yv.on(g), c.bias ? bv.on(g) : nullptr}};
    };
    const Tensor* qnorm[2] = {c.qk_norms ? &qn.c : nullptr, c.qk_norms ? &qn.g : nullptr};
    const Tensor* knorm[2] = {c.qk_norms ? &kn.c : nullptr, c.qk_norms ? &kn.g : nullptr};
    const int64_t fused0 = cuda_probe::qkv_part_ropes(*gpu_);
    for (Backend* b : {cpu_.get(), gpu_.get()}) {
      const bool g = b == gpu_.get();
      const auto qkv = products(g, q, k, v);
      b->qkv_attention(g ? x.g : x.c, InputNorm{g ? &nw.g : &nw.c, 1e-5f, g ? &h.g : &h.c}, qkv, qnorm[g], knorm[g],
                       1e-6f, g ? pos.g : pos.c, g ? freq.g : freq.c, rs, g ? kc.g : kc.c, g ? vc.g : vc.c, as,
                       g ? out.g : out.c);
    }
    EXPECT_EQ(cuda_probe::qkv_part_ropes(*gpu_) - fused0, c.gap ? 0 : 1);
    EXPECT_LT(nerr(out), 5e-4);
    const int64_t filled = c.pos0 + n;
    for (Dual* cache : {&kc, &vc}) {
      const auto want = cache_values(c.cache, bytes_of(*cpu_, cache->c), filled * kw);
      const auto got = cache_values(c.cache, bytes_of(*gpu_, cache->g), filled * kw);
      EXPECT_LT(rel_err(got, want), c.cache == DType::kQ8_0 ? 1e-2 : 1e-3);
    }
    {
      const auto qkv = products(true, q2, k2, v2);
      gpu_->matmuls(x.g, InputNorm{&nw.g, 1e-5f, &h.g}, qkv);
      gpu_->rope_kv_write(q2.g, k2.g, v2.g, qnorm[1], knorm[1], 1e-6f, pos.g, freq.g, rs, c.n_kv_heads, kc2.g, vc2.g);
      gpu_->attention(q2.g, kc2.g, vc2.g, pos.g, as, out2.g);
    }
    const std::pair<Dual*, Dual*> same[] = {{&q, &q2}, {&k, &k2}, {&v, &v2}, {&kc, &kc2}, {&vc, &vc2}, {&out, &out2}};
    for (const auto& [a, b] : same) EXPECT_EQ(bytes_of(*gpu_, a->g), bytes_of(*gpu_, b->g));
  }
}

struct AttnCase {
  int n_heads, n_kv_heads, head_dim;
  int64_t n_ctx;
  std::vector<int32_t> pos;  // query positions (increasing)
  int window = 0;
  float softcap = 0.0f;
  int64_t planned = 0;  // keys announced by plan_attention_keys (0: none, a plan for the cache)
  // v's values times v_scale; with v_spread also 2^((column / 32) % 9 - 4) 2^(row % 5 - 2): blocks
  // of 32 values and keys of different magnitudes (Q8_0 caches: scales 2^-6..2^6 apart).
  float v_scale = 1.0f;
  bool v_spread = false;
  bool reference = true;  // compare with the CPU reference (false: the CUDA output only finite)
};

class CudaAttentionCases : public CudaVsRef {
 protected:
  // step_write: the rows of c.pos (consecutive) are written by kv_write right before attention,
  // as in a decode step (decode attention then loads the older rows before its PDL wait); else
  // every row is written first, with copies between the write and attention.
  void run(const AttnCase& c, DType cache, bool step_write = false) {
    SCOPED_TRACE(fmt::format("{} heads {}/{} dim {} ctx {} n {} window {} softcap {} step write {}", dtype_name(cache),
                             c.n_heads, c.n_kv_heads, c.head_dim, c.n_ctx, c.pos.size(), c.window, c.softcap,
                             step_write));
    const int64_t n = int64_t(c.pos.size()), kvw = int64_t(c.n_kv_heads) * c.head_dim;
    const int64_t qw = int64_t(c.n_heads) * c.head_dim;
    // Fill the cache rows up to the last position through kv_write on both backends (poison after).
    std::vector<uint8_t> nan(*dtype_bytes(cache, c.n_ctx * kvw), 0xff);
    Dual kc = make(cache, {c.n_ctx, kvw}, nan.data()), vc = make(cache, {c.n_ctx, kvw}, nan.data());
    const int64_t filled = c.pos.back() + 1, before = step_write ? c.pos.front() : filled;
    ASSERT_TRUE(!step_write || filled - before == n) << "step_write needs consecutive positions";
    const auto write = [&](int64_t first, int64_t rows) {
      std::vector<int32_t> at(static_cast<size_t>(rows));
      std::iota(at.begin(), at.end(), int32_t(first));
      std::vector<float> vv = randn(rows * kvw, c.v_scale);
      if (c.v_spread)
        for (size_t i = 0; i < vv.size(); ++i)
          vv[i] *= std::ldexp(1.0f, int(i % size_t(kvw) / 32 % 9) - 4 + int((int64_t(i) / kvw + first) % 5) - 2);
      Dual k = make_f32({rows, kvw}, randn(rows * kvw)), v = make_f32({rows, kvw}, vv);
      Dual p = make_i32(at);
      return std::array<Dual, 3>{std::move(k), std::move(v), std::move(p)};
    };
    if (before > 0) {
      auto [k, v, p] = write(0, before);
      cpu_->kv_write(kc.c, vc.c, k.c, v.c, p.c);
      gpu_->kv_write(kc.g, vc.g, k.g, v.g, p.g);
    }
    Dual q = make_f32({n, qw}, randn(n * qw, 2.0f));
    Dual out = output(DType::kF32, {n, qw});
    Dual pos;
    if (step_write) {
      auto [k, v, p] = write(before, n);
      cpu_->kv_write(kc.c, vc.c, k.c, v.c, p.c);
      gpu_->kv_write(kc.g, vc.g, k.g, v.g, p.g);
      pos = p;
    } else {
      pos = make_i32(c.pos);
    }
    AttentionSpec spec{c.n_heads, c.n_kv_heads, c.head_dim, 1.0f / std::sqrt(float(c.head_dim)), c.window, c.softcap};
    if (c.reference) cpu_->attention(q.c, kc.c, vc.c, pos.c, spec, out.c);
    gpu_->plan_attention_keys(c.planned, int(n));
    const int64_t q8_mma = cuda_probe::q8_tensor_core_attention(*gpu_);
    const int64_t batches = cuda_probe::decode_kernel_batches(*gpu_);
    gpu_->attention(q.g, kc.g, vc.g, pos.g, spec, out.g);
    last_on_decode_kernel_ = cuda_probe::decode_kernel_batches(*gpu_) > batches;
    // Q8_0 caches take the tensor-core kernels where f16 caches do (not decode with a softcap).
    const bool tensor_cores = (c.head_dim == 64 || c.head_dim == 128) && (n > 8 || !(c.softcap > 0.0f));
    if (cache == DType::kQ8_0) {
      EXPECT_EQ(cuda_probe::q8_tensor_core_attention(*gpu_), q8_mma + (tensor_cores ? 1 : 0));
    }
    if (!c.reference) {  // every output written (the poison is NaN) and finite
      const std::vector<float> g = floats(*gpu_, out.g);
      EXPECT_TRUE(std::all_of(g.begin(), g.end(), [](float x) { return std::isfinite(x); }));
      return;
    }
    const double err = nerr(out);
    if (one_part_ && n > 8 && cache == DType::kF16 && !last_on_decode_kernel_) {  // prefill kernel, one part
      EXPECT_GT(err, 1e-5) << "the exact path ran";
      EXPECT_LT(err, 3e-3);
    } else {
      EXPECT_LT(err, 1e-5);
    }
  }
  bool one_part_ = false;  // gpu_ has BackendOptions::half_prefill
  bool last_on_decode_kernel_ = false;  // run()'s call of 9..16 tokens ran on the decode kernel
};

TEST_F(CudaAttentionCases, DecodeGqaShapes) {
  for (DType cache : {DType::kF16, DType::kF32, DType::kQ8_0}) {
    run({32, 8, 128, 1024, {600}}, cache);  // Llama-3 8B
    run({16, 8, 128, 512, {0}}, cache);     // Qwen3-0.6B, first token
    run({8, 4, 64, 300, {299}}, cache);     // full cache
    run({12, 4, 96, 700, {333}}, cache);    // group of 3
    run({16, 1, 64, 200, {150}}, cache);    // multi-query: two blocks of 8 heads
    run({4, 4, 256, 100, {57}}, cache);     // no GQA, head_dim 256
  }
}

TEST_F(CudaAttentionCases, DecodeKernelPartialGroupsBatchesAndSoftcap) {
  // f16 caches with head_dim 64/128 take the tensor-core decode kernel (n <= 8 tokens), with a
  // softcap the tiled split kernel.
  run({12, 4, 128, 700, {333}}, DType::kF16);                       // groups of 3: blocks of 2 + 1 heads
  run({24, 2, 64, 300, {250}}, DType::kF16);                        // groups of 12: blocks of 8 + 4 heads
  run({8, 2, 128, 900, {600, 601, 602, 603, 604, 605, 606}}, DType::kF16);  // 7 tokens
  run({8, 4, 64, 500, {450}, 0, 30.0f}, DType::kF16);               // softcap
  run({8, 4, 64, 500, {400, 401, 402, 403, 404}, 100, 0.0f}, DType::kF16);  // window, 5 tokens
  run({8, 4, 128, 600, {550, 551, 552, 553, 554}, 64, 50.0f}, DType::kF16);  // softcap, window, 5 tokens
}

TEST_F(CudaAttentionCases, DecodeTensorCoreSplitsClustersAndRowGroups) {
  // attention_decode_mma.cu: one split writing the output itself (16 cache rows), clusters of 3
  // and 8 splits (sm_90; elsewhere the combine kernel), rows of several tokens and heads in two
  // row groups, and caches over the cluster limit (1792 keys: up to 32 splits and the combine)
  // unless the step announces fewer keys (plan_attention_keys).
  // Q8_0 caches run the same kernel on integer tiles and scales.
  for (DType cache : {DType::kF16, DType::kQ8_0}) {
    SCOPED_TRACE(dtype_name(cache));
    run({8, 2, 64, 16, {15}}, cache);
    run({8, 2, 128, 40, {39}}, cache);
    run({8, 2, 128, 40, {3, 4, 5}}, cache);
    run({32, 8, 128, 4096, {4095}}, cache);
    run({32, 4, 64, 1000, {500, 501, 502}}, cache);  // 3 tokens x 8 heads: 2 row groups
    run({16, 8, 128, 6000, {20}}, cache);            // short context in a large cache
    // Large caches planned for the step's keys: a cluster of 8 splits (sm_90) over a part of the
    // cache, up to its limit; a plan for fewer keys than the call attends is still exact.
    run({32, 8, 128, 4096, {600}, 0, 0.0f, 601}, cache);
    run({32, 8, 128, 1792, {1791}}, cache);                          // the whole cache: a cluster
    run({32, 8, 128, 4096, {1790, 1791}, 0, 0.0f, 1792}, cache);
    run({32, 4, 64, 3000, {2100, 2101, 2102}, 0, 0.0f, 1000}, cache);  // 2 row groups, more keys than planned
    run({8, 2, 128, 4096, {1792, 1793}, 0, 0.0f, 1794}, cache);       // just over the limit: the combine
    run({32, 32, 128, 4096, {3000}}, cache);  // no GQA past the limit: the combine with 9 splits
    run({16, 1, 64, 300, {200, 201, 202, 203, 204, 205, 206, 207}}, cache);  // 16 heads x 8 tokens: 8 row groups
    run({8, 2, 128, 3000, {2500, 2501}, 100, 0.0f}, cache);                    // sliding window across splits
    run({8, 2, 128, 3000, {2500, 2501}, 640, 0.0f}, cache);  // window, 2-tile splits (2501 in tile 1)
  }
}

TEST_F(CudaAttentionCases, DecodeStepWriteThenAttention) {
  // The step's rows written by the kernel just before attention (the cache is NaN elsewhere):
  // the tensor-core decode kernel loads the older rows before its PDL wait and this step's after
  // it, whether they fall in its first tiles (one split, few keys, several tokens; tile 1 of a
  // split of 65..128 keys, both tiles loaded first) or later (clusters, the combine path, a
  // window).
  for (DType cache : {DType::kF16, DType::kQ8_0}) {
    SCOPED_TRACE(dtype_name(cache));
    run({8, 2, 64, 16, {15}}, cache, true);
    run({8, 2, 128, 40, {36, 37, 38, 39}}, cache, true);
    run({16, 8, 128, 512, {0}}, cache, true);  // first token: nothing before the wait
    run({16, 8, 128, 641, {576}}, cache, true);
    run({32, 8, 128, 1024, {600}}, cache, true);
    run({32, 8, 128, 1024, {630, 631}}, cache, true);  // splits of 80 keys: the step's in tile 1
    run({32, 8, 128, 1024, {630, 631, 632}}, cache, true);        // 12 rows, the step's in tile 1
    run({8, 8, 128, 1024, {630, 631}}, cache, true);              // no GQA: 2 rows
    run({8, 2, 64, 9000, {4060, 4061, 4062, 4063}}, cache, true);  // the combine, 96-key splits
    run({8, 2, 128, 3000, {2500, 2501}, 640, 0.0f}, cache, true);  // window, 2-tile splits
    run({8, 4, 128, 600, {550, 551, 552, 553, 554}, 64, 50.0f}, cache, true);  // softcap: tiled kernel
    run({8, 2, 128, 900, {600, 601, 602, 603, 604, 605, 606}}, cache, true);
    run({32, 4, 64, 1000, {500, 501, 502}}, cache, true);
    run({8, 2, 128, 3000, {2500, 2501}, 100, 0.0f}, cache, true);
    run({32, 8, 128, 20000, {19999}}, cache, true);
    run({32, 8, 128, 4096, {700}}, cache, true);                  // the combine
    run({32, 8, 128, 4096, {700}, 0, 0.0f, 701}, cache, true);    // a cluster in a large cache
    run({32, 8, 128, 4096, {3000, 3001}, 0, 0.0f, 1792}, cache, true);  // more keys than planned
  }
  run({32, 8, 128, 1024, {600}}, DType::kF32, true);
}

TEST_F(CudaAttentionCases, LongContextSplitsAndSmallBatches) {
  run({32, 8, 128, 20000, {19999}}, DType::kF16);
  run({8, 2, 64, 9000, {4000, 4001, 4002, 4003}}, DType::kF16);
  run({8, 2, 64, 9000, {8990}}, DType::kQ8_0);
}

TEST_F(CudaAttentionCases, PrefillCausalBatch) {
  std::vector<int32_t> p(37);
  std::iota(p.begin(), p.end(), 0);
  run({8, 2, 64, 64, p}, DType::kF16);
  std::vector<int32_t> p2(20);
  std::iota(p2.begin(), p2.end(), 500);  // a batch continuing a long prompt
  run({16, 8, 128, 2048, p2}, DType::kF16);
  run({16, 8, 128, 2048, p2}, DType::kF32);
}

// More than 8 tokens with an f16 cache and head_dim 64 / 128: the tensor-core prefill kernel
// (attention_prefill.cu), its head grouping (query heads per KV head 1..16, blocks of 1, 2 or 4
// heads), partial token tiles, and key splits with the combine when a batch has few blocks.
// (Calls of up to 16 tokens in short caches take the decode kernel's cluster on sm_90: the
// 9-token case has a cache over its 1792 keys.)
TEST_F(CudaAttentionCases, PrefillTensorCoreShapes) {
  for (DType cache : {DType::kF16, DType::kQ8_0}) {  // (Q8_0: integer tiles and scales)
    SCOPED_TRACE(dtype_name(cache));
    run({32, 8, 128, 641, positions(0, 512)}, cache);   // Llama-3-8B pp512: one split
    run({16, 8, 128, 600, positions(0, 100)}, cache);   // Qwen3-0.6B: 2 heads per block, splits
    run({12, 4, 128, 700, positions(300, 41)}, cache);  // groups of 3: one head per block
    run({16, 2, 64, 300, positions(0, 150)}, cache);    // groups of 8: two blocks of 4 heads
    run({16, 1, 64, 2000, positions(60, 9)}, cache);    // multi-query, 9 tokens
    run({8, 8, 128, 90, positions(0, 90)}, cache);      // no GQA, full cache
  }
}

TEST_F(CudaAttentionCases, PrefillTensorCoreLongContextWindowSoftcap) {
  for (DType cache : {DType::kF16, DType::kQ8_0}) {  // (Q8_0: integer tiles and scales)
    SCOPED_TRACE(dtype_name(cache));
    run({8, 2, 128, 9000, positions(8000, 16)}, cache);  // few blocks: 29 splits of 320 keys
    run({8, 4, 128, 1000, positions(200, 100), 37, 30.0f}, cache);
    run({8, 4, 64, 1000, positions(0, 70), 16, 0.0f}, cache);
  }
}

TEST_F(CudaAttentionCases, PrefillKeyTilesSharedByTwoWarpSets) {
  // PrefillPlan::halves: two sets of warps take every other key tile of a block and merge their
  // softmax states at the end; each shape with it forced on, then off, against the reference.
  // Each shape gives the second set tiles of its own.
  struct Reset {
    ~Reset() { cuda_probe::set_prefill_halves(0); }
  } reset;
  for (const int halves : {2, 1}) {
    SCOPED_TRACE(fmt::format("halves {}", halves));
    cuda_probe::set_prefill_halves(halves);
    run({32, 8, 128, 641, positions(0, 300)}, DType::kF16);  // odd tile counts, a partial token tile
    run({8, 2, 128, 9000, positions(8000, 16)}, DType::kF16);  // 32 splits of 4-5 tiles, the combine
    run({8, 2, 64, 9000, positions(8000, 16)}, DType::kF16);   // the same, head_dim 64
    run({16, 2, 64, 600, positions(0, 520)}, DType::kF16);     // head_dim 64, blocks of 4 heads
    // A window with softcap: tiles without the mask where the window starts after key 0.
    run({8, 4, 128, 1000, positions(0, 800), 150, 30.0f}, DType::kF16);
    run({32, 8, 128, 641, positions(0, 300)}, DType::kQ8_0);
    run({8, 2, 64, 9000, positions(8000, 16)}, DType::kQ8_0);
    run({8, 4, 128, 1000, positions(0, 800), 150, 30.0f}, DType::kQ8_0);
  }
}

TEST_F(CudaAttentionCases, FramesOfUpTo16TokensOnTheDecodeKernelsCluster) {
  // Calls of 9..16 tokens (a pool's frames, laps of drafts) take the decode kernel where its plan
  // is one cluster (sm_90; at most 1792 keys by the plan or the cache), else the prefill kernel:
  // row groups of 4 tokens x 4 heads (Llama-3-8B), 2 x 8, 16 x 1, head_dim 64, a window across
  // the splits, the step's rows written just before (older keys loaded before the PDL wait), Q8_0
  // caches with spread values; a large cache planned for the step's keys, and one that is not.
  const ClusterSetting restore(true);
  if (!restore.before) GTEST_SKIP() << "no thread-block clusters on this device";
  for (DType cache : {DType::kF16, DType::kQ8_0}) {
    SCOPED_TRACE(dtype_name(cache));
    auto on_decode = [&](const AttnCase& c, bool step_write, bool expected) {
      run(c, cache, step_write);
      EXPECT_EQ(last_on_decode_kernel_, expected) << c.pos.size() << " tokens, cache " << c.n_ctx;
    };
    on_decode({32, 8, 128, 641, positions(496, 16)}, true, true);   // a pool's frame, Llama-3-8B heads
    on_decode({32, 8, 128, 641, positions(0, 16)}, true, true);     // the first frame
    on_decode({32, 8, 128, 641, positions(100, 9)}, false, true);   // 9 tokens: 3 row groups, the last partial
    on_decode({32, 8, 128, 1024, positions(700, 12)}, true, true);  // 12 tokens, splits of 3 tiles (the loop)
    on_decode({64, 8, 128, 900, positions(800, 16)}, true, true);   // 8 heads per KV head: 8 row groups
    on_decode({16, 16, 64, 300, positions(200, 16)}, false, true);  // no GQA, head_dim 64
    on_decode({8, 2, 128, 1500, positions(1400, 13), 300, 0.0f}, true, true);  // window
    on_decode({32, 8, 128, 4096, positions(1000, 16), 0, 0.0f, 1016}, true, true);  // planned: a cluster
    on_decode({32, 8, 128, 4096, positions(1000, 16)}, true, false);  // the whole cache: prefill kernel
    on_decode({32, 8, 128, 641, positions(496, 17)}, true, false);    // 17 tokens: prefill kernel
    on_decode({8, 4, 128, 600, positions(500, 16), 0, 30.0f}, false, false);  // softcap: prefill kernel
    AttnCase spread{32, 8, 128, 700, positions(600, 16)};
    spread.v_scale = 0.05f, spread.v_spread = true;
    on_decode(spread, true, true);
    cuda_probe::set_clusters(false);  // (planned from now on) no cluster: the prefill kernel
    on_decode({32, 8, 128, 641, positions(496, 16)}, true, false);
    cuda_probe::set_clusters(true);
  }
}

// --prefill-precision half: the tensor-core prefill kernel takes q and p as one f16 part (as
// llama.cpp's flash attention does): within 3e-3 of the reference, and measurably not the exact
// path; decode calls, f32 caches and Q8_0 caches (prefill and decode) stay exact.
class CudaHalfPrefillAttention : public CudaAttentionCases {
 protected:
  void SetUp() override {
    CudaAttentionCases::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    use_half_prefill();
    one_part_ = true;
  }
};

TEST_F(CudaHalfPrefillAttention, PrefillTakesOnePartDecodeStaysExact) {
  run({32, 8, 128, 641, positions(0, 512)}, DType::kF16);   // one split
  run({16, 8, 128, 600, positions(0, 100)}, DType::kF16);   // splits and the combine
  run({16, 2, 64, 300, positions(0, 150)}, DType::kF16);    // head_dim 64
  run({8, 4, 128, 1000, positions(200, 100), 37, 30.0f}, DType::kF16);  // window, softcap
  run({8, 2, 64, 64, positions(0, 37)}, DType::kF32);       // f32 cache: the tiled kernel, exact
  run({32, 8, 128, 700, {600}}, DType::kF16);               // decode: exact
  run({32, 8, 128, 641, positions(496, 16)}, DType::kF16);  // a frame on the decode kernel (sm_90): exact
  run({8, 2, 64, 300, positions(100, 4)}, DType::kF16);
  run({32, 8, 128, 641, positions(0, 512)}, DType::kQ8_0);  // Q8_0: prefill exact
  run({16, 8, 128, 600, positions(0, 100)}, DType::kQ8_0);
  run({16, 2, 64, 300, positions(0, 150)}, DType::kQ8_0);
  run({32, 8, 128, 700, {600}}, DType::kQ8_0);
}

TEST_F(CudaAttentionCases, Q8CachesWithSmallAndSpreadValues) {
  // Q8_0 caches on the tensor cores: P times each key's V scale is split into two f16 parts under
  // a power of two per block and step, so small values and blocks / keys of different magnitudes
  // stay exact; decode (one pass, several tiles and splits, the combine, head_dim 64) and prefill.
  for (const float scale : {0.05f, 1.0f}) {
    for (const bool spread : {false, true}) {
      SCOPED_TRACE(fmt::format("v scale {} spread {}", scale, spread));
      AttnCase c{32, 8, 128, 1024, {600}};
      c.v_scale = scale, c.v_spread = spread;
      run(c, DType::kQ8_0, true);
      c.n_ctx = 20000, c.pos = {19999};
      run(c, DType::kQ8_0);
      c = {8, 2, 64, 9000, {4060, 4061, 4062, 4063}};
      c.v_scale = scale, c.v_spread = spread;
      run(c, DType::kQ8_0, true);
      c = {32, 8, 128, 641, positions(0, 300)};
      c.v_scale = scale, c.v_spread = spread;
      run(c, DType::kQ8_0);
      c = {8, 2, 128, 9000, positions(8000, 16)};
      c.v_scale = scale, c.v_spread = spread;
      run(c, DType::kQ8_0);
    }
  }
}

TEST_F(CudaAttentionCases, AlternatingShapesReuseScratch) {
  // Prefill and decode calls of different shapes back to back share the scratch: stale partial
  // results of earlier calls (empty splits write none) must not leak into later ones.
  std::vector<int32_t> p(20);
  std::iota(p.begin(), p.end(), 0);
  for (int round = 0; round < 2; ++round) {
    run({8, 2, 64, 128, p}, DType::kF16);
    run({8, 2, 64, 128, {20}}, DType::kF16);
    run({32, 8, 128, 4096, {3000}}, DType::kF16);
    run({4, 4, 64, 64, {5, 6, 7}}, DType::kF32);
  }
}

// Fewer tokens can take more splits (Llama-3-8B heads over 2048 rows: 128 tokens one split, 16
// tokens 24, 8 tokens 17, 4 tokens 32), so attention_scratch_bytes bounds every call of up to its
// tokens: after the largest call (a slice's warm-up) no smaller one allocates scratch (each
// cache type on a fresh backend; with the bound of one call only, 16 tokens would grow it). The
// largest call is not compared with the CPU reference (~70% of the test's time, all of it on the
// CPU; prompts of these heads are compared in PrefillTensorCoreShapes), the smaller ones are.
class CudaAttentionScratch : public CudaAttentionCases {
 protected:
  void check(DType cache) {
    auto last = [](int n) {
      std::vector<int32_t> p(static_cast<size_t>(n));
      std::iota(p.begin(), p.end(), 2048 - n);
      return p;
    };
    AttnCase largest{32, 8, 128, 2048, last(128)};
    largest.reference = false;
    run(largest, cache);
    const int64_t after_largest = cuda_probe::scratch_allocations(*gpu_);
    for (int n : {16, 12, 9, 8, 4, 1}) run({32, 8, 128, 2048, last(n)}, cache);
    EXPECT_EQ(cuda_probe::scratch_allocations(*gpu_), after_largest);
  }
};

TEST_F(CudaAttentionScratch, TheLargestCallServesEverySmallerOneF16Cache) { check(DType::kF16); }
TEST_F(CudaAttentionScratch, TheLargestCallServesEverySmallerOneQ8Cache) { check(DType::kQ8_0); }

// The bound measures only the last count of each plan step; against every count, for heads of
// each warp grouping (G = 1, 2, 4, 7, 8), each cache type, with and without clusters, decode
// planned for the cache or for 1792 keys, and prompts across the decode / prefill edge and many
// prefill token tiles.
TEST(CudaAttentionScratchBound, IsTheMostOfEveryCallUpToIt) {
  struct Heads {
    int n, kv, dim;
  };
  const ClusterSetting restore(true);
  int cases = 0;
  for (const bool clusters : {true, false}) {
    cuda_probe::set_clusters(clusters);
    for (const Heads h : {Heads{32, 8, 128}, Heads{16, 8, 64}, Heads{8, 8, 64}, Heads{28, 4, 128}, Heads{14, 2, 64},
                          Heads{64, 8, 128}, Heads{12, 12, 96}})
      for (const DType cache : {DType::kF16, DType::kQ8_0, DType::kF32})
        for (const int64_t rows : {16, 100, 641, 2048, 9000})
          for (const int64_t max_keys : {int64_t{0}, int64_t{1792}}) {
            uint64_t most = 0;
            for (int64_t n = 1; n <= 1100; ++n) {
              most = std::max(
                  most, cuda_probe::attention_scratch_bytes(n, h.n, h.kv, h.dim, rows, cache, max_keys, false));
              if (n <= 80 || n % 17 == 0 || n == 1100) {
                ASSERT_EQ(cuda_probe::attention_scratch_bytes(n, h.n, h.kv, h.dim, rows, cache, max_keys, true), most)
                    << h.n << "/" << h.kv << " heads of " << h.dim << ", " << rows << " rows, cache "
                    << static_cast<int>(cache) << ", max_keys " << max_keys << ", clusters " << clusters << ", "
                    << n << " tokens";
                ++cases;
              }
            }
          }
  }
  EXPECT_GT(cases, 50000);
}

TEST_F(CudaAttentionCases, SlidingWindowAndSoftcap) {
  run({8, 4, 128, 1000, {900}, 256, 0.0f}, DType::kF16);
  run({8, 4, 128, 1000, {10, 11, 12}, 4, 0.0f}, DType::kF16);
  run({8, 4, 128, 600, {555}, 0, 50.0f}, DType::kF16);
  std::vector<int32_t> p(12);
  std::iota(p.begin(), p.end(), 100);
  run({8, 4, 64, 200, p, 7, 30.0f}, DType::kF32);
}

}  // namespace
}  // namespace shoal::test
