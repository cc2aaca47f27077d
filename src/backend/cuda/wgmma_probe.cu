// Tensor-core rate probes of the benchmark (cuda_probe.h): wgmma with the A operand in registers
// (the quantized prefill GEMM's form, gemm_quant.cu) by MMA columns and warpgroups per SM, and
// mma.sync m16n8k16 (the GEMV's), on operands that stay in registers and shared memory, so that
// only the tensor pipe and the instructions around it are timed. PTX ISA: "wgmma.mma_async",
// "mma.sync".
#include <cuda_fp16.h>

#include <cstdint>

#include "backend/cuda/kernels.h"
#include "backend/cuda/mma.cuh"
#include "backend/cuda/wgmma.cuh"

namespace shoal::cuda {
namespace {

// Every warpgroup runs `iters` stages of the product's side-by-side pattern (gemm_quant at 16
// tokens or one part; with the parts stacked it runs two products of N / 2 columns where this runs
// one of N): four m64nNk16 into two accumulator sets (two commit groups), then, by mode, 0:
// nothing (wait for one group: the tensor pipe's rate), 1: both groups waited for in turn (the
// product's waits), 2: those waits with each set promoted into a total (N / 2 FMAs per thread
// and set, as gemm_quant's promote).
template <int kN>
__global__ void __launch_bounds__(kN == 128 ? 256 : 384, 1) wgmma_rate_kernel(int iters, int mode, float* sink) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  __shared__ __align__(1024) uint8_t b[128 * 128];  // B: kN rows of 64 K-values, 128-byte swizzle
  for (int i = threadIdx.x; i < int(sizeof(b)) / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(b)[i] = 0x3c003c00u;
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // (the writes, then the barrier, then wgmma)
  __syncthreads();
  const uint64_t desc = sw128_desc(b);
  const uint32_t a[4] = {0x3c003c00u ^ threadIdx.x, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
  float acc[2][kN / 2], total[kN / 2];
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) total[i] = 0.0f;
  const float d = 1.0f + 1e-3f * float(threadIdx.x);
#pragma unroll 1
  for (int it = 0; it < iters; ++it) {
    wgmma_fence();
    wgmma<kN>(acc[0], a, desc, 0);
    wgmma<kN>(acc[0], a, desc + uint64_t(32 >> 4), 1);
    wgmma_commit();
    wgmma<kN>(acc[1], a, desc + uint64_t(64 >> 4), 0);
    wgmma<kN>(acc[1], a, desc + uint64_t(96 >> 4), 1);
    wgmma_commit();
    if (mode == 0) {
      wgmma_wait<1>();
      continue;
    }
    wgmma_wait<1>();
    if (mode == 2)
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) total[i] = fmaf(d, acc[0][i], total[i]);
    wgmma_wait<0>();
    if (mode == 2)
#pragma unroll
      for (int i = 0; i < kN / 2; ++i) total[i] = fmaf(d, acc[1][i], total[i]);
  }
  wgmma_wait<0>();
  float s = 0.0f;
#pragma unroll
  for (int i = 0; i < kN / 2; ++i) s += total[i] + acc[0][i] + acc[1][i];
  if (s == 12345.678f) *sink = s;  // keeps the products; practically never taken
#endif
}

// Each warp runs `iters` rounds of 8 independent m16n8k16 products (its 8 accumulators).
__global__ void mma_sync_rate_kernel(int iters, float* sink) {
  const uint32_t a[4] = {0x3c003c00u ^ threadIdx.x, 0x3c003c00u, 0x3c003c00u, 0x3c003c00u};
  const uint32_t b0 = 0x3c003c00u, b1 = 0x3c003c00u ^ (threadIdx.x << 3);
  float c[8][4] = {};
#pragma unroll 1
  for (int it = 0; it < iters; ++it)
#pragma unroll
    for (int j = 0; j < 8; ++j) mma(c[j], a, b0, b1);
  float s = 0.0f;
#pragma unroll
  for (int j = 0; j < 8; ++j) s += c[j][0] + c[j][1] + c[j][2] + c[j][3];
  if (s == 12345.678f) *sink = s;
}

}  // namespace

cudaError_t wgmma_rate(int n_cols, int warpgroups, int mode, int iters, int grid, float* sink, cudaStream_t stream) {
  // (At 128 columns a thread holds 192 accumulators: 2 warpgroups at most.)
  if (warpgroups < 1 || warpgroups > (n_cols == 128 ? 2 : 3) || mode < 0 || mode > 2) return cudaErrorInvalidValue;
  const dim3 block(unsigned(128 * warpgroups));
  switch (n_cols) {
    case 16:
      wgmma_rate_kernel<16><<<grid, block, 0, stream>>>(iters, mode, sink);
      break;
    case 32:
      wgmma_rate_kernel<32><<<grid, block, 0, stream>>>(iters, mode, sink);
      break;
    case 64:
      wgmma_rate_kernel<64><<<grid, block, 0, stream>>>(iters, mode, sink);
      break;
    case 128:
      wgmma_rate_kernel<128><<<grid, block, 0, stream>>>(iters, mode, sink);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  return cudaGetLastError();
}

cudaError_t mma_sync_rate(int warps, int iters, int grid, float* sink, cudaStream_t stream) {
  if (warps < 1 || warps > 32) return cudaErrorInvalidValue;
  mma_sync_rate_kernel<<<grid, unsigned(32 * warps), 0, stream>>>(iters, sink);
  return cudaGetLastError();
}

}  // namespace shoal::cuda
