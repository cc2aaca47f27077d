// Sampling on the GPU: argmax (greedy reads back 4 bytes), top-k (k candidates back), a draw
// from the top-k candidates (sampling_math.h, as the host Sampler), and the next decode step's
// inputs from the chosen id (chained decoding).
// Both are two-stage, deterministic reductions over (value desc, index asc): slices of the
// vocabulary per block, then one block over the per-slice winners.
// Twins: ref::argmax, ref::top_k, ref::sample, ref::advance_decode; tests: tests/cuda/cuda_ops_test.cc.
#include <cmath>
#include <cstdint>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"
#include "backend/sampling_math.h"

namespace shoal::cuda {
namespace {

struct Cand {
  float v;
  int32_t i;  // -1: none
};

// a ranks before b: larger value, then lower index; a real candidate before none.
__device__ __forceinline__ bool better(Cand a, Cand b) {
  if (a.i < 0) return false;
  if (b.i < 0) return true;
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}

__device__ __forceinline__ Cand warp_best(Cand c) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    Cand other{__shfl_xor_sync(0xffffffffu, c.v, o), __shfl_xor_sync(0xffffffffu, c.i, o)};
    if (better(other, c)) c = other;
  }
  return c;
}

// The best candidate of the block (kThreads a multiple of 32); every thread gets it.
template <int kThreads>
__device__ Cand block_best(Cand c, Cand* smem /* 33 */) {
  c = warp_best(c);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) smem[warp] = c;
  __syncthreads();
  if (warp == 0) {
    Cand w = lane < kThreads / 32 ? smem[lane] : Cand{0.0f, -1};
    w = warp_best(w);
    if (lane == 0) smem[32] = w;
  }
  __syncthreads();
  return smem[32];
}

// ---- argmax ---------------------------------------------------------------------------------
constexpr int kArgmaxThreads = 256;
constexpr int64_t kArgmaxSlice = 8192;

__global__ void argmax_partial_kernel(const float* __restrict__ logits, int64_t vocab, int slices,
                                      Cand* __restrict__ partial) {
  pdl_prologue();
  __shared__ Cand smem[33];
  const int64_t row = blockIdx.y;
  const int64_t lo = int64_t(blockIdx.x) * kArgmaxSlice;
  const int64_t hi = min(vocab, lo + kArgmaxSlice);
  Cand best{0.0f, -1};
  for (int64_t j = lo + threadIdx.x; j < hi; j += kArgmaxThreads) {
    const Cand c{logits[row * vocab + j], int32_t(j)};
    if (better(c, best)) best = c;
  }
  best = block_best<kArgmaxThreads>(best, smem);
  if (threadIdx.x == 0) partial[row * slices + blockIdx.x] = best;
}

__global__ void argmax_final_kernel(const Cand* __restrict__ partial, int slices, int32_t* __restrict__ out) {
  pdl_prologue();
  const int64_t row = blockIdx.x;
  Cand best{0.0f, -1};
  for (int s = threadIdx.x; s < slices; s += 32) {
    const Cand c = partial[row * slices + s];
    if (better(c, best)) best = c;
  }
  best = warp_best(best);
  if (threadIdx.x == 0) out[row] = best.i < 0 ? 0 : best.i;
}

// ---- a draw from the top-k candidates ---------------------------------------------------------
constexpr int kSampleThreads = 256;

// The softmax terms in parallel, then thread 0 walks the candidates as the host does.
__global__ void sample_kernel(const int32_t* __restrict__ ids, const float* __restrict__ vals, int k,
                              DeviceSampling* state, int32_t* __restrict__ out) {
  pdl_prologue();
  __shared__ double e[kTopKMax], w[kTopKMax];
  DeviceSampling s = *state;
  for (int i = int(threadIdx.x); i < k; i += kSampleThreads) {
    e[i] = top_p_term(vals, i);
    w[i] = draw_term(vals, i, s.temperature);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    out[0] = draw_token(ids, vals, k, s, e, w);
    state->draw = s.draw;
  }
}

// ---- the next decode step's inputs ------------------------------------------------------------
__global__ void advance_decode_kernel(const int32_t* __restrict__ next, int n, int32_t* __restrict__ ids,
                                      int32_t* __restrict__ pos) {
  pdl_prologue();
  for (int i = int(threadIdx.x); i < n; i += int(blockDim.x)) {
    ids[i] = next[i];
    pos[i] += n;
  }
}

// ---- top-k ----------------------------------------------------------------------------------
// Selection by repeated block-wide best: each thread owns up to 32 strided elements and keeps
// its own best untaken one; after each round only the winner's owner rescans.
constexpr int kOwned = 32;
constexpr int kSliceThreads = 256;
constexpr int64_t kSlice = int64_t(kSliceThreads) * kOwned;  // 8192 logits per first-stage block
constexpr int kFinalThreads = 1024;
constexpr int64_t kMaxCandidates = int64_t(kFinalThreads) * kOwned;

// The k best of n candidates get(p), p < n <= kThreads * kOwned, into out (padded with i = -1).
template <int kThreads, class Get>
__device__ void select_top_k(Get get, int n, int k, Cand* out) {
  __shared__ Cand smem[33];
  uint32_t taken = 0;
  Cand mine{0.0f, -1};
  int slot = -1;
  auto rescan = [&]() {
    mine = Cand{0.0f, -1};
    slot = -1;
    for (int j = 0; j < kOwned; ++j) {
      const int p = threadIdx.x + j * kThreads;
      if (p >= n) break;
      if (taken & (1u << j)) continue;
      const Cand c = get(p);
      if (better(c, mine)) mine = c, slot = j;
    }
  };
  rescan();
  for (int r = 0; r < k; ++r) {
    const Cand w = block_best<kThreads>(mine, smem);
    if (threadIdx.x == 0) out[r] = w;
    if (w.i >= 0 && mine.i == w.i) {
      taken |= 1u << slot;
      rescan();
    }
  }
}

struct SliceGet {
  const float* vals;
  int64_t base;
  __device__ Cand operator()(int p) const { return Cand{vals[p], int32_t(base + p)}; }
};
struct CandGet {
  const Cand* c;
  __device__ Cand operator()(int p) const { return c[p]; }
};

__global__ void __launch_bounds__(kSliceThreads)
    top_k_slice_kernel(const float* __restrict__ logits, int64_t vocab, int k, Cand* __restrict__ cands) {
  pdl_prologue();
  __shared__ float vals[kSlice];
  const int64_t lo = int64_t(blockIdx.x) * kSlice;
  const int n = int(min(kSlice, vocab - lo));
  for (int p = threadIdx.x; p < n; p += kSliceThreads) vals[p] = logits[lo + p];
  __syncthreads();
  select_top_k<kSliceThreads>(SliceGet{vals, lo}, n, k, cands + int64_t(blockIdx.x) * k);
}

__global__ void __launch_bounds__(kFinalThreads)
    top_k_final_kernel(const Cand* __restrict__ cands, int n, int k, Cand* __restrict__ best, int32_t* __restrict__ ids,
                       float* __restrict__ vals) {
  pdl_prologue();
  select_top_k<kFinalThreads>(CandGet{cands}, n, k, best);
  __syncthreads();
  for (int r = threadIdx.x; r < k; r += kFinalThreads) {
    ids[r] = best[r].i;
    vals[r] = best[r].v;
  }
}

int64_t slices_of(int64_t vocab) { return div_up(vocab, kSlice); }

}  // namespace

uint64_t argmax_scratch_bytes(int64_t rows, int64_t vocab) {
  return uint64_t(rows * div_up(vocab, kArgmaxSlice)) * sizeof(Cand);
}

uint64_t top_k_scratch_bytes(int64_t vocab, int k) { return uint64_t(slices_of(vocab) * k + k) * sizeof(Cand); }

cudaError_t argmax(const float* logits, int64_t rows, int64_t vocab, void* scratch, int32_t* out, cudaStream_t stream) {
  if (rows == 0 || vocab == 0) return cudaSuccess;
  const int slices = int(div_up(vocab, kArgmaxSlice));
  Cand* partial = static_cast<Cand*>(scratch);
  SHOAL_TRY_LAUNCH(launch(argmax_partial_kernel, dim3(unsigned(slices), unsigned(rows)), kArgmaxThreads, 0, stream,
                          logits, vocab, slices, partial));
  SHOAL_TRY_LAUNCH(launch(argmax_final_kernel, unsigned(rows), 32, 0, stream, partial, slices, out));
  return cudaGetLastError();
}

cudaError_t top_k(const float* logits, int64_t vocab, int k, void* scratch, int32_t* ids, float* vals,
                  cudaStream_t stream) {
  const int64_t slices = slices_of(vocab);
  if (k <= 0 || k > kTopKMax || k > vocab || slices * k > kMaxCandidates) return cudaErrorInvalidValue;
  Cand* cands = static_cast<Cand*>(scratch);
  SHOAL_TRY_LAUNCH(launch(top_k_slice_kernel, unsigned(slices), kSliceThreads, 0, stream, logits, vocab, k, cands));
  SHOAL_TRY_LAUNCH(launch(top_k_final_kernel, 1, kFinalThreads, 0, stream, cands, int(slices * k), k,
                          cands + slices * k, ids, vals));
  return cudaGetLastError();
}

cudaError_t sample(const int32_t* ids, const float* vals, int k, DeviceSampling* state, int32_t* out,
                   cudaStream_t stream) {
  if (k <= 0 || k > kTopKMax) return cudaErrorInvalidValue;
  SHOAL_TRY_LAUNCH(launch(sample_kernel, 1, kSampleThreads, 0, stream, ids, vals, k, state, out));
  return cudaGetLastError();
}

cudaError_t advance_decode(const int32_t* next, int n, int32_t* ids, int32_t* pos, cudaStream_t stream) {
  if (n <= 0) return cudaSuccess;
  SHOAL_TRY_LAUNCH(launch(advance_decode_kernel, 1, 32, 0, stream, next, n, ids, pos));
  return cudaGetLastError();
}

}  // namespace shoal::cuda
