// Decode attention (1..kGemvMaxTokens tokens; up to kDecodeAttnMaxTokens in one cluster) on the f16
// tensor cores for f16 and Q8_0 KV caches and head_dim 64 / 128 (attention_mma.cuh: the tile step,
// exactness). The MMA's 16 rows are the (token, query head) pairs of one KV head (GQA: 4 heads x 1
// token use 4 rows), so one pass over a key serves all of them; the 4 warps of a block hold the
// same rows and take a quarter (16 keys) of each 64-key tile, which keeps a warp's serial work per
// tile small (the CUDA-core decode kernel was bound by it at short contexts: ~1600 instructions per
// 32-key pass). The warps merge their online-softmax states in shared memory at the end. The
// attended keys are divided evenly over the splits at run time (a captured graph's grid depends
// only on the cache size and AttnArgs::max_keys). On sm_90, for calls of at most kClusterMaxKeys
// keys (by max_keys, else the cache size), the splits of a row group are one thread-block cluster:
// after a cluster barrier each block merges a share of the outputs from every block's shared memory
// (DSMEM), so the step needs no combine kernel; otherwise the splits write partial results for
// attention_combine_kernel. (H200, Llama-3-8B heads, us per layer: context 512 7.6 (cluster) vs
// 9.6 (combine), 4096 14.6 vs 13.7, 32768 43 with the combine and 32 splits; the CUDA-core
// kernel this replaced: 10.0, 12.9, 61.9.)
// Latency, not bytes, bounds it (one warp per scheduler): right after the step's KV write
// (AttnArgs::early_kv) the older keys are loaded before the PDL wait, and the block's serial
// work is kept short (key ranges by warp reductions, q split once per block, merge weights by
// all threads). docs/cuda.md, v11. With the rope prologue (rope_kv_attention: R) the kernel also
// does rope_kv_write's work for its rows: q normed and rotated as it is read, the step's k / v
// rows stored in the caches by the blocks whose keys they are (and straight into their tiles), so
// the decode step has no prologue kernel and the older keys always load before the PDL wait
// (H200: Llama-3-8B Q8_0 step 2.86 -> 2.81 ms, Q4_0 2.16-2.25 -> 2.10-2.19; docs/cuda.md, v12).
// Its code is at the edge of the SM's instruction cache: a second path that runs beside this one,
// or code between its executed parts, costs time at every position (ncu: "no_instruction"
// stalls). So the loops a block runs once (tile copies, RoPE rotation, merges, outputs) are not
// unrolled: 6016 -> 4120 SASS instructions at head_dim 128 with R, steps 0.5-1% faster (H200;
// docs/cuda.md, v17). Keep the footprint small: v18 left softcap to the tiled kernel, ropes the q
// rows in a loop, and skips the work of rows that hold no (token, head) pair (3608 instructions
// with a wide step that serves splits of up to 128 keys in one pass; Qwen3-0.6B step -7%).
// Twin: ref::attention; tests: tests/cuda/cuda_attention_test.cc.
#include <cooperative_groups.h>

#include <algorithm>
#include <climits>

#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_mma.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/launch.cuh"

namespace shoal::cuda {
namespace {

namespace cg = cooperative_groups;
using attn_mma::kKeys;
using attn_mma::kRows;
constexpr int kThreads = 128, kWarps = kThreads / 32;
constexpr int kWarpKeys = kKeys / kWarps;  // keys of a tile per warp
constexpr int kMaxClusterSplits = 8;       // the portable cluster size (16 measured slower)
// Splits of a call of more than kGemvMaxTokens tokens (H100, Llama-3-8B heads, 16 tokens over 512
// keys, us per layer: 8 splits 17.1-17.4, 4 12.4-12.5, 2 13.6-13.7, the prefill kernel and the
// combine 15.4; at 8 tokens 8 and 4 splits made the same layer; docs/cuda.md, v54).
constexpr int kMaxBatchClusterSplits = 4;
// Calls that attend more keys (AttnArgs::max_keys, else n_ctx): up to kMaxSplits splits and the
// combine (H200, Llama-3-8B heads, us per layer: 576 keys 5.8 cluster vs 7.5 combine, 2048 9.4
// vs 9.1, 4096 14.9 vs 11.5; docs/cuda.md, v28).
constexpr int64_t kClusterMaxKeys = 1792;
constexpr int kMaxSplits = 32;             // attention_combine_kernel: one split per lane
constexpr int kFillBlocks = 264;           // about two blocks per SM of an H200
// K/V tiles in flight. The cluster path had 4 on sm_90 until v13: its 170 KB of shared memory
// per block kept the next GEMV's blocks (Q8_0 / Q4_0: 110 KB) off the SM while attention ran.
// With 2, attention alone at context 512 / 4096 is within noise of the 4-stage figures (5.86 /
// 14.97 vs 6.04 / 14.88 us per layer, H200; docs/cuda.md, v13).
constexpr int kStages = 2;
// Accumulators per n-tile of S in a step (attn_mma::tile_step): chains of 8 dependent MMAs at
// head_dim 128.
constexpr int kStepChains = 4;

bool g_clusters = false;

using Params = MmaParams<DecodePlan>;

// The rope prologue (R, rope_kv_attention): each warp norms and rotates the q rows w, w + 4, ...
// of the block, and the step's k / v rows of the block's keys (token t by warp 3 - t % 4), in f32
// in shared memory, with RoPE's cos / sin per (token, pair) made once before the PDL wait.
template <int D, bool R>
struct RopeSmem {
  float q[kRows][D];                  // the block's q rows, normed and rotated
  float kv[kWarps][D];                // a warp's k row being normed and rotated
  double2 cs[kGemvMaxTokens][D / 2];  // (cos, sin) x attn_factor of token t, pair p
};
template <int D>
struct RopeSmem<D, false> {};

// Norms (when `norm`, with w: this lane's values of the norm weight) and rotates a head row into
// x (f32, shared, this warp's) as rope_kv_write: v holds this lane's values lane + 32 j of the
// row; the lanes then rotate the pairs lane + 32 j.
template <int D>
__device__ __forceinline__ void rope_row(float* x, float (&v)[D / 32], const float (&w)[D / 32], bool norm, float eps,
                                         const double2* cs, const AttnRope& r) {
  const int lane = threadIdx.x & 31;
  if (norm) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < D / 32; ++j) ss = fmaf(v[j], v[j], ss);
    const float inv = 1.0f / sqrtf(warp_sum(ss) / float(D) + eps);
#pragma unroll
    for (int j = 0; j < D / 32; ++j) v[j] = v[j] * inv * w[j];
  }
#pragma unroll
  for (int j = 0; j < D / 32; ++j) x[lane + 32 * j] = v[j];
  __syncwarp();
  const int half = r.rot_dims / 2;
#pragma unroll 1
  for (int p = lane; p < half; p += 32) {
    const int ia = r.interleaved ? 2 * p : p, ib = r.interleaved ? 2 * p + 1 : p + half;
    rope_rotate(x[ia], x[ib], cs[p]);
  }
  __syncwarp();
}

// Shared memory of the kernel: K and V tiles [kStages][kKeys][pitch] f16 (Q8: Q8_0 rows staged
// in their tails, load_tile_q8); with Q8 then the scales [kStages][kKeys][q8_blocks] f32 of K
// and of V.
template <int D, bool Q8>
struct DecodeSmem {
  static constexpr size_t kTiles = size_t(2 * kStages * kKeys * attn_mma::pitch<D>()) * sizeof(__half);
  static constexpr size_t kScales = Q8 ? size_t(kStages * kKeys * attn_mma::q8_blocks<D>()) * sizeof(float) : 0;
  static constexpr size_t kBytes = kTiles + 2 * kScales;
};

// R: the rope prologue (P.rope; rope_kv_attention). Q8: Q8_0 caches (staged as they are,
// converted per tile into f16 integer tiles and scales: attention_mma.cuh; the rope prologue
// quantizes the step's rows as kv_write does). kParts (with R): q, k and v are the sums of the
// two partials of a split-K GEMV, times the input RMSNorm's 1 / rms (AttnRope::q2 / k2 / v2 /
// in_ss): a separate instance, so the others carry none of it.
template <int D, bool R, bool Q8, bool kParts = false>
__global__ void __launch_bounds__(kThreads) attention_decode_mma_kernel(const Params P) {
  static_assert(!kParts || R, "partials: the rope prologue reads them");
  constexpr int S = kStages;
  constexpr int DP = attn_mma::pitch<D>(), DT = D / 8, NB = attn_mma::q8_blocks<D>(), AT = attn_mma::q8_stage_at<D>();
  using Sm = DecodeSmem<D, Q8>;
  extern __shared__ uint4 smem[];
  __half* k_s = reinterpret_cast<__half*>(smem);  // [S][kKeys][DP]
  __half* v_s = k_s + S * kKeys * DP;             // [S][kKeys][DP]
  float* o_s = reinterpret_cast<float*>(smem);    // after the tiles: [kWarps][kRows][D]
  // Q8: the scales (DecodeSmem).
  [[maybe_unused]] float* ksc_s = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(smem) + Sm::kTiles);
  [[maybe_unused]] float* vsc_s = ksc_s + S * kKeys * NB;
  __shared__ float m_s[kWarps][kRows], l_s[kWarps][kRows];
  __shared__ uint4 q_s[2][D / 16][32];  // q as A fragments, hi and lo, per k-step and lane
  __shared__ RopeSmem<D, R> rs;

  const DecodePlan& pl = P.plan;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
  const int G = P.n_heads / P.n_kv_heads;
  const int kvh = int(blockIdx.y) / pl.row_groups, p0 = (int(blockIdx.y) % pl.row_groups) * kRows;
  const int split = int(blockIdx.x);
  const int n_tokens = int(P.n_tokens);  // (at most kDecodeAttnMaxTokens; R: kGemvMaxTokens)
  // Row r is the pair p0 + r: token (p0 + r) / G, head kvh * G + (p0 + r) % G.
  auto row_token = [&](int r) { return (p0 + r) / G; };
  auto row_out = [&](int r) { return (int64_t(row_token(r)) * P.n_heads + kvh * G + (p0 + r) % G) * D; };
  // Rows 0 .. n_rows - 1 hold pairs (the others are zeros): the merges and outputs skip the rest
  // (one token of Llama-3-8B: 4 of 16 rows).
  const int n_rows = min(kRows, n_tokens * G - p0);

  // Before the PDL wait: pos (written by copies, and by advance_decode at the end of a chained
  // step, which never directly precedes attention: CudaBackend checks) and, with P.early_kv, the keys of earlier
  // steps: the previous kernel (the step's KV write) writes only the rows at pos, and every
  // kernel before it finished before it could start this one (each kernel lets the next start
  // only after its own wait). Their loads then overlap the KV write.
  // 1. Key range [first, last] of each row (empty: INT_MAX, -1), lane l holding row l % 16; each
  // warp reduces them itself (no barrier).
  int first = INT_MAX, last = -1;
  if (row_token(lane & 15) < n_tokens) {
    last = min(max(P.pos[row_token(lane & 15)], 0), P.n_ctx - 1);
    first = P.window > 0 ? max(0, last - P.window + 1) : 0;
  }
  // This split's share of the rows' keys, whole 16-key warp slices; `fresh`: the first key this
  // step writes, over all its tokens (not only this row group's: lane t < n_tokens <= 16 < 32).
  int b_lo = __reduce_min_sync(0xffffffffu, first), b_hi = __reduce_max_sync(0xffffffffu, last);
  const int fresh =
      __reduce_min_sync(0xffffffffu, lane < n_tokens ? min(max(P.pos[lane], 0), P.n_ctx - 1) : INT_MAX);
  if (b_lo <= b_hi) {
    const int per = int(align_up(uint64_t(div_up(b_hi - b_lo + 1, pl.n_splits)), kWarpKeys));
    b_lo += split * per;
    b_hi = min(b_hi, b_lo + per - 1);
  }
  int r_lo[2], r_hi[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    r_lo[r] = max(__shfl_sync(0xffffffffu, first, g + 8 * r), b_lo);
    r_hi[r] = min(__shfl_sync(0xffffffffu, last, g + 8 * r), b_hi);
  }

  // 2. The tiles of keys [b_lo, b_hi]. When they all fit the stages (`one_pass`: splits of up to
  // 128 keys, positions below 1024 over 8 splits) they are all loaded first (the n_early tiles)
  // and warp w takes keys [w wk, (w + 1) wk) of them, wk = 16 n_tiles, in one step: a split of
  // 65..128 keys no longer costs a second serial step on warp 0 (H200: docs/cuda.md, v18).
  // Otherwise S - 1 tiles load ahead of the loop and warp w takes keys 16w..16w + 15 of each.
  // With early_kv, the n_early tiles' keys before `fresh` are issued before the PDL wait, the
  // rest after it.
  static_assert(S == 2, "one pass: the stages are one tile of 2 kKeys rows");
  const int64_t width = int64_t(P.n_kv_heads) * D;
  const __half* kg = static_cast<const __half*>(P.k) + int64_t(kvh) * D;
  const __half* vg = static_cast<const __half*>(P.v) + int64_t(kvh) * D;
  // Q8: the head's first block in row 0, and the bytes of a cache row.
  [[maybe_unused]] const int64_t q8_row = width / 32 * 34;
  [[maybe_unused]] const uint8_t* kg8 = static_cast<const uint8_t*>(P.k) + int64_t(kvh) * attn_mma::q8_row_bytes<D>();
  [[maybe_unused]] const uint8_t* vg8 = static_cast<const uint8_t*>(P.v) + int64_t(kvh) * attn_mma::q8_row_bytes<D>();
  const int n_tiles = b_hi >= b_lo ? (b_hi - b_lo) / kKeys + 1 : 0;
  const bool one_pass = n_tiles <= S;
  const int n_early = one_pass ? n_tiles : S - 1;
  auto issue = [&](int i, int from, int to) {  // tile i's keys in [from, to), into stage i % S
    if constexpr (Q8)
      attn_mma::load_tile_q8<D, kThreads>(k_s + (i % S) * kKeys * DP, v_s + (i % S) * kKeys * DP, kg8, vg8, q8_row,
                                          b_lo + i * kKeys, b_hi, from, to);
    else
      attn_mma::load_tile<D, kThreads, true>(k_s + (i % S) * kKeys * DP, v_s + (i % S) * kKeys * DP, kg, vg, width,
                                             b_lo + i * kKeys, b_hi, from, to);
  };
  auto load = [&](int i, int from, int to) {  // one commit group
    if (i < n_tiles) issue(i, from, to);
    cp_async_commit();  // (empty groups keep the count)
  };
  auto load_early = [&](int from, int to) {  // the n_early tiles' keys in [from, to), one group
#pragma unroll
    for (int i = 0; i < S; ++i)
      if (i < n_early) issue(i, from, to);
    cp_async_commit();
  };
  if (R || P.early_kv) {
#pragma unroll
    for (int i = 0; i < S; ++i)
      if (i < n_early) load(i, INT_MIN, fresh);
  }
  // R: the step's positions are fresh, fresh + 1, ... (one per token), so every key of
  // [fresh, b_hi] is one this block writes itself (else those rows are loaded, then overwritten).
  bool contiguous = true;
  if constexpr (R) {
    contiguous = __all_sync(0xffffffffu, lane >= n_tokens || P.pos[lane] == fresh + lane);
    const int half = P.rope.rot_dims / 2;
    for (int i = threadIdx.x; i < n_tokens * half; i += kThreads)
      rs.cs[i / half][i % half] = rope_cos_sin(P.pos[i / half], P.rope.inv_freq[i % half], P.rope.attn_factor);
    __syncthreads();
  }
  constexpr int DJ = D / 32;
  [[maybe_unused]] float qw[DJ], kw[DJ];  // this lane's norm weight values (R; uploaded: read before the wait)
  if constexpr (R) {
#pragma unroll
    for (int j = 0; j < DJ; ++j) {
      qw[j] = P.rope.q_norm ? P.rope.q_norm[lane + 32 * j] : 1.0f;
      kw[j] = P.rope.k_norm ? P.rope.k_norm[lane + 32 * j] : 1.0f;
    }
  }
  [[maybe_unused]] const unsigned tl = pdl_prologue();
  if constexpr (R) {
    // The rest of the first tiles: zeros past b_hi, or (positions not contiguous) every row from
    // fresh on, overwritten below with the step's rows once landed.
    load_early(contiguous ? b_hi + 1 : fresh, INT_MAX);
    if (!contiguous) {
      cp_async_wait<0>();
      __syncthreads();
    }
    // The global reads first (one round trip): this warp's first q row (w) and the k / v rows of
    // token 3 - w when its position is among this block's keys (the last warp has the fewest q
    // rows); the q rows w + 4, ... (more than 4 (token, head) pairs) and the k / v rows of tokens
    // 7 - w ... are loaded in the loops below, one row at a time (one rope_row copy: v18). Then
    // the q rows are normed and rotated into rs.q, each k row into rs.kv, and k / v are stored in
    // the caches and, in the n_early tiles, in the tiles.
    // kParts: each value is (first partial + second partial) / rms (the GEMV's input RMSNorm).
    float in_inv = 1.0f;
    if constexpr (kParts)
      if (P.rope.in_ss) in_inv = inv_rms(P.rope.in_ss[0] + P.rope.in_ss[1], P.rope.in_cols, P.rope.in_eps);
    float qv[DJ];
    auto load_q = [&](int r) {
      if constexpr (kParts) {
        float q2[DJ];
#pragma unroll
        for (int j = 0; j < DJ; ++j) {
          qv[j] = P.q[row_out(r) + lane + 32 * j];
          q2[j] = P.rope.q2[row_out(r) + lane + 32 * j];
        }
#pragma unroll
        for (int j = 0; j < DJ; ++j) qv[j] = (qv[j] + q2[j]) * in_inv;
      } else {
#pragma unroll
        for (int j = 0; j < DJ; ++j) qv[j] = P.q[row_out(r) + lane + 32 * j];
      }
    };
    if (row_token(warp) < n_tokens) load_q(warp);
    auto kv_pos = [&](int t) {  // the cache row of token t if among this block's keys, else -1
      const int p = P.pos[t];
      return p >= b_lo && p <= b_hi && p >= 0 && p < P.n_ctx ? p : -1;
    };
    float kv[DJ];
    float2 vv[D / 64];                   // f16 caches: values 2 lane + 64 i, + 1
    [[maybe_unused]] float vq[DJ];       // Q8: value lane of each 32-value block
    auto load_kv = [&](int t) {
      const int64_t at = int64_t(t) * width + int64_t(kvh) * D;
      const float *kr = P.rope.k + at, *vr = P.rope.v + at;
#pragma unroll
      for (int j = 0; j < DJ; ++j) kv[j] = kr[lane + 32 * j];
      if constexpr (Q8) {
#pragma unroll
        for (int j = 0; j < DJ; ++j) vq[j] = vr[lane + 32 * j];
      } else {
#pragma unroll
        for (int i = 0; i < D / 64; ++i) vv[i] = *reinterpret_cast<const float2*>(vr + 2 * lane + 64 * i);
      }
      if constexpr (kParts) {
        const float *kr2 = P.rope.k2 + at, *vr2 = P.rope.v2 + at;
        float k2[DJ];
#pragma unroll
        for (int j = 0; j < DJ; ++j) k2[j] = kr2[lane + 32 * j];
        if constexpr (Q8) {
          float v2[DJ];
#pragma unroll
          for (int j = 0; j < DJ; ++j) v2[j] = vr2[lane + 32 * j];
#pragma unroll
          for (int j = 0; j < DJ; ++j) vq[j] = (vq[j] + v2[j]) * in_inv;
        } else {
          float2 v2[D / 64];
#pragma unroll
          for (int i = 0; i < D / 64; ++i) v2[i] = *reinterpret_cast<const float2*>(vr2 + 2 * lane + 64 * i);
#pragma unroll
          for (int i = 0; i < D / 64; ++i) vv[i] = make_float2((vv[i].x + v2[i].x) * in_inv, (vv[i].y + v2[i].y) * in_inv);
        }
#pragma unroll
        for (int j = 0; j < DJ; ++j) kv[j] = (kv[j] + k2[j]) * in_inv;
      }
    };
    const int t0 = kWarps - 1 - warp;
    const int p0_kv = t0 < n_tokens ? kv_pos(t0) : -1;
    if (p0_kv >= 0) load_kv(t0);
#pragma unroll 1
    for (int r = warp; r < kRows && row_token(r) < n_tokens; r += kWarps) {
      if (r != warp) load_q(r);
      rope_row<D>(rs.q[r], qv, qw, P.rope.q_norm != nullptr, P.rope.eps, rs.cs[row_token(r)], P.rope);
    }
    for (int t = t0; t < n_tokens; t += kWarps) {
      const int p = t == t0 ? p0_kv : kv_pos(t);
      if (p < 0) continue;
      if (t != t0) load_kv(t);
      rope_row<D>(rs.kv[warp], kv, kw, P.rope.k_norm != nullptr, P.rope.eps, rs.cs[t], P.rope);
      const int tile = (p - b_lo) / kKeys, trow = tile * kKeys + (p - b_lo) % kKeys;
      if constexpr (Q8) {
        // Each 32-value block quantized once (as kv_write), into the cache row and, in the first
        // tiles, into the staged row (converted with the others before the loop).
        uint8_t* kc = const_cast<uint8_t*>(kg8) + int64_t(p) * q8_row;
        uint8_t* vc = const_cast<uint8_t*>(vg8) + int64_t(p) * q8_row;
        const bool staged = tile < n_early;
#pragma unroll
        for (int j = 0; j < DJ; ++j) {
          uint16_t kd, vd;
          uint8_t kq, vq8;
          q8_quantize(rs.kv[warp][lane + 32 * j], kd, kq);
          q8_quantize(vq[j], vd, vq8);
          put_q8_block(kd, kq, kc + 34 * j);
          put_q8_block(vd, vq8, vc + 34 * j);
          if (staged) {  // (where load_tile_q8 would have put it)
            const int at = AT + attn_mma::q8_shift(kc) + 34 * j;
            put_q8_block(kd, kq, reinterpret_cast<uint8_t*>(k_s + trow * DP) + at);
            put_q8_block(vd, vq8, reinterpret_cast<uint8_t*>(v_s + trow * DP) + at);
          }
        }
        if (!staged) __threadfence();  // (as below)
        __syncwarp();
        continue;
      }
      __half* kc = const_cast<__half*>(kg) + int64_t(p) * width;
      __half* vc = const_cast<__half*>(vg) + int64_t(p) * width;
      __half* kt = tile < n_early ? k_s + trow * DP : nullptr;
      __half* vt = tile < n_early ? v_s + trow * DP : nullptr;
#pragma unroll
      for (int i = 0; i < D / 64; ++i) {
        const int d = 2 * lane + 64 * i;
        const __half2 kh = __floats2half2_rn(rs.kv[warp][d], rs.kv[warp][d + 1]);
        const __half2 vh = __floats2half2_rn(vv[i].x, vv[i].y);
        *reinterpret_cast<__half2*>(kc + d) = kh;
        *reinterpret_cast<__half2*>(vc + d) = vh;
        if (kt) {
          *reinterpret_cast<__half2*>(kt + d) = kh;
          *reinterpret_cast<__half2*>(vt + d) = vh;
        }
      }
      // A row of a later tile is read back by the loop's cp.async (L2): make the stores visible
      // there before the barrier below, not only to the block.
      if (!kt) __threadfence();
      __syncwarp();  // rs.kv[warp] is read before the warp's next token writes it
    }
    __syncthreads();  // rs.q, the tiles' rows; the cache rows before any later tile's load
    SHOAL_MARK(tl, 1);
  } else if (!P.early_kv) {
#pragma unroll
    for (int i = 0; i < S; ++i)
      if (i < n_early) load(i, INT_MIN, INT_MAX);
  } else if (n_tiles > 0 && fresh < b_lo + n_early * kKeys) {  // this step's keys in the first tiles
    load_early(fresh, INT_MAX);
  }
  // q split into f16 hi + lo once per block: warp w makes k-steps w, w + kWarps, ...
  uint32_t qh[D / 16][4], ql[D / 16][4];
  auto q_src = [&](int r) -> const float* {  // row r of q (R: normed and rotated), null past the tokens
    if (row_token(r) >= n_tokens) return nullptr;
    if constexpr (R)
      return rs.q[r];
    else
      return P.q + row_out(r);
  };
  const float* qa = q_src(g);
  const float* qb = q_src(g + 8);
#pragma unroll
  for (int ks = warp; ks < D / 16; ks += kWarps) {
    uint32_t h[4], l[4];
    attn_mma::q_fragment(h, l, qa, qb, ks, P.scale * attn_mma::kLog2e, c);  // (log2 units)
    q_s[0][ks][lane] = make_uint4(h[0], h[1], h[2], h[3]);
    q_s[1][ks][lane] = make_uint4(l[0], l[1], l[2], l[3]);
  }
  __syncthreads();
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    const uint4 h = q_s[0][ks][lane], l = q_s[1][ks][lane];
    qh[ks][0] = h.x, qh[ks][1] = h.y, qh[ks][2] = h.z, qh[ks][3] = h.w;
    ql[ks][0] = l.x, ql[ks][1] = l.y, ql[ks][2] = l.z, ql[ks][3] = l.w;
  }
  // The step's own keys in the first tiles (an extra commit group), or one pass: wait for all
  // before the loop, which counts S - 1 groups ahead.
  if (one_pass || R || (P.early_kv && n_tiles > 0 && fresh < b_lo + n_early * kKeys)) cp_async_wait<0>();
  SHOAL_MARK(tl, 2);
  attn_mma::RowState<D> st;
  st.init();
  const int wk = one_pass ? kWarpKeys * max(n_tiles, 1) : kWarpKeys;  // keys of a warp per step
#pragma unroll 1
  for (int i = 0; i < n_tiles; i += one_pass ? S : 1) {
    if (!one_pass) load(i + S - 1, INT_MIN, INT_MAX);
    cp_async_wait<S - 1>();
    __syncthreads();
    if constexpr (Q8) {  // the landed stage (one pass: every tile) as integers and scales
      const int first = one_pass ? 0 : i % S;
      attn_mma::convert_q8_tiles<D, kThreads>(k_s + first * kKeys * DP, v_s + first * kKeys * DP,
                                              ksc_s + first * kKeys * NB, vsc_s + first * kKeys * NB, kg8, vg8,
                                              q8_row, b_lo + i * kKeys, (one_pass ? n_tiles : 1) * kKeys);
      __syncthreads();
    }
    const int key0 = b_lo + i * kKeys + warp * wk;
    if (key0 <= b_hi) {
      const int row = (i % S) * kKeys + warp * wk, off = row * DP;
      const bool full = wk > kWarpKeys && key0 + kWarpKeys <= b_hi;  // keys in the warp's second 16
      attn_mma::tile_step<D, 2 * kWarpKeys / 8, kStepChains, false, true, false, Q8>(
          k_s + off, v_s + off, key0, qh, ql, r_lo, r_hi, 0.0f, st, full, n_rows > 8, true, ksc_s + row * NB,
          vsc_s + row * NB);
    }
    __syncthreads();  // a later load overwrites this buffer
  }
  cp_async_wait<0>();
  if constexpr (Q8) st.q8_unscale();
  SHOAL_MARK(tl, 3);

  // 3. The warps' states into shared memory (over the tiles), merged into warp 0's place with
  // per-row weights: M = max_w m_w, L = sum_w l_w e^(m_w - M), O = sum_w o_w e^(m_w - M).
  st.reduce_l();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    float* dst = o_s + (warp * kRows + g + 8 * r) * D + 2 * c;
    if (g + 8 * r < n_rows)
#pragma unroll
      for (int d = 0; d < DT; ++d)
        *reinterpret_cast<float2*>(dst + d * 8) = make_float2(st.o[d][2 * r], st.o[d][2 * r + 1]);
    if (c == 0) m_s[warp][g + 8 * r] = st.m[r], l_s[warp][g + 8 * r] = st.l[r];
  }
  __shared__ float wt_s[kMaxClusterSplits > kWarps ? kMaxClusterSplits : kWarps][kRows];
  __syncthreads();
  static_assert(kWarps == 4 && kRows * kWarps <= kThreads && kRows * kWarps % 32 == 0,
                "a thread per (row, warp), 4 lanes per row, whole warps (full-mask shuffles)");
  if (threadIdx.x < kRows * kWarps) {  // (whole warps) thread 4 r + w: row r, warp w
    const int r = threadIdx.x >> 2, w = threadIdx.x & 3;
    const float m = m_s[w][r];
    float M = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
    M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, 2));
    const float wt = m == -INFINITY ? 0.0f : exp2f(m - M);
    float L = l_s[w][r] * wt;
    L += __shfl_xor_sync(0xffffffffu, L, 1);
    L += __shfl_xor_sync(0xffffffffu, L, 2);
    wt_s[w][r] = wt;
    if (w == 0) m_s[0][r] = M, l_s[0][r] = L;  // (the quad read its values before the shuffles)
  }
  __syncthreads();
#pragma unroll 1
  for (int idx = 4 * threadIdx.x; idx < n_rows * D; idx += 4 * kThreads) {
    const int r = idx / D;
    float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float4 o = *reinterpret_cast<const float4*>(o_s + w * kRows * D + idx);
      const float wt = wt_s[w][r];
      O = make_float4(fmaf(o.x, wt, O.x), fmaf(o.y, wt, O.y), fmaf(o.z, wt, O.z), fmaf(o.w, wt, O.w));
    }
    *reinterpret_cast<float4*>(o_s + idx) = O;
  }
  __syncthreads();
  SHOAL_MARK(tl, 4);

  // 4. Output: this block's (one split), the cluster's merge, or the split's partial result.
  if (pl.n_splits == 1) {
#pragma unroll 1
    for (int idx = threadIdx.x; idx < n_rows * D; idx += kThreads) {
      const int r = idx / D;
      P.out[row_out(r) + idx % D] = l_s[0][r] > 0.0f ? o_s[idx] / l_s[0][r] : 0.0f;
    }
  } else if (pl.cluster) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900  // (clusters: sm_90+; the plan has none below)
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();  // every block's state is in its shared memory
    SHOAL_MARK(tl, 5);
    // Weight of block b for row r, 1 / L folded in; then block `split` merges outputs split,
    // split + n_splits, ... of the row group.
    __syncthreads();  // wt_s is reused
    static_assert(kRows * kMaxClusterSplits == kThreads && kMaxClusterSplits == 8, "thread 8 r + b: row r, block b");
    {
      const int r = threadIdx.x >> 3, b = threadIdx.x & 7;
      const bool in = b < pl.n_splits;
      const float m = in ? cluster.map_shared_rank(&m_s[0][0], b)[r] : -INFINITY;
      const float l = in ? cluster.map_shared_rank(&l_s[0][0], b)[r] : 0.0f;
      float M = m;
#pragma unroll
      for (int s = 1; s < 8; s *= 2) M = fmaxf(M, __shfl_xor_sync(0xffffffffu, M, s));
      const float wt = m == -INFINITY ? 0.0f : exp2f(m - M);
      float L = l * wt;
#pragma unroll
      for (int s = 1; s < 8; s *= 2) L += __shfl_xor_sync(0xffffffffu, L, s);
      wt_s[b][r] = L > 0.0f ? wt / L : 0.0f;
    }
    __syncthreads();
#pragma unroll 1
    for (int idx = 4 * (split * kThreads + threadIdx.x); idx < n_rows * D; idx += 4 * pl.n_splits * kThreads) {
      const int r = idx / D;
      float4 O = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
      for (int b = 0; b < kMaxClusterSplits; ++b)
        if (b < pl.n_splits) {
          const float4 o = *reinterpret_cast<const float4*>(cluster.map_shared_rank(o_s, b) + idx);
          const float wt = wt_s[b][r];
          O = make_float4(fmaf(o.x, wt, O.x), fmaf(o.y, wt, O.y), fmaf(o.z, wt, O.z), fmaf(o.w, wt, O.w));
        }
      *reinterpret_cast<float4*>(P.out + row_out(r) + idx % D) = O;  // (rows of D floats: aligned)
    }
    SHOAL_MARK(tl, 6);
    cluster.sync();  // no block leaves while others read its shared memory
    SHOAL_MARK(tl, 7);
#else
    __trap();  // (set_clusters() is off unless the device code is sm_90+)
#endif
  } else {
#pragma unroll 1
    for (int idx = threadIdx.x; idx < n_rows * D; idx += kThreads) {
      const int r = idx / D;
      const int64_t row = (row_out(r) / D) * pl.n_splits + split;
      P.part_o[row * D + idx % D] = o_s[idx];
      if (idx % D == 0) {
        P.part_ml[row * 2] = m_s[0][r] * attn_mma::kLn2;  // (the combine's m: natural units)
        P.part_ml[row * 2 + 1] = l_s[0][r];
      }
    }
  }
}

template <int D, bool Q8>
constexpr size_t smem_bytes() {
  static_assert(DecodeSmem<D, Q8>::kTiles >= kWarps * kRows * D * sizeof(float), "the warps' states fit over the tiles");
  return DecodeSmem<D, Q8>::kBytes;
}

template <int D, bool R, bool Q8 = false, bool kParts = false>
cudaError_t launch_decode(const Params& P, cudaStream_t stream) {
  const auto kernel = attention_decode_mma_kernel<D, R, Q8, kParts>;
  if (const cudaError_t e =
          cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem_bytes<D, Q8>()));
      e != cudaSuccess)
    return e;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(P.plan.n_splits), unsigned(P.n_kv_heads * P.plan.row_groups));
  cfg.blockDim = dim3(kThreads);
  cfg.dynamicSmemBytes = smem_bytes<D, Q8>();
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (P.plan.cluster) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = unsigned(P.plan.n_splits);
    attr[n].val.clusterDim.y = 1;
    attr[n++].val.clusterDim.z = 1;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, P);
  return e != cudaSuccess ? e : cudaGetLastError();
}

// The launch for the head size (64 or 128: use_decode_mma admits no other).
template <bool R, bool Q8, bool kParts = false>
cudaError_t launch_head(const Params& P, int head_dim, cudaStream_t stream) {
  return head_dim == 64 ? launch_decode<64, R, Q8, kParts>(P, stream) : launch_decode<128, R, Q8, kParts>(P, stream);
}

}  // namespace

bool set_clusters(bool on) {
  const bool before = g_clusters;
  g_clusters = on;
  return before;
}

int64_t attention_keys_bound(int64_t keys, int n_tokens) {
  // Without clusters no plan depends on it: up to 32 splits, and at least 1792 / 16 = 112 key slices.
  if (!g_clusters || n_tokens > kDecodeAttnMaxTokens) return 0;
  return keys <= kClusterMaxKeys ? kClusterMaxKeys : 0;
}

bool use_decode_mma(const AttnArgs& a) {
  static_assert(kDecodeAttnMaxTokens < 32, "the key range's reductions take a token per lane");
  if (!((a.cache == CacheKind::kF16 || a.cache == CacheKind::kQ8_0) && a.n_tokens >= 1 &&
        a.n_tokens <= kDecodeAttnMaxTokens && (a.head_dim == 64 || a.head_dim == 128) && a.n_ctx <= INT_MAX &&
        !(a.softcap > 0.0f)))
    return false;
  // Past kGemvMaxTokens only as one cluster (no combine kernel): its blocks of 16 rows read each
  // K / V tile once per row group, where the prefill kernel's blocks read it once per KV head.
  return a.n_tokens <= kGemvMaxTokens || decode_plan(a).cluster;
}

DecodePlan decode_plan(const AttnArgs& a) {
  DecodePlan p;
  const int G = a.n_heads / a.n_kv_heads;
  p.row_groups = int(div_up(a.n_tokens * G, kRows));
  const int64_t blocks = int64_t(a.n_kv_heads) * p.row_groups;
  const int64_t keys = a.max_keys > 0 ? std::min(a.max_keys, a.n_ctx) : a.n_ctx;
  const bool cluster = g_clusters && keys <= kClusterMaxKeys;
  const int64_t most = !cluster                        ? kMaxSplits
                       : a.n_tokens > kGemvMaxTokens ? kMaxBatchClusterSplits
                                                     : kMaxClusterSplits;
  const int64_t splits = std::min<int64_t>({most, div_up(kFillBlocks, blocks), div_up(keys, kWarpKeys)});
  p.n_splits = int(std::max<int64_t>(1, splits));
  p.cluster = cluster && p.n_splits > 1;
  return p;
}

cudaError_t attention_decode_mma(const float* q, const void* k_cache, const void* v_cache, const int32_t* pos,
                                 const AttnArgs& a, const DecodePlan& plan, float* part_o, float* part_ml, float* out,
                                 cudaStream_t stream, const AttnRope* rope) {
  if (rope && a.n_tokens > kGemvMaxTokens) return cudaErrorInvalidValue;  // (RopeSmem holds kGemvMaxTokens)
  const Params P = Params::of(q, k_cache, v_cache, pos, a, plan, part_o, part_ml, out, rope ? *rope : AttnRope{});
  const bool parts = rope && rope->q2;
  if (a.cache == CacheKind::kQ8_0) {
    if (parts) return launch_head<true, true, true>(P, a.head_dim, stream);
    return rope ? launch_head<true, true>(P, a.head_dim, stream) : launch_head<false, true>(P, a.head_dim, stream);
  }
  if (parts) return launch_head<true, false, true>(P, a.head_dim, stream);
  return rope ? launch_head<true, false>(P, a.head_dim, stream) : launch_head<false, false>(P, a.head_dim, stream);
}

}  // namespace shoal::cuda
