// K-quant dequantization (Q2_K .. Q6_K), bit-exact with ggml's dequantize_row_q*_K
// (ggml/src/ggml-quants.c) and gguf-py's quants.py: the same float operations in the same order
// (a group's scale and min are multiplied out first, then y = scale * q - min), and no FMA
// contraction (GCC in ISO mode does not contract; the pragma stops clang).
#include <cstring>

#include "core/half.h"
#include "tensor/quant_blocks.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

namespace shoal::quant_detail {

namespace {

template <typename Block>
Block load_block(const uint8_t* src, int64_t i) {
  Block b;
  std::memcpy(&b, src + i * int64_t(sizeof(Block)), sizeof(Block));
  return b;
}

// The 6-bit scale and min of group j (0..7) of a Q4_K / Q5_K super-block: groups 0-3 keep them
// in the low 6 bits of bytes j and j+4; groups 4-7 put 4 low bits in byte j+4 and their 2 high
// bits in the top bits of bytes j-4 (scale) and j (min).
void scale_min_k4(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = uint8_t((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = uint8_t((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace

void dequantize_q2_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ2_K>(src, i);
    const float d = f16_to_f32(b.d);
    const float dmin = f16_to_f32(b.dmin);
    const uint8_t* q = b.qs;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2) {
        for (int part = 0; part < 2; ++part) {
          const uint8_t sc = b.scales[is++];
          const float dl = d * float(sc & 0xF);
          const float ml = dmin * float(sc >> 4);
          for (int l = 0; l < 16; ++l) *y++ = dl * float((q[l + 16 * part] >> shift) & 3) - ml;
        }
      }
    }
  }
}

void dequantize_q3_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ3_K>(src, i);
    const float d_all = f16_to_f32(b.d);
    // Unpack 16 6-bit scales: low 4 bits from bytes 0-7 (low then high nibbles), the 2 high
    // bits from bytes 8-11 (2 bits per scale, scale k at byte 8 + k%4, bit pair k/4).
    int8_t scales[16];
    for (int k = 0; k < 16; ++k) {
      const int low = (k < 8) ? (b.scales[k] & 0xF) : (b.scales[k - 8] >> 4);
      const int high = (b.scales[8 + k % 4] >> (2 * (k / 4))) & 3;
      scales[k] = int8_t((low | (high << 4)) - 32);
    }
    const uint8_t* q = b.qs;
    uint8_t m = 1;
    int is = 0;
    for (int half = 0; half < 2; ++half, q += 32) {
      for (int shift = 0; shift < 8; shift += 2, m = uint8_t(m << 1)) {
        for (int part = 0; part < 2; ++part) {
          const float dl = d_all * float(scales[is++]);
          for (int l = 0; l < 16; ++l) {
            const int idx = l + 16 * part;
            const int v = ((q[idx] >> shift) & 3) - ((b.hmask[idx] & m) ? 0 : 4);
            *y++ = dl * float(v);
          }
        }
      }
    }
  }
}

void dequantize_q4_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ4_K>(src, i);
    const float d = f16_to_f32(b.d);
    const float dmin = f16_to_f32(b.dmin);
    const uint8_t* q = b.qs;
    for (int is = 0; is < 8; is += 2, q += 32) {
      uint8_t sc, mn;
      scale_min_k4(is, b.scales, &sc, &mn);
      const float d1 = d * float(sc), m1 = dmin * float(mn);
      scale_min_k4(is + 1, b.scales, &sc, &mn);
      const float d2 = d * float(sc), m2 = dmin * float(mn);
      for (int l = 0; l < 32; ++l) *y++ = d1 * float(q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * float(q[l] >> 4) - m2;
    }
  }
}

void dequantize_q5_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ5_K>(src, i);
    const float d = f16_to_f32(b.d);
    const float dmin = f16_to_f32(b.dmin);
    const uint8_t* ql = b.qs;
    uint8_t u1 = 1, u2 = 2;
    for (int is = 0; is < 8; is += 2, ql += 32) {
      uint8_t sc, mn;
      scale_min_k4(is, b.scales, &sc, &mn);
      const float d1 = d * float(sc), m1 = dmin * float(mn);
      scale_min_k4(is + 1, b.scales, &sc, &mn);
      const float d2 = d * float(sc), m2 = dmin * float(mn);
      for (int l = 0; l < 32; ++l) *y++ = d1 * float((ql[l] & 0xF) + ((b.qh[l] & u1) ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * float((ql[l] >> 4) + ((b.qh[l] & u2) ? 16 : 0)) - m2;
      u1 = uint8_t(u1 << 2);
      u2 = uint8_t(u2 << 2);
    }
  }
}

void dequantize_q6_k(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const auto b = load_block<BlockQ6_K>(src, i);
    const float d = f16_to_f32(b.d);
    const uint8_t* ql = b.ql;
    const uint8_t* qh = b.qh;
    const int8_t* sc = b.scales;
    for (int half = 0; half < 2; ++half, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        // (d * scale) * q, left to right as in ggml.
        y[l + 0] = d * float(sc[is + 0]) * float(q1);
        y[l + 32] = d * float(sc[is + 2]) * float(q2);
        y[l + 64] = d * float(sc[is + 4]) * float(q3);
        y[l + 96] = d * float(sc[is + 6]) * float(q4);
      }
    }
  }
}

}  // namespace shoal::quant_detail
