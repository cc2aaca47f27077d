// Repacking of GGUF Q8_0 / Q4_0 blocks on upload into separate quant and scale arrays
// (layout: cuda_util.h), so the GEMV kernels read 16-byte-aligned quant stripes.
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"

namespace shoal::cuda {
namespace {

// One thread per block. Q8_0 block: f16 d, 32 int8; Q4_0 block: f16 d, 16 bytes of nibbles.
template <int kQuantBytes>
__global__ void repack_kernel(const uint8_t* __restrict__ raw, int64_t n_blocks,
                              uint8_t* __restrict__ quants, uint16_t* __restrict__ scales) {
  const int64_t b = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= n_blocks) return;
  const uint8_t* src = raw + b * (2 + kQuantBytes);
  scales[b] = uint16_t(src[0] | (src[1] << 8));
  // The source is only 2-byte aligned; copy as 16-bit words into 16-byte aligned destinations.
  uint32_t words[kQuantBytes / 4];
#pragma unroll
  for (int i = 0; i < kQuantBytes / 4; ++i) {
    const uint16_t* s16 = reinterpret_cast<const uint16_t*>(src + 2 + 4 * i);
    words[i] = uint32_t(s16[0]) | (uint32_t(s16[1]) << 16);
  }
  uint4* dst = reinterpret_cast<uint4*>(quants + b * kQuantBytes);
#pragma unroll
  for (int i = 0; i < kQuantBytes / 16; ++i)
    dst[i] = make_uint4(words[4 * i], words[4 * i + 1], words[4 * i + 2], words[4 * i + 3]);
}

}  // namespace

cudaError_t repack_blocks(bool q4, const uint8_t* raw, int64_t n_blocks, uint8_t* quants,
                          uint16_t* scales, cudaStream_t stream) {
  if (n_blocks == 0) return cudaSuccess;
  const unsigned grid = unsigned(div_up(n_blocks, kBlock));
  if (q4)
    repack_kernel<16><<<grid, kBlock, 0, stream>>>(raw, n_blocks, quants, scales);
  else
    repack_kernel<32><<<grid, kBlock, 0, stream>>>(raw, n_blocks, quants, scales);
  return cudaGetLastError();
}

}  // namespace shoal::cuda
