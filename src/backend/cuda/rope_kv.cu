// RoPE (RoFormer, arXiv:2104.09864; both pair layouts, partial rot_dims, YaRN attn_factor) and
// the KV cache write (f32, f16 or Q8_0 rows). Positions are read on the device, so a captured
// decode step stays valid as they grow. Twins: ref::rope, ref::kv_write; tests:
// tests/cuda/cuda_attention_test.cc.
#include <cuda_fp16.h>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/cuda/mma.cuh"

namespace shoal::cuda {
namespace {

// Rotates pair p of the head at v (layout of RopeArgs) by pos * inv_freq, as the reference.
__device__ __forceinline__ void rotate_pair(float* v, int p, int half, int32_t pos, float inv_freq,
                                            bool interleaved, float attn_factor) {
  const int ia = interleaved ? 2 * p : p;
  const int ib = interleaved ? 2 * p + 1 : p + half;
  rope_rotate(v[ia], v[ib], rope_cos_sin(pos, inv_freq, attn_factor));
}

// One thread per (token, head, rotated pair).
__global__ void rope_kernel(float* x, const int32_t* __restrict__ pos, const float* __restrict__ inv_freq,
                            const RopeArgs a) {
  pdl_prologue();
  const int half = a.rot_dims / 2;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= a.n_tokens * a.n_heads * half) return;
  const int p = int(i % half);
  const int64_t th = i / half;  // token * n_heads + head
  float* v = x + th * a.head_dim;
  const int64_t t = th / a.n_heads;
  rotate_pair(v, p, half, pos[t], inv_freq[p], a.interleaved, a.attn_factor);
}

template <typename T>
__device__ __forceinline__ T to_cache(float v);
template <>
__device__ __forceinline__ float to_cache<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ uint16_t to_cache<uint16_t>(float v) {
  return __half_as_ushort(__float2half_rn(v));
}

// One thread per element of k (and v) for plain caches.
template <typename T>
__global__ void kv_write_plain_kernel(T* kc, T* vc, int64_t n_ctx, int64_t width, const float* __restrict__ k,
                                      const float* __restrict__ v, int64_t n, const int32_t* __restrict__ pos) {
  pdl_prologue();
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * width) return;
  const int64_t t = i / width, c = i % width;
  const int32_t p = pos[t];
  if (p < 0 || p >= n_ctx) return;
  kc[int64_t(p) * width + c] = to_cache<T>(k[i]);
  vc[int64_t(p) * width + c] = to_cache<T>(v[i]);
}

// One warp per (token, block of 32 values) of k and of v.
__global__ void kv_write_q8_kernel(uint8_t* kc, uint8_t* vc, int64_t n_ctx, int64_t width, const float* __restrict__ k,
                                   const float* __restrict__ v, int64_t n, const int32_t* __restrict__ pos) {
  pdl_prologue();
  const int64_t blocks_per_row = width / 32;
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  if (w >= n * blocks_per_row) return;
  const int64_t t = w / blocks_per_row, b = w % blocks_per_row;
  const int32_t p = pos[t];
  if (p < 0 || p >= n_ctx) return;
  const int lane = threadIdx.x & 31;
  const uint64_t row_bytes = uint64_t(blocks_per_row) * 34;
  const int64_t src = t * width + b * 32 + lane;
  store_q8_block(k[src], kc + uint64_t(p) * row_bytes + uint64_t(b) * 34);
  store_q8_block(v[src], vc + uint64_t(p) * row_bytes + uint64_t(b) * 34);
}

// Copies n floats from src to dst over the lanes of a warp: a float4 per lane and step when
// n % 4 == 0 (one round trip for a head of 128), else one float per lane. With n % 4 == 0 both
// must be 16-byte aligned: rope_kv_kernel's are heads at multiples of head_dim floats in
// tensors CudaBackend::qkv_args checks. Returns the sum of squares of what the lane copied.
__device__ __forceinline__ float warp_copy(const float* src, float* dst, int n, int lane) {
  float ss = 0.0f;
  if (n % 4 == 0) {
    for (int i = 4 * lane; i < n; i += 128) {
      const float4 x = *reinterpret_cast<const float4*>(src + i);
      *reinterpret_cast<float4*>(dst + i) = x;
      ss = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, ss))));
    }
  } else {
    for (int i = lane; i < n; i += 32) {
      dst[i] = src[i];
      ss = fmaf(dst[i], dst[i], ss);
    }
  }
  return ss;
}

// hv[i] = (sum_b yp[b][t][row + i]) * inv_scale[t] (+ bias[i]) for i < hd (combine_kernel's
// operations in its order: parts_sum4), a float4 per lane and step (hd, ld and row multiples of
// 4, yp 16-byte aligned: the host checks, rope_kv_write below and qkv_parts_attention), also
// written to out[0..hd) when out is not null. Returns the sum of squares of what the lane wrote,
// in warp_copy's order.
__device__ __forceinline__ float warp_gather(const QkvParts& s, int64_t n, int64_t t, int64_t row, const float* bias,
                                             int hd, int lane, float* hv, float* out) {
  const float inv = s.inv_scale ? s.inv_scale[t] : 1.0f;
  float ss = 0.0f;
  for (int i = 4 * lane; i < hd; i += 128) {
    float4 x = parts_sum4(s.yp, s.blocks, n * s.ld, t * s.ld + row + i, inv);
    if (bias) x.x += bias[i], x.y += bias[i + 1], x.z += bias[i + 2], x.w += bias[i + 3];
    *reinterpret_cast<float4*>(hv + i) = x;
    if (out) *reinterpret_cast<float4*>(out + i) = x;
    ss = fmaf(x.x, x.x, fmaf(x.y, x.y, fmaf(x.z, x.z, fmaf(x.w, x.w, ss))));
  }
  return ss;
}

// Stores a k head (hv, shared) and its v head (vr) as cache rows at element `at` of kc / vc, over
// the lanes of a warp (f32 / f16: 4 values per lane and step when hd % 4 == 0).
__device__ __forceinline__ void store_kv_head(const float* hv, const float* vr, int hd, int lane, CacheKind cache,
                                              void* kc, void* vc, int64_t at) {
  switch (cache) {
    case CacheKind::kF32:
      warp_copy(hv, static_cast<float*>(kc) + at, hd, lane);
      warp_copy(vr, static_cast<float*>(vc) + at, hd, lane);
      return;
    case CacheKind::kF16: {
      auto* k16 = static_cast<uint16_t*>(kc) + at;
      auto* v16 = static_cast<uint16_t*>(vc) + at;
      if (hd % 4 != 0) {
        for (int i = lane; i < hd; i += 32) k16[i] = to_cache<uint16_t>(hv[i]), v16[i] = to_cache<uint16_t>(vr[i]);
        return;
      }
      for (int i = 4 * lane; i < hd; i += 128) {
        const float4 kx = *reinterpret_cast<const float4*>(hv + i), vx = *reinterpret_cast<const float4*>(vr + i);
        *reinterpret_cast<uint2*>(k16 + i) = make_uint2(half2_bits(kx.x, kx.y), half2_bits(kx.z, kx.w));
        *reinterpret_cast<uint2*>(v16 + i) = make_uint2(half2_bits(vx.x, vx.y), half2_bits(vx.z, vx.w));
      }
      return;
    }
    case CacheKind::kQ8_0: {  // a head is whole 32-value blocks
      const uint64_t b0 = uint64_t(at / 32) * 34;
      for (int b = 0; b < hd / 32; ++b) {
        store_q8_block(hv[b * 32 + lane], static_cast<uint8_t*>(kc) + b0 + uint64_t(b) * 34);
        store_q8_block(vr[b * 32 + lane], static_cast<uint8_t*>(vc) + b0 + uint64_t(b) * 34);
      }
      return;
    }
  }
}

// The attention prologue (QkvArgs): one block per token and group of 8 heads (q heads, then k
// heads). The block makes RoPE's (cos, sin) of the token's pairs (in double, as the reference)
// for its 8 heads, then each warp takes one head: staged in the warp's shared memory, normed
// (optional; the sum of squares by the warp), rotated, written back, and for a k head stored in
// the caches together with the v head. One block barrier, right after the table; none later.
// With parts (QkvParts), q, k and v come from the partial products of their stacked GEMM instead,
// and are written out as q / k above and v as it is.
// (It was a block of 128 threads per (token, head), each making the table: 28 us per
// Llama-3-8B layer at 512 tokens, H200; v32 in docs/cuda.md. Heads are copied a float4 per lane:
// 12.5 us per layer with a float per lane, v34.)
constexpr int kQkvWarps = 8, kQkvThreads = 32 * kQkvWarps;
constexpr int kQkvMaxHeadDim = 256;

// kParts: q / k / v from QkvParts (qkv_parts_attention); a template parameter so that the plain
// kernel keeps its registers and shared memory (40 and 10 KiB on sm_90, 64 and 18 KiB with parts).
template <bool kParts>
__global__ void __launch_bounds__(kQkvThreads)
    rope_kv_kernel(float* q, float* k, const float* __restrict__ v, const int32_t* __restrict__ pos,
                   const float* __restrict__ inv_freq, const QkvArgs a, void* kc, void* vc, const QkvParts parts) {
  pdl_prologue();
  __shared__ double2 cs[kQkvMaxHeadDim / 2];
  __shared__ __align__(16) float staged[kParts ? 2 : 1][kQkvWarps][kQkvMaxHeadDim];  // [1]: v heads, with parts
  const RopeArgs& r = a.rope;
  const int heads = r.n_heads + a.n_kv_heads, hd = r.head_dim, half = r.rot_dims / 2;
  const int groups = (heads + kQkvWarps - 1) / kQkvWarps;
  const int64_t t = blockIdx.x / groups;
  const int32_t p = pos[t];
  for (int i = threadIdx.x; i < half; i += kQkvThreads) cs[i] = rope_cos_sin(p, inv_freq[i], r.attn_factor);
  __syncthreads();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int h = int(blockIdx.x % groups) * kQkvWarps + warp;
  if (h >= heads) return;
  float* const hv = staged[0][warp];
  const int64_t width = int64_t(a.n_kv_heads) * hd;
  const bool is_q = h < r.n_heads;
  const int kvh = h - r.n_heads;
  float* x = is_q ? q + (t * r.n_heads + h) * hd : k + t * width + int64_t(kvh) * hd;
  const float* nw = is_q ? a.q_norm : a.k_norm;
  float ss;
  if constexpr (kParts) {
    const int64_t row = is_q ? int64_t(h) * hd : int64_t(r.n_heads) * hd + int64_t(kvh) * hd;
    const float* bias = is_q ? parts.bias[0] : parts.bias[1];
    ss = warp_gather(parts, r.n_tokens, t, row, bias ? bias + (is_q ? int64_t(h) : int64_t(kvh)) * hd : nullptr, hd,
                     lane, hv, nullptr);
    if (!is_q) {  // v's head: written out, and staged for the caches
      float* vo = parts.v + t * width + int64_t(kvh) * hd;
      const float* vb = parts.bias[2] ? parts.bias[2] + int64_t(kvh) * hd : nullptr;
      warp_gather(parts, r.n_tokens, t, row + width, vb, hd, lane, staged[kParts ? 1 : 0][warp], vo);
    }
  } else {
    ss = warp_copy(x, hv, hd, lane);
  }
  __syncwarp();
  if (nw) {  // uniform over the warp
    const float inv = 1.0f / sqrtf(warp_sum(ss) / float(hd) + a.eps);
    for (int i = lane; i < hd; i += 32) hv[i] = hv[i] * inv * nw[i];
    __syncwarp();
  }
  for (int i = lane; i < half; i += 32) {
    const int ia = r.interleaved ? 2 * i : i, ib = r.interleaved ? 2 * i + 1 : i + half;
    rope_rotate(hv[ia], hv[ib], cs[i]);
  }
  __syncwarp();
  warp_copy(hv, x, hd, lane);
  if (is_q || p < 0 || p >= a.n_ctx) return;
  const int64_t at = int64_t(p) * width + int64_t(kvh) * hd;  // element offset in the caches
  const float* vr = kParts ? staged[kParts ? 1 : 0][warp] : v + t * width + int64_t(kvh) * hd;
  store_kv_head(hv, vr, hd, lane, a.cache, kc, vc, at);
}

}  // namespace

cudaError_t rope_kv_write(float* q, float* k, const float* v, const int32_t* pos, const float* inv_freq,
                          const QkvArgs& a, void* k_cache, void* v_cache, cudaStream_t stream, const QkvParts* parts) {
  const RopeArgs& r = a.rope;
  if (r.head_dim > kQkvMaxHeadDim || r.rot_dims > r.head_dim || r.rot_dims % 2 != 0 ||
      (a.cache == CacheKind::kQ8_0 && r.head_dim % 32 != 0))
    return cudaErrorInvalidValue;
  const int64_t rows = int64_t(r.n_heads + 2 * a.n_kv_heads) * r.head_dim;
  if (parts && (!parts->yp || !parts->v || parts->blocks < 1 || parts->ld < rows || r.head_dim % 4 != 0 ||
                parts->ld % 4 != 0 || reinterpret_cast<uintptr_t>(parts->yp) % 16 != 0))
    return cudaErrorInvalidValue;
  const int64_t blocks = r.n_tokens * div_up(r.n_heads + a.n_kv_heads, kQkvWarps);
  if (blocks == 0) return cudaSuccess;
  SHOAL_TRY_LAUNCH(launch(parts ? rope_kv_kernel<true> : rope_kv_kernel<false>, unsigned(blocks), kQkvThreads, 0,
                          stream, q, k, v, pos, inv_freq, a, k_cache, v_cache, parts ? *parts : QkvParts{}));
  return cudaGetLastError();
}

cudaError_t rope(float* x, const int32_t* pos, const float* inv_freq, const RopeArgs& a, cudaStream_t stream) {
  const int64_t total = a.n_tokens * a.n_heads * (a.rot_dims / 2);
  if (total == 0) return cudaSuccess;
  SHOAL_TRY_LAUNCH(launch(rope_kernel, unsigned(div_up(total, kBlock)), kBlock, 0, stream, x, pos, inv_freq, a));
  return cudaGetLastError();
}

cudaError_t kv_write(void* k_cache, void* v_cache, CacheKind kind, int64_t n_ctx, int64_t width, const float* k,
                     const float* v, int64_t n, const int32_t* pos, cudaStream_t stream) {
  const int64_t total = n * width;
  if (total == 0) return cudaSuccess;
  const unsigned grid = unsigned(div_up(total, kBlock));
  switch (kind) {
    case CacheKind::kF32:
      SHOAL_TRY_LAUNCH(launch(kv_write_plain_kernel<float>, grid, kBlock, 0, stream, static_cast<float*>(k_cache),
                              static_cast<float*>(v_cache), n_ctx, width, k, v, n, pos));
      break;
    case CacheKind::kF16:
      SHOAL_TRY_LAUNCH(launch(kv_write_plain_kernel<uint16_t>, grid, kBlock, 0, stream, static_cast<uint16_t*>(k_cache),
                              static_cast<uint16_t*>(v_cache), n_ctx, width, k, v, n, pos));
      break;
    case CacheKind::kQ8_0:
      SHOAL_TRY_LAUNCH(launch(kv_write_q8_kernel, grid, kBlock, 0, stream, static_cast<uint8_t*>(k_cache),
                              static_cast<uint8_t*>(v_cache), n_ctx, width, k, v, n, pos));
      break;
  }
  return cudaGetLastError();
}

}  // namespace shoal::cuda
