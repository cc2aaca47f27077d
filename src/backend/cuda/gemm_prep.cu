// Helpers of the prefill GEMM (cuBLAS on f16/bf16 operands, cuda_gemm.cc): dequantizing weight
// row tiles, converting activations, adding the bias. Elementwise, memory-bound.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"

namespace shoal::cuda {
namespace {

__device__ __forceinline__ uint16_t to16(float v, bool bf16) {
  return bf16 ? __bfloat16_as_ushort(__float2bfloat16_rn(v)) : __half_as_ushort(__float2half_rn(v));
}

__global__ void dequant_kernel(const WeightRef w, int64_t first, int64_t n, bool bf16,
                               uint16_t* __restrict__ dst) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = to16(weight_value(w, first + i), bf16);
}

__global__ void f32_to_16_kernel(const float* __restrict__ src, int64_t n, bool bf16,
                                 uint16_t* __restrict__ dst) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = to16(src[i], bf16);
}

__global__ void add_bias_kernel(float* __restrict__ y, const float* __restrict__ bias, int64_t n,
                                int64_t rows) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n * rows) y[i] += bias[i % rows];
}

}  // namespace

cudaError_t dequant_rows(const WeightRef& w, int64_t r0, int64_t nr, bool bf16, void* dst,
                         cudaStream_t stream) {
  const int64_t n = nr * w.cols;
  if (n == 0) return cudaSuccess;
  dequant_kernel<<<unsigned(div_up(n, kBlock)), kBlock, 0, stream>>>(
      w, r0 * w.cols, n, bf16, static_cast<uint16_t*>(dst));
  return cudaGetLastError();
}

cudaError_t f32_to_16(const float* src, int64_t n, bool bf16, void* dst, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  f32_to_16_kernel<<<unsigned(div_up(n, kBlock)), kBlock, 0, stream>>>(src, n, bf16,
                                                                         static_cast<uint16_t*>(dst));
  return cudaGetLastError();
}

cudaError_t add_bias(float* y, const float* bias, int64_t n, int64_t rows, cudaStream_t stream) {
  if (n * rows == 0) return cudaSuccess;
  add_bias_kernel<<<unsigned(div_up(n * rows, kBlock)), kBlock, 0, stream>>>(y, bias, n, rows);
  return cudaGetLastError();
}

}  // namespace shoal::cuda
