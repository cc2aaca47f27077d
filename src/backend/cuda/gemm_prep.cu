// Helpers of the prefill GEMM (cuBLAS on 16-bit operands with f32 accumulation, cuda_ops.cc):
// splitting activations and dequantized weights into sums of 16-bit parts so the products keep
// f32 accuracy, and summing the partial products. Elementwise or one block per row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"

namespace shoal::cuda {
namespace {

// Rounds v to f16 (or bf16) and returns the bits; r gets the rounded value back as f32.
__device__ __forceinline__ uint16_t round16(float v, bool bf16, float& r) {
  if (bf16) {
    const __nv_bfloat16 h = __float2bfloat16_rn(v);
    r = __bfloat162float(h);
    return __bfloat16_as_ushort(h);
  }
  const __half h = __float2half_rn(v);
  r = __half2float(h);
  return __half_as_ushort(h);
}

constexpr int kRowThreads = 256;

// One block per row: f16 rows are scaled by a power of two putting max|x| in [2^14, 2^15), far
// from overflow (65504) and keeping the low parts above the f16 subnormals.
__global__ void __launch_bounds__(kRowThreads)
    split_kernel(const float* __restrict__ x, int64_t n, int64_t k, bool bf16, int parts, uint16_t* __restrict__ out,
                 float* __restrict__ inv_scale) {
  __shared__ float smem[32];
  const int64_t t = blockIdx.x;
  const float* xr = x + t * k;
  float scale = 1.0f;
  if (!bf16) {
    float mx = 0.0f;
    for (int64_t i = threadIdx.x; i < k; i += kRowThreads) mx = fmaxf(mx, fabsf(xr[i]));
    mx = warp_max(mx);
    if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = mx;
    __syncthreads();
#pragma unroll
    for (int w = 0; w < kRowThreads / 32; ++w) mx = fmaxf(mx, smem[w]);
    if (mx > 0.0f && isfinite(mx)) {
      int e;
      frexpf(mx, &e);  // mx = m * 2^e, m in [0.5, 1)
      scale = ldexpf(1.0f, max(-100, min(100, 15 - e)));
    }
  }
  if (threadIdx.x == 0) inv_scale[t] = 1.0f / scale;
  for (int64_t i = threadIdx.x; i < k; i += kRowThreads) {
    float v = xr[i] * scale;
    for (int p = 0; p < parts; ++p) {
      float r;
      out[(p * n + t) * k + i] = round16(v, bf16, r);
      v -= r;
    }
  }
}

// One thread per 8 consecutive values of a row in [r0, r0 + nr) (tile layout, cuda_util.h):
// values d * q, split into f16 hi and lo.
__global__ void dequant_split_kernel(const WeightRef w, int64_t r0, int64_t nr, uint16_t* __restrict__ hi,
                                     uint16_t* __restrict__ lo) {
  const int64_t per_row = w.cols / 8;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= nr * per_row) return;
  const int64_t row = i / per_row, c = (i % per_row) * 8;
  uint32_t h[4], l[4];
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    float rv, unused;
    const float v = weight_value(w, (r0 + row) * w.cols + c + j);
    const uint32_t hb = round16(v, false, rv);
    const uint32_t lb = round16(v - rv, false, unused);
    h[j / 2] = (j % 2) ? (h[j / 2] | (hb << 16)) : hb;
    l[j / 2] = (j % 2) ? (l[j / 2] | (lb << 16)) : lb;
  }
  *reinterpret_cast<uint4*>(hi + row * w.cols + c) = make_uint4(h[0], h[1], h[2], h[3]);
  *reinterpret_cast<uint4*>(lo + row * w.cols + c) = make_uint4(l[0], l[1], l[2], l[3]);
}

__global__ void combine_kernel(const float* __restrict__ yp, int blocks, int64_t n, int64_t rows,
                               const float* __restrict__ inv_scale, const float* __restrict__ bias,
                               float* __restrict__ y) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * rows) return;
  float s = 0.0f;
  for (int b = 0; b < blocks; ++b) s += yp[b * n * rows + i];
  if (inv_scale) s *= inv_scale[i / rows];
  y[i] = bias ? s + bias[i % rows] : s;
}

}  // namespace

cudaError_t split_activations(const float* x, int64_t n, int64_t k, bool bf16, int parts, uint16_t* out,
                              float* inv_scale, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  split_kernel<<<unsigned(n), kRowThreads, 0, stream>>>(x, n, k, bf16, parts, out, inv_scale);
  return cudaGetLastError();
}

cudaError_t dequant_split(const WeightRef& w, int64_t r0, int64_t nr, uint16_t* hi, uint16_t* lo, cudaStream_t stream) {
  if (nr == 0) return cudaSuccess;
  if (w.kind != WKind::kQ8_0 && w.kind != WKind::kQ4_0) return cudaErrorInvalidValue;
  const unsigned grid = unsigned(div_up(nr * (w.cols / 8), kBlock));
  dequant_split_kernel<<<grid, kBlock, 0, stream>>>(w, r0, nr, hi, lo);
  return cudaGetLastError();
}

cudaError_t combine_parts(const float* yp, int blocks, int64_t n, int64_t rows, const float* inv_scale,
                          const float* bias, float* y, cudaStream_t stream) {
  if (n * rows == 0) return cudaSuccess;
  combine_kernel<<<unsigned(div_up(n * rows, kBlock)), kBlock, 0, stream>>>(yp, blocks, n, rows, inv_scale, bias, y);
  return cudaGetLastError();
}

}  // namespace shoal::cuda
