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

/// Repacked quantized weight layout (Q8_0, Q4_0): the A operand of the f16 tensor-core MMA
/// (mma.m16n8k16, PTX ISA "matrix fragments for mma.m16n8k16 with floating point type"), so a
/// lane of a warp loads its fragment of a 16-row tile with one 16-byte load. Rows are padded to a
/// multiple of 16 (tile T = row / 16); padding is zero. In a tile, row r is fragment row
/// g = r % 8 of half up = r % 16 / 8. A k-step is 16 columns; lane l = 4 g + t holds the values
/// of rows g and g + 8 at k = 2t, 2t + 1, 2t + 8, 2t + 9 of each k-step. A chunk is what one
/// lane loads at once (16 bytes, a lane's share of 512 bytes per tile):
///   Q4_0: 64 columns (4 k-steps, 2 GGUF blocks; columns padded to whole chunks). Word j of the
///     lane is k-step j: value (row g + 8 up, k = 2t + i + 8 h) is the nibble at bit
///     16 i + 8 h + 4 up, unsigned 0..15 (the value is d * (q - 8)); so word & 0x000f000f are
///     the lane's (k 2t, 2t + 1) of row g once placed under an f16 exponent.
///   Q8_0: 32 columns (2 k-steps, 1 GGUF block). Word 2 s + h of the lane is k-step s: byte
///     2 up + i holds value (row g + 8 up, k = 2t + i + 8 h) plus 128 (unsigned 0..255).
///   Quants of tile T, chunk c at byte (T * chunks + c) * 512 + 16 l.
///   Scales (f16 d): Q4_0 index ((T * chunks + c) * 8 + g) * 4 + 2 b + up for block b of the
///     chunk (a lane reads its 4 as one 8-byte load); Q8_0 ((T * chunks + c) * 8 + g) * 2 + up.
/// Tensor::data points at the quants and Tensor::aux at the scales (starting at scale_offset()).
constexpr int64_t padded_rows(int64_t rows) { return (rows + 15) / 16 * 16; }
/// Chunks per row (see above): Q4_0 64 columns, Q8_0 32.
constexpr int64_t quant_chunks(bool q4, int64_t cols) { return q4 ? (cols + 63) / 64 : cols / 32; }
/// f16 scales per row in the layout (Q4_0: padded to whole chunks).
constexpr int64_t quant_row_scales(bool q4, int64_t cols) { return q4 ? 2 * quant_chunks(true, cols) : cols / 32; }
inline uint64_t scale_offset(bool q4, int64_t rows, int64_t cols) {
  return align_up(uint64_t(padded_rows(rows) / 16) * uint64_t(quant_chunks(q4, cols)) * 512, 256);
}
inline uint64_t repacked_bytes(bool q4, int64_t rows, int64_t cols) {
  return scale_offset(q4, rows, cols) + uint64_t(padded_rows(rows) * quant_row_scales(q4, cols)) * 2;
}

/// Where value (r, k) of a repacked weight lives: the byte of its quant (nibble at `shift` for
/// Q4_0) and the index of its scale.
struct QuantPos {
  int64_t byte;
  int shift;
  int64_t scale;
};
__host__ __device__ inline QuantPos quant_pos(bool q4, int64_t cols, int64_t r, int64_t k) {
  const int64_t T = r / 16, chunks = quant_chunks(q4, cols);
  const int g = int(r % 8), up = int(r % 16) / 8;
  const int64_t c = k / (q4 ? 64 : 32);
  const int kc = int(k % (q4 ? 64 : 32)), step = kc / 16, kk = kc % 16;
  const int t = (kk % 8) / 2, i = kk % 2, h = kk / 8;
  const int64_t lane_at = (T * chunks + c) * 512 + (4 * g + t) * 16;
  QuantPos p;
  if (q4) {
    p.byte = lane_at + step * 4 + 2 * i + h;
    p.shift = 4 * up;
    p.scale = ((T * chunks + c) * 8 + g) * 4 + 2 * (step / 2) + up;
  } else {
    p.byte = lane_at + (2 * step + h) * 4 + 2 * up + i;
    p.shift = 0;
    p.scale = ((T * chunks + c) * 8 + g) * 2 + up;
  }
  return p;
}

}  // namespace shoal::cuda
