// Internal to src/backend/cpu/: the per-ISA row primitives behind fast_attention
// (attention_fast.h). Each is a fixed instruction sequence for a given n, so results never
// depend on threads or batch. As in matmul_kernels.h, ISA files keep everything in an anonymous
// namespace and call no inline function of a shared header.
#pragma once

#include <cstdint>

namespace shoal::cpu_detail {

struct AttnKernels {
  /// sum_i a[i] * b[i] in f32 (lane-wise FMA, fixed reduction order).
  float (*dot)(const float* a, const float* b, int64_t n);
  /// y[i] += a * x[i].
  void (*axpy)(float* y, float a, const float* x, int64_t n);
  /// y[i] *= a.
  void (*scale)(float* y, float a, int64_t n);
  /// f16 bits -> f32 (exact).
  void (*f16_to_f32)(const uint16_t* src, float* dst, int64_t n);
  /// Q8_0 blocks (34 bytes: f16 d, 32 x int8) -> f32, float(q) * d (exact as tensor/quant.h).
  void (*q8_0_to_f32)(const uint8_t* blocks, float* dst, int64_t n_blocks);
};

const AttnKernels& attn_kernels_scalar();
const AttnKernels& attn_kernels_avx2();
const AttnKernels& attn_kernels_avx512();

}  // namespace shoal::cpu_detail
