// What the GEMV kernels of gemv.cu (CUDA cores) and gemv_quant.cu (tensor cores) share: a
// launch covers up to kGemvMaxOuts products (segments), each owning a run of blocks (gemv.cu)
// or of units of row tiles (gemv_quant.cu, which maps units to segments itself as its blocks
// loop over them). Only included by .cu files of src/backend/cuda/.
#pragma once

#include <cstdint>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"

namespace shoal::cuda {

/// The segment of this block and the block's index inside it. Args has `seg[kGemvMaxOuts]`
/// (each with `block_end`: the blocks of this segment and of those before it) and `n_segs`.
template <class Args>
__device__ __forceinline__ auto block_seg(const Args& a, int64_t& local) {
  auto s = a.seg[0];
  unsigned base = 0;
#pragma unroll
  for (int i = 1; i < kGemvMaxOuts; ++i)
    if (i < a.n_segs && blockIdx.x >= a.seg[i - 1].block_end) {
      base = a.seg[i - 1].block_end;
      s = a.seg[i];
    }
  local = int64_t(blockIdx.x - base);
  return s;
}

/// 1 / rms of a row of `cols` values whose squares sum to `sumsq` (RMSNorm, Zhang & Sennrich 2019).
__device__ __forceinline__ float inv_rms(float sumsq, int64_t cols, float eps) {
  return 1.0f / sqrtf(sumsq / float(cols) + eps);
}

/// The inputs of an output element's epilogue that no product computes: bias[row] and, when
/// accumulating, the old y. `ready`: loaded ahead of the store (before the PDL wait where the
/// backend allows it: GemvOpts::early_epilogue; at a unit's start for the later units of a
/// persistent block), so the store does not wait for one more round trip to memory; otherwise
/// store_output() reads them itself.
struct EpilogueIn {
  float bias = 0.0f, y = 0.0f;
  bool ready = false;
};

/// Loads the EpilogueIn of row `row` (bias may be null; y: the output element).
__device__ __forceinline__ EpilogueIn load_epilogue(const float* bias, int64_t row, bool accumulate, const float* y) {
  EpilogueIn e;
  if (bias) e.bias = bias[row];
  if (accumulate) e.y = *y;
  e.ready = true;
  return e;
}

/// v + bias[row] (from `e` when it is ready), or v when bias is null.
__device__ __forceinline__ float add_bias(float v, const float* bias, int64_t row, const EpilogueIn& e) {
  return bias ? v + (e.ready ? e.bias : bias[row]) : v;
}

/// The epilogue of one output element: v holds the finished dot product(s), already times
/// 1 / rms; with S == 2 (gate, up) act(gate) * up, else v[0] + bias[row] (bias may be null);
/// written to *y, or added to it when accumulating. Bias and old y come from `e` when it is
/// ready. Returns the value stored.
template <int S>
__device__ __forceinline__ float store_output(const float (&v)[S], Act act, const float* bias, int64_t row,
                                              bool accumulate, float* y, const EpilogueIn& e) {
  float out;
  if constexpr (S == 2)
    out = apply_act(v[0], act) * v[1];
  else
    out = add_bias(v[0], bias, row, e);
  const float stored = accumulate ? (e.ready ? e.y : *y) + out : out;
  *y = stored;
  return stored;
}

/// 1 / rms of a token whose W warps left their shares of its sum of squares at sq[w * sq_stride]
/// (cols values, eps); 1 when sq is null (no fused norm).
template <int W>
__device__ __forceinline__ float block_inv_rms(const float* sq, int sq_stride, int64_t cols, float eps) {
  if (!sq) return 1.0f;
  float q = 0.0f;
#pragma unroll
  for (int w = 0; w < W; ++w) q += sq[w * sq_stride];
  return inv_rms(q, cols, eps);
}

/// The W warps' partial dot products at dots[w * warp_stride], summed in warp order.
template <int W>
__device__ __forceinline__ float warps_sum(const float* dots, int warp_stride) {
  float sum = 0.0f;
#pragma unroll
  for (int w = 0; w < W; ++w) sum += dots[w * warp_stride];
  return sum;
}

/// The reduction and epilogue of output element (row, token) of a block whose W warps left
/// partial results in shared memory: dot product s of warp w at dots[w * warp_stride +
/// s * s_stride]; with a fused RMSNorm (sq not null) the warp's share of the token's sum of
/// squares at sq[w * sq_stride] (cols values, eps). Sums in warp order (deterministic), times
/// 1 / rms, then store_output() into *y. Returns the value stored.
template <int S, int W>
__device__ __forceinline__ float reduce_store(const float* dots, int warp_stride, int s_stride, const float* sq,
                                              int sq_stride, int64_t cols, float eps, Act act, const float* bias,
                                              int64_t row, bool accumulate, float* y, const EpilogueIn& e) {
  const float inv = block_inv_rms<W>(sq, sq_stride, cols, eps);
  float v[S];
#pragma unroll
  for (int s = 0; s < S; ++s) v[s] = warps_sum<W>(dots + s * s_stride, warp_stride) * inv;
  return store_output(v, act, bias, row, accumulate, y, e);
}

/// Gives each of the n segments div_up(units, units_per_block) blocks, where units() is its
/// row (or tile) count; returns the grid size.
template <class Seg, class Units>
unsigned assign_seg_blocks(Seg* segs, int n, int64_t units_per_block, Units units) {
  unsigned end = 0;
  for (int i = 0; i < n; ++i) {
    end += unsigned((units(segs[i]) + units_per_block - 1) / units_per_block);
    segs[i].block_end = end;
  }
  return end;
}

}  // namespace shoal::cuda
