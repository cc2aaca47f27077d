// AVX2 + FMA + F16C matmul kernels. Float weights: 8-lane f32 FMA against f32 activations.
// Q8_0 / Q4_0 weights: one 32-value block per register; u8 x s8 products by vpmaddubsw then
// vpmaddwd into 8 int32 lanes (llama.cpp's mul_sum_i8_pairs, ggml-cpu/arch/x86/quants.c): |w|
// times x with w's sign moved onto it (|w| * |x| <= 128 * 127 keeps the 16-bit pair sums from
// saturating).
// Everything here is in an anonymous namespace (see matmul_kernels.h on why).
#include <immintrin.h>

#include <cstring>

#include "backend/cpu/matmul_kernels.h"

namespace shoal::cpu_detail {
namespace {

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// Fixed-order horizontal sum of 8 lanes.
float hsum(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 s2 = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s2, _mm_movehdup_ps(s2)));
}

template <int R, int T>
void store_tile(const MatmulJob& j, int64_t r0, int64_t t0, __m256 (&acc)[R][T]) {
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float s = hsum(acc[r][t]);
      if (j.bias) s += j.bias[r0 + r];
      j.y[(t0 + t) * j.out + r0 + r] = s;
    }
  }
}

// ---- float weights --------------------------------------------------------------------------

struct LoadF32 {
  static constexpr int64_t kBytes = 4;
  static __m256 full(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
};
struct LoadF16 {
  static constexpr int64_t kBytes = 2;
  static __m256 full(const uint8_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};
struct LoadBF16 {
  static constexpr int64_t kBytes = 2;
  static __m256 full(const uint8_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
};

template <typename L>
struct FloatTiles {
  template <int R, int T>
  static void tile(const MatmulJob& j, int64_t r0, int64_t t0) {
    __m256 acc[R][T];
    const uint8_t* w[R];
    const float* x[T];
    for (int r = 0; r < R; ++r) {
      w[r] = j.w + (r0 + r) * j.w_row_bytes;
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    for (int t = 0; t < T; ++t) x[t] = j.x + (t0 + t) * j.in;
    int64_t k = 0;
    for (; k + 8 <= j.in; k += 8) {
      __m256 wv[R];
      for (int r = 0; r < R; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w[r] + k * L::kBytes + kPrefetchBytes), _MM_HINT_T0);
        wv[r] = L::full(w[r] + k * L::kBytes);
      }
      for (int t = 0; t < T; ++t) {
        const __m256 xv = _mm256_loadu_ps(x[t] + k);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    if (k < j.in) {  // the last in % 8 values, through zero-padded copies
      const int64_t rem = j.in - k;
      __m256 wv[R];
      for (int r = 0; r < R; ++r) {
        alignas(32) uint8_t buf[32] = {};
        std::memcpy(buf, w[r] + k * L::kBytes, size_t(rem * L::kBytes));
        wv[r] = L::full(buf);
      }
      for (int t = 0; t < T; ++t) {
        alignas(32) float buf[8] = {};
        std::memcpy(buf, x[t] + k, size_t(rem) * 4);
        const __m256 xv = _mm256_load_ps(buf);
        for (int r = 0; r < R; ++r) acc[r][t] = _mm256_fmadd_ps(wv[r], xv, acc[r][t]);
      }
    }
    store_tile<R, T>(j, r0, t0, acc);
  }
};

// ---- quantized weights ----------------------------------------------------------------------

// 8 int32 lanes: lane i = sum over bytes 4i..4i+3 of u[k] * s[k] (u unsigned, s signed).
__m256i dot_u8_s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// Q8_0: blocks of 34 bytes (f16 d, 32 x int8).
struct Q8_0Weights {
  static constexpr int64_t kBlockBytes = 34;
  static __m256i load(const uint8_t* blk) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
  }
};

// Q4_0: blocks of 18 bytes (f16 d, value i in the low nibble of byte i, value i + 16 in the high
// nibble, both offset by 8).
struct Q4_0Weights {
  static constexpr int64_t kBlockBytes = 18;
  static __m256i load(const uint8_t* blk) {
    const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 2));
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(q), _mm_srli_epi16(q, 4), 1);
    return _mm256_sub_epi8(_mm256_and_si256(both, _mm256_set1_epi8(0x0F)), _mm256_set1_epi8(8));
  }
};

template <typename W>
struct QuantTiles {
  template <int R, int T>
  static void tile(const MatmulJob& j, int64_t r0, int64_t t0) {
    __m256 acc[R][T];
    const uint8_t* w[R];
    const uint8_t* xq[T];
    const float* xd[T];
    for (int r = 0; r < R; ++r) {
      w[r] = j.w + (r0 + r) * j.w_row_bytes;
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
    }
    for (int t = 0; t < T; ++t) {
      xq[t] = j.qx + (t0 + t) * j.qx_stride;
      xd[t] = reinterpret_cast<const float*>(xq[t] + 32 * j.nbp);
    }
    const int64_t nb = j.in / 32;
    for (int64_t b = 0; b < nb; ++b) {
      __m256i wq[R], wabs[R];
      __m256 wd[R];
      for (int r = 0; r < R; ++r) {
        const uint8_t* blk = w[r] + b * W::kBlockBytes;
        _mm_prefetch(reinterpret_cast<const char*>(blk + kPrefetchBytes), _MM_HINT_T0);
        wq[r] = W::load(blk);
        wabs[r] = _mm256_sign_epi8(wq[r], wq[r]);
        wd[r] = _mm256_cvtph_ps(_mm_set1_epi16(short(load_u16(blk))));
      }
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_load_si256(reinterpret_cast<const __m256i*>(xq[t] + 32 * b));
        const __m256 dv = _mm256_broadcast_ss(xd[t] + b);
        for (int r = 0; r < R; ++r) {
          const __m256i s = dot_u8_s8(wabs[r], _mm256_sign_epi8(xv, wq[r]));
          acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(wd[r], dv), acc[r][t]);
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
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < nbp; ++b) {
    __m256i q = _mm256_setzero_si256();
    float db = 0.0f;
    if (b < nb) {
      __m256 v[4], m = _mm256_setzero_ps();
      for (int i = 0; i < 4; ++i) {
        v[i] = _mm256_loadu_ps(x + 32 * b + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, v[i]));
      }
      __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
      h = _mm_max_ps(h, _mm_movehl_ps(h, h));
      h = _mm_max_ss(h, _mm_movehdup_ps(h));
      db = _mm_cvtss_f32(h) / 127.0f;
      const __m256 id = _mm256_set1_ps(db != 0.0f ? 1.0f / db : 0.0f);
      __m256i i32[4];
      for (int i = 0; i < 4; ++i) i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], id));
      // Pack 4 x 8 int32 to 32 int8 (saturating), then undo the per-128-bit-lane interleave.
      const __m256i p16a = _mm256_packs_epi32(i32[0], i32[1]);
      const __m256i p16b = _mm256_packs_epi32(i32[2], i32[3]);
      q = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(p16a, p16b), _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(qs + 32 * b), q);
    d[b] = db;
  }
}

}  // namespace

const IsaKernels& kernels_avx2() {
  static const IsaKernels k{rows<FloatTiles<LoadF32>>, rows<FloatTiles<LoadF16>>, rows<FloatTiles<LoadBF16>>,
                            rows<QuantTiles<Q8_0Weights>>, rows<QuantTiles<Q4_0Weights>>, quantize_x};
  return k;
}

}  // namespace shoal::cpu_detail
