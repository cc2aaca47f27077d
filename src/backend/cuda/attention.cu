// Causal attention over the KV cache with GQA, and its dispatch. f16 caches with head_dim 64 or
// 128 (the default) run on the tensor cores: attention_decode_mma.cu for decode (and up to
// kDecodeAttnMaxTokens tokens in one cluster), attention_prefill.cu for the rest; so do Q8_0
// caches. Here: the tiled CUDA-core kernel for the other caches (f32) and head sizes, and the
// combine kernel of split results.
//
// The tiled kernel splits along the sequence (flash-decoding, Dao et al. 2023), combined in a
// second kernel. One block handles one (split, KV head, group of up to 8 query heads sharing it,
// token). It walks its keys in tiles of 32: the tile's K and V rows are loaded with all threads
// (16-byte loads, all in flight at once) into shared memory as f32, then scores, an online
// softmax (Milakov & Gimelshein 2018) and the V sum run from shared memory, so each K/V row is
// read from memory once per block for all heads of the group. Decode uses small splits (many
// blocks, one or a few tiles each), so a short context still fills the GPU. The key range comes
// from pos[t] on the device: the grid depends only on the cache size, a captured graph stays
// valid as positions grow, and splits past pos[t] exit at once.
// Twin: ref::attention; tests: tests/cuda/cuda_attention_test.cc.
#include <cuda_fp16.h>

#include <algorithm>
#include <cmath>

#include "backend/cuda/attention_mma.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace shoal::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 32;  // keys per shared-memory tile (one per lane in the softmax)
constexpr int kMaxHeadDim = 256;
constexpr int kMaxSplits = 32;  // one per lane in the combine kernel

// Cache row loaders: 8 values at column c (c % 8 == 0) of a row.
// Read-only loads (__ldg); with plain loads nvcc 13 did not finish compiling the F32 variant.
struct CacheF32 {
  __device__ static void load8(const void* cache, int64_t width, int64_t row, int64_t c, float* out) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(cache) + row * width + c);
    const float4 a = __ldg(p), b = __ldg(p + 1);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  }
};

// 8 halves (a 16-byte load) as floats.
__device__ __forceinline__ void half8_to_float(uint4 v, float* f) {
  const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 p = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
    f[2 * i] = p.x;
    f[2 * i + 1] = p.y;
  }
}

struct CacheF16 {
  __device__ static void load8(const void* cache, int64_t width, int64_t row, int64_t c, float* out) {
    half8_to_float(__ldg(reinterpret_cast<const uint4*>(static_cast<const __half*>(cache) + row * width + c)), out);
  }
};

// GGUF Q8_0 rows: width / 32 blocks of 34 bytes (f16 d, 32 int8).
struct CacheQ8 {
  __device__ static const uint8_t* block(const void* cache, int64_t width, int64_t row, int64_t c) {
    return static_cast<const uint8_t*>(cache) + uint64_t(row) * uint64_t(width / 32 * 34) + uint64_t(c / 32) * 34;
  }
  __device__ static void load8(const void* cache, int64_t width, int64_t row, int64_t c, float* out) {
    const uint8_t* b = block(cache, width, row, c);
    const float d = f16_bits_to_float(__ldg(reinterpret_cast<const uint16_t*>(b)));
    const uint16_t* q = reinterpret_cast<const uint16_t*>(b + 2 + c % 32);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint16_t two = __ldg(q + i);
      out[2 * i] = d * float(int8_t(two & 0xff));
      out[2 * i + 1] = d * float(int8_t(two >> 8));
    }
  }
};

struct Params {
  const float* q;
  const void* k;
  const void* v;
  const int32_t* pos;
  AttnArgs a;
  int64_t chunk;  // keys per split
  int n_splits;
  int groups;      // head groups per KV head
  float* part_o;   // [n_tokens, n_heads, n_splits, head_dim] unnormalised outputs
  float* part_ml;  // [n_tokens, n_heads, n_splits, 2] running max and sum
};

// Shared memory of the split kernel, in floats: q [GB][D], K and V tiles [kTile][D + 4] (rows
// padded so that 16-byte reads of consecutive rows hit distinct banks), p [GB][kTile].
constexpr int smem_floats(int gb, int d) { return gb * d + 2 * kTile * (d + 4) + gb * kTile; }

// One split's partial result: unnormalised output, running max and sum of each head of the block.
template <class C, int GB>
__device__ void split_partial(const Params& P, int64_t k0, int64_t k1, int kvh, int h0, int nh, int64_t t,
                              int64_t out_base, float* q_s, float* k_s, float* v_s, float* p_s, float* m_s, float* l_s,
                              float* corr_s) {
  constexpr int kOut = GB * kMaxHeadDim / kThreads;  // outputs per thread at most
  const AttnArgs& a = P.a;
  const int D = a.head_dim, DP = a.head_dim + 4;
  const int64_t width = int64_t(a.n_kv_heads) * D;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  // q goes to registers now and to shared memory after the first tile's loads are issued, so
  // both reads are in flight together (one memory round trip before the first scores).
  constexpr int kQ = GB * kMaxHeadDim / kThreads;
  float qv[kQ];
#pragma unroll
  for (int i = 0; i < kQ; ++i) {
    const int idx = threadIdx.x + i * kThreads, g = idx / D, d = idx % D;
    qv[i] = (idx < GB * D && g < nh) ? P.q[(t * a.n_heads + h0 + g) * D + d] * a.scale : 0.0f;
  }
  if (threadIdx.x < GB) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  float acc[kOut];
#pragma unroll
  for (int i = 0; i < kOut; ++i) acc[i] = 0.0f;
  const int chunks = D / 8;  // 8-value pieces per row

  const int n_tiles = int((k1 - k0) / kTile) + 1;
#pragma unroll 1
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int64_t tile0 = k0 + int64_t(tile) * kTile;
    const int len = int(min(int64_t(kTile), k1 - tile0 + 1));
    // 1. K and V rows of the tile into shared memory (all loads issued before any store).
    constexpr int kPieces = kTile * kMaxHeadDim / 8 / kThreads;
#pragma unroll
    for (int i = 0; i < kPieces; ++i) {
      const int piece = threadIdx.x + i * kThreads;
      const int j = piece / chunks, e = (piece % chunks) * 8;
      if (j < len) {
        float kv[8], vv[8];
        C::load8(P.k, width, tile0 + j, int64_t(kvh) * D + e, kv);
        C::load8(P.v, width, tile0 + j, int64_t(kvh) * D + e, vv);
        float4* kd = reinterpret_cast<float4*>(k_s + j * DP + e);
        float4* vd = reinterpret_cast<float4*>(v_s + j * DP + e);
        kd[0] = make_float4(kv[0], kv[1], kv[2], kv[3]);
        kd[1] = make_float4(kv[4], kv[5], kv[6], kv[7]);
        vd[0] = make_float4(vv[0], vv[1], vv[2], vv[3]);
        vd[1] = make_float4(vv[4], vv[5], vv[6], vv[7]);
      }
    }
    if (tile == 0) {
#pragma unroll
      for (int i = 0; i < kQ; ++i)
        if (threadIdx.x + i * kThreads < GB * D) q_s[threadIdx.x + i * kThreads] = qv[i];
    }
    __syncthreads();
    // 2. scores: item (head g, key j); a warp holds 32 keys of one head.
#pragma unroll
    for (int i = 0; i < (GB * kTile + kThreads - 1) / kThreads; ++i) {
      const int item = threadIdx.x + i * kThreads;
      if (item < GB * kTile) {
        const int g = item / kTile, j = item % kTile;
        float s = -INFINITY;
        if (j < len && g < nh) {
          const float4* qr = reinterpret_cast<const float4*>(q_s + g * D);
          const float4* kr = reinterpret_cast<const float4*>(k_s + j * DP);
          float s0 = 0.0f, s1 = 0.0f;
#pragma unroll 1
          for (int e = 0; e < D / 4; e += 2) {
            const float4 q0 = qr[e], k0v = kr[e], q1 = qr[e + 1], k1v = kr[e + 1];
            s0 = fmaf(q0.x, k0v.x, fmaf(q0.y, k0v.y, fmaf(q0.z, k0v.z, fmaf(q0.w, k0v.w, s0))));
            s1 = fmaf(q1.x, k1v.x, fmaf(q1.y, k1v.y, fmaf(q1.z, k1v.z, fmaf(q1.w, k1v.w, s1))));
          }
          s = s0 + s1;
          if (a.softcap > 0.0f) s = a.softcap * tanhf(s / a.softcap);
        }
        p_s[g * kTile + j] = s;
      }
    }
    __syncthreads();
    // 3. online softmax statistics: warp w owns heads w, w + 4, ...; one key per lane.
#pragma unroll 1
    for (int g = warp; g < nh; g += kThreads / 32) {
      const float s = p_s[g * kTile + lane];
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, warp_max(s));
      const float p = s == -INFINITY ? 0.0f : expf(s - m_new);
      p_s[g * kTile + lane] = p;
      const float sum = warp_sum(p);
      if (lane == 0) {
        const float corr = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        corr_s[g] = corr;
        m_s[g] = m_new;
        l_s[g] = l_s[g] * corr + sum;
      }
    }
    __syncthreads();
    // 4. acc = acc * corr + sum_j p_j v_j; output o = (head o / D, dim o % D).
#pragma unroll
    for (int i = 0; i < kOut; ++i) {
      const int o = threadIdx.x + i * kThreads;
      if (o < nh * D) {
        const int g = o / D, d = o % D;
        const float* pr = p_s + g * kTile;
        const float* vc = v_s + d;
        float v[4] = {acc[i] * corr_s[g], 0.0f, 0.0f, 0.0f};
        if (len == kTile) {  // full tile: unrolled, four independent sums
#pragma unroll
          for (int j = 0; j < kTile; ++j) v[j % 4] = fmaf(pr[j], vc[j * DP], v[j % 4]);
        } else {
#pragma unroll 1
          for (int j = 0; j < len; ++j) v[0] = fmaf(pr[j], vc[j * DP], v[0]);
        }
        acc[i] = (v[0] + v[1]) + (v[2] + v[3]);
      }
    }
    __syncthreads();  // the next tile overwrites k_s, v_s, p_s
  }

#pragma unroll
  for (int i = 0; i < kOut; ++i) {
    const int o = threadIdx.x + i * kThreads;
    if (o < nh * D) P.part_o[(out_base + int64_t(o / D) * P.n_splits) * D + o % D] = acc[i];
  }
  if (threadIdx.x < nh) {
    P.part_ml[(out_base + int64_t(threadIdx.x) * P.n_splits) * 2] = m_s[threadIdx.x];
    P.part_ml[(out_base + int64_t(threadIdx.x) * P.n_splits) * 2 + 1] = l_s[threadIdx.x];
  }
}

template <class C, int GB>
__global__ void __launch_bounds__(kThreads) attention_split_kernel(const Params P) {
  pdl_prologue();
  const AttnArgs& a = P.a;
  const int D = a.head_dim, DP = a.head_dim + 4, G = a.n_heads / a.n_kv_heads;
  const int split = blockIdx.x;  // DP: padded K/V rows in shared memory
  const int kvh = blockIdx.y / P.groups;
  const int h0 = kvh * G + (blockIdx.y % P.groups) * GB;  // first query head of this block
  const int nh = min(GB, kvh * G + G - h0);               // heads of this block that exist
  const int64_t t = blockIdx.z;

  const int64_t last = min(int64_t(max(P.pos[t], 0)), a.n_ctx - 1);
  const int64_t first = a.sliding_window > 0 ? max(int64_t(0), last - a.sliding_window + 1) : 0;
  const int64_t k0 = max(first, int64_t(split) * P.chunk);
  const int64_t k1 = min(last, int64_t(split) * P.chunk + P.chunk - 1);
  const int64_t out_base = (t * a.n_heads + h0) * P.n_splits + split;  // + g * n_splits
  extern __shared__ float4 smem4[];
  float* q_s = reinterpret_cast<float*>(smem4);
  float* k_s = q_s + GB * D;
  float* v_s = k_s + kTile * DP;
  float* p_s = v_s + kTile * DP;
  __shared__ float m_s[GB], l_s[GB], corr_s[GB];
  if (k0 <= k1) {
    split_partial<C, GB>(P, k0, k1, kvh, h0, nh, t, out_base, q_s, k_s, v_s, p_s, m_s, l_s, corr_s);
  } else if (threadIdx.x < nh) {  // nothing to attend in this split
    P.part_ml[(out_base + int64_t(threadIdx.x) * P.n_splits) * 2] = -INFINITY;
    P.part_ml[(out_base + int64_t(threadIdx.x) * P.n_splits) * 2 + 1] = 0.0f;
  }
}

// out[t, h, :] = sum_s w_s o_s with w_s = e^{m_s - M} / sum_s e^{m_s - M} l_s, in split order.
// One block per (token, head): warp 0 computes the weights (one split per lane), then every
// thread sums its dimensions with all split loads in flight.
__global__ void __launch_bounds__(kThreads)
    attention_combine_kernel(const float* __restrict__ part_o, const float* __restrict__ part_ml, int n_splits, int D,
                             float* __restrict__ out) {
  pdl_prologue();
  __shared__ float w_s[kMaxSplits];
  const int64_t th = blockIdx.x;  // token * n_heads + head
  if (threadIdx.x < 32) {
    const int s = threadIdx.x;
    const float m = s < n_splits ? part_ml[(th * n_splits + s) * 2] : -INFINITY;
    const float l = s < n_splits ? part_ml[(th * n_splits + s) * 2 + 1] : 0.0f;
    const float M = warp_max(l > 0.0f ? m : -INFINITY);
    const float w = l > 0.0f ? expf(m - M) : 0.0f;
    w_s[s] = w / warp_sum(w * l);
  }
  __syncthreads();
  for (int d = threadIdx.x; d < D; d += kThreads) {
    const float* po = part_o + th * n_splits * D + d;
    float part[kMaxSplits];
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s)  // splits with nothing to attend left part_o unwritten
      part[s] = (s < n_splits && w_s[s] != 0.0f) ? po[int64_t(s) * D] : 0.0f;
    float o = 0.0f;
#pragma unroll
    for (int s = 0; s < kMaxSplits; ++s) o = fmaf(s < n_splits ? w_s[s] : 0.0f, part[s], o);
    out[th * D + d] = o;
  }
}

// The same sums for calls of more than kGemvMaxTokens tokens: one thread per output value, which
// reads its row's (m, l) of every split itself (L1 hits after the first) and has all its loads in
// flight at once, no barrier. With the kernel above (one block per (token, head)) prompt attention
// with splits was 2-4x slower (H200, Llama-3-8B heads, 128 tokens in a 128-row cache, 2 splits:
// 41.6 us, now 13.6; docs/cuda.md v35). A row that attends nothing gets 0, as without splits;
// the sums run in split order (the kernel above sums over the warp: last bits may differ).
constexpr int kFlatThreads = 256;
__global__ void __launch_bounds__(kFlatThreads)
    attention_combine_flat_kernel(const float* __restrict__ part_o, const float* __restrict__ part_ml, int n_splits,
                                  int D, int64_t values, float* __restrict__ out) {
  pdl_prologue();
  const int64_t i = int64_t(blockIdx.x) * kFlatThreads + threadIdx.x;
  if (i >= values) return;
  const int64_t th = i / D;  // token * n_heads + head
  const float* ml = part_ml + th * n_splits * 2;
  const float* po = part_o + th * n_splits * D + i % D;
  // Splits with nothing to attend (l = 0) left part_o unwritten and are skipped; a NaN in m or l
  // is not skipped and reaches the output, as in the kernel above.
  float M = -INFINITY;
  for (int s = 0; s < n_splits; ++s)
    if (ml[2 * s + 1] != 0.0f) M = fmaxf(M, ml[2 * s]);
  float sum = 0.0f;
  for (int s = 0; s < n_splits; ++s) {
    const float l = ml[2 * s + 1];
    if (l != 0.0f) sum = fmaf(expf(ml[2 * s] - M), l, sum);
  }
  float o = 0.0f;
  if (sum != 0.0f)
    for (int s = 0; s < n_splits; ++s)
      if (ml[2 * s + 1] != 0.0f) o = fmaf(expf(ml[2 * s] - M) / sum, po[int64_t(s) * D], o);
  out[i] = o;
}

// Keys per split of the tiled kernel, at most kMaxSplits splits: decode spreads a short context
// over many small blocks (multiples of the tile); prefill batches (one block per token already)
// use 8.
int64_t chunk_for(const AttnArgs& a) {
  const int64_t parts = a.n_tokens > kGemvMaxTokens ? 8 : kMaxSplits;
  const int64_t c = int64_t(align_up(uint64_t(div_up(a.n_ctx, parts)), uint64_t(kTile)));
  return c < kTile ? kTile : c;
}

// Splits of a call (the tensor-core kernels plan their own).
int n_splits_for(const AttnArgs& a) {
  if (use_prefill_mma(a)) return prefill_plan(a).n_splits;
  if (use_decode_mma(a)) return decode_plan(a).n_splits;
  return int(div_up(a.n_ctx, chunk_for(a)));
}

int heads_per_block(const AttnArgs& a) {
  const int g = a.n_heads / a.n_kv_heads;
  return g >= 8 ? 8 : g >= 4 ? 4 : g >= 2 ? 2 : 1;
}

template <class C, int GB>
cudaError_t launch_gb(const Params& P, dim3 grid, cudaStream_t stream) {
  const size_t smem = size_t(smem_floats(GB, P.a.head_dim)) * sizeof(float);
  const cudaError_t e =
      cudaFuncSetAttribute(attention_split_kernel<C, GB>, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem));
  if (e != cudaSuccess) return e;
  SHOAL_TRY_LAUNCH(launch(attention_split_kernel<C, GB>, grid, kThreads, smem, stream, P));
  return cudaGetLastError();
}

template <class C>
cudaError_t launch_cache(const Params& P, int gb, dim3 grid, cudaStream_t stream) {
  switch (gb) {
    case 1:
      return launch_gb<C, 1>(P, grid, stream);
    case 2:
      return launch_gb<C, 2>(P, grid, stream);
    case 4:
      return launch_gb<C, 4>(P, grid, stream);
    default:
      return launch_gb<C, 8>(P, grid, stream);
  }
}

}  // namespace

uint64_t attention_call_scratch_bytes(const AttnArgs& a) {
  if (use_decode_mma(a) && decode_plan(a).cluster) return 0;  // (the splits merge in the cluster)
  return uint64_t(a.n_tokens * a.n_heads * n_splits_for(a)) * uint64_t(a.head_dim + 2) * sizeof(float);
}

uint64_t attention_scratch_bytes(const AttnArgs& a) {
  // Fewer tokens may take more splits, and more bytes (Llama-3-8B heads over a large cache: 9
  // tokens 24 splits, 128 tokens one), so the bound is the most over every call of 1..n_tokens
  // tokens. The splits change only at the plans' steps below, so only the largest count of each
  // step is planned:
  // - 1..kDecodeAttnMaxTokens each (the decode plans, and the others' at 9..16 tokens);
  // - above, on the tensor cores, the last count of each prefill token tile (the splits follow
  //   the tiles, never rise with them, and stay at one once they are one), then n_tokens;
  // - the tiled kernel above that: its splits follow the cache only, so n_tokens.
  // (Before, every count was planned: 4096 plans per attention op recorded at -b 4096.)
  AttnArgs m = a;
  uint64_t most = 0;
  auto take = [&](int64_t n) {
    m.n_tokens = n;
    most = std::max(most, attention_call_scratch_bytes(m));
    return n_splits_for(m);
  };
  for (int64_t n = 1; n <= std::min<int64_t>(a.n_tokens, kDecodeAttnMaxTokens); ++n) take(n);
  if (a.n_tokens <= kDecodeAttnMaxTokens) return most;
  if (use_prefill_mma(a)) {
    const int64_t tile = prefill_plan(a).block_tokens;
    for (int64_t n = align_up(uint64_t(kDecodeAttnMaxTokens + 1), uint64_t(tile)); n < a.n_tokens; n += tile)
      if (take(n) == 1) break;
  }
  take(a.n_tokens);
  return most;
}
namespace {

// attention(), or with `rope` rope_kv_attention() (decode kernel only: checked by the caller).
cudaError_t run_attention(const float* q, const void* k_cache, const void* v_cache, const int32_t* pos,
                          const AttnArgs& a, void* scratch, float* out, cudaStream_t stream, const AttnRope* rope) {
  if (a.n_tokens == 0) return cudaSuccess;
  if (a.head_dim % 8 != 0 || a.head_dim > kMaxHeadDim || a.n_kv_heads <= 0 || a.n_heads % a.n_kv_heads != 0)
    return cudaErrorInvalidValue;
  Params P{};
  P.q = q;
  P.k = k_cache;
  P.v = v_cache;
  P.pos = pos;
  P.a = a;
  P.chunk = chunk_for(a);
  P.n_splits = n_splits_for(a);
  const int gb = heads_per_block(a);
  P.groups = int(div_up(a.n_heads / a.n_kv_heads, gb));
  P.part_o = static_cast<float*>(scratch);
  P.part_ml = P.part_o + a.n_tokens * a.n_heads * P.n_splits * a.head_dim;
  const dim3 grid(unsigned(P.n_splits), unsigned(a.n_kv_heads * P.groups), unsigned(a.n_tokens));
  cudaError_t e = cudaSuccess;
  if (use_prefill_mma(a)) {
    const PrefillPlan plan = prefill_plan(a);
    e = attention_prefill(q, k_cache, v_cache, pos, a, plan, P.part_o, P.part_ml, out, stream);
    if (e != cudaSuccess || plan.n_splits == 1) return e;
  } else if (use_decode_mma(a)) {
    const DecodePlan plan = decode_plan(a);
    e = attention_decode_mma(q, k_cache, v_cache, pos, a, plan, P.part_o, P.part_ml, out, stream, rope);
    if (e != cudaSuccess || plan.n_splits == 1 || plan.cluster) return e;
  } else {
    switch (a.cache) {
    case CacheKind::kF32:
      e = launch_cache<CacheF32>(P, gb, grid, stream);
      break;
    case CacheKind::kF16:
      e = launch_cache<CacheF16>(P, gb, grid, stream);
      break;
    case CacheKind::kQ8_0:
      e = launch_cache<CacheQ8>(P, gb, grid, stream);
      break;
    }
  }
  if (e != cudaSuccess) return e;
  if (a.n_tokens > kGemvMaxTokens) {
    const int64_t values = a.n_tokens * a.n_heads * a.head_dim;
    SHOAL_TRY_LAUNCH(launch(attention_combine_flat_kernel, unsigned(div_up(values, kFlatThreads)), kFlatThreads, 0,
                            stream, P.part_o, P.part_ml, P.n_splits, a.head_dim, values, out));
    return cudaSuccess;
  }
  SHOAL_TRY_LAUNCH(launch(attention_combine_kernel, unsigned(a.n_tokens * a.n_heads), kThreads, 0, stream, P.part_o,
                          P.part_ml, P.n_splits, a.head_dim, out));
  return cudaSuccess;
}

}  // namespace

cudaError_t attention(const float* q, const void* k_cache, const void* v_cache, const int32_t* pos, const AttnArgs& a,
                      void* scratch, float* out, cudaStream_t stream) {
  return run_attention(q, k_cache, v_cache, pos, a, scratch, out, stream, nullptr);
}

bool attention_on_tensor_cores(const AttnArgs& a) { return use_prefill_mma(a) || use_decode_mma(a); }

bool attention_on_decode_kernel(const AttnArgs& a) { return use_decode_mma(a); }

bool rope_kv_attention_supported(const AttnArgs& a, int rot_dims) {
  return a.n_kv_heads > 0 && a.n_heads % a.n_kv_heads == 0 && a.n_tokens <= kGemvMaxTokens && use_decode_mma(a) &&
         rot_dims >= 0 && rot_dims % 2 == 0 && rot_dims <= a.head_dim;
}

cudaError_t rope_kv_attention(const float* q, const AttnRope& r, void* k_cache, void* v_cache, const int32_t* pos,
                              const AttnArgs& a, void* scratch, float* out, cudaStream_t stream) {
  if (!rope_kv_attention_supported(a, r.rot_dims) || !r.k || !r.v || (r.rot_dims > 0 && !r.inv_freq) ||
      !r.q2 != !r.k2 || !r.k2 != !r.v2 || (r.in_ss && (!r.q2 || r.in_cols <= 0)) || reinterpret_cast<uintptr_t>(r.v) % 8 != 0 ||
      reinterpret_cast<uintptr_t>(r.v2) % 8 != 0)  // (v rows read as float2)
    return cudaErrorInvalidValue;
  return run_attention(q, k_cache, v_cache, pos, a, scratch, out, stream, &r);
}

}  // namespace shoal::cuda
