// Device helpers shared by the kernels: activations (same formulas as ref::apply_activation, in
// f32), warp reductions, streaming loads. Only included by .cu files of src/backend/cuda/.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"

namespace shoal::cuda {

/// act(x): silu x*sigmoid(x); GELU tanh approximation; exact (erf) GELU. Written in forms that
/// keep f32 relative accuracy for negative x (1 + tanh(u) and 1 + erf(z) cancel there):
/// 0.5 (1 + tanh u) = sigmoid(2u) and 1 + erf(z) = erfc(-z).
__device__ __forceinline__ float apply_act(float x, Act act) {
  switch (act) {
    case Act::kSilu:
      return x / (1.0f + expf(-x));
    case Act::kGeluTanh:
      return x / (1.0f + expf(-1.5957691216057308f * (x + 0.044715f * x * x * x)));
    case Act::kGeluErf:
      return 0.5f * x * erfcf(-x * 0.7071067811865476f);
  }
  return x;
}

/// The sum of the prefill GEMM's partial products of element i (4 consecutive elements of one
/// token; yp + i 16-byte aligned), times the token's 1 / scale; parts `count` floats apart, the
/// parts after the first times lo (1, or 2^-11 for glu_parts' shifted low part: a power of two,
/// so the sum is the same as of the unshifted part). The one order of these sums: combine_parts,
/// combine_glu and the RoPE kernel's q / k / v (rope_kv.cu) give the same values.
__device__ __forceinline__ float4 parts_sum4(const float* __restrict__ yp, int blocks, int64_t count, int64_t i,
                                             float inv, float lo = 1.0f) {
  float4 s = *reinterpret_cast<const float4*>(yp + i);
  for (int b = 1; b < blocks; ++b) {
    const float4 v = *reinterpret_cast<const float4*>(yp + b * count + i);
    s.x = fmaf(v.x, lo, s.x), s.y = fmaf(v.y, lo, s.y), s.z = fmaf(v.z, lo, s.z), s.w = fmaf(v.w, lo, s.w);
  }
  return make_float4(s.x * inv, s.y * inv, s.z * inv, s.w * inv);
}

/// Sum over the 32 lanes of a warp (butterfly: every lane gets the same, order fixed).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

/// Sum over a block of kThreads threads (a multiple of 32, at most 1024); every thread gets the
/// result. smem: 32 floats. Fixed order, so deterministic.
template <int kThreads>
__device__ __forceinline__ float block_sum(float v, float* smem) {
  v = warp_sum(v);
  if constexpr (kThreads == 32) {
    return v;
  } else {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    __syncthreads();  // smem may still be read by a previous call
    if (lane == 0) smem[warp] = v;
    __syncthreads();
    float t = lane < kThreads / 32 ? smem[lane] : 0.0f;
    return warp_sum(t);
  }
}

/// cos and sin of RoPE's angle pos * inv_freq (RoFormer, arXiv:2104.09864), times attn_factor
/// (YaRN), as ref::rope: in double (an f32 angle is off by ~1e-2 rad at position 1e5).
__device__ __forceinline__ double2 rope_cos_sin(int32_t pos, float inv_freq, float attn_factor) {
  double s, c;
  sincos(double(pos) * double(inv_freq), &s, &c);
  return make_double2(c * attn_factor, s * attn_factor);
}

/// Rotates the pair (x0, x1) by cs = rope_cos_sin(...), in double as ref::rope.
__device__ __forceinline__ void rope_rotate(float& x0, float& x1, double2 cs) {
  const double a = x0, b = x1;
  x0 = float(a * cs.x - b * cs.y);
  x1 = float(a * cs.y + b * cs.x);
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

/// One block of 32 values (lane = value, all lanes calling) quantized as ggml's
/// quantize_row_q8_0_ref: d = amax / 127 (as f16 bits), this lane's q = round(x / d).
__device__ __forceinline__ void q8_quantize(float x, uint16_t& d_bits, uint8_t& q) {
  const float amax = warp_max(fabsf(x));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  d_bits = __half_as_ushort(__float2half_rn(d));
  q = uint8_t(int8_t(roundf(x * id)));
}
/// A q8_quantize block written as a 34-byte Q8_0 block at dst (2-byte aligned): f16 d, 32 int8.
__device__ __forceinline__ void put_q8_block(uint16_t d_bits, uint8_t q, uint8_t* dst) {
  if ((threadIdx.x & 31) == 0) *reinterpret_cast<uint16_t*>(dst) = d_bits;
  dst[2 + (threadIdx.x & 31)] = q;
}
/// q8_quantize then put_q8_block.
__device__ __forceinline__ void store_q8_block(float x, uint8_t* dst) {
  uint16_t d;
  uint8_t q;
  q8_quantize(x, d, q);
  put_q8_block(d, q, dst);
}

/// A 16-byte load of data read once (weights): bypasses L1 so it keeps the activations.
__device__ __forceinline__ uint4 load_stream(const uint4* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ float f16_bits_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }

/// Value i (row-major element index) of a weight in its device layout (cuda_util.h), as f32.
__device__ __forceinline__ float weight_value(const WeightRef& w, int64_t i) {
  switch (w.kind) {
    case WKind::kF32:
      return static_cast<const float*>(w.data)[i];
    case WKind::kF16:
      return f16_bits_to_float(static_cast<const uint16_t*>(w.data)[i]);
    case WKind::kBF16:
      return __uint_as_float(uint32_t(static_cast<const uint16_t*>(w.data)[i]) << 16);
    case WKind::kQ8_0:
    case WKind::kQ4_0: {
      // Tensor-core tile layout (cuda_util.h).
      const bool q4 = w.kind == WKind::kQ4_0;
      const QuantPos p = quant_pos(q4, w.cols, i / w.cols, i % w.cols);
      const float d = f16_bits_to_float(w.scales[p.scale]);
      const uint8_t byte = static_cast<const uint8_t*>(w.data)[p.byte];
      return d * float(q4 ? int((byte >> p.shift) & 0x0f) - 8 : int(byte) - 128);
    }
  }
  return 0.0f;
}

}  // namespace shoal::cuda
