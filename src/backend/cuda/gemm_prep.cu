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

// Dequantization of the tile layout (cuda_util.h) into f16 hi and lo parts, hi + lo = d * q.
// A block takes one 16-row tile and kDqChunks chunks: each lane reads its 16 bytes of a chunk
// (coalesced), writes its values into shared memory, and the block then writes the 16 rows out
// as contiguous 16-byte stores.
constexpr int kDqChunks = 8;  // chunks per block (= warps)

template <bool kQ4>
__global__ void __launch_bounds__(kDqChunks * 32)
    dequant_split_kernel(const WeightRef w, int64_t r0, int64_t nr, uint16_t* __restrict__ hi, uint16_t* __restrict__ lo) {
  constexpr int kCols = kQ4 ? 64 : 32, kSpan = kDqChunks * kCols;  // columns of this block
  __shared__ __align__(16) uint16_t sh[2][16][kSpan + 8];  // (+8: rows start 4 banks apart)
  const int64_t chunks = quant_chunks(kQ4, w.cols);
  const int64_t T = r0 / 16 + blockIdx.y, c0 = int64_t(blockIdx.x) * kDqChunks;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int64_t c = c0 + warp;
  if (c < chunks) {
    const uint4 v = __ldg(static_cast<const uint4*>(w.data) + (T * chunks + c) * 32 + lane);
    const uint32_t words[4] = {v.x, v.y, v.z, v.w};
    const uint16_t* sc = w.scales + ((T * chunks + c) * 8 + g) * (kQ4 ? 4 : 2);
#pragma unroll
    for (int st = 0; st < kCols / 16; ++st)
#pragma unroll
      for (int up = 0; up < 2; ++up) {
        const float d = f16_bits_to_float(sc[kQ4 ? 2 * (st / 2) + up : up]);
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {  // values (row g + 8 up, k = 16 st + 2t + 8 hh + ii)
          uint32_t hp = 0, lp = 0;
#pragma unroll
          for (int ii = 0; ii < 2; ++ii) {
            const int qv = kQ4 ? int((words[st] >> (16 * ii + 8 * hh + 4 * up)) & 0x0fu) - 8
                               : int((words[2 * st + hh] >> (16 * up + 8 * ii)) & 0xffu) - 128;
            float rv, unused;
            const float val = d * float(qv);
            hp |= uint32_t(round16(val, false, rv)) << (16 * ii);
            lp |= uint32_t(round16(val - rv, false, unused)) << (16 * ii);
          }
          const int col = warp * kCols + 16 * st + 2 * t + 8 * hh;
          *reinterpret_cast<uint32_t*>(&sh[0][g + 8 * up][col]) = hp;
          *reinterpret_cast<uint32_t*>(&sh[1][g + 8 * up][col]) = lp;
        }
      }
  }
  __syncthreads();
  const int64_t cols = min(int64_t(kSpan), w.cols - c0 * kCols);  // a multiple of 16
  constexpr int kVecs = kSpan / 8;  // 16-byte vectors per row
  for (int i = threadIdx.x; i < 2 * 16 * kVecs; i += kDqChunks * 32) {
    const int part = i / (16 * kVecs), rr = (i / kVecs) % 16, vv = i % kVecs;
    const int64_t row = T * 16 + rr - r0;
    if (row >= nr || vv * 8 >= cols) continue;
    uint16_t* out = (part ? lo : hi) + row * w.cols + c0 * kCols + vv * 8;
    *reinterpret_cast<uint4*>(out) = *reinterpret_cast<const uint4*>(&sh[part][rr][vv * 8]);
  }
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
  if (r0 % 16 != 0 || (w.kind != WKind::kQ8_0 && w.kind != WKind::kQ4_0)) return cudaErrorInvalidValue;
  const bool q4 = w.kind == WKind::kQ4_0;
  const dim3 grid(unsigned(div_up(quant_chunks(q4, w.cols), kDqChunks)), unsigned(div_up(nr, 16)));
  if (q4)
    dequant_split_kernel<true><<<grid, kDqChunks * 32, 0, stream>>>(w, r0, nr, hi, lo);
  else
    dequant_split_kernel<false><<<grid, kDqChunks * 32, 0, stream>>>(w, r0, nr, hi, lo);
  return cudaGetLastError();
}

cudaError_t combine_parts(const float* yp, int blocks, int64_t n, int64_t rows, const float* inv_scale,
                          const float* bias, float* y, cudaStream_t stream) {
  if (n * rows == 0) return cudaSuccess;
  combine_kernel<<<unsigned(div_up(n * rows, kBlock)), kBlock, 0, stream>>>(yp, blocks, n, rows, inv_scale, bias, y);
  return cudaGetLastError();
}

}  // namespace shoal::cuda
