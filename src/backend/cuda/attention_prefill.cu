// Prefill attention (more than kGemvMaxTokens tokens, but for the decode kernel's clusters of up to
// kDecodeAttnMaxTokens) on the f16 tensor cores for f16 and Q8_0 KV caches and head_dim 64 / 128
// (attention_mma.cuh: the tile step, Q8_0 rows, exactness). A warp owns 16 consecutive tokens of
// one query head; the 4 warps of a block share a KV head (4 / gb token slices of gb heads), so each
// K/V tile is read once for all of them. The block walks its keys in 64-key tiles, double-buffered
// (the next tile loading while this one is computed); the blocks with the most keys start first,
// over all heads. Splits along the keys (combined by attention_combine_flat_kernel) only when a
// call has too few blocks to fill the GPU; with up to two blocks per SM, two sets of 4 warps share
// each block's key tiles and merge their softmax states at the end (PrefillPlan::halves).
//
// Other caches and head sizes keep attention.cu's tiled kernel; this one replaced it for
// prefill, where it re-read every key for each token on the CUDA cores (1.05 ms per Llama-3-8B
// layer at 512 tokens on the H200, now 26 us).
// Twin: ref::attention; tests: tests/cuda/cuda_attention_test.cc.
#include <algorithm>
#include <climits>
#include <cmath>

#include "backend/cuda/attention_mma.cuh"
#include "backend/cuda/attention_mma.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/launch.cuh"

namespace shoal::cuda {
namespace {

using attn_mma::kKeys;
using attn_mma::kRows;
constexpr int kWarps = 4;                        // warps of a block's (head, token slice) pairs
constexpr int kMaxBlockTokens = kWarps * kRows;  // when every warp has the same head
constexpr int kMaxSplits = 32;                   // splits at most (bounds the partial results)
// Fewer blocks than kFillBlocks: split the keys, for about kSplitBlocks blocks. (96 before v36;
// 64 since the blocks' order and the two warp sets: 128 tokens with Llama-3-8B's heads 12.3 ->
// 8.9 us, 256 with Qwen3-0.6B's 17.8 -> 12.4 on the H200, docs/cuda.md v36.)
constexpr int64_t kFillBlocks = 64, kSplitBlocks = 192;

// The current device's SMs (132, the H200's, where they cannot be read).
int64_t sm_count() {
  DeviceLimits d;
  return device_limits(d) == cudaSuccess && d.sms > 0 ? d.sms : 132;
}
// Threads of a block with kHalves warp sets.
template <int kHalves>
constexpr int kThreadsOf = kWarps * 32 * kHalves;

using Params = MmaParams<PrefillPlan>;
int g_halves_override = 0;  // set_prefill_halves

using attn_mma::kLn2;
using attn_mma::kLog2e;

// kOnePart: AttnArgs::one_part (q and p as one f16 part). Scores are in log2 units (tile_step's
// kLog2). The minimum of one block per SM is not a no-op: with it ptxas gives the one-part
// kernel 223 registers instead of 176, as in the build measured in docs/cuda.md v33.
// kHalves (PrefillPlan::halves): warps 4 h + w (h < kHalves) take the block's key tiles
// kHalves j + h; the halves' softmax states are merged in shared memory at the end.
// Q8: Q8_0 caches, staged in the tiles' rows and converted per set of tiles into f16 integer
// tiles and scales (attention_mma.cuh; PrefillSmem).
template <int D, int kHalves, bool Q8>
struct PrefillSmem {
  static constexpr int kBuffers = 2 * kHalves;  // tiles of K (and of V): 2 buffers of kHalves
  static constexpr size_t kTiles = size_t(2 * kBuffers * kKeys * attn_mma::pitch<D>()) * sizeof(__half);
  static constexpr size_t kScales = Q8 ? size_t(kBuffers * kKeys * attn_mma::q8_blocks<D>()) * sizeof(float) : 0;
  static constexpr size_t kBytes = kTiles + 2 * kScales;
};

template <int D, bool kOnePart, int kHalves, bool Q8>
__global__ void __launch_bounds__(kThreadsOf<kHalves>, 1) attention_prefill_kernel(const Params P) {
  constexpr int DP = attn_mma::pitch<D>(), DT = D / 8, kThreads = kThreadsOf<kHalves>;
  constexpr int kTile = kKeys * DP;               // halves of one K or V tile
  constexpr int NB = attn_mma::q8_blocks<D>();
  using Sm = PrefillSmem<D, kHalves, Q8>;
  extern __shared__ uint4 smem[];
  __half* k_s = reinterpret_cast<__half*>(smem);  // [2 buffers][kHalves][kKeys][DP]
  __half* v_s = k_s + 2 * kHalves * kTile;        // [2 buffers][kHalves][kKeys][DP]
  // Q8: the scales [2 buffers][kHalves][kKeys][NB] of K and V.
  [[maybe_unused]] float* ksc_s = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(smem) + Sm::kTiles);
  [[maybe_unused]] float* vsc_s = ksc_s + Sm::kBuffers * kKeys * NB;
  __shared__ int lo_s[kMaxBlockTokens], hi_s[kMaxBlockTokens];

  const PrefillPlan& pl = P.plan;
  const int lane = threadIdx.x & 31, half = int(threadIdx.x) >> 7, warp = (threadIdx.x >> 5) & (kWarps - 1);
  const int g = lane >> 2, c = lane & 3;
  const int G = P.n_heads / P.n_kv_heads;
  // Blocks in order of their keys, most first over every head: block b (linear over x, y) takes
  // token tile T - 1 - b / Y of head group b % Y. (Taking the heads one after another, as before,
  // started the last heads' longest blocks last: 1024 tokens of Llama-3-8B's heads 102 against
  // 73 us on the H200, docs/cuda.md v36.)
  const int Y = int(gridDim.y), b = int(blockIdx.x) + int(gridDim.x) * int(blockIdx.y);
  const int tile = pl.token_tiles - 1 - b / Y, yy = b % Y;
  const int64_t t0 = int64_t(tile) * pl.block_tokens;
  const int kvh = yy / pl.groups;
  const int head = kvh * G + (yy % pl.groups) * pl.gb + warp % pl.gb;
  const int wtok = (warp / pl.gb) * kRows;  // the warp's first token in the block
  const int split = int(blockIdx.z);
  pdl_prologue();

  // 1. Key range [first, last] of each token of the block (empty: first > last).
  for (int i = threadIdx.x; i < pl.block_tokens; i += kThreads) {
    const int64_t t = t0 + i;
    int first = 1, last = 0;
    if (t < P.n_tokens) {
      last = min(max(P.pos[t], 0), P.n_ctx - 1);
      first = P.window > 0 ? max(0, last - P.window + 1) : 0;
    }
    lo_s[i] = first;
    hi_s[i] = last;
  }
  // 2. The warp's 16 rows of q (loads in flight with the range reads above).
  uint32_t qh[D / 16][4], ql[D / 16][4];
  {
    const int64_t ta = t0 + wtok + g, tb = ta + 8;
    attn_mma::load_q<D>(qh, ql, ta < P.n_tokens ? P.q + (ta * P.n_heads + head) * D : nullptr,
                        tb < P.n_tokens ? P.q + (tb * P.n_heads + head) * D : nullptr,
                        P.scale * kLog2e, c);
  }
  __syncthreads();
  // This split's share of the block's keys (divided at run time: a captured graph's grid depends
  // only on the cache size), then each token's and the warp's keys inside it.
  int b_lo = INT_MAX, b_hi = -1;
  for (int i = 0; i < pl.block_tokens; ++i)
    if (lo_s[i] <= hi_s[i]) b_lo = min(b_lo, lo_s[i]), b_hi = max(b_hi, hi_s[i]);
  if (b_lo <= b_hi) {
    const int per = int(align_up(uint64_t(div_up(b_hi - b_lo + 1, pl.n_splits)), kKeys));
    b_lo += split * per;
    b_hi = min(b_hi, b_lo + per - 1);
  }
  // [w_lo, w_hi]: the keys any row of the warp attends; [f_lo, f_hi]: those every row attends
  // (a tile inside it needs no mask).
  int w_lo = INT_MAX, w_hi = -1, f_lo = INT_MIN, f_hi = INT_MAX, r_lo[2], r_hi[2];
  for (int i = wtok; i < wtok + kRows; ++i) {
    const int lo = max(lo_s[i], b_lo), hi = min(hi_s[i], b_hi);
    if (lo <= hi) w_lo = min(w_lo, lo), w_hi = max(w_hi, hi);
    f_lo = max(f_lo, lo), f_hi = min(f_hi, hi);
  }
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    r_lo[r] = max(lo_s[wtok + g + 8 * r], b_lo);
    r_hi[r] = min(hi_s[wtok + g + 8 * r], b_hi);
  }

  // 3. The tiles of keys [b_lo, b_hi] in sets of kHalves (one per half), double-buffered.
  const int64_t width = int64_t(P.n_kv_heads) * D;
  const __half* kg = static_cast<const __half*>(P.k) + int64_t(kvh) * D;
  const __half* vg = static_cast<const __half*>(P.v) + int64_t(kvh) * D;
  // Q8: the head's first block in row 0, and the bytes of a cache row.
  [[maybe_unused]] const int64_t q8_row = width / 32 * 34;
  [[maybe_unused]] const uint8_t* kg8 = static_cast<const uint8_t*>(P.k) + int64_t(kvh) * attn_mma::q8_row_bytes<D>();
  [[maybe_unused]] const uint8_t* vg8 = static_cast<const uint8_t*>(P.v) + int64_t(kvh) * attn_mma::q8_row_bytes<D>();
  const int n_tiles = b_hi >= b_lo ? (b_hi - b_lo) / kKeys + 1 : 0;
  const int n_sets = (n_tiles + kHalves - 1) / kHalves;
  auto load_set = [&](int j) {  // tiles kHalves j .. into buffer j & 1
#pragma unroll
    for (int h = 0; h < kHalves; ++h) {
      const int i = j * kHalves + h, buf = (j & 1) * kHalves + h;
      if (i >= n_tiles) continue;
      if constexpr (Q8)
        attn_mma::load_tile_q8<D, kThreads>(k_s + buf * kTile, v_s + buf * kTile, kg8, vg8, q8_row, b_lo + i * kKeys,
                                            b_hi);
      else
        attn_mma::load_tile<D, kThreads>(k_s + buf * kTile, v_s + buf * kTile, kg, vg, width, b_lo + i * kKeys, b_hi);
    }
  };
  attn_mma::RowState<D> st;
  st.init();
  if (n_sets > 0) load_set(0);
  cp_async_commit();
#pragma unroll 1
  for (int j = 0; j < n_sets; ++j) {
    if (j + 1 < n_sets) load_set(j + 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    if constexpr (Q8) {  // the set's landed tiles as integers and scales
      const int first = (j & 1) * kHalves;
      attn_mma::convert_q8_tiles<D, kThreads>(k_s + first * kTile, v_s + first * kTile, ksc_s + first * kKeys * NB,
                                              vsc_s + first * kKeys * NB, kg8, vg8, q8_row, b_lo + j * kHalves * kKeys,
                                              min(kHalves, n_tiles - j * kHalves) * kKeys);
      __syncthreads();
    }
    const int i = j * kHalves + half, k0 = b_lo + i * kKeys, buf = (j & 1) * kHalves + half, at = buf * kTile;
    if (i < n_tiles && k0 <= w_hi && k0 + kKeys - 1 >= w_lo)
      attn_mma::tile_step<D, kKeys / 8, 1, true, true, kOnePart, Q8>(
          k_s + at, v_s + at, k0, qh, ql, r_lo, r_hi, P.softcap * kLog2e, st, true, true,
          k0 < f_lo || k0 + kKeys - 1 > f_hi, ksc_s + buf * kKeys * NB, vsc_s + buf * kKeys * NB);
    __syncthreads();  // the next load overwrites this buffer
  }
  cp_async_wait<0>();
  if constexpr (Q8) st.q8_unscale();
  if constexpr (kHalves == 2) {
    // Half 1's state through shared memory (the tile buffers, free now) into half 0's: each lane
    // holds the same rows and output columns in both halves, and the quad's shares of l are
    // merged lane by lane (reduce_l sums them after).
    constexpr int kVals = 4 * DT + 4;  // o, then m and l of rows g, g + 8
    static_assert(kWarps * kVals * 32 * sizeof(float) <= 4 * kHalves * kTile * sizeof(__half), "fits the tiles");
    float* xs = reinterpret_cast<float*>(smem) + warp * kVals * 32 + lane;
    if (half == 1) {
#pragma unroll
      for (int d = 0; d < DT; ++d)
#pragma unroll
        for (int e = 0; e < 4; ++e) xs[(4 * d + e) * 32] = st.o[d][e];
#pragma unroll
      for (int r = 0; r < 2; ++r) xs[(4 * DT + r) * 32] = st.m[r], xs[(4 * DT + 2 + r) * 32] = st.l[r];
    }
    __syncthreads();
    if (half == 1) return;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const float m1 = xs[(4 * DT + r) * 32], l1 = xs[(4 * DT + 2 + r) * 32];
      const float m = fmaxf(st.m[r], m1);
      const float c0 = st.m[r] == -INFINITY ? 0.0f : attn_mma::exp2_ftz(st.m[r] - m);
      const float c1 = m1 == -INFINITY ? 0.0f : attn_mma::exp2_ftz(m1 - m);
      st.m[r] = m;
      st.l[r] = st.l[r] * c0 + l1 * c1;
#pragma unroll
      for (int d = 0; d < DT; ++d)
#pragma unroll
        for (int e = 2 * r; e < 2 * r + 2; ++e) st.o[d][e] = st.o[d][e] * c0 + xs[(4 * d + e) * 32] * c1;
    }
  }

  // 4. The normalised output, or the split's partial result.
  st.reduce_l();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t t = t0 + wtok + g + 8 * r;
    if (t >= P.n_tokens) continue;
    const int64_t th = t * P.n_heads + head;
    if (pl.n_splits == 1) {
      const float inv = st.l[r] > 0.0f ? 1.0f / st.l[r] : 0.0f;
      float* dst = P.out + th * D + 2 * c;
#pragma unroll
      for (int d = 0; d < DT; ++d)
        *reinterpret_cast<float2*>(dst + d * 8) = make_float2(st.o[d][2 * r] * inv, st.o[d][2 * r + 1] * inv);
    } else {
      const int64_t row = th * pl.n_splits + split;
      float* dst = P.part_o + row * D + 2 * c;
#pragma unroll
      for (int d = 0; d < DT; ++d)
        *reinterpret_cast<float2*>(dst + d * 8) = make_float2(st.o[d][2 * r], st.o[d][2 * r + 1]);
      if (c == 0) {
        P.part_ml[row * 2] = st.m[r] * kLn2;  // (the combine kernel's m is in natural units)
        P.part_ml[row * 2 + 1] = st.l[r];
      }
    }
  }
}

template <int D, bool kOnePart, int kHalves, bool Q8>
cudaError_t launch_prefill_v(const Params& P, cudaStream_t stream) {
  const size_t smem = PrefillSmem<D, kHalves, Q8>::kBytes;
  auto* kernel = attention_prefill_kernel<D, kOnePart, kHalves, Q8>;
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  const dim3 grid(unsigned(P.plan.token_tiles), unsigned(P.n_kv_heads * P.plan.groups), unsigned(P.plan.n_splits));
  return launch(kernel, grid, kThreadsOf<kHalves>, smem, stream, P);
}
// (Two accumulator chains per n-tile, and q in shared memory with three blocks per SM, measured
// slower on the H200: docs/cuda.md v33.)
template <int D, bool kOnePart, bool Q8 = false>
cudaError_t launch_prefill_h(const Params& P, cudaStream_t stream) {
  return P.plan.halves == 2 ? launch_prefill_v<D, kOnePart, 2, Q8>(P, stream)
                            : launch_prefill_v<D, kOnePart, 1, Q8>(P, stream);
}
// Q8_0 caches run exact whatever one_part says (AttnArgs::one_part: for f16 caches).
template <int D>
cudaError_t launch_prefill(const Params& P, bool one_part, bool q8, cudaStream_t stream) {
  if (q8) return launch_prefill_h<D, false, true>(P, stream);
  return one_part ? launch_prefill_h<D, true>(P, stream) : launch_prefill_h<D, false>(P, stream);
}

}  // namespace

bool use_prefill_mma(const AttnArgs& a) {
  return (a.cache == CacheKind::kF16 || a.cache == CacheKind::kQ8_0) && a.n_tokens > kGemvMaxTokens &&
         (a.head_dim == 64 || a.head_dim == 128) && a.n_ctx <= INT_MAX && !use_decode_mma(a);
}

void set_prefill_halves(int halves) { g_halves_override = halves; }

PrefillPlan prefill_plan(const AttnArgs& a) {
  PrefillPlan p;
  const int G = a.n_heads / a.n_kv_heads;
  p.gb = G % 4 == 0 ? 4 : G % 2 == 0 ? 2 : 1;
  p.groups = G / p.gb;
  p.block_tokens = kRows * kWarps / p.gb;
  p.token_tiles = int(div_up(a.n_tokens, p.block_tokens));
  const int64_t blocks = int64_t(p.token_tiles) * a.n_kv_heads * p.groups;
  const int64_t splits = blocks >= kFillBlocks ? 1 : std::min<int64_t>(kMaxSplits, div_up(kSplitBlocks, blocks));
  p.n_splits = int(std::max<int64_t>(1, std::min(splits, div_up(a.n_ctx, kKeys))));
  // Two warp sets where the blocks fit at two per SM without a split (256 threads of 255
  // registers: one block per SM), so the longest blocks take half as long; with more blocks the
  // order alone balances the SMs (docs/cuda.md v36). n_ctx is the cache's size, not the keys the
  // call attends: a short prompt in a long cache may take them for one tile of keys.
  p.halves = p.n_splits == 1 && blocks <= 2 * sm_count() && a.n_ctx > kKeys ? 2 : 1;
  if (g_halves_override == 1 || g_halves_override == 2) p.halves = g_halves_override;
  return p;
}

cudaError_t attention_prefill(const float* q, const void* k_cache, const void* v_cache, const int32_t* pos,
                              const AttnArgs& a, const PrefillPlan& plan, float* part_o, float* part_ml, float* out,
                              cudaStream_t stream) {
  const Params P = Params::of(q, k_cache, v_cache, pos, a, plan, part_o, part_ml, out);
  const bool q8 = a.cache == CacheKind::kQ8_0;
  return a.head_dim == 64 ? launch_prefill<64>(P, a.one_part, q8, stream)
                          : launch_prefill<128>(P, a.one_part, q8, stream);
}

}  // namespace shoal::cuda
