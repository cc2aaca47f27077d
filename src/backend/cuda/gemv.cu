// GEMV (and small-batch GEMM, n <= 8 tokens) for F32, F16 and BF16 weights, with the gate+up+
// activation fusion, an input RMSNorm and a residual add (gemv_multi). Q8_0 and Q4_0 weights go
// to the tensor-core kernel of gemv_quant.cu. Memory-bound: the weights are read once, as 16-byte
// loads that skip L1, several per lane in flight; the f32 activations come from L1.
//
// A block of 4 warps computes R rows; its 128 lanes take each row's 16-byte vectors round-robin
// (R = 2, 4 vectors per lane per row in flight; rows of one token: R = 8 / 4 with 1 / 2 vectors
// when narrow, R = 8 with 1 vector over several passes when 512 vectors or wider).
// Partial sums are reduced in a fixed order (warp butterfly, then warps 0..3): results are
// deterministic. A q / k / v launch of one token may also rotate q and k (RoPE, interleaved
// pairs: both rows of a pair are in one block) and store k and v in the KV cache (GemvRope).
// Twin: ref::matmul (src/backend/cpu/ref_ops.cc); tests: tests/cuda/cuda_matmul_test.cc.
#include <cuda_fp16.h>

#include "backend/cuda/device_math.cuh"
#include "backend/cuda/gemv_common.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace shoal::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

// One product of a launch (see GemvOut): its weight(s), output and the blocks it owns.
struct GemvSeg {
  const uint4* w[2];  // gate (or the only weight), up
  int64_t rows;
  const float* bias;   // [rows] or null
  float* y;            // [n, rows]
  unsigned block_end;  // blocks of this segment and of those before it
  int role;            // with a RoPE epilogue: 0 q, 1 k, 2 v
};

struct GemvArgs {
  GemvSeg seg[kGemvMaxOuts];
  int n_segs;
  int64_t nvec;  // 16-byte vectors per row
  int64_t cols;
  const float* x;  // [n, cols]
  int n;
  const float* norm_w;  // RMSNorm weight [cols] applied to x first, or null
  float eps;
  bool accumulate;  // y += result
  bool early_epilogue;  // bias and old y may be read before the PDL wait (GemvOpts)
  Act act;
  GemvRope rope;  // used by the Rope kernels only
};

// Per-dtype decoding of one 16-byte vector. kVals: values per vector; dot() adds w . x to acc.
struct F32W {
  static constexpr int kVals = 4;
  __device__ static float dot(uint4 w, const float* x, float acc) {
    acc = fmaf(__uint_as_float(w.x), x[0], acc);
    acc = fmaf(__uint_as_float(w.y), x[1], acc);
    acc = fmaf(__uint_as_float(w.z), x[2], acc);
    return fmaf(__uint_as_float(w.w), x[3], acc);
  }
};

struct F16W {
  static constexpr int kVals = 8;
  __device__ static float dot(uint4 w, const float* x, float acc) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&ws[i]));
      acc = fmaf(f.x, x[2 * i], acc);
      acc = fmaf(f.y, x[2 * i + 1], acc);
    }
    return acc;
  }
};

struct BF16W {
  static constexpr int kVals = 8;
  __device__ static float dot(uint4 w, const float* x, float acc) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc = fmaf(__uint_as_float(ws[i] << 16), x[2 * i], acc);
      acc = fmaf(__uint_as_float(ws[i] & 0xffff0000u), x[2 * i + 1], acc);
    }
    return acc;
  }
};

// Loads N activations of token t at column k; with a fused RMSNorm, adds their squares to ss
// and scales them by the norm weight (the 1 / rms factor is applied to the dot products).
template <int N>
__device__ __forceinline__ void load_x(const GemvArgs& a, int t, int64_t k, float (&v)[N], float& ss) {
  const float* p = a.x + int64_t(t) * a.cols + k;
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(p) + i);
    v[4 * i] = f.x;
    v[4 * i + 1] = f.y;
    v[4 * i + 2] = f.z;
    v[4 * i + 3] = f.w;
  }
  if (a.norm_w) {
#pragma unroll
    for (int i = 0; i < N / 4; ++i) {
      const float4 g = __ldg(reinterpret_cast<const float4*>(a.norm_w + k) + i);
      const float gs[4] = {g.x, g.y, g.z, g.w};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        ss = fmaf(v[4 * i + j], v[4 * i + j], ss);
        v[4 * i + j] *= gs[j];
      }
    }
  }
}

// The EpilogueIn of output element threadIdx.x = r * NT + t (row row0 + r, token t) of a block
// of R rows, loaded when it exists and the backend allows an early load (else not ready).
template <int R, int NT>
__device__ __forceinline__ EpilogueIn early_epilogue(const GemvArgs& a, const GemvSeg& sg, int64_t row0) {
  const int r = threadIdx.x / NT, t = threadIdx.x % NT;
  const int64_t row = row0 + r;
  if (!a.early_epilogue || threadIdx.x >= R * NT || row >= sg.rows || t >= a.n) return EpilogueIn{};
  return load_epilogue(sg.bias, row, a.accumulate, sg.y + int64_t(t) * sg.rows + row);
}

// For the epilogue of a Rope kernel (after the products, so nothing of it is held in registers
// through the weight loop): the step's position p and, in thread r < R, the cos / sin of its
// row's pair when the row is a rotated dim of q or k (else cs stays (1, 0), unused).
template <int R>
__device__ __forceinline__ void rope_prepare(const GemvArgs& a, const GemvSeg& sg, int64_t row0, double2& cs,
                                             int32_t& p) {
  if (threadIdx.x >= R) return;
  p = *a.rope.pos;
  const int64_t row = row0 + threadIdx.x;
  if (row >= sg.rows || sg.role > 1) return;
  const int d = int(row % a.rope.head_dim);
  if (d < a.rope.rot_dims) cs = rope_cos_sin(p, a.rope.inv_freq[d / 2], a.rope.attn_factor);
}

// Reduces acc[S][R][NT] (and the squares ss[NT] of a fused norm) over the block and writes y:
// the dot, times 1 / rms(x) with a fused norm, plus bias, or act(gate) * up when S == 2; added
// to y when accumulating. e: thread i's EpilogueIn (early_epilogue()). Rope (one token, one
// product): thread r < R of warp 0 finishes row row0 + r, trades it with its pair's other row
// (r ^ 1), rotates it by cs when it is a rotated dim of q or k, stores it, and stores k and v
// rows as f16 in the caches at row p.
template <int S, int R, int NT, bool Rope = false>
__device__ __forceinline__ void reduce_and_store(float (&acc)[S][R][NT], float (&ss)[NT], const GemvArgs& a,
                                                 const GemvSeg& sg, int64_t row0, const EpilogueIn& e,
                                                 double2 cs = {}, int32_t p = 0) {
  static_assert(R * NT <= kThreads, "a thread per output element");
  constexpr int kSq = S * R * NT;  // offset of the squares in red
  __shared__ float red[kWarps][kSq + NT];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const float v = warp_sum(acc[s][r][t]);
        if (lane == 0) red[warp][(s * R + r) * NT + t] = v;
      }
  if (a.norm_w) {
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const float v = warp_sum(ss[t]);
      if (lane == 0) red[warp][kSq + t] = v;
    }
  }
  __syncthreads();
  const int i = threadIdx.x;  // (a thread per output element)
  if constexpr (Rope) {
    static_assert(S == 1 && NT == 1 && R % 2 == 0 && R <= 32, "RoPE pairs of one token's rows in warp 0");
    if (i >= 32) return;
    const int64_t row = row0 + i;
    const bool live = i < R && row < sg.rows;
    float v = 0.0f;
    if (live) {
      const float inv = block_inv_rms<kWarps>(a.norm_w ? &red[0][kSq] : nullptr, kSq + NT, a.cols, a.eps);
      v = add_bias(warps_sum<kWarps>(&red[0][i], kSq + NT) * inv, sg.bias, row, e);
    }
    const float other = __shfl_xor_sync(0xffffffffu, v, 1);  // the pair's other row
    if (!live) return;
    const int d = int(row % a.rope.head_dim);
    if (sg.role <= 1 && d < a.rope.rot_dims) {
      const bool odd = d & 1;
      float x0 = odd ? other : v, x1 = odd ? v : other;
      rope_rotate(x0, x1, cs);
      v = odd ? x1 : x0;
    }
    sg.y[row] = v;
    if (sg.role >= 1 && p >= 0 && p < a.rope.n_ctx)
      static_cast<__half*>(sg.role == 1 ? a.rope.k_cache : a.rope.v_cache)[int64_t(p) * sg.rows + row] =
          __float2half_rn(v);
    return;
  }
  const int r = i / NT, t = i % NT;
  const int64_t row = row0 + r;
  if (i >= R * NT || row >= sg.rows || t >= a.n) return;
  reduce_store<S, kWarps>(&red[0][i], kSq + NT, R * NT, a.norm_w ? &red[0][kSq + t] : nullptr, kSq + NT, a.cols,
                          a.eps, a.act, sg.bias, row, a.accumulate, sg.y + int64_t(t) * sg.rows + row, e);
}

// The plain kernel: R rows per block, NT tokens, S = 2 for the gate/up fusion, U vectors
// per row loaded per lane before use. Late: the next kernel may start only once this block's
// products are done (not right after its PDL wait), so its early blocks do not take the SMs
// this kernel's later blocks need. Rope: the RoPE / KV cache epilogue (GemvRope), held to 80
// registers (6 blocks per SM, as the plain F16 wide-row kernel): with the cos / sin before the
// wait it took 96, the Llama-3-8B q/k/v GEMV's 768 blocks no longer fit in one wave and the F16
// decode step was 20 us slower than without the fusion (H200; docs/cuda.md, v20). (0: no bound,
// the other kernels unchanged.)
template <class T, int R, int NT, int S, int U, bool Late = false, bool Rope = false>
__global__ void __launch_bounds__(kThreads, Rope ? 6 : 0) gemv_vec_kernel(const GemvArgs a) {
  int64_t local;
  const GemvSeg sg = block_seg(a, local);
  const int64_t row0 = local * R;
  const uint4* wrow[S][R];
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = min(row0 + r, sg.rows - 1);  // spare rows redo the last; not stored
      wrow[s][r] = sg.w[s] + row * a.nvec;
    }
  uint4 wv[S][R][U];
  auto load = [&](int64_t v0) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t vi = v0 + int64_t(u) * kThreads;
      const bool ok = vi < a.nvec;
#pragma unroll
      for (int s = 0; s < S; ++s)
#pragma unroll
        for (int r = 0; r < R; ++r) wv[s][r][u] = ok ? load_stream(wrow[s][r] + vi) : make_uint4(0, 0, 0, 0);
    }
  };
  load(threadIdx.x);  // before the wait: weights never depend on the previous kernel
  const EpilogueIn e = early_epilogue<R, NT>(a, sg, row0);
  pdl_prologue<!Late>();
  float acc[S][R][NT], ss[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) ss[t] = 0.0f;
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[s][r][t] = 0.0f;

  for (int64_t v0 = threadIdx.x; v0 < a.nvec; v0 += int64_t(kThreads) * U) {
    if (v0 != threadIdx.x) load(v0);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t vi = v0 + int64_t(u) * kThreads;
      if (vi >= a.nvec) break;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int tt = min(t, a.n - 1);  // spare token slots redo the last; not stored
        float xv[T::kVals];
        load_x(a, tt, vi * T::kVals, xv, ss[t]);
#pragma unroll
        for (int s = 0; s < S; ++s)
#pragma unroll
          for (int r = 0; r < R; ++r) acc[s][r][t] = T::dot(wv[s][r][u], xv, acc[s][r][t]);
      }
    }
  }
  if constexpr (Late) pdl_trigger();
  [[maybe_unused]] double2 cs = make_double2(1.0, 0.0);
  [[maybe_unused]] int32_t p = 0;
  if constexpr (Rope) rope_prepare<R>(a, sg, row0, cs, p);
  reduce_and_store<S, R, NT, Rope>(acc, ss, a, sg, row0, e, cs, p);
}

// Element loaders for the scalar path (plain weights whose rows are not whole 16-byte vectors).
__device__ __forceinline__ float load_elem(WKind kind, const void* w, int64_t i) {
  switch (kind) {
    case WKind::kF32:
      return static_cast<const float*>(w)[i];
    case WKind::kF16:
      return f16_bits_to_float(static_cast<const uint16_t*>(w)[i]);
    default:
      return __uint_as_float(uint32_t(static_cast<const uint16_t*>(w)[i]) << 16);
  }
}

// One row per block, element by element: any cols, any alignment.
template <int NT, int S>
__global__ void __launch_bounds__(kThreads) gemv_scalar_kernel(const GemvArgs a, WKind kind) {
  pdl_prologue();
  int64_t row;
  const GemvSeg sg = block_seg(a, row);
  float acc[S][1][NT], ss[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) ss[t] = 0.0f;
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[s][0][t] = 0.0f;
  for (int64_t k = threadIdx.x; k < a.cols; k += kThreads) {
    float xv[NT];
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      xv[t] = a.x[int64_t(min(t, a.n - 1)) * a.cols + k];
      if (a.norm_w) {
        ss[t] = fmaf(xv[t], xv[t], ss[t]);
        xv[t] *= a.norm_w[k];
      }
    }
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const float w = load_elem(kind, sg.w[s], row * a.cols + k);
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[s][0][t] = fmaf(w, xv[t], acc[s][0][t]);
    }
  }
  reduce_and_store<S, 1, NT>(acc, ss, a, sg, row, EpilogueIn{});
}

int g_rows_override = 0;

// Rows per block of the plain kernel: enough 16-byte loads in flight per lane without spilling.
template <int S, int NT>
constexpr int plain_rows() {
  return (NT >= 4 && S == 2) ? 1 : 2;
}

unsigned assign_blocks(GemvArgs& a, int64_t rows_per_block) {
  return assign_seg_blocks(a.seg, a.n_segs, rows_per_block, [](const GemvSeg& s) { return s.rows; });
}

template <class T, int R, int NT, int S, int U = 4, bool Late = false, bool Rope = false>
cudaError_t launch_plain(GemvArgs a, cudaStream_t stream) {
  const unsigned grid = assign_blocks(a, R);
  SHOAL_TRY_LAUNCH(launch(gemv_vec_kernel<T, R, NT, S, U, Late, Rope>, grid, kThreads, 0, stream, a));
  return cudaGetLastError();
}

// Rope: the q / k / v launch of one token with the RoPE epilogue (qkv_attention): the same row
// counts (all even, so a pair's rows share a block) as without it, no benchmark override.
template <class T, int S, int NT, bool Rope = false>
cudaError_t dispatch_rows(const GemvArgs& a, cudaStream_t stream) {
  constexpr int kDefault = plain_rows<S, NT>();
  if constexpr (S == 1 && NT == 1 && !Rope) {  // benchmarks try other row counts for the plain GEMV
    if (g_rows_override == 1 && kDefault != 1) return launch_plain<T, 1, 1, 1>(a, stream);
    if (g_rows_override == 4 && kDefault != 4) return launch_plain<T, 4, 1, 1>(a, stream);
  }
  if constexpr (NT == 1) {
    // Narrow rows (one or two vectors per lane: F16 up to 2048 columns): more rows per block for
    // the same loads in flight, so one block reduction serves more rows. Qwen3-0.6B decode step
    // 1054-1059 -> 1176-1184 tok/s (H200; q/k/v GEMV 7.9 -> 6.1 us, gate+up 8.7 -> 7.6).
    // gate+up of one-vector rows takes 8 rows too (16 loads per lane): its blocks then fit on the
    // SMs in one wave (Qwen3-0.6B: 384 instead of 768), step 0.823-0.843 -> 0.802-0.815 ms
    // (H200; 8 rows for wo's two-vector rows or 4 rows of three vectors for its down projection
    // measured slower; docs/cuda.md, v13).
    if (a.nvec <= kThreads) return launch_plain<T, 8, 1, S, 1, false, Rope>(a, stream);
    if (a.nvec <= 2 * kThreads) return launch_plain<T, 4 / S, 1, S, 2, false, Rope>(a, stream);
    // Wide rows (F16 / BF16 from 4096 columns, F32 from 2048): one vector per lane and row,
    // 8 / S rows, several passes per row. Llama-3-8B F16 decode step 4.24 -> 4.12 ms (H200;
    // 4096x14336 alone 72% -> 82% of read; docs/cuda.md, v12); rows of 3 passes (Qwen3-0.6B
    // down, 3072 columns) measured slower, and R = 4, U = 2 or R = 8, U = 2 gained less or lost.
    // The next kernel starts late (after this block's products): F16 step 3.907-3.910 -> 3.854
    // ms and 3.947-3.955 -> 3.901-3.906 (two machines; BF16 / F32 not measured). Late narrow
    // rows made Qwen3-0.6B slower (0.718 -> 0.738-0.748), as did, for F16, a trigger at the last
    // pass's start or none before the exit (docs/cuda.md, v14).
    // Tall ones (one product of 16384+ rows: LM heads) take 4 rows with 4 vectors each in flight
    // per lane instead: their many waves of blocks need no late trigger, and more loads in flight
    // per lane read faster (F16 128256x4096 alone 97% -> 99% of read, H200; docs/cuda.md, v19).
    if constexpr (S == 1 && !Rope)
      if (a.nvec >= 4 * kThreads && a.n_segs == 1 && a.seg[0].rows >= 16384) return launch_plain<T, 4, 1, 1>(a, stream);
    if (a.nvec >= 4 * kThreads) return launch_plain<T, 8 / S, 1, S, 1, true, Rope>(a, stream);
  }
  return launch_plain<T, kDefault, NT, S, 4, false, Rope>(a, stream);
}

template <class T, int S>
cudaError_t dispatch_tokens(const GemvArgs& a, cudaStream_t stream, bool rope) {
  if constexpr (S == 1)
    if (rope) return dispatch_rows<T, 1, 1, true>(a, stream);  // (one token: checked by run())
  if (a.n == 1) return dispatch_rows<T, S, 1>(a, stream);
  if (a.n == 2) return dispatch_rows<T, S, 2>(a, stream);
  if (a.n <= 4) return dispatch_rows<T, S, 4>(a, stream);
  return dispatch_rows<T, S, 8>(a, stream);
}

template <int S>
cudaError_t launch_scalar(GemvArgs a, WKind kind, cudaStream_t stream) {
  const unsigned grid = assign_blocks(a, 1);
  if (a.n == 1)
    SHOAL_TRY_LAUNCH(launch(gemv_scalar_kernel<1, S>, grid, kThreads, 0, stream, a, kind));
  else
    SHOAL_TRY_LAUNCH(launch(gemv_scalar_kernel<kGemvMaxTokens, S>, grid, kThreads, 0, stream, a, kind));
  return cudaGetLastError();
}

int vals_per_vector(WKind k) {
  switch (k) {
    case WKind::kF32:
      return 4;
    case WKind::kF16:
    case WKind::kBF16:
      return 8;
    default:
      return 1;
  }
}

template <int S>
cudaError_t run(const GemvOut* outs, int count, const float* x, int n, const GemvOpts& o, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (count < 1 || count > kGemvMaxOuts || n < 0 || n > kGemvMaxTokens) return cudaErrorInvalidValue;
  const WKind kind = outs[0].w.kind;
  const int64_t cols = outs[0].w.cols;
  GemvArgs a{};
  for (int i = 0; i < count; ++i) {
    const GemvOut& g = outs[i];
    if (g.w.kind != kind || g.w.cols != cols || (S == 2) != (g.up != nullptr)) return cudaErrorInvalidValue;
    if (S == 2 && (g.up->kind != kind || g.up->rows != g.w.rows || g.up->cols != cols)) return cudaErrorInvalidValue;
    if (g.w.rows == 0) continue;
    GemvSeg& sg = a.seg[a.n_segs++];
    sg.w[0] = static_cast<const uint4*>(g.w.data);
    sg.w[1] = g.up ? static_cast<const uint4*>(g.up->data) : nullptr;
    sg.rows = g.w.rows;
    sg.bias = g.bias;
    sg.y = g.y;
  }
  if (a.n_segs == 0) return cudaSuccess;
  if (kind == WKind::kQ8_0 || kind == WKind::kQ4_0)
    return o.rope ? cudaErrorInvalidValue : gemv_quant(outs, count, x, n, o, stream);
  if (o.frags_in || o.frags_out || o.split_k) return cudaErrorInvalidValue;  // (quantized weights only)
  const int vals = vals_per_vector(kind);
  a.cols = cols;
  a.nvec = cols / vals;
  a.x = x;
  a.n = n;
  a.norm_w = o.norm_w;
  a.eps = o.eps;
  a.accumulate = o.accumulate;
  a.early_epilogue = o.early_epilogue;
  a.act = o.act;
  const bool vec_ok = cols % vals == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
                      (!o.norm_w || reinterpret_cast<uintptr_t>(o.norm_w) % 16 == 0);
  if (o.rope) {
    if constexpr (S != 1) {
      return cudaErrorInvalidValue;
    } else {
      const GemvRope& r = *o.rope;
      const int64_t hd = r.head_dim;
      if (count != 3 || a.n_segs != 3 || n != 1 || o.accumulate || !vec_ok || vals == 1 || hd <= 0 || hd % 2 != 0 ||
          r.rot_dims < 0 || r.rot_dims % 2 != 0 || r.rot_dims > hd || a.seg[0].rows % hd != 0 ||
          a.seg[1].rows % hd != 0 || a.seg[1].rows != a.seg[2].rows || !r.pos || !r.k_cache || !r.v_cache ||
          (r.rot_dims > 0 && !r.inv_freq))
        return cudaErrorInvalidValue;
      for (int i = 0; i < 3; ++i) a.seg[i].role = i;
      a.rope = r;
    }
  }
  const bool rope = o.rope != nullptr;
  switch (kind) {
    case WKind::kF32:
      return vec_ok ? dispatch_tokens<F32W, S>(a, stream, rope) : launch_scalar<S>(a, kind, stream);
    case WKind::kF16:
      return vec_ok ? dispatch_tokens<F16W, S>(a, stream, rope) : launch_scalar<S>(a, kind, stream);
    case WKind::kBF16:
      return vec_ok ? dispatch_tokens<BF16W, S>(a, stream, rope) : launch_scalar<S>(a, kind, stream);
    default:
      break;
  }
  return cudaErrorInvalidValue;
}

}  // namespace

void set_gemv_rows_override(int rows_per_block) { g_rows_override = rows_per_block; }
int gemv_rows_override() { return g_rows_override; }

cudaError_t gemv_multi(const GemvOut* outs, int count, const float* x, int n, const GemvOpts& opts,
                       cudaStream_t stream) {
  if (count > 0 && outs[0].up) return run<2>(outs, count, x, n, opts, stream);
  return run<1>(outs, count, x, n, opts, stream);
}

cudaError_t gemv(const WeightRef& w, const float* x, int n, const float* bias, float* y, cudaStream_t stream) {
  const GemvOut o{w, nullptr, bias, y};
  return gemv_multi(&o, 1, x, n, GemvOpts{}, stream);
}

cudaError_t gemv_glu(const WeightRef& gate, const WeightRef& up, const float* x, int n, Act act, float* out,
                     cudaStream_t stream) {
  const GemvOut o{gate, &up, nullptr, out};
  GemvOpts opts;
  opts.act = act;
  return gemv_multi(&o, 1, x, n, opts, stream);
}

}  // namespace shoal::cuda
