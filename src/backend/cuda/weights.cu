// Repacking of GGUF Q8_0 / Q4_0 blocks on upload into the 4-row-interleaved quant and scale arrays
// of cuda_util.h, so the GEMV kernels read 16-byte stripes of 4 rows and coalesced activations.
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"

namespace shoal::cuda {
namespace {

// One thread per GGUF block; block B (row-major) is row B / nb, block B % nb of that row.
// Q8_0 block: f16 d, 32 int8. Q4_0 block: f16 d, 16 bytes (byte j: value j low, j + 16 high).
template <bool kQ4>
__global__ void repack_kernel(const uint8_t* __restrict__ raw, int64_t first, int64_t n_blocks, int64_t cols,
                              uint8_t* __restrict__ quants, uint16_t* __restrict__ scales) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_blocks) return;
  const int64_t nb = cols / 32, B = first + i;
  const int64_t r = B / nb, b = B % nb, g = r / 4, rr = r % 4;
  const uint8_t* src = raw + i * (kQ4 ? 18 : 34);
  scales[(g * nb + b) * 4 + rr] = uint16_t(src[0] | (src[1] << 8));
  const uint8_t* qs = src + 2;
  constexpr int kVals = kQ4 ? 8 : 4;   // values of a row per 16-byte vector
  constexpr int kChunks = 32 / kVals;  // vectors per block
  const int64_t chunks_per_row = cols / kVals;
#pragma unroll
  for (int c = 0; c < kChunks; ++c) {
    uint32_t word = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t byte;
      if constexpr (kQ4) {
        auto nib = [&](int v) { return v < 16 ? (qs[v] & 0x0fu) : (qs[v - 16] >> 4); };
        byte = nib(c * 8 + 2 * j) | (nib(c * 8 + 2 * j + 1) << 4);
      } else {
        byte = qs[c * 4 + j];
      }
      word |= byte << (8 * j);
    }
    const int64_t vec = g * chunks_per_row + b * kChunks + c;
    *reinterpret_cast<uint32_t*>(quants + vec * 16 + rr * 4) = word;
  }
}

}  // namespace

cudaError_t repack_blocks(bool q4, const uint8_t* raw, int64_t first, int64_t n_blocks, int64_t cols, uint8_t* quants,
                          uint16_t* scales, cudaStream_t stream) {
  if (n_blocks == 0) return cudaSuccess;
  const unsigned grid = unsigned(div_up(n_blocks, kBlock));
  if (q4)
    repack_kernel<true><<<grid, kBlock, 0, stream>>>(raw, first, n_blocks, cols, quants, scales);
  else
    repack_kernel<false><<<grid, kBlock, 0, stream>>>(raw, first, n_blocks, cols, quants, scales);
  return cudaGetLastError();
}

}  // namespace shoal::cuda
