// Repacking of GGUF Q8_0 / Q4_0 blocks on upload into the tensor-core tile layout of
// cuda_util.h (the A fragments of mma.m16n8k16), so a GEMV lane loads its fragment of a 16-row
// tile with one 16-byte load.
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"

namespace shoal::cuda {
namespace {

// One thread per GGUF block; block B (row-major) is row B / nb, block B % nb of that row.
// Q8_0 block: f16 d, 32 int8. Q4_0 block: f16 d, 16 bytes (byte j: value j low, j + 16 high).
// The destination was zeroed (alloc_weight): a Q4_0 word holds nibbles of rows g and g + 8,
// which are different blocks, so their threads OR them in.
template <bool kQ4>
__global__ void repack_kernel(const uint8_t* __restrict__ raw, int64_t first, int64_t n_blocks, int64_t cols,
                              uint8_t* __restrict__ quants, uint16_t* __restrict__ scales) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n_blocks) return;
  const int64_t nb = cols / 32, B = first + i;
  const int64_t r = B / nb, k0 = (B % nb) * 32;
  const uint8_t* src = raw + i * (kQ4 ? 18 : 34);
  scales[quant_pos(kQ4, cols, r, k0).scale] = uint16_t(src[0] | (src[1] << 8));
  const uint8_t* qs = src + 2;
  if constexpr (kQ4) {
    // The block's 32 nibbles fill 8 words (4 lanes x 2 k-steps), 4 nibbles each.
#pragma unroll
    for (int w = 0; w < 8; ++w) {
      uint32_t word = 0;
      int64_t at = 0;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int kk = (w / 4) * 16 + (w % 4) * 2 + (j % 2) + (j / 2) * 8;  // lane t = w % 4, k-step w / 4
        const uint32_t nib = kk < 16 ? (qs[kk] & 0x0fu) : (qs[kk - 16] >> 4);
        const QuantPos p = quant_pos(true, cols, r, k0 + kk);
        word |= nib << (8 * (p.byte % 4) + p.shift);
        at = p.byte - p.byte % 4;
      }
      atomicOr(reinterpret_cast<unsigned*>(quants + at), word);
    }
  } else {
#pragma unroll 4
    for (int kk = 0; kk < 32; ++kk) quants[quant_pos(false, cols, r, k0 + kk).byte] = uint8_t(qs[kk] ^ 0x80u);
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
