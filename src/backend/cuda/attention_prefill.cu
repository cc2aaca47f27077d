// Prefill attention on the f16 tensor cores for f16 KV caches and head_dim 64 / 128, in the
// structure of FlashAttention-2 (Dao 2023): a warp owns 16 query rows (16 consecutive tokens of
// one head), keeps them in registers as MMA A fragments, and walks the keys in tiles of 64 that
// the block stages in shared memory with cp.async (double-buffered, the next tile loading while
// this one is computed). Per tile: S = Q K^T (mma.m16n8k16), the causal / sliding-window mask
// per row, an online softmax (Milakov & Gimelshein 2018) with the row statistics shared by the
// 4 lanes of a quad, then O += P V with P taken straight from the score accumulators as A
// fragments. The warps of a block share a KV head (GQA), so each K/V tile is read once for them.
//
// Exactness (the CPU reference is f32): K and V are f16 in the cache, so exact as MMA operands;
// q (times the softmax scale) and p are split into f16 hi + lo (22 significant bits), and each
// product takes two MMAs with f32 accumulation, so the result is the f32 computation to ~2^-22
// relative (tests compare at 1e-5). Limits: |q * scale| above 65504 overflows f16 (inf / NaN);
// q elements below ~2^-14 * max|q| lose relative (not absolute) precision in lo.
//
// The decode path (<= kGemvMaxTokens tokens) and other caches / head sizes keep attention.cu's
// kernels; this one replaced the tiled split kernel for prefill, which re-read every key for each
// token on the CUDA cores (1.05 ms per Llama-3-8B layer at 512 tokens on the H200).
// Twin: ref::attention; tests: tests/cuda/cuda_attention_test.cc.
#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/attention_prefill.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"

namespace shoal::cuda {
namespace {

constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kRows = 16;                           // tokens per warp (the MMA's M)
constexpr int kKeys = 64;                           // keys per tile
constexpr int kMaxBlockTokens = kWarps * kRows;     // when every warp has the same head
constexpr int kMaxSplits = 32;                      // attention_combine_kernel: one split per lane
constexpr int64_t kFillBlocks = 96;                 // fewer blocks than this: split the keys

struct Params {
  const float* q;
  const __half* k;
  const __half* v;
  const int32_t* pos;
  int64_t n_tokens;
  int n_ctx, n_heads, n_kv_heads, window;
  float scale, softcap;
  PrefillPlan plan;
  float* part_o;
  float* part_ml;
  float* out;
};

template <int D>
__global__ void __launch_bounds__(kThreads) attention_prefill_kernel(const Params P) {
  constexpr int DP = D + 8;      // shared row pitch in halves: 16-byte rows, conflict-free ldmatrix
  constexpr int KS = D / 16;     // k-steps of Q K^T
  constexpr int DT = D / 8;      // n-tiles of the output
  constexpr int NT = kKeys / 8;  // n-tiles of the scores
  extern __shared__ uint4 smem[];
  __half* k_s = reinterpret_cast<__half*>(smem);  // [2][kKeys][DP]
  __half* v_s = k_s + 2 * kKeys * DP;             // [2][kKeys][DP]
  __shared__ int lo_s[kMaxBlockTokens], hi_s[kMaxBlockTokens];

  const PrefillPlan& pl = P.plan;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int G = P.n_heads / P.n_kv_heads;
  const int64_t t0 = int64_t(pl.token_tiles - 1 - int(blockIdx.x)) * pl.block_tokens;  // latest (longest) first
  const int kvh = int(blockIdx.y) / pl.groups;
  const int head = kvh * G + (int(blockIdx.y) % pl.groups) * pl.gb + warp % pl.gb;
  const int wtok = (warp / pl.gb) * kRows;  // the warp's first token in the block
  const int split = int(blockIdx.z);
  const int64_t s_lo = int64_t(split) * pl.chunk, s_hi = s_lo + pl.chunk - 1;
  pdl_prologue();

  // 1. Key range [lo, hi] of each token of the block in this split (empty: lo > hi).
  for (int i = threadIdx.x; i < pl.block_tokens; i += kThreads) {
    const int64_t t = t0 + i;
    int lo = 1, hi = 0;
    if (t < P.n_tokens) {
      const int last = min(max(P.pos[t], 0), P.n_ctx - 1);
      const int first = P.window > 0 ? max(0, last - P.window + 1) : 0;
      lo = int(max(int64_t(first), s_lo));
      hi = int(min(int64_t(last), s_hi));
    }
    lo_s[i] = lo;
    hi_s[i] = hi;
  }
  // 2. The warp's 16 rows of q times the scale as A fragments, hi and lo (loads in flight with
  // the range reads above).
  uint32_t qh[KS][4], ql[KS][4];
  {
    const int64_t ta = t0 + wtok + g, tb = ta + 8;
    const float* qa = P.q + (ta * P.n_heads + head) * D + 2 * c;
    const float* qb = P.q + (tb * P.n_heads + head) * D + 2 * c;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
#pragma unroll
      for (int f = 0; f < 4; ++f) {  // f: (row g, cols 0..7), (g + 8, 0..7), (g, 8..15), (g + 8, 8..15)
        const bool second = f & 1;
        float2 x = make_float2(0.0f, 0.0f);
        if ((second ? tb : ta) < P.n_tokens)
          x = *reinterpret_cast<const float2*>((second ? qb : qa) + ks * 16 + (f >> 1) * 8);
        x.x *= P.scale;
        x.y *= P.scale;
        qh[ks][f] = half2_bits(x.x, x.y);
        const float2 h = bits_half2(qh[ks][f]);
        ql[ks][f] = half2_bits(x.x - h.x, x.y - h.y);
      }
    }
  }
  __syncthreads();
  int b_lo = INT_MAX, b_hi = -1, w_lo = INT_MAX, w_hi = -1;
  for (int i = 0; i < pl.block_tokens; ++i) {
    const int lo = lo_s[i], hi = hi_s[i];
    if (lo > hi) continue;
    b_lo = min(b_lo, lo), b_hi = max(b_hi, hi);
    if (i >= wtok && i < wtok + kRows) w_lo = min(w_lo, lo), w_hi = max(w_hi, hi);
  }
  const int r_lo[2] = {lo_s[wtok + g], lo_s[wtok + g + 8]}, r_hi[2] = {hi_s[wtok + g], hi_s[wtok + g + 8]};

  // 3. The tiles of keys [b_lo, b_hi]: K and V rows into shared memory, rows past b_hi zero.
  const int64_t width = int64_t(P.n_kv_heads) * D;
  const __half* kg = P.k + int64_t(kvh) * D;
  const __half* vg = P.v + int64_t(kvh) * D;
  const int n_tiles = b_hi >= b_lo ? (b_hi - b_lo) / kKeys + 1 : 0;
  auto load_tile = [&](int i) {
    const int k0 = b_lo + i * kKeys, buf = i & 1;
#pragma unroll
    for (int p = threadIdx.x; p < kKeys * D / 8; p += kThreads) {
      const int j = p / (D / 8), e = p % (D / 8) * 8;
      const bool ok = k0 + j <= b_hi;
      const int64_t off = int64_t(ok ? k0 + j : b_lo) * width + e;
      cp_async_or_zero(k_s + (buf * kKeys + j) * DP + e, kg + off, ok);
      cp_async_or_zero(v_s + (buf * kKeys + j) * DP + e, vg + off, ok);
    }
  };
  float o[DT][4];
#pragma unroll
  for (int d = 0; d < DT; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this lane's share of the row sums
  if (n_tiles > 0) load_tile(0);
  cp_async_commit();
#pragma unroll 1
  for (int i = 0; i < n_tiles; ++i) {
    if (i + 1 < n_tiles) load_tile(i + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const int k0 = b_lo + i * kKeys;
    if (k0 <= w_hi && k0 + kKeys - 1 >= w_lo) {
      const __half* kt = k_s + (i & 1) * kKeys * DP;
      const __half* vt = v_s + (i & 1) * kKeys * DP;
      // S = (q * scale) K^T: ldmatrix gives B fragments of two k-steps of 8 keys.
      float s[NT][4];
#pragma unroll
      for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
      for (int ks = 0; ks < KS; ks += 2) {
#pragma unroll
        for (int n = 0; n < NT; ++n) {
          uint32_t b[4];
          ldmatrix_x4<false>(b, kt + (n * 8 + (lane & 7)) * DP + ks * 16 + (lane >> 3) * 8);
          mma(s[n], qh[ks], b[0], b[1]);
          mma(s[n], ql[ks], b[0], b[1]);
          mma(s[n], qh[ks + 1], b[2], b[3]);
          mma(s[n], ql[ks + 1], b[2], b[3]);
        }
      }
      // Mask, softcap, online softmax. s[n][e]: row g (e < 2) or g + 8, key k0 + 8n + 2c + e % 2.
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int key = k0 + n * 8 + 2 * c + (e & 1), r = e >> 1;
          float x = s[n][e];
          if (P.softcap > 0.0f) x = P.softcap * tanhf(x / P.softcap);
          x = key >= r_lo[r] && key <= r_hi[r] ? x : -INFINITY;
          s[n][e] = x;
          mx[r] = fmaxf(mx[r], x);
        }
      float base[2];
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
        const float m_new = fmaxf(m[r], mx[r]);
        const float corr = m[r] == -INFINITY ? (m_new == -INFINITY ? 1.0f : 0.0f) : expf(m[r] - m_new);
        m[r] = m_new;
        base[r] = m_new == -INFINITY ? 0.0f : m_new;
        l[r] *= corr;
#pragma unroll
        for (int d = 0; d < DT; ++d) o[d][2 * r] *= corr, o[d][2 * r + 1] *= corr;
      }
#pragma unroll
      for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float p = expf(s[n][e] - base[e >> 1]);  // masked: e^-inf = 0
          s[n][e] = p;
          l[e >> 1] += p;
        }
      // O += P V, P as A fragments (hi + lo) of 16 keys; ldmatrix.trans gives V's B fragments of
      // two n-tiles of 8 dimensions.
#pragma unroll
      for (int kk = 0; kk < NT / 2; ++kk) {
        uint32_t ah[4], al[4];
#pragma unroll
        for (int f = 0; f < 4; ++f) {  // rows g / g + 8 of keys 0..7, then of keys 8..15
          const float* src = s[2 * kk + (f >> 1)] + (f & 1) * 2;
          ah[f] = half2_bits(src[0], src[1]);
          const float2 h = bits_half2(ah[f]);
          al[f] = half2_bits(src[0] - h.x, src[1] - h.y);
        }
#pragma unroll
        for (int d = 0; d < DT; d += 2) {
          uint32_t b[4];
          ldmatrix_x4<true>(b, vt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * DP + d * 8 + (lane >> 4) * 8);
          mma(o[d], ah, b[0], b[1]);
          mma(o[d], al, b[0], b[1]);
          mma(o[d + 1], ah, b[2], b[3]);
          mma(o[d + 1], al, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the next load overwrites this buffer
  }
  cp_async_wait<0>();

  // 4. Rows sums over the quad; the normalised output, or the split's partial result.
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t t = t0 + wtok + g + 8 * r;
    if (t >= P.n_tokens) continue;
    const int64_t th = t * P.n_heads + head;
    if (pl.n_splits == 1) {
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      float* dst = P.out + th * D + 2 * c;
#pragma unroll
      for (int d = 0; d < DT; ++d)
        *reinterpret_cast<float2*>(dst + d * 8) = make_float2(o[d][2 * r] * inv, o[d][2 * r + 1] * inv);
    } else {
      const int64_t row = th * pl.n_splits + split;
      float* dst = P.part_o + row * D + 2 * c;
#pragma unroll
      for (int d = 0; d < DT; ++d) *reinterpret_cast<float2*>(dst + d * 8) = make_float2(o[d][2 * r], o[d][2 * r + 1]);
      if (c == 0) {
        P.part_ml[row * 2] = m[r];
        P.part_ml[row * 2 + 1] = l[r];
      }
    }
  }
}

template <int D>
cudaError_t launch_prefill(const Params& P, cudaStream_t stream) {
  const size_t smem = size_t(4 * kKeys * (D + 8)) * sizeof(__half);
  const cudaError_t e =
      cudaFuncSetAttribute(attention_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned(P.plan.token_tiles), unsigned(P.n_kv_heads * P.plan.groups), unsigned(P.plan.n_splits));
  return launch(attention_prefill_kernel<D>, grid, kThreads, smem, stream, P);
}

}  // namespace

bool use_prefill_mma(const AttnArgs& a) {
  return a.cache == CacheKind::kF16 && a.n_tokens > kGemvMaxTokens && (a.head_dim == 64 || a.head_dim == 128) &&
         a.n_ctx <= INT_MAX;
}

PrefillPlan prefill_plan(const AttnArgs& a) {
  PrefillPlan p;
  const int G = a.n_heads / a.n_kv_heads;
  p.gb = G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
  p.groups = G / p.gb;
  p.block_tokens = kRows * kWarps / p.gb;
  p.token_tiles = int(div_up(a.n_tokens, p.block_tokens));
  const int64_t blocks = int64_t(p.token_tiles) * a.n_kv_heads * p.groups;
  int64_t splits = blocks >= kFillBlocks ? 1 : std::min<int64_t>(kMaxSplits, div_up(2 * kFillBlocks, blocks));
  splits = std::max<int64_t>(1, std::min(splits, div_up(a.n_ctx, kKeys)));
  p.chunk = int64_t(align_up(uint64_t(div_up(a.n_ctx, splits)), kKeys));
  p.n_splits = int(div_up(a.n_ctx, p.chunk));
  return p;
}

cudaError_t attention_prefill(const float* q, const __half* k_cache, const __half* v_cache, const int32_t* pos,
                              const AttnArgs& a, const PrefillPlan& plan, float* part_o, float* part_ml, float* out,
                              cudaStream_t stream) {
  Params P{q, k_cache, v_cache, pos, a.n_tokens, int(a.n_ctx), a.n_heads, a.n_kv_heads, a.sliding_window,
           a.scale, a.softcap, plan, part_o, part_ml, out};
  return a.head_dim == 64 ? launch_prefill<64>(P, stream) : launch_prefill<128>(P, stream);
}

}  // namespace shoal::cuda
