// Tensor-core and asynchronous-copy primitives shared by the kernels of src/backend/cuda/
// (PTX ISA: "warp-level matrix instructions", mma.m16n8k16 fragment layouts; ldmatrix;
// cp.async). Only included by .cu files of src/backend/cuda/.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

namespace shoal::cuda {

/// c += A (16x16 f16, row) * B (16x8 f16, col), f32 accumulators. Lane (g = lane / 4,
/// c = lane % 4) holds a[0] = A[g][2c..2c+1], a[1] = A[g+8][2c..], a[2] = A[g][2c+8..],
/// a[3] = A[g+8][2c+8..]; b0 = B[2c..2c+1][g], b1 = B[2c+8..2c+9][g]; c[0..1] = C[g][2c..2c+1],
/// c[2..3] = C[g+8][2c..2c+1].
__device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// Two floats as an f16x2 word (round to nearest), a first (low half).
__device__ __forceinline__ uint32_t half2_bits(float a, float b) {
  const __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
/// An f16x2 word as two floats.
__device__ __forceinline__ float2 bits_half2(uint32_t u) {
  return __half22float2(*reinterpret_cast<const __half2*>(&u));
}

/// Four 8x8 f16 matrices from shared memory: lanes 8i..8i+7 give the 16-byte rows of matrix i;
/// r[i] is lane (g, c)'s word of matrix i: row g, columns 2c..2c+1 (with .trans: rows 2c..2c+1
/// of column g).
template <bool kTrans>
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const unsigned a = unsigned(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/// Asynchronous 16-, 8- and 4-byte copies global -> shared (cp.async, sm_80+). A lane that reads
/// back only what it copied itself needs cp.async.wait_group alone; otherwise also a barrier.
__device__ __forceinline__ void cp_async(void* dst, const void* src, std::integral_constant<int, 16>) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(unsigned(__cvta_generic_to_shared(dst))), "l"(src)
               : "memory");
}
template <int B>
__device__ __forceinline__ void cp_async(void* dst, const void* src, std::integral_constant<int, B>) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2;" ::"r"(unsigned(__cvta_generic_to_shared(dst))), "l"(src),
               "n"(B)
               : "memory");
}
/// 16 bytes global -> shared, or 16 zero bytes when !valid (src is not read then).
__device__ __forceinline__ void cp_async_or_zero(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(unsigned(__cvta_generic_to_shared(dst))),
               "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
/// B (4 or 8) bytes global -> shared, or B zero bytes when !valid (src is not read then).
template <int B>
__device__ __forceinline__ void cp_async_or_zero(void* dst, const void* src, bool valid) {
  static_assert(B == 4 || B == 8, "cp.async.ca copies 4, 8 or 16 bytes (16: the overload above)");
  asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(unsigned(__cvta_generic_to_shared(dst))),
               "l"(src), "n"(B), "r"(valid ? B : 0)
               : "memory");
}
/// A 16-byte shared-memory store of a, b, c, d at dst (16-byte aligned): one st.shared.v4 where
/// the compiler, not knowing the alignment of a pointer cast from bytes, would store 4 words.
__device__ __forceinline__ void st_shared_v4(void* dst, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(unsigned(__cvta_generic_to_shared(dst))), "r"(a),
               "r"(b), "r"(c), "r"(d)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
/// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

}  // namespace shoal::cuda
