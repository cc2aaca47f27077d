// Dequantization of the plain and 32-value block types, Q8_0 / Q4_0 quantization, and conversion
// to Q8_0. Float operations follow ggml's reference C code (ggml/src/ggml-quants.c:
// dequantize_row_q*, quantize_row_q8_0_ref, quantize_row_q4_0_ref) in the same order, without FMA
// contraction, so results are bit-identical. K-quants are in quant_k.cc.
#include "tensor/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/half.h"
#include "tensor/quant_blocks.h"

#ifdef __clang__
#pragma STDC FP_CONTRACT OFF
#endif

namespace shoal {

using namespace quant_detail;

namespace {

template <typename Block>
Block load_block(const uint8_t* src, int64_t i) {
  Block b;
  std::memcpy(&b, src + i * int64_t(sizeof(Block)), sizeof(Block));
  return b;
}

uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, 2);
  return v;
}

// float -> int by truncation; values outside [-128, 127] (only from NaN / inf input, which has
// no meaningful quantization) give 0 instead of undefined behaviour.
int to_int_or_zero(float v) { return (v >= -128.0f && v <= 127.0f) ? int(v) : 0; }

void dequantize_q4_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ4_0>(src, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < 16; ++j) {
      y[j] = float((b.qs[j] & 0xF) - 8) * d;
      y[j + 16] = float((b.qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ4_1>(src, i);
    const float d = f16_to_f32(b.d);
    const float m = f16_to_f32(b.m);
    for (int j = 0; j < 16; ++j) {
      y[j] = float(b.qs[j] & 0xF) * d + m;
      y[j + 16] = float(b.qs[j] >> 4) * d + m;
    }
  }
}

uint32_t load_qh(const uint8_t qh[4]) {
  uint32_t v;
  std::memcpy(&v, qh, 4);
  return v;
}

void dequantize_q5_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ5_0>(src, i);
    const float d = f16_to_f32(b.d);
    const uint32_t qh = load_qh(b.qh);
    for (int j = 0; j < 16; ++j) {
      const int h0 = int((qh >> j) << 4) & 0x10;
      const int h1 = int(qh >> (j + 12)) & 0x10;
      y[j] = float(((b.qs[j] & 0xF) | h0) - 16) * d;
      y[j + 16] = float(((b.qs[j] >> 4) | h1) - 16) * d;
    }
  }
}

void dequantize_q5_1(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ5_1>(src, i);
    const float d = f16_to_f32(b.d);
    const float m = f16_to_f32(b.m);
    const uint32_t qh = load_qh(b.qh);
    for (int j = 0; j < 16; ++j) {
      const int h0 = int((qh >> j) << 4) & 0x10;
      const int h1 = int(qh >> (j + 12)) & 0x10;
      y[j] = float((b.qs[j] & 0xF) | h0) * d + m;
      y[j + 16] = float((b.qs[j] >> 4) | h1) * d + m;
    }
  }
}

void dequantize_q8_0(const uint8_t* src, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += kQK) {
    const auto b = load_block<BlockQ8_0>(src, i);
    const float d = f16_to_f32(b.d);
    for (int j = 0; j < kQK; ++j) y[j] = float(b.qs[j]) * d;
  }
}

}  // namespace

Status dequantize(DType t, const void* src_v, float* dst, int64_t n) {
  const auto* src = static_cast<const uint8_t*>(src_v);
  const auto info = dtype_info(uint32_t(t));
  if (!info) return make_error(Code::kUnsupported, "dequantize: unknown dtype id {}", uint32_t(t));
  if (n < 0 || n % info->block_size != 0)
    return make_error(Code::kInvalidArgument, "dequantize: {} values of {} is not a whole number of {}-value blocks",
                      n, info->name, info->block_size);
  const int64_t nb = n / info->block_size;
  switch (t) {
    case DType::kF32:
      if (n > 0) std::memcpy(dst, src, size_t(n) * 4);
      return Status::Ok();
    case DType::kF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = f16_to_f32(load_u16(src + 2 * i));
      return Status::Ok();
    case DType::kBF16:
      for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(load_u16(src + 2 * i));
      return Status::Ok();
    case DType::kQ4_0: dequantize_q4_0(src, dst, nb); return Status::Ok();
    case DType::kQ4_1: dequantize_q4_1(src, dst, nb); return Status::Ok();
    case DType::kQ5_0: dequantize_q5_0(src, dst, nb); return Status::Ok();
    case DType::kQ5_1: dequantize_q5_1(src, dst, nb); return Status::Ok();
    case DType::kQ8_0: dequantize_q8_0(src, dst, nb); return Status::Ok();
    case DType::kQ2_K: dequantize_q2_k(src, dst, nb); return Status::Ok();
    case DType::kQ3_K: dequantize_q3_k(src, dst, nb); return Status::Ok();
    case DType::kQ4_K: dequantize_q4_k(src, dst, nb); return Status::Ok();
    case DType::kQ5_K: dequantize_q5_k(src, dst, nb); return Status::Ok();
    case DType::kQ6_K: dequantize_q6_k(src, dst, nb); return Status::Ok();
    default:
      return make_error(Code::kUnsupported, "dequantize: dtype {} is not supported", info->name);
  }
}

void quantize_q8_0(const float* src, BlockQ8_0* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, src += kQK) {
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      const float a = std::fabs(src[j]);
      amax = amax > a ? amax : a;  // ggml's MAX(): a NaN propagates
    }
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ8_0 b;
    b.d = f32_to_f16(d);
    for (int j = 0; j < kQK; ++j) b.qs[j] = int8_t(to_int_or_zero(std::roundf(src[j] * id)));
    std::memcpy(&dst[i], &b, sizeof b);
  }
}

void quantize_q4_0(const float* src, BlockQ4_0* dst, int64_t n) {
  for (int64_t i = 0; i < n / kQK; ++i, src += kQK) {
    // The signed value of largest magnitude (the first one on ties) maps to -8.
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < kQK; ++j) {
      if (amax < std::fabs(src[j])) {
        amax = std::fabs(src[j]);
        max = src[j];
      }
    }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    BlockQ4_0 b;
    b.d = f32_to_f16(d);
    for (int j = 0; j < 16; ++j) {
      // x * id + 8.5 lies in [0.5, 16.5]; truncation toward zero then clamp to 15, as ggml.
      const int q0 = std::min(15, to_int_or_zero(src[j] * id + 8.5f));
      const int q1 = std::min(15, to_int_or_zero(src[j + 16] * id + 8.5f));
      b.qs[j] = uint8_t(q0 | (q1 << 4));
    }
    std::memcpy(&dst[i], &b, sizeof b);
  }
}

Status convert_to_q8_0(DType t, const void* src_v, BlockQ8_0* dst, int64_t n) {
  const auto* src = static_cast<const uint8_t*>(src_v);
  const auto info = dtype_info(uint32_t(t));
  if (!info) return make_error(Code::kUnsupported, "convert_to_q8_0: unknown dtype id {}", uint32_t(t));
  if (n < 0 || n % info->block_size != 0 || n % kQK != 0)
    return make_error(Code::kInvalidArgument,
                      "convert_to_q8_0: {} values of {} is not a whole number of blocks", n, info->name);
  if (t == DType::kQ8_0) {
    if (n > 0) std::memcpy(static_cast<void*>(dst), src, size_t(n / kQK) * sizeof(BlockQ8_0));
    return Status::Ok();
  }
  // A chunk is a whole number of source blocks and of 32-value Q8_0 blocks.
  const int64_t chunk = std::max<int64_t>(info->block_size, kQK);
  if (chunk > kQK_K)
    return make_error(Code::kUnsupported, "convert_to_q8_0: dtype {} has {}-value blocks", info->name, chunk);
  float buf[kQK_K];
  const int64_t src_chunk_bytes = chunk / info->block_size * info->type_size;
  for (int64_t v = 0; v < n; v += chunk, src += src_chunk_bytes, dst += chunk / kQK) {
    SHOAL_RETURN_IF_ERROR(dequantize(t, src, buf, chunk));
    quantize_q8_0(buf, dst, chunk);
  }
  return Status::Ok();
}

}  // namespace shoal
