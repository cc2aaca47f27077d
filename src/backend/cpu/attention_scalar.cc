// Portable row primitives for fast_attention (see attention_kernels.h): 8 interleaved partial
// sums for dot products, plain loops elsewhere.
#include <cstring>

#include "backend/cpu/attention_kernels.h"
#include "core/half.h"

namespace shoal::cpu_detail {
namespace {

float dot(const float* a, const float* b, int64_t n) {
  float s[8] = {};
  for (int64_t i = 0; i < n; ++i) s[i % 8] += a[i] * b[i];
  return ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
}

void axpy(float* y, float a, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scale(float* y, float a, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] *= a;
}

void f16_row(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(src[i]);
}

void q8_0_row(const uint8_t* blocks, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, blocks += 34, dst += 32) {
    uint16_t dh;
    std::memcpy(&dh, blocks, 2);
    const float d = f16_to_f32(dh);
    for (int i = 0; i < 32; ++i) dst[i] = float(int8_t(blocks[2 + i])) * d;
  }
}

}  // namespace

const AttnKernels& attn_kernels_scalar() {
  static const AttnKernels k{dot, axpy, scale, f16_row, q8_0_row};
  return k;
}

}  // namespace shoal::cpu_detail
