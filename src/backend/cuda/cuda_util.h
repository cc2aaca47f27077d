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

/// Repacked quantized weight layout (Q8_0, Q4_0): rows are taken in groups of 4 (the row count
/// is padded up to a multiple of 4) and interleaved, so that one 16-byte vector holds the same
/// k-range of 4 rows and the lanes of a warp read consecutive activations. One allocation holds:
///   quants: for group g, chunk c (Q4_0: 8 values, Q8_0: 4 values of each row): 16 bytes at
///           (g * chunks + c) * 16, row r of the group at bytes 4r..4r+3. Q8_0: 4 int8.
///           Q4_0: byte b holds value 2b (low nibble) and 2b + 1 (high nibble), unsigned 0..15
///           (the value is d * (q - 8)).
///   scales: f16, for group g, block b (32 values), row r: index (g * (cols / 32) + b) * 4 + r,
///           starting at scale_offset().
/// Tensor::data points at the quants and Tensor::aux at the scales.
inline int64_t padded_rows(int64_t rows) { return (rows + 3) / 4 * 4; }
inline uint64_t row_quant_bytes(bool q4, int64_t cols) { return uint64_t(q4 ? cols / 2 : cols); }
inline uint64_t scale_offset(bool q4, int64_t rows, int64_t cols) {
  return align_up(row_quant_bytes(q4, cols) * uint64_t(padded_rows(rows)), 256);
}
inline uint64_t repacked_bytes(bool q4, int64_t rows, int64_t cols) {
  return scale_offset(q4, rows, cols) + uint64_t(padded_rows(rows) * (cols / 32)) * 2;
}

}  // namespace shoal::cuda
