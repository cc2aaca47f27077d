// GEMV (and small-batch GEMM, n <= 8 tokens) for F32, F16, BF16, Q8_0 and Q4_0 weights, with
// the gate+up+activation fusion (gemv_glu). Memory-bound: the weights are read once, as 16-byte
// loads that skip L1, several per lane in flight; the f32 activations come from L1.
//
// Work split: a block of 4 warps computes R rows; its 128 lanes split each row's 16-byte vectors
// round-robin (coalesced), then the per-lane partial sums are reduced in a fixed order (warp
// butterfly, then warps 0..3), so results are deterministic.
//
// Quantized values become floats without I2F (a quarter-rate instruction on sm_80..sm_90): the
// byte is placed in the mantissa of 2^23 (prmt) and 2^23 + offset subtracted, which is exact.
// Twin: ref::matmul (src/backend/cpu/ref_ops.cc); tests: tests/cuda/cuda_matmul_test.cc.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"

namespace shoal::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;

struct GemvArgs {
  const uint4* w[2];        // gate (or the only weight), up
  const uint16_t* s[2];     // block scales (quantized kinds)
  int64_t rows;
  int64_t nvec;             // 16-byte vectors per row
  int64_t cols;
  const float* x;           // [n, cols]
  int n;
  const float* bias;        // [rows] or null
  float* y;                 // [n, rows]
  Act act;
};

// Float value of byte i of u (0..255) plus 2^23.
__device__ __forceinline__ float byte_plus_2p23(uint32_t u, int i) {
  return __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7440u | unsigned(i)));
}

// Per-dtype decoding of one 16-byte vector. kVals: values per vector; dot() adds w . x to acc.
struct F32W {
  static constexpr int kVals = 4;
  static constexpr bool kScaled = false;
  __device__ static float dot(uint4 w, const float* x, float, float acc) {
    acc = fmaf(__uint_as_float(w.x), x[0], acc);
    acc = fmaf(__uint_as_float(w.y), x[1], acc);
    acc = fmaf(__uint_as_float(w.z), x[2], acc);
    return fmaf(__uint_as_float(w.w), x[3], acc);
  }
};

struct F16W {
  static constexpr int kVals = 8;
  static constexpr bool kScaled = false;
  __device__ static float dot(uint4 w, const float* x, float, float acc) {
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
  static constexpr bool kScaled = false;
  __device__ static float dot(uint4 w, const float* x, float, float acc) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      acc = fmaf(__uint_as_float(ws[i] << 16), x[2 * i], acc);
      acc = fmaf(__uint_as_float(ws[i] & 0xffff0000u), x[2 * i + 1], acc);
    }
    return acc;
  }
};

// Q8_0: a vector is half a block (16 int8); two lanes share a scale.
struct Q8W {
  static constexpr int kVals = 16;
  static constexpr bool kScaled = true;
  __device__ static int64_t scale_index(int64_t v) { return v >> 1; }
  __device__ static float dot(uint4 w, const float* x, float d, float acc) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t u = ws[i] ^ 0x80808080u;  // int8 q -> q + 128 in 0..255
      s0 = fmaf(byte_plus_2p23(u, 0) - 8388736.0f, x[4 * i + 0], s0);
      s1 = fmaf(byte_plus_2p23(u, 1) - 8388736.0f, x[4 * i + 1], s1);
      s0 = fmaf(byte_plus_2p23(u, 2) - 8388736.0f, x[4 * i + 2], s0);
      s1 = fmaf(byte_plus_2p23(u, 3) - 8388736.0f, x[4 * i + 3], s1);
    }
    return fmaf(d, s0 + s1, acc);
  }
};

// Q4_0: a vector is one block (32 nibbles); byte j holds values j (low) and j + 16 (high).
struct Q4W {
  static constexpr int kVals = 32;
  static constexpr bool kScaled = true;
  __device__ static int64_t scale_index(int64_t v) { return v; }
  __device__ static float dot(uint4 w, const float* x, float d, float acc) {
    const uint32_t ws[4] = {w.x, w.y, w.z, w.w};
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t lo = ws[i] & 0x0f0f0f0fu;
      const uint32_t hi = (ws[i] >> 4) & 0x0f0f0f0fu;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        s0 = fmaf(byte_plus_2p23(lo, j) - 8388616.0f, x[4 * i + j], s0);
        s1 = fmaf(byte_plus_2p23(hi, j) - 8388616.0f, x[16 + 4 * i + j], s1);
      }
    }
    return fmaf(d, s0 + s1, acc);
  }
};

template <int N>
__device__ __forceinline__ void load_x(const float* p, float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const float4 f = __ldg(reinterpret_cast<const float4*>(p) + i);
    v[4 * i] = f.x;
    v[4 * i + 1] = f.y;
    v[4 * i + 2] = f.z;
    v[4 * i + 3] = f.w;
  }
}

// Reduces acc[S][R][NT] over the block and writes y (or act(gate) * up when S == 2).
template <int S, int R, int NT>
__device__ __forceinline__ void reduce_and_store(float (&acc)[S][R][NT], const GemvArgs& a,
                                                 int64_t row0) {
  __shared__ float red[kWarps][S * R * NT];
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
  __syncthreads();
  for (int i = threadIdx.x; i < R * NT; i += kThreads) {
    const int r = i / NT, t = i % NT;
    const int64_t row = row0 + r;
    if (row >= a.rows || t >= a.n) continue;
    float g = 0.0f;
#pragma unroll
    for (int wi = 0; wi < kWarps; ++wi) g += red[wi][i];
    float out;
    if constexpr (S == 2) {
      float u = 0.0f;
#pragma unroll
      for (int wi = 0; wi < kWarps; ++wi) u += red[wi][R * NT + i];
      out = apply_act(g, a.act) * u;
    } else {
      out = a.bias ? g + a.bias[row] : g;
    }
    a.y[int64_t(t) * a.rows + row] = out;
  }
}

// The vectorised kernel: R rows per block, NT tokens, S = 2 for the gate/up fusion, U vectors
// per row loaded per lane before use.
template <class T, int R, int NT, int S, int U>
__global__ void __launch_bounds__(kThreads) gemv_vec_kernel(const GemvArgs a) {
  const int64_t row0 = int64_t(blockIdx.x) * R;
  const uint4* wrow[S][R];
  const uint16_t* srow[S][R];
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t row = min(row0 + r, a.rows - 1);  // spare rows redo the last; not stored
      wrow[s][r] = a.w[s] + row * a.nvec;
      srow[s][r] = T::kScaled ? a.s[s] + row * (a.cols / 32) : nullptr;
    }
  float acc[S][R][NT];
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[s][r][t] = 0.0f;

  for (int64_t v0 = threadIdx.x; v0 < a.nvec; v0 += int64_t(kThreads) * U) {
    uint4 wv[S][R][U];
    float d[S][R][U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t vi = v0 + int64_t(u) * kThreads;
      const bool ok = vi < a.nvec;
#pragma unroll
      for (int s = 0; s < S; ++s)
#pragma unroll
        for (int r = 0; r < R; ++r) {
          wv[s][r][u] = ok ? load_stream(wrow[s][r] + vi) : make_uint4(0, 0, 0, 0);
          if constexpr (T::kScaled)
            d[s][r][u] = ok ? f16_bits_to_float(__ldg(srow[s][r] + T::scale_index(vi))) : 0.0f;
          else
            d[s][r][u] = 0.0f;
        }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t vi = v0 + int64_t(u) * kThreads;
      if (vi >= a.nvec) break;
#pragma unroll
      for (int t = 0; t < NT; ++t) {
        const int tt = min(t, a.n - 1);  // spare token slots redo the last; not stored
        float xv[T::kVals];
        load_x(a.x + int64_t(tt) * a.cols + vi * T::kVals, xv);
#pragma unroll
        for (int s = 0; s < S; ++s)
#pragma unroll
          for (int r = 0; r < R; ++r) acc[s][r][t] = T::dot(wv[s][r][u], xv, d[s][r][u], acc[s][r][t]);
      }
    }
  }
  reduce_and_store<S, R, NT>(acc, a, row0);
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
  const int64_t row = blockIdx.x;
  float acc[S][1][NT];
#pragma unroll
  for (int s = 0; s < S; ++s)
#pragma unroll
    for (int t = 0; t < NT; ++t) acc[s][0][t] = 0.0f;
  for (int64_t k = threadIdx.x; k < a.cols; k += kThreads) {
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const float w = load_elem(kind, a.w[s], row * a.cols + k);
#pragma unroll
      for (int t = 0; t < NT; ++t) acc[s][0][t] = fmaf(w, a.x[int64_t(min(t, a.n - 1)) * a.cols + k], acc[s][0][t]);
    }
  }
  reduce_and_store<S, 1, NT>(acc, a, row);
}

int g_rows_override = 0;

// Rows per block: enough 16-byte loads in flight per lane without spilling registers.
template <class T, int S, int NT>
constexpr int default_rows() {
  if (NT == 1) return T::kVals == 32 ? 4 : 2;
  return (NT >= 4 && S == 2) ? 1 : 2;
}

template <class T, int R, int NT, int S>
cudaError_t launch_vec(const GemvArgs& a, cudaStream_t stream) {
  constexpr int U = T::kVals == 32 ? 2 : 4;
  const unsigned grid = unsigned(div_up(a.rows, R));
  gemv_vec_kernel<T, R, NT, S, U><<<grid, kThreads, 0, stream>>>(a);
  return cudaGetLastError();
}

template <class T, int S, int NT>
cudaError_t dispatch_rows(const GemvArgs& a, cudaStream_t stream) {
  constexpr int kDefault = default_rows<T, S, NT>();
  if constexpr (S == 1 && NT == 1) {
    // Benchmarks try other row counts for the plain GEMV.
    if (g_rows_override == 1 && kDefault != 1) return launch_vec<T, 1, 1, 1>(a, stream);
    if (g_rows_override == 2 && kDefault != 2) return launch_vec<T, 2, 1, 1>(a, stream);
    if (g_rows_override == 4 && kDefault != 4) return launch_vec<T, 4, 1, 1>(a, stream);
  }
  return launch_vec<T, kDefault, NT, S>(a, stream);
}

template <class T, int S>
cudaError_t dispatch_tokens(const GemvArgs& a, cudaStream_t stream) {
  if (a.n == 1) return dispatch_rows<T, S, 1>(a, stream);
  if (a.n == 2) return dispatch_rows<T, S, 2>(a, stream);
  if (a.n <= 4) return dispatch_rows<T, S, 4>(a, stream);
  return dispatch_rows<T, S, 8>(a, stream);
}

template <int S>
cudaError_t launch_scalar(const GemvArgs& a, WKind kind, cudaStream_t stream) {
  const unsigned grid = unsigned(a.rows);
  if (a.n == 1)
    gemv_scalar_kernel<1, S><<<grid, kThreads, 0, stream>>>(a, kind);
  else
    gemv_scalar_kernel<kGemvMaxTokens, S><<<grid, kThreads, 0, stream>>>(a, kind);
  return cudaGetLastError();
}

int vals_per_vector(WKind k) {
  switch (k) {
    case WKind::kF32:
      return 4;
    case WKind::kF16:
    case WKind::kBF16:
      return 8;
    case WKind::kQ8_0:
      return 16;
    case WKind::kQ4_0:
      return 32;
  }
  return 1;
}

template <int S>
cudaError_t run(const WeightRef& w, const WeightRef* up, const float* x, int n, const float* bias,
                Act act, float* y, cudaStream_t stream) {
  if (w.rows == 0 || n == 0) return cudaSuccess;
  const int vals = vals_per_vector(w.kind);
  GemvArgs a{};
  a.w[0] = static_cast<const uint4*>(w.data);
  a.s[0] = w.scales;
  a.w[1] = up ? static_cast<const uint4*>(up->data) : nullptr;
  a.s[1] = up ? up->scales : nullptr;
  a.rows = w.rows;
  a.cols = w.cols;
  a.nvec = w.cols / vals;
  a.x = x;
  a.n = n;
  a.bias = bias;
  a.y = y;
  a.act = act;
  const bool vec_ok = w.cols % vals == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  switch (w.kind) {
    case WKind::kQ8_0:
      return dispatch_tokens<Q8W, S>(a, stream);
    case WKind::kQ4_0:
      return dispatch_tokens<Q4W, S>(a, stream);
    case WKind::kF32:
      return vec_ok ? dispatch_tokens<F32W, S>(a, stream) : launch_scalar<S>(a, w.kind, stream);
    case WKind::kF16:
      return vec_ok ? dispatch_tokens<F16W, S>(a, stream) : launch_scalar<S>(a, w.kind, stream);
    case WKind::kBF16:
      return vec_ok ? dispatch_tokens<BF16W, S>(a, stream) : launch_scalar<S>(a, w.kind, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

void set_gemv_rows_override(int rows_per_block) { g_rows_override = rows_per_block; }

cudaError_t gemv(const WeightRef& w, const float* x, int n, const float* bias, float* y,
                 cudaStream_t stream) {
  return run<1>(w, nullptr, x, n, bias, Act::kSilu, y, stream);
}

cudaError_t gemv_glu(const WeightRef& gate, const WeightRef& up, const float* x, int n, Act act,
                     float* out, cudaStream_t stream) {
  return run<2>(gate, &up, x, n, nullptr, act, out, stream);
}

}  // namespace shoal::cuda
