// AVX-512 (F, BW, DQ, VL, VNNI) matmul kernels. Float weights: 16-lane f32 FMA against f32
// activations (F16 widened by vcvtph2ps, BF16 by a 16-bit shift). Q8_0 / Q4_0 weights: integer
// dot products (vpdpbusd, with the sign trick of llama.cpp's ggml_vec_dot_q8_0_q8_0 in
// ggml-cpu/arch/x86/quants.c) against activations quantized to 8 bits per 32-value block (QX, see
// matmul_kernels.h), two blocks per register, then one f32 FMA per lane with the product of the
// two blocks' scales.
// Everything here is in an anonymous namespace (see matmul_kernels.h on why).
#include <immintrin.h>

#include <cstring>

// GCC 12's own reduce/extract intrinsics pass an "undefined" vector as the merge source, which
// -Wmaybe-uninitialized reports inside <avx512fintrin.h> (a false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "backend/cpu/matmul_kernels.h"

namespace shoal::cpu_detail {
namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Stores y[t, r] = sum of acc's lanes (+ bias[r]) for a tile.
template <int R, int T>
void store_tile(const MatmulJob& j, int64_t r0, int64_t t0, __m512 (&acc)[R][T]) {
  for (int r = 0; r < R; ++r) {
    const float b = j.bias ? j.bias[r0 + r] : 0.0f;
    for (int t = 0; t < T; ++t) {
      float s = _mm512_reduce_add_ps(acc[r][t]);
      if (j.bias) s += b;
      j.y[(t0 + t) * j.out + r0 + r] = s;
    }
  }
}

// ---- float weights --------------------------------------------------------------------------

struct LoadF32 {
  static constexpr int64_t kBytes = 4;
  static __m512 full(const uint8_t* row, int64_t k) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(row) + k);
  }
  static __m512 part(const uint8_t* row, int64_t k, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, reinterpret_cast<const float*>(row) + k);
  }
};

struct LoadF16 {
  static constexpr int64_t kBytes = 2;
  static __m512 full(const uint8_t* row, int64_t k) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k)));
  }
  static __m512 part(const uint8_t* row, int64_t k, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, row + 2 * k));
  }
};

struct LoadBF16 {
  static constexpr int64_t kBytes = 2;
  static __m512 widen(__m256i h) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
  static __m512 full(const uint8_t* row, int64_t k) {
    return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + 2 * k)));
  }
  static __m512 part(const uint8_t* row, int64_t k, __mmask16 m) {
    return widen(_mm256_maskz_loadu_epi16(m, row + 2 * k));
  }
};

template <typename L>
struct FloatTiles {
  template <int R, int T>
  static void tile(const MatmulJob& j, int64_t r0, int64_t t0) {
    __m512 acc[R][T];
    const uint8_t* w[R];
    const float* x[T];
    for (int r = 0; r < R; ++r) {
      w[r] = j.w + (r0 + r) * j.w_row_bytes;
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    for (int t = 0; t < T; ++t) x[t] = j.x + (t0 + t) * j.in;
    int64_t k = 0;
    for (; k + 16 <= j.in; k += 16) {
      __m512 wv[R];
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + k * L::kBytes + kPrefetchBytes), _MM_HINT_T0);
        wv[r] = L::full(w[r], k);
      }
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_loadu_ps(x[t] + k);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    if (k < j.in) {
      const __mmask16 m = __mmask16((1u << (j.in - k)) - 1);
      __m512 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = L::part(w[r], k, m);
      for (int t = 0; t < T; ++t) {
        const __m512 xv = _mm512_maskz_loadu_ps(m, x[t] + k);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm512_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    store_tile<R, T>(j, r0, t0, acc);
  }
};

// ---- quantized weights ----------------------------------------------------------------------

// Scales of weight blocks b and b+1 as [d_b x 8, d_b+1 x 8] (f16 -> f32).
__m512 pair_scales(uint16_t d0, uint16_t d1) {
  const __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_set1_epi16(short(d0))),
                                            _mm_set1_epi16(short(d1)), 1);
  return _mm512_cvtph_ps(h);
}

// Q8_0 row: blocks of 34 bytes (f16 d, 32 x int8). Loads blocks b, b+1 (b+1 only if `second`)
// as 64 signed values and their scales.
struct Q8_0Weights {
  static constexpr int64_t kBlockBytes = 34;
  static void load_pair(const uint8_t* row, int64_t b, bool second, __m512i* q, __m512* d) {
    const uint8_t* p = row + b * kBlockBytes;
    const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 2));
    const __m256i hi = second ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + kBlockBytes + 2))
                              : _mm256_setzero_si256();
    *q = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
    *d = pair_scales(load_u16(p), second ? load_u16(p + kBlockBytes) : 0);
  }
};

// Q4_0 row: blocks of 18 bytes (f16 d, 16 bytes: value i in the low nibble of byte i, value
// i + 16 in the high nibble, both offset by 8).
struct Q4_0Weights {
  static constexpr int64_t kBlockBytes = 18;
  static void load_pair(const uint8_t* row, int64_t b, bool second, __m512i* q, __m512* d) {
    const uint8_t* p = row + b * kBlockBytes;
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 2));
    // A missing second block reads as nibbles 8, i.e. zeros.
    const __m128i hi = second ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + kBlockBytes + 2))
                              : _mm_set1_epi8(char(0x88));
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
    const __m256i m4 = _mm256_set1_epi8(0x0F);
    const __m256i low = _mm256_and_si256(both, m4);                         // [b lo, b+1 lo]
    const __m256i high = _mm256_and_si256(_mm256_srli_epi16(both, 4), m4);  // [b hi, b+1 hi]
    const __m512i z = _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
    const __m512i nib = _mm512_shuffle_i64x2(z, z, _MM_SHUFFLE(3, 1, 2, 0));  // [b lo, b hi, b+1 lo, b+1 hi]
    *q = _mm512_sub_epi8(nib, _mm512_set1_epi8(8));
    *d = pair_scales(load_u16(p), second ? load_u16(p + kBlockBytes) : 0);
  }
};

// Integer dot products of signed weights and signed QX activations by vpdpbusd (u8 x s8): the
// weights' magnitudes (|w| <= 128 fits u8) times the activations with the weights' signs, 4
// products per int32 lane, exact. Then one f32 FMA per lane with d_w * d_x.
template <typename W>
struct QuantTiles {
  template <int R, int T>
  static void tile(const MatmulJob& j, int64_t r0, int64_t t0) {
    __m512 acc[R][T];
    const uint8_t* w[R];
    const uint8_t* xq[T];
    const float* xd[T];
    for (int r = 0; r < R; ++r) {
      w[r] = j.w + (r0 + r) * j.w_row_bytes;
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
    }
    for (int t = 0; t < T; ++t) {
      xq[t] = j.qx + (t0 + t) * j.qx_stride;
      xd[t] = reinterpret_cast<const float*>(xq[t] + 32 * j.nbp);
    }
    const __m512i lanes = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const int64_t nb = j.in / 32;
    for (int64_t b = 0; b < nb; b += 2) {
      const bool second = b + 1 < nb;
      __m512i wabs[R];
      __mmask64 wneg[R];
      __m512 wd[R];
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + b * W::kBlockBytes + kPrefetchBytes), _MM_HINT_T0);
        __m512i q;
        W::load_pair(w[r], b, second, &q, &wd[r]);
        wabs[r] = _mm512_abs_epi8(q);
        wneg[r] = _mm512_movepi8_mask(q);
      }
      for (int t = 0; t < T; ++t) {
        const __m512i xv = _mm512_load_si512(xq[t] + 32 * b);
        const __m512 dv = _mm512_permutexvar_ps(lanes, _mm512_castps128_ps512(_mm_castpd_ps(
                                                           _mm_load_sd(reinterpret_cast<const double*>(xd[t] + b)))));
        for (int r = 0; r < R; ++r) {
          const __m512i xs = _mm512_mask_sub_epi8(xv, wneg[r], _mm512_setzero_si512(), xv);
          const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), wabs[r], xs);
          acc[r][t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(wd[r], dv), acc[r][t]);
        }
      }
    }
    store_tile<R, T>(j, r0, t0, acc);
  }
};

template <typename K>
void rows(const MatmulJob& j, int64_t r0, int64_t r1, int64_t token_block) {
  run_rows<K>(j, r0, r1, token_block);
}

// QX record of one token (layout in matmul_kernels.h). Rounds x / d to nearest, ties to even.
void quantize_x(const float* x, int64_t in, int64_t nbp, uint8_t* rec) {
  auto* qs = reinterpret_cast<int8_t*>(rec);
  auto* d = reinterpret_cast<float*>(rec + 32 * nbp);
  const int64_t nb = in / 32;
  for (int64_t b = 0; b < nb; ++b) {
    const __m512 a = _mm512_loadu_ps(x + 32 * b);
    const __m512 c = _mm512_loadu_ps(x + 32 * b + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(c)));
    const float db = amax / 127.0f;
    const __m512 id = _mm512_set1_ps(db != 0.0f ? 1.0f / db : 0.0f);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(a, id))));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + 32 * b + 16),
                     _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(_mm512_mul_ps(c, id))));
    d[b] = db;
  }
  for (int64_t b = nb; b < nbp; ++b) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(qs + 32 * b), _mm256_setzero_si256());
    d[b] = 0.0f;
  }
}

}  // namespace

const IsaKernels& kernels_avx512() {
  static const IsaKernels k{rows<FloatTiles<LoadF32>>, rows<FloatTiles<LoadF16>>, rows<FloatTiles<LoadBF16>>,
                            rows<QuantTiles<Q8_0Weights>>, rows<QuantTiles<Q4_0Weights>>, quantize_x};
  return k;
}

}  // namespace shoal::cpu_detail
