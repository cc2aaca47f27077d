// Small helpers shared by the CUDA backend's host code (.cc) and kernels (.cu): error checking
// of CUDA runtime calls, and the layout of repacked quantized weights. Only included inside
// src/backend/cuda/.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace shoal::cuda {

/// Threads per block of the simple elementwise kernels.
constexpr int kBlock = 256;

/// ceil(a / b) for positive values.
constexpr int64_t div_up(int64_t a, int64_t b) { return (a + b - 1) / b; }

/// Rounds a byte count up to a multiple of `align`.
constexpr uint64_t align_up(uint64_t n, uint64_t align) { return (n + align - 1) / align * align; }

/// Repacked quantized weight layout (Q8_0, Q4_0). One device allocation holds, in order:
///   quants: rows * row_quant_bytes(cols) bytes, row-major. Q8_0: one int8 per value.
///           Q4_0: 16 bytes per block of 32 values, as in the file (byte j: low nibble = value j,
///           high nibble = value j + 16), so one 16-byte load is one block.
///   scales: rows * cols / 32 f16 values (one per block), starting at scale_offset().
/// Each row's quants start 16-byte aligned (cols is a multiple of 32). Tensor::data points at
/// the quants and Tensor::aux at the scales.
inline uint64_t row_quant_bytes(bool q4, int64_t cols) { return uint64_t(q4 ? cols / 2 : cols); }
inline uint64_t scale_offset(bool q4, int64_t rows, int64_t cols) {
  return align_up(row_quant_bytes(q4, cols) * uint64_t(rows), 256);
}

}  // namespace shoal::cuda
