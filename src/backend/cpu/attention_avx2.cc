// AVX2 + FMA + F16C row primitives for fast_attention (see attention_kernels.h).
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/attention_kernels.h"

namespace shoal::cpu_detail {
namespace {

// Mask of the first `rem` (< 8) of 8 lanes for vmaskmovps.
__m256i tail_mask(int64_t rem) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(rem)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

float dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i < n; i += 8) {
    const __m256i m = n - i >= 8 ? _mm256_set1_epi32(-1) : tail_mask(n - i);
    acc0 = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, m), _mm256_maskload_ps(b + i, m), acc0);
  }
  return hsum(_mm256_add_ps(acc0, acc1));
}

void axpy(float* y, float a, const float* x, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = n - i >= 8 ? _mm256_set1_epi32(-1) : tail_mask(n - i);
    _mm256_maskstore_ps(y + i, m, _mm256_fmadd_ps(av, _mm256_maskload_ps(x + i, m), _mm256_maskload_ps(y + i, m)));
  }
}

void scale(float* y, float a, int64_t n) {
  const __m256 av = _mm256_set1_ps(a);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i m = n - i >= 8 ? _mm256_set1_epi32(-1) : tail_mask(n - i);
    _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(av, _mm256_maskload_ps(y + i, m)));
  }
}

void f16_to_f32(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  if (i < n) {
    alignas(16) uint16_t h[8] = {};
    alignas(32) float f[8];
    std::memcpy(h, src + i, size_t(n - i) * 2);
    _mm256_store_ps(f, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h))));
    std::memcpy(dst + i, f, size_t(n - i) * 4);
  }
}

void q8_0_to_f32(const uint8_t* blocks, float* dst, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b, blocks += 34, dst += 32) {
    uint16_t dh;
    std::memcpy(&dh, blocks, 2);
    const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16(short(dh)));
    for (int k = 0; k < 4; ++k) {
      const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(blocks + 2 + 8 * k));
      _mm256_storeu_ps(dst + 8 * k, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d));
    }
  }
}

}  // namespace

const AttnKernels& attn_kernels_avx2() {
  static const AttnKernels k{dot, axpy, scale, f16_to_f32, q8_0_to_f32};
  return k;
}

}  // namespace shoal::cpu_detail
