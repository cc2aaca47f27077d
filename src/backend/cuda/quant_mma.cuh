// The A operand of the f16 tensor-core MMAs from the repacked Q4_0 / Q8_0 tile layout
// (cuda_util.h): each quantized value becomes an exact f16 small integer (q - 8, or q) in
// registers, shared by the GEMV (gemv_quant.cu) and the prefill GEMM (gemm_quant.cu). Only
// included by .cu files of src/backend/cuda/.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

namespace shoal::cuda {

// (a & mask) | bits in one instruction.
__device__ __forceinline__ uint32_t and_or(uint32_t a, uint32_t mask, uint32_t bits) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;" : "=r"(d) : "r"(a), "r"(mask), "r"(bits));
  return d;
}
__device__ __forceinline__ uint32_t hsub2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("sub.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}
__device__ __forceinline__ uint32_t hfma2(uint32_t a, uint32_t b, uint32_t c) {
  uint32_t d;
  asm("fma.rn.f16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
  return d;
}

// f16x2 constants.
constexpr uint32_t k1024 = 0x64006400u;         // 1024, 1024
constexpr uint32_t k1032 = 0x64086408u;         // 1024 + 8
constexpr uint32_t kSixteenth = 0x2c002c00u;    // 1 / 16
constexpr uint32_t kMinus72 = 0xd480d480u;      // -(1024 / 16 + 8)
constexpr uint32_t k1152 = 0x64806480u;         // 1024 + 128

// The A fragment of one k-step from a Q4_0 word (cuda_util.h): nibble q at bits 0-3 (or 16-19)
// under the exponent of 1024 is the f16 1024 + q; at bits 4-7 it is 1024 + 16 q.
__device__ __forceinline__ void q4_fragment(uint32_t w, uint32_t (&a)[4]) {
  const uint32_t w8 = w >> 8;
  a[0] = hsub2(and_or(w, 0x000f000fu, k1024), k1032);
  a[1] = hfma2(and_or(w, 0x00f000f0u, k1024), kSixteenth, kMinus72);
  a[2] = hsub2(and_or(w8, 0x000f000fu, k1024), k1032);
  a[3] = hfma2(and_or(w8, 0x00f000f0u, k1024), kSixteenth, kMinus72);
}

// The A fragment of one k-step from two Q8_0 words (bytes q + 128): each byte goes under the
// exponent of 1024 with one prmt.
__device__ __forceinline__ void q8_fragment(uint32_t w0, uint32_t w1, uint32_t (&a)[4]) {
  a[0] = hsub2(__byte_perm(w0, k1024, 0x5150), k1152);
  a[1] = hsub2(__byte_perm(w0, k1024, 0x5352), k1152);
  a[2] = hsub2(__byte_perm(w1, k1024, 0x5150), k1152);
  a[3] = hsub2(__byte_perm(w1, k1024, 0x5352), k1152);
}

}  // namespace shoal::cuda
