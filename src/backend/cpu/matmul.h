// The fast CPU backend's matmul: y[n, out] = x[n, in] · w[out, in]ᵀ (+ bias), multi-threaded and
// SIMD (AVX-512 / AVX2 / scalar, chosen at run time: cpu_features.h). n == 1 is the decode GEMV;
// n > 1 (prefill) is a tiled GEMM that reads each tile of weight rows once per block of tokens.
//
// Precision: F32, F16 and BF16 weights are multiplied in f32 FMA with f32 activations (per
// element |y - exact| / (||w_row|| ||x||) below 1e-6; ~4e-8 seen). Q8_0 and Q4_0 weights meet activations quantized to
// 8 bits per 32-value block (scale amax / 127, kept in f32) in exact integer dot products, as
// llama.cpp does: the result differs from the f32 product of the dequantized weights by the
// rounding of x: per element |y - exact| / (||w_row|| ||x||) <= sqrt(32)/254 = 0.022 in theory,
// ~1e-3 (largest seen 2.6e-3) on random data.
//
// Determinism: each output element is computed by one fixed instruction sequence, never split
// across threads, so results are bit-identical for any thread count and any n (row i of a
// batch equals the GEMV of row i alone). Different ISA levels may differ in the last bits.
#pragma once

#include "backend/cpu/cpu_features.h"
#include "backend/tensor.h"
#include "core/thread_pool.h"

namespace shoal {

/// y = x · wᵀ (+ bias) with the kernels of cpu_isa().
/// w: [out, in] of F32, F16, BF16, Q8_0 or Q4_0 in GGUF block layout (in % 32 == 0 for Q8_0 and
/// Q4_0); x: f32 [n, in]; y: f32 [n, out], must not alias x; bias: f32 [out] or null.
/// Shapes and dtypes are CHECKed (a mismatch is a bug in the caller).
void fast_matmul(ThreadPool& pool, const Tensor& w, const Tensor& x, Tensor& y, const Tensor* bias);

/// As fast_matmul, with the kernels of a given level (CHECKs that the CPU supports it). For tests
/// and benchmarks.
void fast_matmul_isa(ThreadPool& pool, CpuIsa isa, const Tensor& w, const Tensor& x, Tensor& y,
                     const Tensor* bias);

}  // namespace shoal
