// Helpers of the prefill GEMM (cuBLAS on 16-bit operands with f32 accumulation, cuda_ops.cc):
// splitting activations and dequantized weights into sums of 16-bit parts so the products keep
// f32 accuracy, and summing the partial products. Elementwise or one block per row.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

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

// Writes 4 values e = v * scale as `parts` 16-bit parts at out + i (8-byte aligned), parts
// `stride` apart: part 0 = round16(e), part p + 1 = round16 of what the parts before leave, times
// shift^(p + 1) (split_activations: 1; glu_parts' f16 parts: kGluLoShift).
__device__ __forceinline__ void store_parts4(float4 v, float scale, int parts, bool bf16, float shift,
                                             uint16_t* __restrict__ out, int64_t stride, int64_t i) {
  float e[4] = {v.x * scale, v.y * scale, v.z * scale, v.w * scale};
  for (int p = 0; p < parts; ++p) {
    uint16_t b[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      float r;
      b[q] = round16(e[q], bf16, r);
      e[q] = (e[q] - r) * shift;  // (exact: e - r fits in f32, and the shift is a power of two)
    }
    *reinterpret_cast<uint2*>(out + p * stride + i) =
        make_uint2(b[0] | uint32_t(b[1]) << 16, b[2] | uint32_t(b[3]) << 16);
  }
}

constexpr int kRowThreads = 256;

// The power of two that puts mx (> 0, finite) in [2^14, 2^15), within 2^+-100.
__device__ __forceinline__ float pow2_scale(float mx) {
  int e;
  frexpf(mx, &e);  // mx = m * 2^e, m in [0.5, 1)
  return ldexpf(1.0f, max(-100, min(100, 15 - e)));
}

// The power of two that puts a row's max |x| (mx, after the norm) in [2^14, 2^15) for f16 parts:
// far from overflow (65504), and the low parts stay above the f16 subnormals; 1 for bf16 parts,
// a zero row and a non-finite max. Every thread of the block gets it; smem: 32 floats.
__device__ __forceinline__ float row_scale(float mx, float inv, bool bf16, float* smem) {
  if (bf16) return 1.0f;
  mx = warp_max(mx);
  __syncthreads();  // smem was read by block_sum
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = mx;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kRowThreads / 32; ++w) mx = fmaxf(mx, smem[w]);
  mx *= inv;
  return mx > 0.0f && isfinite(mx) ? pow2_scale(mx) : 1.0f;
}

// The end of a row's reductions for its split: the row's 1 / rms (1 without norm_w; ss: this
// thread's sum of x^2) and its scale (row_scale; mx: this thread's max |x * w|); thread 0 writes
// 1 / scale to *inv_scale_t. Every thread of the block gets both; smem: 32 floats.
__device__ __forceinline__ float row_inv_rms_and_scale(float ss, float mx, int64_t k, const float* norm_w, float eps,
                                                       bool bf16, float* smem, float* inv_scale_t, float& inv) {
  inv = norm_w ? 1.0f / sqrtf(block_sum<kRowThreads>(ss, smem) / float(k) + eps) : 1.0f;
  const float scale = row_scale(mx, inv, bf16, smem);
  if (threadIdx.x == 0) *inv_scale_t = 1.0f / scale;
  return scale;
}

// One block per row. With a norm weight the row is RMSNorm'ed first (x * inv_rms * w, as
// norm.cu), so the normed input is never written; then scaled by row_scale and split into parts.
// The generic loop: any k, the row read twice, one value per thread and iteration (latency-bound:
// split_vec_kernel below takes the rows it can).
__global__ void __launch_bounds__(kRowThreads)
    split_kernel(const float* __restrict__ x, int64_t n, int64_t k, bool bf16, int parts,
                 const float* __restrict__ norm_w, float eps, uint16_t* __restrict__ out,
                 float* __restrict__ inv_scale) {
  pdl_prologue();
  __shared__ float smem[32];
  const int64_t t = blockIdx.x;
  const float* xr = x + t * k;
  float mx = 0.0f, ss = 0.0f;  // max |x * w|, sum of x^2
  for (int64_t i = threadIdx.x; i < k; i += kRowThreads) {
    const float v = xr[i];
    mx = fmaxf(mx, fabsf(norm_w ? v * norm_w[i] : v));
    ss = fmaf(v, v, ss);
  }
  float inv;
  const float scale = row_inv_rms_and_scale(ss, mx, k, norm_w, eps, bf16, smem, inv_scale + t, inv);
  for (int64_t i = threadIdx.x; i < k; i += kRowThreads) {
    float v = (norm_w ? xr[i] * inv * norm_w[i] : xr[i]) * scale;
    for (int p = 0; p < parts; ++p) {
      float r;
      out[(p * n + t) * k + i] = round16(v, bf16, r);
      v -= r;
    }
  }
}

// The split of one row of k % 4 == 0 values held in registers (v: kVec float4 per thread,
// zeros past the row), as split_kernel computes it but for the order of the sum of squares:
// RMSNorm'ed with norm_w when given, scaled by row_scale, each part written 8 bytes per thread
// (out 8-byte aligned, norm_w 16-byte aligned). smem: 32 floats.
template <int kVec>
__device__ __forceinline__ void split_row(float4 (&v)[kVec], int64_t n, int64_t t, int64_t k, bool bf16, int parts,
                                          const float* __restrict__ norm_w, float eps, uint16_t* __restrict__ out,
                                          float* __restrict__ inv_scale, float* smem) {
  const int nv = int(k / 4);
  const auto* w4 = reinterpret_cast<const float4*>(norm_w);
  float mx = 0.0f, ss = 0.0f;  // max |x * w|, sum of x^2 (the zeros past the row change neither)
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int i = int(threadIdx.x) + j * kRowThreads;
    const float4 w = norm_w && i < nv ? __ldg(w4 + i) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
    ss = fmaf(v[j].x, v[j].x, fmaf(v[j].y, v[j].y, fmaf(v[j].z, v[j].z, fmaf(v[j].w, v[j].w, ss))));
    mx = fmaxf(fmaxf(mx, fmaxf(fabsf(v[j].x * w.x), fabsf(v[j].y * w.y))),
               fmaxf(fabsf(v[j].z * w.z), fabsf(v[j].w * w.w)));
  }
  float inv;
  const float scale = row_inv_rms_and_scale(ss, mx, k, norm_w, eps, bf16, smem, inv_scale + t, inv);
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int i = int(threadIdx.x) + j * kRowThreads;
    if (i >= nv) break;
    float4 e = v[j];
    if (norm_w) {
      const float4 w = __ldg(w4 + i);
      e = make_float4(e.x * inv * w.x, e.y * inv * w.y, e.z * inv * w.z, e.w * inv * w.w);
    }
    store_parts4(e, scale, parts, bf16, 1.0f, out, n * k, t * k + 4 * int64_t(i));
  }
}

// split_kernel for rows of k % 4 == 0 values, at most 4 * kVec * kRowThreads: the row is read
// once into registers, a float4 per thread and step with all its loads in flight at once (x
// 16-byte aligned), then split_row.
template <int kVec>
__global__ void __launch_bounds__(kRowThreads)
    split_vec_kernel(const float* __restrict__ x, int64_t n, int64_t k, bool bf16, int parts,
                     const float* __restrict__ norm_w, float eps, uint16_t* __restrict__ out,
                     float* __restrict__ inv_scale) {
  pdl_prologue();
  __shared__ float smem[32];
  const int64_t t = blockIdx.x;
  const int nv = int(k / 4);
  const auto* xr = reinterpret_cast<const float4*>(x + t * k);
  float4 v[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int i = int(threadIdx.x) + j * kRowThreads;
    v[j] = i < nv ? xr[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  split_row<kVec>(v, n, t, k, bf16, parts, norm_w, eps, out, inv_scale, smem);
}

// combine_kernel (accumulating, 4 elements per thread) of one row, kept in registers, then
// split_row of the new row: y written once, never read back (combine_split).
template <int kVec>
__global__ void __launch_bounds__(kRowThreads)
    combine_split_kernel(const float* __restrict__ yp, int blocks, int64_t ld, float lo,
                         const float* __restrict__ p_inv_scale, const float* __restrict__ bias, float* __restrict__ y,
                         int64_t n, int64_t k, bool bf16, int parts, const float* __restrict__ norm_w, float eps,
                         uint16_t* __restrict__ out, float* __restrict__ inv_scale) {
  pdl_prologue();
  __shared__ float smem[32];
  const int64_t t = blockIdx.x;
  const int nv = int(k / 4);
  const float pin = p_inv_scale ? p_inv_scale[t] : 1.0f;
  auto* y4 = reinterpret_cast<float4*>(y + t * k);
  float4 v[kVec];
#pragma unroll
  for (int j = 0; j < kVec; ++j) {
    const int i = int(threadIdx.x) + j * kRowThreads;
    if (i >= nv) {
      v[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      continue;
    }
    float4 s = parts_sum4(yp, blocks, n * ld, t * ld + 4 * int64_t(i), pin, lo);  // (combine_kernel's order)
    if (bias) s.x += bias[4 * i], s.y += bias[4 * i + 1], s.z += bias[4 * i + 2], s.w += bias[4 * i + 3];
    const float4 o = y4[i];
    v[j] = make_float4(o.x + s.x, o.y + s.y, o.z + s.z, o.w + s.w);
    y4[i] = v[j];
  }
  split_row<kVec>(v, n, t, k, bf16, parts, norm_w, eps, out, inv_scale, smem);
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

// y = sum of parts (* inv_scale) (+ bias) (+ y when accumulating): one thread per element, or
// per 4 elements when rows and ld are multiples of 4 (yp 16-byte aligned). yp rows are ld apart.
template <bool kVec4>
__global__ void combine_kernel(const float* yp, int blocks, int64_t n, int64_t rows, int64_t ld,
                               const float* __restrict__ inv_scale, const float* __restrict__ bias, bool accumulate,
                               float* y, float lo) {
  pdl_prologue();
  const int64_t count = n * rows, src_count = n * ld;
  if constexpr (kVec4) {
    const int64_t i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
    if (i >= count) return;
    const int64_t t = i / rows, r = i % rows;
    float4 s = parts_sum4(yp, blocks, src_count, t * ld + r, inv_scale ? inv_scale[t] : 1.0f, lo);
    if (bias) s.x += bias[r], s.y += bias[r + 1], s.z += bias[r + 2], s.w += bias[r + 3];
    if (accumulate) {
      const float4 o = *reinterpret_cast<const float4*>(y + i);
      s.x = o.x + s.x, s.y = o.y + s.y, s.z = o.z + s.z, s.w = o.w + s.w;
    }
    *reinterpret_cast<float4*>(y + i) = s;
  } else {
    const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= count) return;
    const int64_t t = i / rows, r = i % rows;
    float s = 0.0f;
    for (int b = 0; b < blocks; ++b) s = fmaf(yp[b * src_count + t * ld + r], b > 0 ? lo : 1.0f, s);
    if (inv_scale) s *= inv_scale[t];
    if (bias) s += bias[r];
    y[i] = accumulate ? y[i] + s : s;
  }
}

// act(gate) * up of 4 elements (src: token t's row offset), gate and up each the sum of their
// parts times the token's 1 / scale: the one formula of combine_glu and glu_parts.
__device__ __forceinline__ float4 glu4(const float* __restrict__ gate, int gate_blocks, const float* __restrict__ up,
                                       int up_blocks, int64_t src_count, int64_t src, float inv, Act act) {
  const float4 g = parts_sum4(gate, gate_blocks, src_count, src, inv),
               u = parts_sum4(up, up_blocks, src_count, src, inv);
  return make_float4(apply_act(g.x, act) * u.x, apply_act(g.y, act) * u.y, apply_act(g.z, act) * u.z,
                     apply_act(g.w, act) * u.w);
}

// out = act(gate) * up; gate and up rows ld apart (ld % 4 == 0); 4 elements per thread (rows % 4
// == 0).
__global__ void combine_glu_kernel(const float* __restrict__ gate, int gate_blocks, const float* __restrict__ up,
                                   int up_blocks, int64_t n, int64_t rows, int64_t ld,
                                   const float* __restrict__ inv_scale, Act act, float* __restrict__ y) {
  pdl_prologue();
  const int64_t count = n * rows, i = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * 4;
  if (i >= count) return;
  const int64_t t = i / rows;
  *reinterpret_cast<float4*>(y + i) =
      glu4(gate, gate_blocks, up, up_blocks, n * ld, t * ld + i % rows, inv_scale[t], act);
}

__device__ __forceinline__ uint32_t abs_bits(float v) { return __float_as_uint(v) & 0x7fffffffu; }

constexpr int kGluThreads = 256;
// Rows whose max |h| lies in [2^-14, 2^15) keep scale 1: every value of 2^-14 or more keeps 22
// bits in its two parts, and one below errs by at most 2^-36 absolute (2^-22 of the row's max),
// as close as split_activations' row scale keeps them.
constexpr uint32_t kGluMinBits = 0x38800000u;  // 2^-14
constexpr uint32_t kGluMaxBits = 0x47000000u;  // 2^15
constexpr uint32_t kInfBits = 0x7f800000u;

// glu_parts: one block per token row. It writes the row's values as parts under scale 1 as it
// goes (two float4 steps per thread in flight, nothing held), and keeps the row's max |h|; where
// that max left [2^-14, 2^15) (finite, not 0; f16 parts only), it writes the row again under the
// scale that puts the max in [2^14, 2^15). Four blocks per SM (at most 64 registers): a
// 512-token prompt's rows are resident at once on an H200 (132 SMs), so there is no tail of
// waves, and no state is shared between blocks. Every block reads its token's input scale from
// inv_scale, which must not lie in `out` (glu_parts_ffn writes the other input slot).
__global__ void __launch_bounds__(kGluThreads, 4)
    glu_parts_kernel(const float* __restrict__ gate, int gate_blocks, const float* __restrict__ up, int up_blocks,
                     int64_t n, int64_t rows, int64_t ld, const float* __restrict__ inv_scale, Act act, bool bf16,
                     int parts, uint16_t* __restrict__ out, float* __restrict__ out_inv_scale) {
  pdl_prologue();
  __shared__ uint32_t smem[kGluThreads / 32];
  constexpr int kSteps = 2;
  const int64_t t = blockIdx.x, src_count = n * ld, stride = n * rows;
  const float inv = inv_scale[t], shift = bf16 ? 1.0f : kGluLoShift;
  uint32_t mx = 0;  // max |h| as bits (a NaN above inf)
  for (int64_t j0 = int64_t(threadIdx.x) * 4; j0 < rows; j0 += 4 * kSteps * kGluThreads) {
    float4 h[kSteps];
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int64_t j = j0 + 4 * s * kGluThreads;
      if (j < rows) h[s] = glu4(gate, gate_blocks, up, up_blocks, src_count, t * ld + j, inv, act);
    }
#pragma unroll
    for (int s = 0; s < kSteps; ++s) {
      const int64_t j = j0 + 4 * s * kGluThreads;
      if (j >= rows) break;
      mx = max(mx, max(max(abs_bits(h[s].x), abs_bits(h[s].y)), max(abs_bits(h[s].z), abs_bits(h[s].w))));
      store_parts4(h[s], 1.0f, parts, bf16, shift, out, stride, t * rows + j);
    }
  }
  mx = __reduce_max_sync(0xffffffffu, mx);
  if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = mx;
  __syncthreads();
#pragma unroll
  for (int w = 0; w < kGluThreads / 32; ++w) mx = max(mx, smem[w]);
  float scale = 1.0f;
  if (!bf16 && mx < kInfBits && (mx >= kGluMaxBits || (mx > 0 && mx < kGluMinBits))) {  // (non-finite: as it is)
    scale = pow2_scale(__uint_as_float(mx));
    for (int64_t j = int64_t(threadIdx.x) * 4; j < rows; j += 4 * kGluThreads)  // (each thread its own values)
      store_parts4(glu4(gate, gate_blocks, up, up_blocks, src_count, t * ld + j, inv, act), scale, parts, bf16, shift,
                   out, stride, t * rows + j);
  }
  if (threadIdx.x == 0) out_inv_scale[t] = 1.0f / scale;
}

}  // namespace

cudaError_t split_activations(const float* x, int64_t n, int64_t k, bool bf16, int parts, const float* norm_w,
                              float eps, uint16_t* out, float* inv_scale, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  auto aligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  const bool vec = k % 4 == 0 && aligned(x, 16) && aligned(out, 8) && (!norm_w || aligned(norm_w, 16));
  const int64_t per_thread = div_up(k, int64_t(4) * kRowThreads);  // float4 steps of a thread
  auto go = [&](auto kernel) {
    SHOAL_TRY_LAUNCH(launch(kernel, unsigned(n), kRowThreads, 0, stream, x, n, k, bf16, parts, norm_w, eps, out,
                            inv_scale));
    return cudaSuccess;
  };
  if (vec && per_thread <= 1) return go(split_vec_kernel<1>);
  if (vec && per_thread <= 2) return go(split_vec_kernel<2>);
  if (vec && per_thread <= 4) return go(split_vec_kernel<4>);
  if (vec && per_thread <= 8) return go(split_vec_kernel<8>);
  if (vec && per_thread <= 16) return go(split_vec_kernel<16>);
  return go(split_kernel);
}

cudaError_t combine_split(const float* yp, int blocks, int64_t ld, float lo, const float* p_inv_scale,
                          const float* bias, float* y, int64_t n, int64_t k, bool bf16, int parts, const float* norm_w,
                          float eps, uint16_t* out, float* inv_scale, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  auto aligned = [](const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; };
  const int64_t per_thread = div_up(k, int64_t(4) * kRowThreads);
  if (k % 4 != 0 || ld % 4 != 0 || ld < k || per_thread > 16 || !aligned(yp, 16) || !aligned(y, 16) ||
      !aligned(out, 8) || (norm_w && !aligned(norm_w, 16)))
    return cudaErrorNotSupported;
  auto go = [&](auto kernel) {
    SHOAL_TRY_LAUNCH(launch(kernel, unsigned(n), kRowThreads, 0, stream, yp, blocks, ld, lo, p_inv_scale, bias, y, n,
                            k, bf16, parts, norm_w, eps, out, inv_scale));
    return cudaSuccess;
  };
  if (per_thread <= 1) return go(combine_split_kernel<1>);
  if (per_thread <= 2) return go(combine_split_kernel<2>);
  if (per_thread <= 4) return go(combine_split_kernel<4>);
  if (per_thread <= 8) return go(combine_split_kernel<8>);
  return go(combine_split_kernel<16>);
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
                          const float* bias, bool accumulate, float* y, cudaStream_t stream, int64_t ld, float lo) {
  if (n * rows == 0) return cudaSuccess;
  if (ld == 0) ld = rows;
  if (ld < rows) return cudaErrorInvalidValue;
  if (rows % 4 == 0 && ld % 4 == 0 && reinterpret_cast<uintptr_t>(yp) % 16 == 0) {
    SHOAL_TRY_LAUNCH(launch(combine_kernel<true>, unsigned(div_up(n * rows / 4, kBlock)), kBlock, 0, stream, yp,
                            blocks, n, rows, ld, inv_scale, bias, accumulate, y, lo));
  } else {
    SHOAL_TRY_LAUNCH(launch(combine_kernel<false>, unsigned(div_up(n * rows, kBlock)), kBlock, 0, stream, yp, blocks,
                            n, rows, ld, inv_scale, bias, accumulate, y, lo));
  }
  return cudaSuccess;
}

cudaError_t glu_parts(const float* gate, int gate_blocks, const float* up, int up_blocks, int64_t n, int64_t rows,
                      const float* inv_scale, Act act, bool bf16, int parts, uint16_t* out, float* out_inv_scale,
                      cudaStream_t stream, int64_t ld) {
  if (n * rows == 0) return cudaSuccess;
  if (ld == 0) ld = rows;
  if (rows % 4 != 0 || ld % 4 != 0 || ld < rows || (parts != 1 && parts != (bf16 ? 3 : 2)) ||
      reinterpret_cast<uintptr_t>(out) % 8 != 0)
    return cudaErrorInvalidValue;
  SHOAL_TRY_LAUNCH(launch(glu_parts_kernel, unsigned(n), kGluThreads, 0, stream, gate, gate_blocks, up, up_blocks, n,
                          rows, ld, inv_scale, act, bf16, parts, out, out_inv_scale));
  return cudaSuccess;
}

cudaError_t combine_glu(const float* gate, int gate_blocks, const float* up, int up_blocks, int64_t n, int64_t rows,
                        const float* inv_scale, Act act, float* y, cudaStream_t stream, int64_t ld) {
  if (n * rows == 0) return cudaSuccess;
  if (ld == 0) ld = rows;
  if (rows % 4 != 0 || ld % 4 != 0 || ld < rows) return cudaErrorInvalidValue;
  SHOAL_TRY_LAUNCH(launch(combine_glu_kernel, unsigned(div_up(n * rows / 4, kBlock)), kBlock, 0, stream, gate,
                          gate_blocks, up, up_blocks, n, rows, ld, inv_scale, act, y));
  return cudaSuccess;
}

}  // namespace shoal::cuda
