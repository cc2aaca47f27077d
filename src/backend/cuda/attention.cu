// Causal attention over the KV cache with GQA, split along the sequence (flash-decoding, Dao et
// al. 2023) and combined in a second kernel. One block handles one (split, KV head, group of up
// to 8 query heads sharing it, token): it walks its keys in tiles of 256 with an online softmax
// (Milakov & Gimelshein 2018), so K and V rows are read once per block for all heads of the
// group. (Loops carry explicit unroll pragmas: nvcc 13's default unrolling of this kernel did
// not finish compiling.) The key range comes from pos[t] on the device, so the grid depends only on the cache
// size and a captured graph stays valid as positions grow; splits past pos[t] exit at once.
// Twin: ref::attention; tests: tests/cuda/cuda_attention_test.cc.
#include <cuda_fp16.h>

#include <cmath>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"

namespace shoal::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kTile = 256;       // keys scored per pass (shared-memory scores)
constexpr int kMaxHeadDim = 256;

// Cache row loaders: 8 values at column c (c % 8 == 0) and 2 values at column c (c even).
// Read-only loads (__ldg); with plain loads nvcc 13 did not finish compiling the F32 variant.
struct CacheF32 {
  __device__ static void load8(const void* cache, int64_t width, int64_t row, int64_t c, float* out) {
    const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(cache) + row * width + c);
    const float4 a = __ldg(p), b = __ldg(p + 1);
    out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w;
    out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
  }
  __device__ static float2 load2(const void* cache, int64_t width, int64_t row, int64_t c) {
    return __ldg(reinterpret_cast<const float2*>(static_cast<const float*>(cache) + row * width + c));
  }
};

struct CacheF16 {
  __device__ static void load8(const void* cache, int64_t width, int64_t row, int64_t c, float* out) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(static_cast<const __half*>(cache) + row * width + c));
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      out[2 * i] = f.x;
      out[2 * i + 1] = f.y;
    }
  }
  __device__ static float2 load2(const void* cache, int64_t width, int64_t row, int64_t c) {
    const unsigned two = __ldg(reinterpret_cast<const unsigned*>(static_cast<const __half*>(cache) + row * width + c));
    return __half22float2(*reinterpret_cast<const __half2*>(&two));
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
  __device__ static float2 load2(const void* cache, int64_t width, int64_t row, int64_t c) {
    const uint8_t* b = block(cache, width, row, c);
    const float d = f16_bits_to_float(__ldg(reinterpret_cast<const uint16_t*>(b)));
    const uint16_t two = __ldg(reinterpret_cast<const uint16_t*>(b + 2 + c % 32));
    return make_float2(d * float(int8_t(two & 0xff)), d * float(int8_t(two >> 8)));
  }
};

struct Params {
  const float* q;
  const void* k;
  const void* v;
  const int32_t* pos;
  AttnArgs a;
  int64_t chunk;   // keys per split
  int n_splits;
  int groups;      // head groups per KV head
  float* part_o;   // [n_tokens, n_heads, n_splits, head_dim] unnormalised outputs
  float* part_ml;  // [n_tokens, n_heads, n_splits, 2] running max and sum
};

template <class C, int GB>
__global__ void __launch_bounds__(kThreads) attention_split_kernel(const Params P) {
  const AttnArgs& a = P.a;
  const int D = a.head_dim, G = a.n_heads / a.n_kv_heads;
  const int split = blockIdx.x;
  const int kvh = blockIdx.y / P.groups;
  const int h0 = kvh * G + (blockIdx.y % P.groups) * GB;  // first query head of this block
  const int nh = min(GB, kvh * G + G - h0);                // heads of this block that exist
  const int64_t t = blockIdx.z;
  const int64_t width = int64_t(a.n_kv_heads) * D;

  const int64_t last = min(int64_t(max(P.pos[t], 0)), a.n_ctx - 1);
  const int64_t first = a.sliding_window > 0 ? max(int64_t(0), last - a.sliding_window + 1) : 0;
  const int64_t k0 = max(first, int64_t(split) * P.chunk);
  const int64_t k1 = min(last, int64_t(split) * P.chunk + P.chunk - 1);
  const int64_t out_base = (t * a.n_heads + h0) * P.n_splits + split;  // + g * n_splits
  if (k0 > k1) {
#pragma unroll 1
    for (int g = threadIdx.x; g < nh; g += kThreads) {
      P.part_ml[(out_base + int64_t(g) * P.n_splits) * 2] = -INFINITY;
      P.part_ml[(out_base + int64_t(g) * P.n_splits) * 2 + 1] = 0.0f;
    }
    return;
  }

  __shared__ float q_s[GB][kMaxHeadDim];
  __shared__ float scores[GB][kTile];
  __shared__ float m_s[GB], l_s[GB], corr_s[GB];
#pragma unroll 1
  for (int i = threadIdx.x; i < GB * D; i += kThreads) {
    const int g = i / D, d = i % D;
    q_s[g][d] = g < nh ? P.q[(t * a.n_heads + h0 + g) * D + d] * a.scale : 0.0f;
  }
  if (threadIdx.x < GB) {
    m_s[threadIdx.x] = -INFINITY;
    l_s[threadIdx.x] = 0.0f;
  }
  // PV layout: threads split the head dimension in pairs; kg key groups take alternate keys.
  const int pairs = D / 2;
  const int kgroups = kThreads / pairs;
  const int kg = threadIdx.x / pairs, pr = threadIdx.x % pairs;
  const bool pv_active = kg < kgroups;
  float acc[GB][2];
#pragma unroll
  for (int g = 0; g < GB; ++g) acc[g][0] = acc[g][1] = 0.0f;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();

  const int n_tiles = int((k1 - k0) / kTile) + 1;
#pragma unroll 1
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int64_t tile0 = k0 + int64_t(tile) * kTile;
    const int len = int(min(int64_t(kTile), k1 - tile0 + 1));
    // 1. scores: one key per thread, all heads of the group.
#pragma unroll 1
    for (int j = threadIdx.x; j < len; j += kThreads) {
      float s[GB];
#pragma unroll
      for (int g = 0; g < GB; ++g) s[g] = 0.0f;
#pragma unroll 2
      for (int e = 0; e < D; e += 8) {
        float kv[8];
        C::load8(P.k, width, tile0 + j, int64_t(kvh) * D + e, kv);
#pragma unroll
        for (int g = 0; g < GB; ++g)
#pragma unroll
          for (int i = 0; i < 8; ++i) s[g] = fmaf(q_s[g][e + i], kv[i], s[g]);
      }
#pragma unroll
      for (int g = 0; g < GB; ++g)
        scores[g][j] = a.softcap > 0.0f ? a.softcap * tanhf(s[g] / a.softcap) : s[g];
    }
    __syncthreads();
    // 2. online softmax statistics: warp w owns heads w, w + 4, ...
#pragma unroll 1
    for (int g = warp; g < nh; g += kThreads / 32) {
      float mx = -INFINITY;
#pragma unroll 1
      for (int j = lane; j < len; j += 32) mx = fmaxf(mx, scores[g][j]);
      mx = warp_max(mx);
      const float m_old = m_s[g];
      const float m_new = fmaxf(m_old, mx);
      float sum = 0.0f;
#pragma unroll 1
      for (int j = lane; j < len; j += 32) {
        const float p = m_new == -INFINITY ? 0.0f : expf(scores[g][j] - m_new);
        scores[g][j] = p;
        sum += p;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        const float corr = m_old == -INFINITY ? 0.0f : expf(m_old - m_new);
        corr_s[g] = corr;
        m_s[g] = m_new;
        l_s[g] = l_s[g] * corr + sum;
      }
    }
    __syncthreads();
    // 3. acc = acc * corr + sum_j p_j v_j.
    if (pv_active) {
#pragma unroll
      for (int g = 0; g < GB; ++g) {
        const float c = g < nh ? corr_s[g] : 0.0f;
        acc[g][0] *= c;
        acc[g][1] *= c;
      }
#pragma unroll 4
      for (int j = kg; j < len; j += kgroups) {
        const float2 v = C::load2(P.v, width, tile0 + j, int64_t(kvh) * D + 2 * pr);
#pragma unroll
        for (int g = 0; g < GB; ++g) {
          const float p = scores[g][j];
          acc[g][0] = fmaf(p, v.x, acc[g][0]);
          acc[g][1] = fmaf(p, v.y, acc[g][1]);
        }
      }
    }
    __syncthreads();  // scores are rewritten by the next tile
  }

  // Sum the key groups in a fixed order (scores is free now) and store the partial result.
  float* red = &scores[0][0];  // [kgroups][GB][D] <= GB * kTile floats since kgroups * D <= 256
  if (pv_active) {
#pragma unroll
    for (int g = 0; g < GB; ++g) {
      red[(kg * GB + g) * D + 2 * pr] = acc[g][0];
      red[(kg * GB + g) * D + 2 * pr + 1] = acc[g][1];
    }
  }
  __syncthreads();
#pragma unroll 1
  for (int i = threadIdx.x; i < nh * D; i += kThreads) {
    const int g = i / D, d = i % D;
    float o = 0.0f;
#pragma unroll 1
    for (int k = 0; k < kgroups; ++k) o += red[(k * GB + g) * D + d];
    P.part_o[(out_base + int64_t(g) * P.n_splits) * D + d] = o;
  }
  if (threadIdx.x < nh) {
    P.part_ml[(out_base + int64_t(threadIdx.x) * P.n_splits) * 2] = m_s[threadIdx.x];
    P.part_ml[(out_base + int64_t(threadIdx.x) * P.n_splits) * 2 + 1] = l_s[threadIdx.x];
  }
}

// out[t, h, d] = sum_s e^{m_s - M} o_s[d] / sum_s e^{m_s - M} l_s. One block per (token, head).
__global__ void attention_combine_kernel(const float* __restrict__ part_o,
                                         const float* __restrict__ part_ml, int n_splits, int D,
                                         float* __restrict__ out) {
  const int64_t th = blockIdx.x;  // token * n_heads + head
  const float* ml = part_ml + th * n_splits * 2;
  float M = -INFINITY;
  for (int s = 0; s < n_splits; ++s)
    if (ml[2 * s + 1] > 0.0f) M = fmaxf(M, ml[2 * s]);
  for (int d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f, L = 0.0f;
    for (int s = 0; s < n_splits; ++s) {
      if (!(ml[2 * s + 1] > 0.0f)) continue;
      const float w = expf(ml[2 * s] - M);
      L = fmaf(w, ml[2 * s + 1], L);
      o = fmaf(w, part_o[(th * n_splits + s) * D + d], o);
    }
    out[th * D + d] = o / L;
  }
}

// Keys per split: small chunks (more blocks) for decode, at most 8 splits for prefill batches
// so the partial results stay small.
int64_t chunk_for(const AttnArgs& a) {
  if (a.n_tokens > kGemvMaxTokens) return int64_t(align_up(uint64_t(div_up(a.n_ctx, 8)), kTile));
  const int64_t c = int64_t(align_up(uint64_t(div_up(a.n_ctx, 128)), kTile));
  return c < 4 * kTile ? c : 4 * kTile;
}

int heads_per_block(const AttnArgs& a) {
  const int g = a.n_heads / a.n_kv_heads;
  return g >= 8 ? 8 : g >= 4 ? 4 : g >= 2 ? 2 : 1;
}

template <class C>
cudaError_t launch(const Params& P, int gb, dim3 grid, cudaStream_t stream) {
  switch (gb) {
    case 1:
      attention_split_kernel<C, 1><<<grid, kThreads, 0, stream>>>(P);
      break;
    case 2:
      attention_split_kernel<C, 2><<<grid, kThreads, 0, stream>>>(P);
      break;
    case 4:
      attention_split_kernel<C, 4><<<grid, kThreads, 0, stream>>>(P);
      break;
    default:
      attention_split_kernel<C, 8><<<grid, kThreads, 0, stream>>>(P);
      break;
  }
  return cudaGetLastError();
}

}  // namespace

uint64_t attention_scratch_bytes(const AttnArgs& a) {
  const int64_t splits = div_up(a.n_ctx, chunk_for(a));
  return uint64_t(a.n_tokens * a.n_heads * splits) * uint64_t(a.head_dim + 2) * sizeof(float);
}

cudaError_t attention(const float* q, const void* k_cache, const void* v_cache, const int32_t* pos,
                      const AttnArgs& a, void* scratch, float* out, cudaStream_t stream) {
  if (a.n_tokens == 0) return cudaSuccess;
  if (a.head_dim % 8 != 0 || a.head_dim > kMaxHeadDim || a.n_kv_heads <= 0 ||
      a.n_heads % a.n_kv_heads != 0)
    return cudaErrorInvalidValue;
  Params P{};
  P.q = q;
  P.k = k_cache;
  P.v = v_cache;
  P.pos = pos;
  P.a = a;
  P.chunk = chunk_for(a);
  P.n_splits = int(div_up(a.n_ctx, P.chunk));
  const int gb = heads_per_block(a);
  P.groups = int(div_up(a.n_heads / a.n_kv_heads, gb));
  P.part_o = static_cast<float*>(scratch);
  P.part_ml = P.part_o + a.n_tokens * a.n_heads * P.n_splits * a.head_dim;
  const dim3 grid(unsigned(P.n_splits), unsigned(a.n_kv_heads * P.groups), unsigned(a.n_tokens));
  cudaError_t e = cudaSuccess;
  switch (a.cache) {
    case CacheKind::kF32:
      e = launch<CacheF32>(P, gb, grid, stream);
      break;
    case CacheKind::kF16:
      e = launch<CacheF16>(P, gb, grid, stream);
      break;
    case CacheKind::kQ8_0:
      e = launch<CacheQ8>(P, gb, grid, stream);
      break;
  }
  if (e != cudaSuccess) return e;
  const int threads = a.head_dim < 128 ? a.head_dim : 128;
  attention_combine_kernel<<<unsigned(a.n_tokens * a.n_heads), unsigned(threads), 0, stream>>>(
      P.part_o, P.part_ml, P.n_splits, a.head_dim, out);
  return cudaGetLastError();
}

}  // namespace shoal::cuda
