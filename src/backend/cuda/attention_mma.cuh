// Attention on the f16 tensor cores for f16 and Q8_0 KV caches (head_dim 64 / 128), the device pieces the
// prefill kernel (attention_prefill.cu) and the decode kernel (attention_decode_mma.cu) share, in
// the structure of FlashAttention-2 (Dao 2023): a warp owns 16 query rows held in registers as
// MMA A fragments; the block stages 64-key tiles of K and V in shared memory with cp.async; per
// tile a warp computes S = Q K^T for its keys (mma.m16n8k16), masks each row to its key range,
// updates an online softmax (Milakov & Gimelshein 2018) whose row statistics live in the 4 lanes
// of a quad, and adds P V with P taken straight from the score accumulators as A fragments.
//
// Q8_0 caches (GGUF blocks of 32 values along a head: f16 d, 32 int8) are staged as they are
// (load_tile_q8) and converted per tile into f16 tiles of the integers q (exact) and f32 scales
// per (key, block) (convert_q8_tiles); a step then scales each block's partial scores by its key's
// K scale, and P by its key's V scale per 32-dimension block of the output (tile_step's kQ8).
//
// Exactness (the CPU reference is f32): K and V are f16 in the cache, so exact as MMA operands;
// q (times the softmax scale) and p are split into f16 hi + lo (22 significant bits), each
// product takes two MMAs with f32 accumulation, so results match the f32 computation to ~2^-22
// relative (the tests compare at 1e-5); exp2_ftz is within 2 ulp. With kOnePart (opt-in) q and p
// are one f16 part each. Limits: |q * scale| (prefill: times log2 e) above 65504 overflows f16
// (inf / NaN); q elements below ~2^-14 * max|q| lose relative (not absolute) precision in lo.
// A block loads every K/V row between its earliest and latest attended key, also rows that a
// row's mask skips (gaps in pos with a sliding window): they must be finite, since a masked p of
// 0 times a NaN is NaN. The engine writes positions in order and CudaBackend::alloc zeroes
// caches.
// Only included by .cu files of src/backend/cuda/.
#pragma once

#include <cuda_fp16.h>

#include <climits>
#include <cmath>
#include <cstdint>

#include "backend/cuda/mma.cuh"
#include "backend/cuda/quant_mma.cuh"

namespace shoal::cuda::attn_mma {

/// log2 e and ln 2: scores in log2 units (tile_step's kLog2) and back to natural units.
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

constexpr int kKeys = 64;  // keys per tile
constexpr int kRows = 16;  // query rows per warp (the MMA's M)

/// Shared-memory row pitch of K / V tiles in halves: 16-byte rows, conflict-free ldmatrix.
template <int D>
constexpr int pitch() {
  return D + 8;
}

/// A warp's online-softmax state for its 16 rows; lane (g, c) holds rows g and g + 8: output
/// dimensions 8d + 2c, 8d + 2c + 1 in o[d][2r], o[d][2r + 1], the running max m[r] and its
/// share l[r] of the row sum (summed over the quad at the end).
/// Q8_0 caches: o of each 32-dimension block b holds vf[b] (a power of two) times its value until
/// q8_unscale (softmax_pv).
template <int D>
struct RowState {
  float o[D / 8][4];
  float m[2], l[2];
  float vf[D / 32];
  __device__ __forceinline__ void init() {
#pragma unroll
    for (int d = 0; d < D / 8; ++d) o[d][0] = o[d][1] = o[d][2] = o[d][3] = 0.0f;
    m[0] = m[1] = -INFINITY;
    l[0] = l[1] = 0.0f;
#pragma unroll
    for (int b = 0; b < D / 32; ++b) vf[b] = 1.0f;
  }
  /// o in its own units after the steps of a Q8_0 cache (o /= vf per block: exact).
  __device__ __forceinline__ void q8_unscale() {
#pragma unroll
    for (int b = 0; b < D / 32; ++b) {
      const float r = 1.0f / vf[b];
#pragma unroll
      for (int d = 4 * b; d < 4 * b + 4; ++d) o[d][0] *= r, o[d][1] *= r, o[d][2] *= r, o[d][3] *= r;
      vf[b] = 1.0f;
    }
  }
  /// l summed over the 4 lanes of the quad (once, after the last tile).
  __device__ __forceinline__ void reduce_l() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
      l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
  }
};

/// K-step ks of the q rows of lane (g, c), times `scale`, as A fragments hi + lo: qa / qb point
/// at row g / g + 8 (null: a row of zeros).
__device__ __forceinline__ void q_fragment(uint32_t (&qh)[4], uint32_t (&ql)[4], const float* qa, const float* qb,
                                           int ks, float scale, int c) {
#pragma unroll
  for (int f = 0; f < 4; ++f) {  // f: (row g, cols 0..7), (g + 8, 0..7), (g, 8..15), (g + 8, 8..15)
    const float* row = f & 1 ? qb : qa;
    float2 x = make_float2(0.0f, 0.0f);
    if (row) x = *reinterpret_cast<const float2*>(row + ks * 16 + (f >> 1) * 8 + 2 * c);
    x.x *= scale;
    x.y *= scale;
    qh[f] = half2_bits(x.x, x.y);
    const float2 h = bits_half2(qh[f]);
    ql[f] = half2_bits(x.x - h.x, x.y - h.y);
  }
}

/// All k-steps of q_fragment.
template <int D>
__device__ __forceinline__ void load_q(uint32_t (&qh)[D / 16][4], uint32_t (&ql)[D / 16][4], const float* qa,
                                       const float* qb, float scale, int c) {
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) q_fragment(qh[ks], ql[ks], qa, qb, ks, scale, c);
}

/// Issues the cp.async copies of keys k0 .. k0 + 63 of one KV head (rows of kg / vg, `width`
/// halves apart) into k_dst / v_dst [kKeys][pitch]: all kThreads threads of the block take part
/// (a thread always copies the same 16 bytes of its rows); rows past `hi` become zeros (never
/// read from memory). Only the rows of keys in [from, to) are issued (a tile loaded in two
/// parts: decode attention copies the keys of earlier steps before its PDL wait). kCompact: a loop,
/// not unrolled (decode attention waits on instruction fetches; docs/cuda.md v17).
template <int D, int kThreads, bool kCompact = false>
__device__ __forceinline__ void load_tile(__half* k_dst, __half* v_dst, const __half* kg, const __half* vg,
                                          int64_t width, int k0, int hi, int from = INT_MIN, int to = INT_MAX) {
  constexpr int DP = pitch<D>(), kPieces = D / 8, kStep = kThreads / kPieces;
  static_assert(kThreads % kPieces == 0 && kKeys % kStep == 0, "whole rows per pass");
  const int e = int(threadIdx.x) % kPieces * 8, j0 = int(threadIdx.x) / kPieces;
#pragma unroll(kCompact ? 1 : kKeys / kStep)
  for (int j = j0; j < kKeys; j += kStep) {
    if (k0 + j < from || k0 + j >= to) continue;
    const bool ok = k0 + j <= hi;
    const int64_t off = (ok ? int64_t(k0 + j) * width : 0) + e;
    cp_async_or_zero(k_dst + j * DP + e, kg + off, ok);
    cp_async_or_zero(v_dst + j * DP + e, vg + off, ok);
  }
}

/// Q8_0 cache rows of one KV head (head_dim D): bytes of its part of a cache row (34 per block
/// of 32 values; rows and heads lie at multiples of 4 bytes), the 32-value blocks, and the
/// 16-byte aligned window around that part as it is staged (load_tile_q8): at most
/// q8_window bytes, in the tail of the row's f16 tile row (from byte q8_stage_at), where
/// convert_q8_tiles turns it into that row in place.
template <int D>
constexpr int q8_row_bytes() {
  return D / 32 * 34;
}
template <int D>
constexpr int q8_blocks() {
  return D / 32;
}
template <int D>
constexpr int q8_window() {
  return (q8_row_bytes<D>() + 15 + 15) / 16 * 16;
}
template <int D>
constexpr int q8_stage_at() {
  return int(pitch<D>() * sizeof(__half)) - q8_window<D>();
}
/// Where a row's part starts in its staged window: its address mod 16 (rows and heads at
/// multiples of 4 bytes, so the blocks' alignment mod 4 is the same in every row).
__device__ __forceinline__ int q8_shift(const uint8_t* row) { return int(reinterpret_cast<uintptr_t>(row) & 15); }

/// load_tile for Q8_0 caches: the rows of keys k0 .. k0 + 63 of one KV head (kg / vg: the head's
/// part of cache row 0; rows `row_bytes` apart) staged in the tails of the f16 tile rows of
/// k_dst / v_dst [kKeys][pitch] as 16-byte aligned windows (cp.async.cg, as load_tile: no L1);
/// rows past `hi` become zeros, only keys in [from, to) are issued. A window may end up to 15
/// bytes past the row's part: the caches carry 16 bytes of slack (CudaBackend::alloc).
template <int D, int kThreads>
__device__ __forceinline__ void load_tile_q8(__half* k_dst, __half* v_dst, const uint8_t* kg, const uint8_t* vg,
                                             int64_t row_bytes, int k0, int hi, int from = INT_MIN,
                                             int to = INT_MAX) {
  constexpr int RB = q8_row_bytes<D>(), W = q8_window<D>() / 16, AT = q8_stage_at<D>(), DP = pitch<D>();
  static_assert(AT % 16 == 0 && AT >= 0, "16-byte aligned windows in the rows' tails");
#pragma unroll 1
  for (int i = int(threadIdx.x); i < kKeys * W; i += kThreads) {
    const int j = i / W, e = i % W;
    if (k0 + j < from || k0 + j >= to) continue;
    const bool ok = k0 + j <= hi;
    const int64_t at = ok ? int64_t(k0 + j) * row_bytes : 0;
    const int sh = q8_shift(kg + at);  // (the same for vg: both caches 16-byte aligned)
    const bool live = ok && 16 * e < sh + RB;  // pieces past the row's part are neither read nor used
    cp_async_or_zero(reinterpret_cast<uint8_t*>(k_dst + j * DP) + AT + 16 * e, kg + at - sh + 16 * e, live);
    cp_async_or_zero(reinterpret_cast<uint8_t*>(v_dst + j * DP) + AT + 16 * e, vg + at - sh + 16 * e, live);
  }
}

/// The rows of `rows` consecutive keys from key0 staged by load_tile_q8 (k_t / v_t [rows][pitch])
/// turned in place into f16 tile rows of their integers q (exact) and f32 scales d (ksc / vsc
/// [rows][q8_blocks]), a row per thread of the block (kThreads); zero rows give q = 0, d = 0.
/// kg / vg / row_bytes as load_tile_q8 (for each row's shift). A row's block b is read before it
/// is written, and its f16 values [64 b, 64 b + 64) bytes lie below the staged blocks after it.
/// The caller puts a block barrier before (the copies landed) and after.
template <int D, int kThreads>
__device__ __forceinline__ void convert_q8_tiles(__half* k_t, __half* v_t, float* ksc, float* vsc, const uint8_t* kg,
                                                 const uint8_t* vg, int64_t row_bytes, int key0, int rows) {
  constexpr int NB = q8_blocks<D>(), AT = q8_stage_at<D>(), DP = pitch<D>();
  static_assert(AT + 34 * (NB - 1) >= 64 * (NB - 1), "a block's f16 values lie below the blocks after it");
#pragma unroll 1
  for (int i = int(threadIdx.x); i < 2 * rows; i += kThreads) {
    const bool is_v = i >= rows;
    const int j = is_v ? i - rows : i;
    uint8_t* row = reinterpret_cast<uint8_t*>((is_v ? v_t : k_t) + j * DP);
    const uint8_t* src = row + AT + q8_shift(kg + int64_t(key0 + j) * row_bytes);
    float* sc = (is_v ? vsc : ksc) + j * NB;
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const uint8_t* blk = src + 34 * b;  // (2-byte aligned)
      sc[b] = __half2float(*reinterpret_cast<const __half*>(blk));
      // The 32 quants start at blk + 2: 4-byte aligned for odd blocks, 2 bytes past it for even
      // ones (the shift is a multiple of 4), whose ninth word holds the next block's d.
      const int mis = (34 * b + 2) & 3;
      const uint32_t* w = reinterpret_cast<const uint32_t*>(blk + 2 - mis);
      uint32_t words[9];
#pragma unroll
      for (int k = 0; k < 9; ++k)
        if (k < 8 || mis) words[k] = w[k];
      uint32_t h[16];
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        const uint32_t x = (mis ? __byte_perm(words[k], words[k + 1], 0x5432u) : words[k]) ^ 0x80808080u;  // q + 128
        h[2 * k] = hsub2(__byte_perm(x, k1024, 0x5150), k1152);  // 1024 + (q + 128) - 1152
        h[2 * k + 1] = hsub2(__byte_perm(x, k1024, 0x5352), k1152);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) st_shared_v4(row + 64 * b + 16 * k, h[4 * k], h[4 * k + 1], h[4 * k + 2], h[4 * k + 3]);
    }
  }
}

/// Whether n-tile n of a step over NT * 8 keys is computed (full = false: the first NT / 2 only).
template <int NT>
__device__ __forceinline__ bool tile_live(int n, bool full) {
  return full || NT < 4 || n < NT / 2;
}

/// One k-step pair (ks, ks + 1) of S = q K^T over NT * 8 keys whose K rows start at kt (shared,
/// pitch<D>()): h0 / l0 and h1 / l1 are the A fragments of q's k-steps ks and ks + 1 (hi, lo; lo
/// unused with kOnePart). kChains: accumulators per n-tile (the four products of a k-step pair
/// go to separate ones: chains of 2 KS / kChains dependent MMAs, summed by qk_sum).
template <int D, int NT, int kChains, bool kOnePart>
__device__ __forceinline__ void qk_pair(const __half* kt, int ks, const uint32_t (&h0)[4], const uint32_t (&l0)[4],
                                        const uint32_t (&h1)[4], const uint32_t (&l1)[4],
                                        float (&acc)[kChains][NT][4], bool full) {
  constexpr int DP = pitch<D>();
  static_assert(kChains == 1 || kChains == 2 || kChains == 4, "products of a k-step pair per accumulator");
  static_assert(NT % 2 == 0, "whole 16-key slices");
  const int lane = threadIdx.x & 31;
  // ldmatrix gives the B fragments of two k-steps of 8 keys.
#pragma unroll
  for (int n = 0; n < NT; ++n) {
    if (!tile_live<NT>(n, full)) continue;
    uint32_t b[4];
    ldmatrix_x4<false>(b, kt + (n * 8 + (lane & 7)) * DP + ks * 16 + (lane >> 3) * 8);
    mma(acc[0][n], h0, b[0], b[1]);
    if constexpr (!kOnePart) mma(acc[1 % kChains][n], l0, b[0], b[1]);
    mma(acc[2 % kChains][n], h1, b[2], b[3]);
    if constexpr (!kOnePart) mma(acc[3 % kChains][n], l1, b[2], b[3]);
  }
}

/// 2^x by one MUFU.EX2 (PTX ex2.approx.ftz.f32: ~2 ulp like exp2f, which adds a scale for
/// subnormal results): results below 2^-126 become 0, nothing beside a softmax row's largest
/// term of 1; 2^-inf = 0, NaN stays NaN.
__device__ __forceinline__ float exp2_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}

/// Zeroed accumulators for qk_pair.
template <int NT, int kChains>
__device__ __forceinline__ void qk_zero(float (&acc)[kChains][NT][4]) {
#pragma unroll
  for (int h = 0; h < kChains; ++h)
#pragma unroll
    for (int n = 0; n < NT; ++n) acc[h][n][0] = acc[h][n][1] = acc[h][n][2] = acc[h][n][3] = 0.0f;
}

/// The scores from qk_pair's accumulators: s[n][e] is row g (e < 2) or g + 8, key 8n + 2c + e % 2.
template <int NT, int kChains>
__device__ __forceinline__ void qk_sum(const float (&acc)[kChains][NT][4], float (&s)[NT][4]) {
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e)
      if constexpr (kChains == 4)
        s[n][e] = (acc[0][n][e] + acc[1][n][e]) + (acc[2][n][e] + acc[3][n][e]);
      else if constexpr (kChains == 2)
        s[n][e] = acc[0][n][e] + acc[1][n][e];
      else
        s[n][e] = acc[0][n][e];
}

/// The A fragments (hi + lo) of P for the 16 keys kk of a step from the probabilities s
/// (softmax_pv's layout): rows g / g + 8 of keys 0..7, then of keys 8..15; with kScaled each
/// value times its key's factor dk[h][e] (h: keys 0..7 or 8..15; e: key 2c or 2c + 1; Q8_0 V
/// scales).
template <int NT, bool kScaled>
__device__ __forceinline__ void p_fragments(const float (&s)[NT][4], int kk, const float (&dk)[2][2],
                                            uint32_t (&ah)[4], uint32_t (&al)[4]) {
#pragma unroll
  for (int f = 0; f < 4; ++f) {
    const float* src = s[2 * kk + (f >> 1)] + (f & 1) * 2;
    const float x0 = kScaled ? src[0] * dk[f >> 1][0] : src[0], x1 = kScaled ? src[1] * dk[f >> 1][1] : src[1];
    ah[f] = half2_bits(x0, x1);
    const float2 h = bits_half2(ah[f]);
    al[f] = half2_bits(x0 - h.x, x1 - h.y);
  }
}

/// O's n-tiles [d_first, d_end) (8 dimensions each, pairs) += P V for the 16 keys kk of a step,
/// P as A fragments ah / al (al unused with kOnePart), V's rows at vt (shared, pitch<D>()).
template <int D, bool kOnePart>
__device__ __forceinline__ void pv_products(const __half* vt, int kk, const uint32_t (&ah)[4], const uint32_t (&al)[4],
                                            int d_first, int d_end, RowState<D>& st) {
  constexpr int DP = pitch<D>();
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int d = d_first; d < d_end; d += 2) {
    uint32_t b[4];
    ldmatrix_x4<true>(b, vt + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * DP + d * 8 + (lane >> 4) * 8);
    mma(st.o[d], ah, b[0], b[1]);
    if constexpr (!kOnePart) mma(st.o[d], al, b[0], b[1]);
    mma(st.o[d + 1], ah, b[2], b[3]);
    if constexpr (!kOnePart) mma(st.o[d + 1], al, b[2], b[3]);
  }
}

/// The rest of a step after the scores (qk_pair, qk_sum): keys key0 + ... outside
/// [r_lo[r], r_hi[r]] of row r masked, softcap (when > 0), online softmax into st, then
/// O += P V with V's rows at vt (shared, pitch<D>()). Template flags and full / hi_rows / mask
/// as tile_step.
template <int D, int NT, bool kSoftcap, bool kLog2, bool kOnePart, bool kQ8 = false>
__device__ __forceinline__ void softmax_pv(const __half* vt, int key0, float (&s)[NT][4], const int (&r_lo)[2],
                                           const int (&r_hi)[2], float softcap, RowState<D>& st, bool full,
                                           bool hi_rows, bool mask, const float* vd = nullptr) {
  constexpr int DT = D / 8;
  const int lane = threadIdx.x & 31, c = lane & 3;
  auto live = [&](int n) { return tile_live<NT>(n, full); };
  // Softcap, mask (a branch for the whole warp), online softmax. s[n][e]: row g (e < 2) or g + 8,
  // key key0 + 8n + 2c + e % 2.
  if (kSoftcap && softcap > 0.0f) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e)
        if (e < 2 || hi_rows) s[n][e] = softcap * tanhf(s[n][e] / softcap);
  }
  if (mask || !full) {
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int key = key0 + n * 8 + 2 * c + (e & 1), r = e >> 1;
        if ((r == 0 || hi_rows) && !(live(n) && key >= r_lo[r] && key <= r_hi[r])) s[n][e] = -INFINITY;
      }
  }
  float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e >= 2 && !hi_rows) continue;
      mx[e >> 1] = fmaxf(mx[e >> 1], s[n][e]);
    }
  float base[2] = {0.0f, 0.0f};
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    if (r == 1 && !hi_rows) continue;
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
    mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
    const float m_new = fmaxf(st.m[r], mx[r]);
    const float corr = st.m[r] == -INFINITY ? (m_new == -INFINITY ? 1.0f : 0.0f)
                       : kLog2               ? exp2_ftz(st.m[r] - m_new)
                                             : expf(st.m[r] - m_new);
    st.m[r] = m_new;
    base[r] = m_new == -INFINITY ? 0.0f : m_new;
    st.l[r] *= corr;
    // O rescaled where a row's maximum rose (decided for the whole warp: after the first tiles
    // of a long row most tiles raise none).
    if (__any_sync(0xffffffffu, corr != 1.0f)) {
#pragma unroll
      for (int d = 0; d < DT; ++d) st.o[d][2 * r] *= corr, st.o[d][2 * r + 1] *= corr;
    }
  }
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      if (e >= 2 && !hi_rows) continue;
      const float p = kLog2 ? exp2_ftz(s[n][e] - base[e >> 1]) : expf(s[n][e] - base[e >> 1]);  // masked: 0
      s[n][e] = p;
      st.l[e >> 1] += p;
    }
  // Q8_0: V holds the integers q, and each 32-dimension block b of the output takes P times its
  // keys' scales d times f[b] = 2^(14 - e), e the exponent of the step's largest scale of the
  // block (d f < 2^15): two f16 parts of x = p d f then keep ~22 bits where the block's scales are
  // within 2^14 of its largest (without f, lo of a small d would fall into the f16 subnormals).
  // o of block b holds f times its value (st.vf, rescaled here when f changes; q8_unscale).
  constexpr int NB = q8_blocks<D>();
  [[maybe_unused]] float f[NB];
  if constexpr (kQ8) {
    float vmax = 0.0f;  // lane l: block l % NB; the scales of the live n-tiles' keys only (the
                        // rows past them may lie past the scale array)
    const int scales = (full || NT < 4 ? NT : NT / 2) * 8 * NB;
#pragma unroll
    for (int i = lane; i < NT * 8 * NB; i += 32)
      if (i < scales) vmax = fmaxf(vmax, vd[i]);
#pragma unroll
    for (int o = NB; o < 32; o *= 2) vmax = fmaxf(vmax, __shfl_xor_sync(0xffffffffu, vmax, o));
#pragma unroll
    for (int b = 0; b < NB; ++b) {
      const int eb = int(__float_as_uint(__shfl_sync(0xffffffffu, vmax, b)) >> 23) & 0xff;
      // (No finite non-zero scale in the step: f stays, so o is not rescaled there and back.)
      f[b] = eb == 0 || eb == 0xff ? st.vf[b] : __uint_as_float(uint32_t(268 - eb) << 23);
      if (f[b] != st.vf[b]) {  // (the same for the whole warp)
        const float r = f[b] / st.vf[b];
#pragma unroll
        for (int d = 4 * b; d < 4 * b + 4; ++d) st.o[d][0] *= r, st.o[d][1] *= r, st.o[d][2] *= r, st.o[d][3] *= r;
        st.vf[b] = f[b];
      }
    }
  }
  // O += P V, P as A fragments (hi + lo; hi only with kOnePart) of 16 keys; ldmatrix.trans gives
  // V's B fragments of two n-tiles of 8 dimensions.
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    if (!live(2 * kk)) continue;
    uint32_t ah[4], al[4];
    if constexpr (kQ8) {
      // Lane (g, c): keys 2c, 2c + 1 and 8 + 2c, 9 + 2c of the 16.
      const float* d0 = vd + (kk * 16 + 2 * c) * NB;
      const float* d1 = d0 + 8 * NB;
#pragma unroll
      for (int b = 0; b < NB; ++b) {
        const float dk[2][2] = {{d0[b] * f[b], d0[NB + b] * f[b]}, {d1[b] * f[b], d1[NB + b] * f[b]}};
        p_fragments<NT, true>(s, kk, dk, ah, al);
        pv_products<D, kOnePart>(vt, kk, ah, al, 4 * b, 4 * b + 4, st);
      }
    } else {
      p_fragments<NT, false>(s, kk, {}, ah, al);
      pv_products<D, kOnePart>(vt, kk, ah, al, 0, DT, st);
    }
  }
}

/// One warp's step over NT * 8 keys starting at key0, whose K / V rows start at kt / vt
/// (shared, pitch<D>()): S = q K^T, keys outside [r_lo[r], r_hi[r]] of row r masked, softcap
/// (when > 0), online softmax, O += P V. full = false (NT >= 4; ignored below): only the first
/// NT / 2 n-tiles (NT / 2 * 8 keys), the rest skipped and masked, their rows of kt / vt never
/// read (decode attention's one step code for 16- and 32-key warp slices). kChains: accumulators
/// per n-tile (the four products of a k-step pair go to separate ones: chains of 2 KS / kChains
/// dependent MMAs, summed at the end).
/// hi_rows = false: rows g + 8 hold no query (decode with at most 8 (token, head) pairs): their
/// softmax is skipped (P keeps their raw scores), so their o, m and l must not be read; rows g
/// are unaffected (a row of an MMA's result depends only on the same row of A).
/// kSoftcap = false: softcap is ignored (its tanh per score is a third of decode attention's
/// step code, which waits on instruction fetch; docs/cuda.md, v18).
/// kLog2: the scores are in log2 units (q times scale * log2 e, softcap * log2 e), so the
/// softmax takes exp2_ftz (one MUFU.EX2) instead of expf's range reduction; m too is in
/// log2 units (prefill: 10-14% faster on the H200, docs/cuda.md v33; decode: v34).
/// kOnePart: q and p as one f16 part (no lo products): half the MMAs, to ~2^-11 relative
/// (BackendOptions::half_prefill, llama.cpp's numerics).
/// mask = false: every key of the step lies in every row's range (r_lo / r_hi are not read): the
/// prefill kernel's tiles below the diagonal skip the mask's compares (with full = false the
/// skipped n-tiles are still masked).
/// kQ8: kt / vt hold the integers q of Q8_0 rows (convert_q8_tiles) and kd / vd the scales of
/// the step's keys ([key][q8_blocks]): each k-step pair (a 32-value block b) sums its scores
/// apart and adds them times the key's K scale d_b; P is multiplied by the V scales (and a power
/// of two) per block of the output (softmax_pv; st.q8_unscale after the last step). The q K
/// products stay exact; p d is split into two f16 parts as p alone is on f16 caches.
template <int D, int NT, int kChains = (NT <= 2 ? 4 : 1), bool kSoftcap = true, bool kLog2 = false,
          bool kOnePart = false, bool kQ8 = false>
__device__ __forceinline__ void tile_step(const __half* kt, const __half* vt, int key0, const uint32_t (&qh)[D / 16][4],
                                          const uint32_t (&ql)[D / 16][4], const int (&r_lo)[2], const int (&r_hi)[2],
                                          float softcap, RowState<D>& st, bool full = true,
                                          bool hi_rows = true, bool mask = true, const float* kd = nullptr,
                                          const float* vd = nullptr) {
  float acc[kChains][NT][4], s[NT][4];
  if constexpr (kQ8) {
    constexpr int NB = q8_blocks<D>();
    const int c = threadIdx.x & 3;
#pragma unroll
    for (int n = 0; n < NT; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ks += 2) {
      float blk[NT][4];
      qk_zero(acc);
      qk_pair<D, NT, kChains, kOnePart>(kt, ks, qh[ks], ql[ks], qh[ks + 1], ql[ks + 1], acc, full);
      qk_sum(acc, blk);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        if (!tile_live<NT>(n, full)) continue;
        const float d0 = kd[(n * 8 + 2 * c) * NB + ks / 2], d1 = kd[(n * 8 + 2 * c + 1) * NB + ks / 2];
        s[n][0] = fmaf(d0, blk[n][0], s[n][0]);
        s[n][1] = fmaf(d1, blk[n][1], s[n][1]);
        s[n][2] = fmaf(d0, blk[n][2], s[n][2]);
        s[n][3] = fmaf(d1, blk[n][3], s[n][3]);
      }
    }
  } else {
    qk_zero(acc);
#pragma unroll
    for (int ks = 0; ks < D / 16; ks += 2)
      qk_pair<D, NT, kChains, kOnePart>(kt, ks, qh[ks], ql[ks], qh[ks + 1], ql[ks + 1], acc, full);
    qk_sum(acc, s);
  }
  softmax_pv<D, NT, kSoftcap, kLog2, kOnePart, kQ8>(vt, key0, s, r_lo, r_hi, softcap, st, full, hi_rows, mask, vd);
}

}  // namespace shoal::cuda::attn_mma
