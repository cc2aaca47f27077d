// RMSNorm (Zhang & Sennrich 2019), RMSNorm with the residual add fused in, and LayerNorm
// (Ba et al. 2016): one block per row (or per group), f32 block sums in a fixed order.
// Twins: ref::rms_norm, ref::layer_norm, Backend::add_rms_norm; tests: tests/cuda/cuda_ops_test.cc.
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace shoal::cuda {
namespace {

template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    rms_norm_kernel(const float* x, const float* __restrict__ w, int64_t g, float eps, float* y) {
  pdl_prologue();
  __shared__ float smem[32];
  const float* xr = x + int64_t(blockIdx.x) * g;
  float* yr = y + int64_t(blockIdx.x) * g;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < g; i += kThreads) ss = fmaf(xr[i], xr[i], ss);
  ss = block_sum<kThreads>(ss, smem);
  const float inv = 1.0f / sqrtf(ss / float(g) + eps);
  for (int64_t i = threadIdx.x; i < g; i += kThreads) yr[i] = xr[i] * inv * w[i];
}

template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    add_rms_norm_kernel(float* x, const float* delta, const float* __restrict__ w, int64_t d, float eps, float* y) {
  pdl_prologue();
  __shared__ float smem[32];
  float* xr = x + int64_t(blockIdx.x) * d;
  const float* dr = delta + int64_t(blockIdx.x) * d;
  float* yr = y + int64_t(blockIdx.x) * d;
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) {
    const float v = xr[i] + dr[i];
    xr[i] = v;
    ss = fmaf(v, v, ss);
  }
  ss = block_sum<kThreads>(ss, smem);
  const float inv = 1.0f / sqrtf(ss / float(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += kThreads) yr[i] = xr[i] * inv * w[i];
}

template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    layer_norm_kernel(const float* x, const float* __restrict__ w, const float* __restrict__ b, int64_t d, float eps,
                      float* y) {
  pdl_prologue();
  __shared__ float smem[32];
  const float* xr = x + int64_t(blockIdx.x) * d;
  float* yr = y + int64_t(blockIdx.x) * d;
  float s = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) s += xr[i];
  const float mean = block_sum<kThreads>(s, smem) / float(d);
  float v = 0.0f;
  for (int64_t i = threadIdx.x; i < d; i += kThreads) v = fmaf(xr[i] - mean, xr[i] - mean, v);
  const float inv = 1.0f / sqrtf(block_sum<kThreads>(v, smem) / float(d) + eps);
  for (int64_t i = threadIdx.x; i < d; i += kThreads) yr[i] = (xr[i] - mean) * inv * w[i] + (b ? b[i] : 0.0f);
}

}  // namespace

cudaError_t rms_norm(const float* x, const float* w, int64_t groups, int64_t g, float eps, float* y,
                     cudaStream_t stream) {
  if (groups == 0) return cudaSuccess;
  const unsigned grid = unsigned(groups);
  if (g <= 128)
    SHOAL_TRY_LAUNCH(launch(rms_norm_kernel<32>, grid, 32, 0, stream, x, w, g, eps, y));
  else if (g <= 1024)
    SHOAL_TRY_LAUNCH(launch(rms_norm_kernel<128>, grid, 128, 0, stream, x, w, g, eps, y));
  else
    SHOAL_TRY_LAUNCH(launch(rms_norm_kernel<512>, grid, 512, 0, stream, x, w, g, eps, y));
  return cudaGetLastError();
}

cudaError_t add_rms_norm(float* x, const float* delta, const float* w, int64_t rows, int64_t d, float eps, float* y,
                         cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const unsigned grid = unsigned(rows);
  if (d <= 128)
    SHOAL_TRY_LAUNCH(launch(add_rms_norm_kernel<32>, grid, 32, 0, stream, x, delta, w, d, eps, y));
  else if (d <= 1024)
    SHOAL_TRY_LAUNCH(launch(add_rms_norm_kernel<128>, grid, 128, 0, stream, x, delta, w, d, eps, y));
  else
    SHOAL_TRY_LAUNCH(launch(add_rms_norm_kernel<512>, grid, 512, 0, stream, x, delta, w, d, eps, y));
  return cudaGetLastError();
}

cudaError_t layer_norm(const float* x, const float* w, const float* b, int64_t rows, int64_t d, float eps, float* y,
                       cudaStream_t stream) {
  if (rows == 0) return cudaSuccess;
  const unsigned grid = unsigned(rows);
  if (d <= 128)
    SHOAL_TRY_LAUNCH(launch(layer_norm_kernel<32>, grid, 32, 0, stream, x, w, b, d, eps, y));
  else if (d <= 1024)
    SHOAL_TRY_LAUNCH(launch(layer_norm_kernel<128>, grid, 128, 0, stream, x, w, b, d, eps, y));
  else
    SHOAL_TRY_LAUNCH(launch(layer_norm_kernel<512>, grid, 512, 0, stream, x, w, b, d, eps, y));
  return cudaGetLastError();
}

}  // namespace shoal::cuda
