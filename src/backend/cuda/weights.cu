// Repacking of GGUF Q8_0 / Q4_0 blocks on upload into the tensor-core tile layout of
// cuda_util.h (the A fragments of mma.m16n8k16), so a GEMV lane loads its fragment of a 16-row
// tile with one 16-byte load; BF16 weights rewritten as F16 where that keeps each row to 2^-20
// normalised (prefill products then take two f16 activation parts instead of three bf16 ones).
#include <cuda_fp16.h>

#include <algorithm>

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

// One block per row (grid-stride over rows): the row's rounding error and sum of squares in f64.
__global__ void bf16_f16_check_kernel(const uint16_t* __restrict__ w, int64_t rows, int64_t cols, int* bad) {
  __shared__ double e_sh[kBlock], s_sh[kBlock];
  __shared__ int inf_sh;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    if (threadIdx.x == 0) inf_sh = 0;
    __syncthreads();
    double e2 = 0.0, s2 = 0.0;
    bool inf = false;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
      const float v = __uint_as_float(uint32_t(w[r * cols + c]) << 16);
      const float h = __half2float(__float2half_rn(v));
      inf = inf || !isfinite(h);  // (a NaN or inf v gives a non-finite h too)
      const double d = double(v) - double(h);
      e2 += d * d;
      s2 += double(v) * double(v);
    }
    if (inf) inf_sh = 1;
    e_sh[threadIdx.x] = e2;
    s_sh[threadIdx.x] = s2;
    __syncthreads();
    for (int k = blockDim.x / 2; k > 0; k /= 2) {
      if (int(threadIdx.x) < k) {
        e_sh[threadIdx.x] += e_sh[threadIdx.x + k];
        s_sh[threadIdx.x] += s_sh[threadIdx.x + k];
      }
      __syncthreads();
    }
    if (threadIdx.x == 0 && (inf_sh || e_sh[0] > ldexp(s_sh[0], -40))) atomicAdd(bad, 1);
    __syncthreads();  // (the shared sums are reused by the next row)
  }
}

__global__ void bf16_to_f16_kernel(uint16_t* w, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float v = __uint_as_float(uint32_t(w[i]) << 16);
    w[i] = __half_as_ushort(__float2half_rn(v));
  }
}

}  // namespace

cudaError_t bf16_rows_not_f16(const uint16_t* w, int64_t rows, int64_t cols, int* bad, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const unsigned grid = unsigned(std::min<int64_t>(rows, 4096));
  bf16_f16_check_kernel<<<grid, kBlock, 0, stream>>>(w, rows, cols, bad);
  return cudaGetLastError();
}

cudaError_t bf16_to_f16_in_place(uint16_t* w, int64_t n, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  const unsigned grid = unsigned(std::min<int64_t>(div_up(n, kBlock), 8192));
  bf16_to_f16_kernel<<<grid, kBlock, 0, stream>>>(w, n);
  return cudaGetLastError();
}

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
