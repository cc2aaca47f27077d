// Internal to src/tensor/: the block layouts of the types that are only dequantized (converted to
// Q8_0 at load), and the per-type dequantization loops shared by quant.cc and quant_k.cc.
// Layouts are ggml's (ggml/src/ggml-common.h), as GGUF stores them; all fields little-endian.
#pragma once

#include <cstdint>

namespace shoal::quant_detail {

inline constexpr int kQK = 32;    // values per block of the 32-value types
inline constexpr int kQK_K = 256; // values per K-quant super-block

// 32 values = d * nibble + m.
struct BlockQ4_1 {
  uint16_t d, m;  // f16
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_1) == 20);

// 32 values = d * (5-bit q - 16); qh holds bit 4 of value i in bit i.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_0) == 22);

// 32 values = d * (5-bit q) + m.
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ5_1) == 24);

// 256 values in 16 groups of 16: 4-bit scale and 4-bit min per group, 2-bit quants.
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d, dmin;
};
static_assert(sizeof(BlockQ2_K) == 84);

// 256 values in 16 groups of 16: 6-bit signed scales (offset 32), 3-bit quants (2 low bits in qs,
// the high bit in hmask; a clear high bit subtracts 4).
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
static_assert(sizeof(BlockQ3_K) == 110);

// 256 values in 8 groups of 32: 6-bit scale and min per group (packed in 12 bytes), 4-bit quants.
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144);

// As Q4_K with a fifth bit per value in qh.
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ5_K) == 176);

// 256 values in 16 groups of 16: int8 scales, 6-bit quants (offset 32; 4 low bits in ql, 2 high
// bits in qh).
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
static_assert(sizeof(BlockQ6_K) == 210);

// Dequantize `nb` whole super-blocks into y (256 * nb floats). Bit-exact with ggml's
// dequantize_row_q*_K (ggml/src/ggml-quants.c). Source pointers may be unaligned.
void dequantize_q2_k(const uint8_t* src, float* y, int64_t nb);
void dequantize_q3_k(const uint8_t* src, float* y, int64_t nb);
void dequantize_q4_k(const uint8_t* src, float* y, int64_t nb);
void dequantize_q5_k(const uint8_t* src, float* y, int64_t nb);
void dequantize_q6_k(const uint8_t* src, float* y, int64_t nb);

}  // namespace shoal::quant_detail
