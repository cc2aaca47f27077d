// AVX-512 row primitives for fast_attention (see attention_kernels.h).
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/attention_kernels.h"

// GCC 12's reduce intrinsics trip -Wmaybe-uninitialized inside <avx512fintrin.h> (false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

namespace shoal::cpu_detail {
namespace {

__mmask16 tail_mask(int64_t rem) { return __mmask16((1u << rem) - 1); }

float dot(const float* a, const float* b, int64_t n) {
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i), _mm512_loadu_ps(b + i), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(a + i + 16), _mm512_loadu_ps(b + i + 16), acc1);
  }
  for (; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : tail_mask(n - i);
    acc0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + i), _mm512_maskz_loadu_ps(m, b + i), acc0);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1));
}

void axpy(float* y, float a, const float* x, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_fmadd_ps(av, _mm512_maskz_loadu_ps(m, x + i), _mm512_maskz_loadu_ps(m, y + i)));
  }
}

void scale(float* y, float a, int64_t n) {
  const __m512 av = _mm512_set1_ps(a);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : tail_mask(n - i);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(av, _mm512_maskz_loadu_ps(m, y + i)));
  }
}

void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = n - i >= 16 ? __mmask16(0xFFFF) : tail_mask(n - i);
    _mm512_mask_storeu_ps(dst + i, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, src + i)));
  }
}

void q8_0_to_f32(const uint8_t* blocks, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, blocks += 34, dst += 32) {
    uint16_t dh;
    std::memcpy(&dh, blocks, 2);
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16(short(dh)));
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + 2));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + 18));
    _mm512_storeu_ps(dst, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q0)), d));
    _mm512_storeu_ps(dst + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q1)), d));
  }
}

}  // namespace

const AttnKernels& attn_kernels_avx512() {
  static const AttnKernels k{dot, axpy, scale, f16_to_f32, q8_0_to_f32};
  return k;
}

}  // namespace shoal::cpu_detail
