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
constexpr int kLoadsMax = 8;  // float4 loads per thread in flight in a slice's first read

// Reads n = min(slice, vocab - lo) values of row r at lo: a whole, 16-byte-aligned slice of a
// multiple of 4 * kThreads values, at most kLoadsMax times that, with every float4 load of a
// thread in flight before the first use (the logits were just written: L2 latency, not
// bandwidth, bounds a slice), and quad(j, v) called for the values lo + j .. lo + j + 3 (j a
// multiple of 4); else one value at a time, one(j, v) for value lo + j. Each call is made by
// the thread that loaded the values.
template <int kThreads, class Quad, class One>
__device__ __forceinline__ void read_slice(const float* r, int64_t lo, int slice, int n, Quad quad, One one) {
  if (n == slice && slice % (4 * kThreads) == 0 && slice <= kLoadsMax * 4 * kThreads &&
      reinterpret_cast<uintptr_t>(r + lo) % 16 == 0) {
    const float4* r4 = reinterpret_cast<const float4*>(r + lo);
    const int per = slice / (4 * kThreads);
    float4 v[kLoadsMax];
#pragma unroll
    for (int u = 0; u < kLoadsMax; ++u)
      if (u < per) v[u] = r4[threadIdx.x + u * kThreads];
#pragma unroll
    for (int u = 0; u < kLoadsMax; ++u)
      if (u < per) quad(4 * (int(threadIdx.x) + u * kThreads), v[u]);
  } else {
    for (int j = threadIdx.x; j < n; j += kThreads) one(j, r[lo + j]);
  }
}

// Logits per block of argmax_partial_kernel: 63 blocks for a 128256-value row. (With 8192 per
// block, 16 blocks, one value per load: the argmax of a 128256-value row 8.4 us, now 5.8-6.9;
// H100, v48.)
constexpr int kArgmaxSlice = 2048;
static_assert(kArgmaxSlice % (4 * kArgmaxThreads) == 0 && kArgmaxSlice <= kLoadsMax * 4 * kArgmaxThreads);

__global__ void argmax_partial_kernel(const float* __restrict__ logits, int64_t vocab, int slices,
                                      Cand* __restrict__ partial) {
  pdl_prologue();
  __shared__ Cand smem[33];
  const int64_t row = blockIdx.y;
  const int64_t lo = int64_t(blockIdx.x) * kArgmaxSlice;
  Cand best{0.0f, -1};
  auto one = [&](int j, float v) {
    const Cand c{v, int32_t(lo + j)};
    if (better(c, best)) best = c;
  };
  read_slice<kArgmaxThreads>(
      logits + row * vocab, lo, kArgmaxSlice, int(min(int64_t(kArgmaxSlice), vocab - lo)),
      [&](int j, float4 v) {
        one(j, v.x);
        one(j + 1, v.y);
        one(j + 2, v.z);
        one(j + 3, v.w);
      },
      one);
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

// a[i] = a[0] + ... + a[i], added left to right (as pick_candidate's loops add), eight loads
// ahead of the adds.
__device__ void running_sum(double* a, int n) {
  double r = 0;
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    double v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = a[i + j];
#pragma unroll
    for (int j = 0; j < 8; ++j) a[i + j] = r += v[j];
  }
  for (; i < n; ++i) a[i] = r += a[i];
}

// The lowest i in [lo, n) with pred(i), else n; every lane of warp 0 gets it.
template <class Pred>
__device__ int first_index(int lo, int n, Pred pred) {
  unsigned best = unsigned(n);
  for (int i = lo + int(threadIdx.x); i < n; i += 32)
    if (pred(i)) {
      best = unsigned(i);
      break;
    }
  return int(__reduce_min_sync(0xffffffffu, best));
}

// pick_candidate (sampling_math.h) for the k >= 1 candidates' logits l (shared memory), by the
// block's threads: the softmax terms in parallel, then warp 0. Its sums are pick_candidate's, in
// the same order (lane 0 turns e and w into running sums), so the pick is the host's; the
// searches for the first index past a cut are spread over the lanes. Returns the index in warp
// 0 (-1 elsewhere). It mirrors pick_candidate step for step: a change to one is a change to
// both. (Thread 0 walking pick_candidate's four loops took ~8.5 us for 40 candidates; H100, v49.)
template <int kThreads>
__device__ int pick_on_device(const float* l, int k, const DeviceSampling& s, double* e, double* w) {
  for (int i = threadIdx.x; i < k; i += kThreads) {
    e[i] = top_p_term(l, i);
    w[i] = draw_term(l, i, s.temperature);
  }
  __syncthreads();
  if (threadIdx.x >= 32) return -1;
  if (s.top_p < 1.0f) {  // the smallest prefix whose mass reaches top_p
    if (threadIdx.x == 0) running_sum(e, k);
    __syncwarp();
    const double reach = double(s.top_p) * e[k - 1];
    const int i = first_index(0, k, [&](int i) { return e[i] >= reach; });
    if (i < k) k = i + 1;
  }
  if (s.min_p > 0.0f) {  // then those at or above l[0] + log(min_p)
    const double cut = double(l[0]) + log(double(s.min_p));
    k = first_index(1, k, [&](int i) { return !(double(l[i]) >= cut); });
  }
  if (threadIdx.x == 0) running_sum(w, k);
  __syncwarp();
  const double x = uniform_draw(s.seed, s.draw) * w[k - 1];
  return min(first_index(0, k, [&](int i) { return x < w[i]; }), k - 1);
}

// draw_token (sampling_math.h) on the device, by the block's kThreads threads: the k candidates'
// logits value(i) (sorted descending) into shared memory, pick_on_device, then thread 0 writes
// out[0] = id(pick) and state->draw + 1.
template <int kThreads, class Value, class Id>
__device__ void draw_token_on_device(int k, Value value, Id id, DeviceSampling* state, int32_t* out) {
  __shared__ double e[kTopKMax], w[kTopKMax];
  __shared__ float l[kTopKMax];
  const DeviceSampling s = *state;
  for (int i = threadIdx.x; i < k; i += kThreads) l[i] = value(i);
  __syncthreads();
  const int i = pick_on_device<kThreads>(l, k, s, e, w);
  if (threadIdx.x == 0) {
    out[0] = id(i);
    state->draw = s.draw + 1;
  }
}

__global__ void sample_kernel(const int32_t* __restrict__ ids, const float* __restrict__ vals, int k,
                              DeviceSampling* state, int32_t* __restrict__ out) {
  pdl_prologue();
  draw_token_on_device<kSampleThreads>(
      k, [&](int i) { return vals[i]; }, [&](int i) { return ids[i]; }, state, out);
}

// ---- the next decode step's inputs ------------------------------------------------------------
__global__ void advance_decode_kernel(const int32_t* __restrict__ next, int n, int32_t* __restrict__ ids,
                                      int32_t* __restrict__ pos, int32_t* published, int slots) {
  pdl_prologue();
  const int32_t p0 = pos[0];
  volatile int32_t* slot = published + (uint32_t(p0) % uint32_t(slots)) * kDecodedWords;
  slot[0] = -1;  // being written: a host reading the slot's previous step sees the change
  __threadfence_system();
  slot[1] = n;
  for (int i = 0; i < n; ++i) {
    const int32_t id = next[i];
    ids[i] = id;
    pos[i] += n;
    slot[2 + i] = id;
  }
  __threadfence_system();  // the count and ids reach the host before the tag
  slot[0] = p0;
}

// ---- top-k ----------------------------------------------------------------------------------
// Two stages: each block takes a slice of 2048-8192 logits (topk_slice) and keeps its k best,
// sorted; one block then takes the k best of those. A stage finds its k-th best by radix select on an
// order-preserving key of the value (MSB first, 8 bits a pass, stopping once the boundary digit's
// elements are all in), takes every element above it and, of those equal to it on the bits
// seen, the first ones by position (position order is index order: slices are contiguous, their
// lists sorted), then sorts the k taken by rank (value desc, index asc: better(), or
// ranks_before where a NaN is among them). About six block barriers a pass; the earlier
// selection by k rounds of block-wide best took ~2 us a round. (Histogram adds merged per digit
// within a warp by __match_any_sync made the first stage slower: 17.3-17.7 us standalone against
// 10.7-11.4; H100, v49.)
constexpr int kSliceThreads = 256;
constexpr int kSliceMax = kLoadsMax * 4 * kSliceThreads;  // logits per first-stage block, at most
// Threads of the final stage (with 256, top-k 40 took 16.5-21.6 us instead of 15.3-16.6; H100,
// v48).
constexpr int kFinalThreads = 1024;
constexpr int64_t kMaxCandidates = 32768;

// Larger value, larger key; -0 and +0 one key (better() ranks them equal).
__device__ __forceinline__ uint32_t key_of(float v) {
  const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

// a ranks before b in top-k's order: the larger key, then the lower index; a real candidate
// before none. better()'s order where no value is a NaN; with NaNs (above +inf or below -inf by
// their sign bit) still a strict total order, so a sort by counting gives every candidate its
// own rank. Slower than better() (a sort of 40 candidates by it took top-k 40 from 14 to 19
// us; H100, v49), so the sorts take it only where a NaN is among the candidates.
__device__ __forceinline__ bool ranks_before(Cand a, Cand b) {
  if (a.i < 0) return false;
  if (b.i < 0) return true;
  const uint32_t ka = key_of(a.v), kb = key_of(b.v);
  return ka > kb || (ka == kb && a.i < b.i);
}

// Exclusive prefix sum of v over the block's threads (kThreads a multiple of 32, <= 1024).
template <int kThreads>
__device__ int block_exclusive_sum(int v, int* smem /* 33 */) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int incl = v;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int t = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += t;
  }
  __syncthreads();
  if (lane == 31) smem[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = lane < kThreads / 32 ? smem[lane] : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int t = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += t;
    }
    smem[lane] = w;  // inclusive sums of warps
  }
  __syncthreads();
  return incl - v + (warp > 0 ? smem[warp - 1] : 0);
}

// The k best of the n candidates get(p) (i < 0: none), sorted, into out[0, k) (padded with i =
// -1). Every thread of the block calls it.
template <int kThreads, class Get>
__device__ void select_top_k(Get get, int n, int k, Cand* out) {
  __shared__ int hist[256];
  __shared__ int found[3];  // the boundary digit, the elements above it, all elements (pass 1)
  __shared__ int scan[33];
  __shared__ int taken;
  __shared__ Cand sel[kTopKMax];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint32_t prefix = 0, mask = 0;  // the boundary's bits so far
  int need = k;                   // elements still to take among those matching prefix
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < 256; b += kThreads) hist[b] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < n; p += kThreads) {
      const Cand c = get(p);
      const uint32_t key = key_of(c.v);
      if (c.i >= 0 && (key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1);
    }
    __syncthreads();
    if (warp == 0) {  // lane l holds digits 8l .. 8l + 7; find d: above(d) < need <= above(d) + hist[d]
      int c[8], sum = 0;
#pragma unroll
      for (int b = 0; b < 8; ++b) sum += (c[b] = hist[lane * 8 + b]);
      int incl = sum;  // the digits of lanes >= lane
#pragma unroll
      for (int o = 1; o < 32; o <<= 1) {
        const int t = __shfl_down_sync(0xffffffffu, incl, o);
        if (lane + o < 32) incl += t;
      }
      if (lane == 0) found[2] = incl;
      const int total = __shfl_sync(0xffffffffu, incl, 0);
      int above = incl - sum;
      if (total > need && above < need && need <= incl) {
        for (int b = 7; b >= 0; --b) {
          if (above + c[b] >= need) {
            found[0] = lane * 8 + b;
            found[1] = above;
            break;
          }
          above += c[b];
        }
      }
    }
    __syncthreads();
    if (found[2] <= need) {  // (only in pass 1: at most k valid elements) take them all
      need = found[2];
      __syncthreads();
      break;
    }
    const int d = found[0];
    need -= found[1];
    prefix |= uint32_t(d) << shift;
    mask |= 255u << shift;
    const bool all_in = hist[d] == need;
    __syncthreads();  // (hist and found are rewritten by the next pass)
    if (all_in) break;
  }
  // Take what lies above the boundary, and the first `need` on it by position: each thread scans a
  // contiguous run of positions.
  if (threadIdx.x == 0) taken = 0;
  const int run = (n + kThreads - 1) / kThreads, p0 = threadIdx.x * run, p1 = min(n, p0 + run);
  int on = 0;
  for (int p = p0; p < p1; ++p) {
    const Cand c = get(p);
    on += c.i >= 0 && (key_of(c.v) & mask) == prefix;
  }
  int rank = block_exclusive_sum<kThreads>(on, scan);  // (its barriers also order `taken = 0`)
  for (int p = p0; p < p1; ++p) {
    const Cand c = get(p);
    if (c.i < 0) continue;
    const uint32_t key = key_of(c.v) & mask;
    if (key > prefix || (key == prefix && rank++ < need)) sel[atomicAdd(&taken, 1)] = c;
  }
  __syncthreads();
  const int m = taken;
  bool nan = false;
  for (int a = threadIdx.x; a < m; a += kThreads) nan = nan || isnan(sel[a].v);
  nan = __syncthreads_or(nan);
  for (int a = threadIdx.x; a < m; a += kThreads) {  // sorted by rank among the taken
    const Cand c = sel[a];
    int r = 0;
    if (nan)
      for (int b = 0; b < m; ++b) r += ranks_before(sel[b], c);
    else
      for (int b = 0; b < m; ++b) r += better(sel[b], c);
    out[r] = c;
  }
  for (int r = m + int(threadIdx.x); r < k; r += kThreads) out[r] = Cand{0.0f, -1};
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
    top_k_slice_kernel(const float* __restrict__ logits, int64_t vocab, int slice, int k, Cand* __restrict__ cands) {
  pdl_prologue();
  __shared__ __align__(16) float vals[kSliceMax];
  const int64_t lo = int64_t(blockIdx.x) * slice;
  const int n = int(min(int64_t(slice), vocab - lo));
  read_slice<kSliceThreads>(
      logits, lo, slice, n, [&](int j, float4 v) { reinterpret_cast<float4*>(vals)[j / 4] = v; },
      [&](int j, float v) { vals[j] = v; });
  __syncthreads();
  select_top_k<kSliceThreads>(SliceGet{vals, lo}, n, k, cands + int64_t(blockIdx.x) * k);
}

// The final stage's fast path, for k <= slices (top-k 40 of 128256 logits: 63 lists). The
// first-stage lists are sorted, so the head ranked k - 1 among the lists' heads, b, has k
// candidates at or above it (the k - 1 heads ranked above it and b itself): every one of the k
// best overall ranks at or above b. Those survivors (for random logits, k = 40 over 63 lists,
// about k + a few dozen) are sorted by counting, for each, the survivors better than it. Taken
// for at most kBoundListsMax lists, kSurvivorsMax survivors and no NaN among the candidates; else
// final_top_k falls back to the radix select. (A bound from the first ceil(k / slices) of every
// list, for k > slices, was too weak: top-k 256 + draw of 128256 logits took 108-117 us against
// 84-95 with the radix select; H100, v49.)
constexpr int kBoundListsMax = 512;
constexpr int kSurvivorsMax = 1024;
static_assert(kBoundListsMax < kFinalThreads, "one list head per thread");

// The k best of the slices' sorted lists cands [slices][k] into top[0, k), sorted (padded with
// i = -1 where fewer than k exist). Every thread of the block calls it.
__device__ void final_top_k(const Cand* __restrict__ cands, int slices, int k, Cand* top) {
  __shared__ Cand buf[kSurvivorsMax];
  __shared__ Cand bound;
  __shared__ int count;
  const int n = slices * k;
  bool fast = k <= slices && slices <= kBoundListsMax;
  if (fast) {
    bool nan = false;
    if (int(threadIdx.x) < slices) {
      buf[threadIdx.x] = cands[threadIdx.x * k];
      nan = isnan(buf[threadIdx.x].v);
    }
    if (threadIdx.x == 0) count = 0;
    fast = !__syncthreads_or(nan);  // (NaNs: the radix select)
  }
  if (fast) {
    // The head ranked k - 1 is the bound. Every head is real (each slice holds a value) and
    // better() ranks them strictly, so exactly one thread writes it.
    if (int(threadIdx.x) < slices) {
      const Cand c = buf[threadIdx.x];
      int r = 0;
      for (int q = 0; q < slices; ++q) r += better(buf[q], c);
      if (r == k - 1) bound = c;
    }
    __syncthreads();  // (also: the heads are read before buf is rewritten below)
    const Cand b = bound;
    bool nan = false;
    for (int p = threadIdx.x; p < n; p += kFinalThreads) {
      const Cand c = cands[p];
      nan = nan || isnan(c.v);
      if (c.i >= 0 && !better(b, c)) {
        const int at = atomicAdd(&count, 1);
        if (at < kSurvivorsMax) buf[at] = c;
      }
    }
    nan = __syncthreads_or(nan);
    const int m = count;
    fast = m <= kSurvivorsMax && !nan;
    if (fast) {  // (m >= k: the k - 1 heads above the bound and the bound survive)
      for (int a = threadIdx.x; a < m; a += kFinalThreads) {
        const Cand c = buf[a];
        int r = 0;
        for (int q = 0; q < m; ++q) r += better(buf[q], c);
        if (r < k) top[r] = c;
      }
    }
  }
  if (!fast) select_top_k<kFinalThreads>(CandGet{cands}, n, k, top);
  __syncthreads();
}

// The final stage: the k best of the first stage's lists into ids / vals; with kDraw also the
// draw from them (draw_token_on_device, in the same block: one kernel boundary less in a sampled
// step): out[0] the drawn id, state->draw + 1.
template <bool kDraw>
__global__ void __launch_bounds__(kFinalThreads)
    top_k_final_kernel(const Cand* __restrict__ cands, int slices, int k, int32_t* __restrict__ ids,
                       float* __restrict__ vals, DeviceSampling* state, int32_t* __restrict__ out) {
  pdl_prologue();
  __shared__ Cand top[kTopKMax];
  final_top_k(cands, slices, k, top);
  for (int r = threadIdx.x; r < k; r += kFinalThreads) {
    ids[r] = top[r].i;
    vals[r] = top[r].v;
  }
  if constexpr (kDraw)
    draw_token_on_device<kFinalThreads>(
        k, [&](int i) { return top[i].v; }, [&](int i) { return top[i].i; }, state, out);
}

// Logits per first-stage block of a top-k: the smallest power of two from 2048 up to kSliceMax
// that leaves the final stage at most kFinalCandidates. (Top-k 40 of 128256 values: 63 blocks of
// 2048, 15.3-16.0 us; 28.4 with 8192 per block, 29.9 before the loads in flight, 16.1 with 1024;
// k = 256 takes 4096 for 128256 values and 8192 for 151936. H100, v48.)
constexpr int64_t kFinalCandidates = 8192;
int topk_slice(int64_t vocab, int k) {
  int slice = 2048;
  while (slice < kSliceMax && div_up(vocab, int64_t(slice)) * k > kFinalCandidates) slice *= 2;
  return slice;
}
int64_t slices_of(int64_t vocab, int k) { return div_up(vocab, int64_t(topk_slice(vocab, k))); }

}  // namespace

uint64_t argmax_scratch_bytes(int64_t rows, int64_t vocab) {
  return uint64_t(rows * div_up(vocab, int64_t(kArgmaxSlice))) * sizeof(Cand);
}

uint64_t top_k_scratch_bytes(int64_t vocab, int k) { return uint64_t(slices_of(vocab, k) * k) * sizeof(Cand); }

cudaError_t argmax(const float* logits, int64_t rows, int64_t vocab, void* scratch, int32_t* out, cudaStream_t stream) {
  if (rows == 0 || vocab == 0) return cudaSuccess;
  const int slices = int(div_up(vocab, int64_t(kArgmaxSlice)));
  Cand* partial = static_cast<Cand*>(scratch);
  SHOAL_TRY_LAUNCH(launch(argmax_partial_kernel, dim3(unsigned(slices), unsigned(rows)), kArgmaxThreads, 0, stream,
                          logits, vocab, slices, partial));
  SHOAL_TRY_LAUNCH(launch(argmax_final_kernel, unsigned(rows), 32, 0, stream, partial, slices, out));
  return cudaGetLastError();
}

namespace {
cudaError_t launch_top_k(const float* logits, int64_t vocab, int k, void* scratch, int32_t* ids, float* vals,
                         DeviceSampling* state, int32_t* out, cudaStream_t stream) {
  const int slice = topk_slice(vocab, k);
  const int64_t slices = div_up(vocab, int64_t(slice));
  if (k <= 0 || k > kTopKMax || k > vocab || slices * k > kMaxCandidates) return cudaErrorInvalidValue;
  Cand* cands = static_cast<Cand*>(scratch);
  SHOAL_TRY_LAUNCH(launch(top_k_slice_kernel, unsigned(slices), kSliceThreads, 0, stream, logits, vocab, slice, k, cands));
  const auto final_kernel = state ? top_k_final_kernel<true> : top_k_final_kernel<false>;
  SHOAL_TRY_LAUNCH(launch(final_kernel, 1, kFinalThreads, 0, stream, cands, int(slices), k, ids, vals, state, out));
  return cudaGetLastError();
}
}  // namespace

cudaError_t top_k(const float* logits, int64_t vocab, int k, void* scratch, int32_t* ids, float* vals,
                  cudaStream_t stream) {
  return launch_top_k(logits, vocab, k, scratch, ids, vals, nullptr, nullptr, stream);
}

cudaError_t top_k_sample(const float* logits, int64_t vocab, int k, void* scratch, int32_t* ids, float* vals,
                         DeviceSampling* state, int32_t* out, cudaStream_t stream) {
  if (!state || !out) return cudaErrorInvalidValue;
  return launch_top_k(logits, vocab, k, scratch, ids, vals, state, out, stream);
}

cudaError_t sample(const int32_t* ids, const float* vals, int k, DeviceSampling* state, int32_t* out,
                   cudaStream_t stream) {
  if (k <= 0 || k > kTopKMax) return cudaErrorInvalidValue;
  SHOAL_TRY_LAUNCH(launch(sample_kernel, 1, kSampleThreads, 0, stream, ids, vals, k, state, out));
  return cudaGetLastError();
}

cudaError_t advance_decode(const int32_t* next, int n, int32_t* ids, int32_t* pos, int32_t* published, int slots,
                           cudaStream_t stream) {
  if (n <= 0 || n > kDecodedWords - 2 || slots <= 0) return cudaErrorInvalidValue;
  SHOAL_TRY_LAUNCH(launch(advance_decode_kernel, 1, 1, 0, stream, next, n, ids, pos, published, slots));
  return cudaGetLastError();
}

}  // namespace shoal::cuda
