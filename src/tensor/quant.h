// Quantized block formats (ggml's, as GGUF stores them) and conversions. Dequantization is
// bit-exact with ggml's C code (ggml/src/ggml-quants.c) and gguf-py's quants.py; tests compare
// against ../shared/fixtures/quant/*.dequant.safetensors exactly.
#pragma once

#include <cstdint>

#include "core/status.h"
#include "tensor/dtype.h"

namespace shoal {

// One Q8_0 block: 32 values = d * qs[i]. 34 bytes.
struct BlockQ8_0 {
  uint16_t d;  // f16 scale
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34);

// One Q4_0 block: 32 values = d * (nibble - 8); qs[i] low nibble = value i, high = value i+16.
struct BlockQ4_0 {
  uint16_t d;  // f16 scale
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18);

/// Dequantizes n values (a whole number of blocks) of type t from src into f32 dst.
/// Supports F32, F16, BF16 and every quant type that dtype_is_native or dtype_converts_to_q8_0.
/// Errors: kUnsupported for other types, kInvalidArgument if n is not a whole number of blocks.
Status dequantize(DType t, const void* src, float* dst, int64_t n);

/// Quantizes n f32 values (n % 32 == 0) to Q8_0 the way ggml's quantize_row_q8_0_ref does
/// (d = amax / 127, q = round(x / d)).
void quantize_q8_0(const float* src, BlockQ8_0* dst, int64_t n);
/// Quantizes n f32 values to Q4_0 as ggml's quantize_row_q4_0_ref does.
void quantize_q4_0(const float* src, BlockQ4_0* dst, int64_t n);

/// Converts one tensor's bytes of type t (a dtype_converts_to_q8_0 type, or Q8_0 itself) to Q8_0
/// blocks: dequantize then re-quantize, block by block. n values; dst holds n/32 blocks.
/// Errors as dequantize.
Status convert_to_q8_0(DType t, const void* src, BlockQ8_0* dst, int64_t n);

}  // namespace shoal
