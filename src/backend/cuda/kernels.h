// Host-side launchers of the CUDA kernels (defined in the .cu files beside this header). Each
// enqueues its kernel(s) on `stream` and returns the launch status (cudaGetLastError), so the
// caller can turn it into a Status. Pointers are device memory; shapes are as in backend.h.
// Every kernel has a CPU twin in src/backend/cpu/ref_ops.h and a test in tests/cuda/.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/sampling_math.h"

namespace shoal::cuda {

/// How a weight (or embedding table) is stored on the device.
enum class WKind : int { kF32, kF16, kBF16, kQ8_0, kQ4_0 };

/// A weight as the kernels see it. data: [rows, cols] plain values, or the repacked quants of
/// cuda_util.h; scales: the f16 block scales (Q8_0, Q4_0), else null.
struct WeightRef {
  WKind kind = WKind::kF32;
  const void* data = nullptr;
  const uint16_t* scales = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

/// Turns programmatic dependent launch on or off for this process (on for sm_90+ devices).
void set_pdl(bool on);
/// Whether kernels may use thread-block clusters (sm_90+; set by each backend as it starts).
/// Returns the setting before.
bool set_clusters(bool on);
/// Whether the kernels the driver runs on the current device were compiled for sm_90 or later
/// (not the case for a build of older architectures JIT-compiled from PTX): PDL and clusters
/// need it.
bool device_code_sm90();

#ifdef SHOAL_CUDA_TIMELINE
/// Diagnostic builds (timeline.cuh). One block's pass through pdl_prologue: %globaltimer (ns) on
/// arrival and when the wait on the previous kernel returned, the SM, the block's linear index,
/// the grid's blocks and threads.
struct TimelineRecord {
  unsigned long long arrive, release;
  unsigned sm, block, grid, threads;
};
/// Where blocks append their records (recs null: recording off).
struct TimelineSink {
  TimelineRecord* recs;
  unsigned* count;
  unsigned cap;
};
/// Registers one .cu file's sink setter (timeline.cuh does it); returns 0.
int timeline_register(cudaError_t (*set)(const TimelineSink&));
/// Points every kernel's recording at recs (cap records; *count is the next free one, reset by
/// the caller), or turns recording off (recs null); synchronizes the device, so kernels started
/// after it see the new sink.
cudaError_t timeline_start(TimelineRecord* recs, unsigned* count, unsigned cap);
#endif

/// Activation ids, equal to shoal::Activation's order (silu, gelu tanh, gelu erf).
enum class Act : int { kSilu = 0, kGeluTanh = 1, kGeluErf = 2 };

/// Cache element kinds for kv_write / attention.
enum class CacheKind : int { kF32, kF16, kQ8_0 };

// ---- weights.cu -----------------------------------------------------------------------------
/// Repacks GGUF blocks [first, first + n_blocks) of a [rows, cols] Q8_0 (34-byte blocks) or Q4_0
/// (18-byte blocks) weight, read from `raw` (the chunk's bytes), into the tensor-core tile quants
/// and scales of cuda_util.h (the whole tensor's arrays, zeroed before the first chunk).
cudaError_t repack_blocks(bool q4, const uint8_t* raw, int64_t first, int64_t n_blocks, int64_t cols, uint8_t* quants,
                          uint16_t* scales, cudaStream_t stream);
/// BF16 weights held as F16 (CudaBackend::settle_weights): adds to *bad (device int) the number
/// of rows of the BF16 matrix w [rows, cols] that F16 would not hold: a value that is not finite
/// or rounds to an infinite f16 (|v| > 65504), or a row whose rounding error sum (v - f16(v))^2
/// exceeds 2^-40 sum v^2 (2^-20 normalised, below the f32 rounding of a dot product of more than
/// 256 terms, sqrt(256) 2^-24). F16 holds every bf16 value of magnitude 2^-17 .. 65280 exactly;
/// smaller ones move by at most 2^-25. A tensor of N(0, sigma) rows passes for sigma above
/// ~0.002 (4096 columns) to ~0.003 (1024 columns); at sigma 0.02 about 2e-4 of the values move,
/// rows to ~2^-26 normalised. Sums in f64.
cudaError_t bf16_rows_not_f16(const uint16_t* w, int64_t rows, int64_t cols, int* bad, cudaStream_t stream);
/// Rewrites the n BF16 values at w in place as F16 (round to nearest even).
cudaError_t bf16_to_f16_in_place(uint16_t* w, int64_t n, cudaStream_t stream);

// ---- gemv.cu: matmul for n <= kGemvMaxTokens tokens, weights read once ---------------------
constexpr int kGemvMaxTokens = 8;
/// Where gemm_quant runs (Hopper), Q8_0 / Q4_0 products of this many tokens or more take it
/// instead of the GEMV: from 5 tokens its items of 32 columns beat the GEMV's 8-token tiles
/// (H100, Llama-3-8B Q4_0 / Q8_0 steps of 5 to 8 tokens 1.3-1.4x, of 4 tokens even; docs/cuda.md v51).
constexpr int kQuantGemmMinTokens = 5;
/// Attention calls of kGemvMaxTokens + 1 to this many tokens (a pool's 16-token frames, a lap of
/// 1 + K drafts) run on the decode kernel (attention_decode_mma.cu) where its plan is one cluster
/// of up to 4 splits (sm_90, at most 1792 keys): one kernel, no combine, older keys loaded before
/// the PDL wait (H100, Llama-3-8B Q4_0, 16 tokens over 512 keys: attention 15.4 -> 12.4 us, the
/// layer 128.3-130.0 -> 123.4-124.1 us; docs/cuda.md, v54). Longer calls, or those without a
/// cluster plan, take the prefill kernel and the combine.
constexpr int kDecodeAttnMaxTokens = 16;
/// y[t, r] = sum_k w[r, k] * x[t, k] (+ bias[r]). x: f32 [n, cols]; y: f32 [n, rows]; n in
/// [1, kGemvMaxTokens]. f32 accumulation.
cudaError_t gemv(const WeightRef& w, const float* x, int n, const float* bias, float* y, cudaStream_t stream);
/// out[t, r] = act(gate[r] . x[t]) * (up[r] . x[t]); gate and up have the same shape and kind.
cudaError_t gemv_glu(const WeightRef& gate, const WeightRef& up, const float* x, int n, Act act, float* out,
                     cudaStream_t stream);
/// One product of gemv_multi(): y = x . wᵀ (+ bias), or with `up` act(x . wᵀ) * (x . upᵀ).
struct GemvOut {
  WeightRef w;
  const WeightRef* up = nullptr;
  const float* bias = nullptr;  // [w.rows] or null (not with up)
  float* y = nullptr;           // f32 [n, w.rows]
  float* y2 = nullptr;          // GemvOpts::split_k: the second column half's partial [w.rows]
};
/// RoPE and the KV cache write as the epilogue of a q / k / v launch of gemv_multi() (one token,
/// outs[0..2] = q, k, v; plain weights): q and k are rotated by pos[0] * inv_freq in interleaved
/// pairs (2i, 2i + 1) of the first rot_dims dims of every head_dim-wide head (RoFormer,
/// arXiv:2104.09864; cos / sin and the rotation in double, as rope()), and k and v are also
/// stored as f16 at row pos[0] of k_cache / v_cache ([n_ctx, k rows]; skipped outside [0, n_ctx)),
/// as kv_write(). The same values as the GEMV, rope() and kv_write() launched one after another.
/// The epilogue reads pos and computes cos / sin after the products, so they hold no registers
/// through the weight loop.
struct GemvRope {
  const int32_t* pos = nullptr;
  const float* inv_freq = nullptr;  // [rot_dims / 2]
  int head_dim = 0, rot_dims = 0;
  float attn_factor = 1.0f;
  void* k_cache = nullptr;  // f16 [n_ctx, k rows]
  void* v_cache = nullptr;
  int64_t n_ctx = 0;
};
/// What the products of one gemv_multi() launch share.
struct GemvOpts {
  const float* norm_w = nullptr;  // RMSNorm weight [cols]: the input is rms_norm(x) (eps below)
  float eps = 0.0f;
  bool accumulate = false;  // y += result (a residual add)
  Act act = Act::kSilu;     // of the GLU products
  // The bias and, when accumulating, the old y may be read before the PDL wait (launch.cuh):
  // only when the kernel launched just before writes neither. Off: read after it.
  bool early_epilogue = false;
  // RoPE and the KV cache write fused into the epilogue (q / k / v of one token), or null.
  const GemvRope* rope = nullptr;
  // Q8_0 / Q4_0 and one token only (gemv_quant). frags_out: the launch also writes its output
  // y as the activation fragments of a quantized GEMV that reads y next (gemv_frag_bytes(rows)
  // bytes at frags_out; one GLU product of rows % 32 == 0). frags_in: x as fragments written
  // so by the launch just before (no norm_w, no up; Q4_0: cols % 64 == 0): the launch copies
  // them instead of building them from x, with the same results bit for bit. Errors:
  // cudaErrorInvalidValue otherwise.
  void* frags_out = nullptr;
  const void* frags_in = nullptr;
  // Split-K (Q8_0 only, one token, no up, no bias, no accumulate, no fragments; chunks per row a
  // multiple of 16: cols % 512): each product is computed as two column halves by different
  // blocks, so a launch of 1.45 rounds of units (Llama-3-8B q / k / v) takes 2.9 of half the
  // size. y gets the first half's partial dot products of x (times the norm weight), y2 the
  // second's, and with norm_w split_ss[0], [1] the halves' sums of x^2; the reader computes
  // (y + y2) / rms (AttnRope::q2 / k2 / v2 / in_ss). Errors: cudaErrorInvalidValue otherwise,
  // without every y2, or with norm_w and no split_ss.
  bool split_k = false;
  float* split_ss = nullptr;
};
/// Bytes of the activation fragments of a quantized GEMV input of `cols` values (a multiple of
/// 32), one token: per 32-value word, 8 16-byte words of f16 hi and lo parts in the MMA's
/// B-operand order (gemv_quant.cu), then f32 [cols / 32], each word's 1 / scale.
int64_t gemv_frag_bytes(int64_t cols);
constexpr int kGemvMaxOuts = 3;
/// Up to kGemvMaxOuts products of the same input in one launch (q, k and v of a layer): every
/// weight has the same kind and cols, and all or none have `up`. With norm_w, each block
/// computes the RMS of x itself (Zhang & Sennrich 2019; the 1/rms factor multiplies the dot
/// products, the norm weight the activations), so the normed input is never written.
/// Errors: cudaErrorInvalidValue for mixed kinds or widths, count or n out of range; with
/// opts.rope, unless there are exactly three non-empty products of one token on the vector path
/// (plain weights, cols a multiple of the values per 16 bytes, x and norm_w 16-byte aligned),
/// none accumulating or with `up`, q and k rows whole heads of an even head_dim, k and v the same
/// rows, an even rot_dims <= head_dim, and pos, the caches and (rot_dims > 0) inv_freq given.
cudaError_t gemv_multi(const GemvOut* outs, int count, const float* x, int n, const GemvOpts& opts,
                       cudaStream_t stream);
/// The Q8_0 / Q4_0 path of gemv_multi() (gemv_quant.cu): f16 tensor-core MMAs on the tile
/// layout of cuda_util.h, exact to ~2^-22 relative. The products are already validated by
/// gemv_multi(). Errors: cudaErrorInvalidValue when cols is not a multiple of 32 or not below
/// 2^30 (32-bit column indices), or x / norm_w are not 16-byte aligned.
cudaError_t gemv_quant(const GemvOut* outs, int count, const float* x, int n, const GemvOpts& opts,
                       cudaStream_t stream);
/// The current device's SM count and opt-in shared memory per block (bytes), read once per device
/// (gemv_quant.cu). Errors: the CUDA API's.
struct DeviceLimits {
  int device = 0, sms = 0, smem_optin = 0;
};
cudaError_t device_limits(DeviceLimits& out);
/// Rows per block of the GEMV (0: per dtype; plain weights 1, 2, 4; quantized 16 or 32). For
/// benchmarks.
void set_gemv_rows_override(int rows_per_block);
int gemv_rows_override();
/// Prefill attention's PrefillPlan::halves (attention_prefill.cu) from now on: 1 or 2 forced, 0
/// as planned. For tests and benchmarks.
void set_prefill_halves(int halves);

// ---- gemm_prep.cu: helpers of the prefill paths (n > kGemvMaxTokens; gemm_quant from 5) -----
// cuBLAS multiplies 16-bit operands with f32 accumulation. To stay within ~1e-6 of the f32
// reference, the f32 activations are split into a sum of 16-bit parts (x = hi + lo (+ lo2)), the
// dequantized weights into hi + lo f16 parts, and the partial products summed in f32.
/// Splits x [n, k] (RMSNorm'ed first with norm_w [k] and eps when norm_w is not null) into
/// `parts` 16-bit parts out[p][t][:] with sum_p out[p][t] ~ x[t] * scale[t] (f16: scale[t] a
/// power of two that keeps row t inside the f16 range; bf16: 1), and writes inv_scale[t] =
/// 1 / scale[t].
cudaError_t split_activations(const float* x, int64_t n, int64_t k, bool bf16, int parts, const float* norm_w,
                              float eps, uint16_t* out, float* inv_scale, cudaStream_t stream);
/// Dequantizes rows [r0, r0 + nr) of w into hi and lo f16 parts, [nr, cols] each, hi + lo = w
/// (exact for Q8_0 and Q4_0 values). Errors: cudaErrorInvalidValue unless w is Q8_0 or Q4_0 and
/// r0 a multiple of 16 (a tile).
cudaError_t dequant_split(const WeightRef& w, int64_t r0, int64_t nr, uint16_t* hi, uint16_t* lo, cudaStream_t stream);
/// y[t, r] = (yp[0][t][r] + lo * sum_{b > 0} yp[b][t][r]) * inv_scale[t] (+ bias[r]) (+ y[t, r]
/// when accumulating), yp: [blocks, n, ld] of which the first `rows` of each token are read (ld
/// 0: rows); lo: 1, or 1 / 2^11 for products of glu_parts' parts; inv_scale and bias may be null;
/// y may alias yp when blocks == 1 and ld == rows. 4 elements per thread when rows and ld are
/// multiples of 4 and yp is 16-byte aligned (y too, then). Errors: cudaErrorInvalidValue if 0 <
/// ld < rows.
cudaError_t combine_parts(const float* yp, int blocks, int64_t n, int64_t rows, const float* inv_scale,
                          const float* bias, bool accumulate, float* y, cudaStream_t stream, int64_t ld = 0,
                          float lo = 1.0f);
/// y[t, r] = act(g) * u with g = (sum_b gate[b][t][r]) * inv_scale[t], u likewise from up
/// (gate [gate_blocks, n, ld], up [up_blocks, n, ld], of which the first `rows` of each token are
/// read (ld 0: rows; gate and up of one stacked product: up = gate + rows, ld = 2 rows); gate and
/// up of different kinds may come in different parts). Errors: cudaErrorInvalidValue unless rows
/// and ld are multiples of 4 and ld >= rows.
cudaError_t combine_glu(const float* gate, int gate_blocks, const float* up, int up_blocks, int64_t n, int64_t rows,
                        const float* inv_scale, Act act, float* y, cudaStream_t stream, int64_t ld = 0);

/// combine_parts(yp, blocks, n, k, p_inv_scale, bias, accumulate = true, y, ld, lo) and then
/// split_activations(y, n, k, bf16, parts, norm_w, eps, out, inv_scale) in one pass, one block
/// per row: the residual add of a block and the next block's input parts (MatmulOut::next),
/// the same values as the two, y written once and not read again. Errors: cudaErrorNotSupported
/// where split_activations' vector path does not apply (k % 4, k > 16384, alignment: yp and y
/// 16 bytes, out 8, norm_w 16) or ld % 4 != 0 or ld < k: the caller then runs the two.
cudaError_t combine_split(const float* yp, int blocks, int64_t ld, float lo, const float* p_inv_scale,
                          const float* bias, float* y, int64_t n, int64_t k, bool bf16, int parts, const float* norm_w,
                          float eps, uint16_t* out, float* inv_scale, cudaStream_t stream);
/// glu_parts' shift of the f16 low part (2^11); its products are summed with lo = 1 / kGluLoShift.
constexpr float kGluLoShift = 2048.0f;
/// The GLU of a prefill FFN as the down product's input (Backend::gated_ffn): h = act(g) * u of
/// token t, with g, u as combine_glu sums them, written as `parts` 16-bit parts out [parts][n]
/// [rows], one pass over gate and up where combine_glu then split_activations write h in f32
/// and read it again. f16 (parts 1 or 2): h times scale[t]; part 0 = f16(h s), part 1 = f16((h
/// s - part 0) * 2^11), the low part shifted to the high part's magnitude so that it stays clear
/// of the f16 subnormals without a per-row scale (its products are summed with lo = 2^-11 by
/// combine_parts); scale[t] is 1 where the row's max |h| lies in [2^-14, 2^15) (or is 0 or not
/// finite), otherwise the power of two that puts it in [2^14, 2^15) (within 2^+-100), as
/// split_activations, and the row is written twice. bf16 (parts 1 or 3): as
/// split_activations, scale 1, no shift.
/// out_inv_scale[t] = 1 / scale[t]. Errors: cudaErrorInvalidValue unless rows and ld are
/// multiples of 4, ld >= rows (0: rows), parts is in range and out is 8-byte aligned.
cudaError_t glu_parts(const float* gate, int gate_blocks, const float* up, int up_blocks, int64_t n, int64_t rows,
                      const float* inv_scale, Act act, bool bf16, int parts, uint16_t* out, float* out_inv_scale,
                      cudaStream_t stream, int64_t ld = 0);

// ---- gemm_quant.cu: the quantized prefill GEMM on Hopper ---------------------------------------
/// One product of gemm_quant: y[j * rows + r] = (accumulate ? y : 0) + bias[r] + inv_scale[j] *
/// sum_k W[r, k] x[j, k] (the operations in combine_parts' order).
struct QuantGemmOut {
  float* y;                    // [n, rows]
  const float* bias = nullptr;  // [rows] or null
  bool accumulate = false;
};
/// Scratch of gemm_quant's split K: `partial` holds partial_floats f32 (any contents), `counters`
/// counter_count u32 that are zero before the launch (a launch leaves them zero). Null partial:
/// no split. `used`, if set, receives the ranges each item's K was split into (1: none).
/// item_tokens: 0 lets gemm_quant choose a work item's tokens; else those (16, 32, 64 or 128 with
/// two parts; 32, 64 or 128 with one), for tests and benchmarks of each width.
struct QuantGemmSplit {
  float* partial = nullptr;
  uint64_t partial_floats = 0;
  unsigned* counters = nullptr;
  int counter_count = 0;
  int* used = nullptr;
  int* blocks_per_sm = nullptr;  // out, if set: the launch's resident blocks per SM (two for Q4_0 at 32 columns)
  int item_tokens = 0;
  int* item_tokens_used = nullptr;  // out, if set: a work item's tokens in the launch
};
/// The scratch gemm_quant may use for split K on a device of `sms` SMs: sms work items of at most
/// 64 tokens x 128 rows of f32 (and sms counters).
constexpr uint64_t gemm_quant_split_floats(int sms) { return uint64_t(sms) * 64 * 128; }
/// The prefill products of up to kGemvMaxOuts Q8_0 / Q4_0 weights of one kind and width on
/// Hopper's wgmma, one launch (gemm_quant.cu), for n tokens split by split_activations into
/// `parts` (x16 [parts * n, cols] f16, 16-byte aligned: the hi rows, then the lo rows; one part:
/// f16 x alone, BackendOptions::half_prefill; inv_scale [n] its 1 / scales, or null for 1):
/// out[i] as QuantGemmOut says, exact like the GEMV with two parts (f16 products of the small
/// integers q - 8 or q, f32 sums per 32-value block times the block scale, the parts summed in
/// registers). With glu (count 2: gate and up of the same rows; out[0] only, no bias, no
/// accumulate): out[0].y = act(gate) * up, as combine_glu. Only where gemm_quant_available().
/// w's quants and scales as uploaded (256-byte aligned).
/// Errors: cudaErrorNotSupported where !gemm_quant_available(); cudaErrorInvalidValue for other
/// kinds, mixed kinds or widths, cols % 32 != 0, a misaligned x16, parts other than 1 or 2, a
/// count out of 1..kGemvMaxOuts, a glu of other than two weights of one shape or with a bias or
/// accumulate, more than INT32_MAX / (an item's tokens: 16 to 128) rows, an item_tokens the parts
/// do not allow, or a tensor map the driver refuses.
/// A work item is a block of 128 rows (glu: 64 of gate and of up) by some tokens: with two parts
/// the narrowest of 16 / 32 / 64 that holds a short call's, else 64, or 128 where the call has
/// enough items to fill the SMs in fewer rounds (a 512-token prompt through Llama-3-8B's wo,
/// gate / up and down); with one part the narrowest of 32 / 64 / 128 that holds it, else 128.
/// A call of few work items (items of at most 64 tokens over few rows: a pool's 16-token frame
/// through wo or down) splits each item's K over up to 8 blocks where `split` has room (gemm_quant_split_floats):
/// each writes its partial sums to split.partial, and the last to finish (split.counters) adds
/// them in split order and applies the epilogue, so results do not depend on timing (they do on
/// n and the device's SM count, which choose the split: f32 sums in another order).
cudaError_t gemm_quant(const WeightRef* w, const QuantGemmOut* out, int count, const uint16_t* x16, int parts,
                       const float* inv_scale, int64_t n, bool glu, Act act, cudaStream_t stream,
                       const QuantGemmSplit& split = {});
/// Whether the current device runs gemm_quant(): compute capability 9.0, the build's sm_90a code
/// and the driver's tensor-map encoder. The first call per device runs a probe kernel and a
/// synchronous copy (not during a graph capture).
bool gemm_quant_available();

// ---- norm.cu --------------------------------------------------------------------------------
/// y = x / sqrt(mean(x^2) + eps) * w over `groups` groups of g values. y may alias x.
cudaError_t rms_norm(const float* x, const float* w, int64_t groups, int64_t g, float eps, float* y,
                     cudaStream_t stream);
/// x += delta; y = rms_norm(x) per row of d values (rows rows).
cudaError_t add_rms_norm(float* x, const float* delta, const float* w, int64_t rows, int64_t d, float eps, float* y,
                         cudaStream_t stream);
/// y = (x - mean) / sqrt(var + eps) * w (+ b) per row of d values. b may be null.
cudaError_t layer_norm(const float* x, const float* w, const float* b, int64_t rows, int64_t d, float eps, float* y,
                       cudaStream_t stream);

// ---- elementwise.cu -------------------------------------------------------------------------
cudaError_t add(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream);
cudaError_t scale(float* x, float s, int64_t n, cudaStream_t stream);
/// out = act(gate) * up.
cudaError_t glu(const float* gate, const float* up, Act act, float* out, int64_t n, cudaStream_t stream);
cudaError_t activation(const float* x, Act act, float* out, int64_t n, cudaStream_t stream);
/// Converts n values between F32 (0), F16 (1) and BF16 (30) (the DType ids).
cudaError_t convert(const void* src, int src_dtype, void* dst, int dst_dtype, int64_t n, cudaStream_t stream);
/// out[i, :] = table[ids[i], :] as f32; ids outside [0, rows) give a row of NaN.
cudaError_t embed(const WeightRef& table, const int32_t* ids, int64_t n, float* out, cudaStream_t stream);

// ---- rope_kv.cu -----------------------------------------------------------------------------
struct RopeArgs {
  int64_t n_tokens = 0;
  int n_heads = 0, head_dim = 0, rot_dims = 0;
  bool interleaved = false;
  float attn_factor = 1.0f;
};
/// Rotates x [n_tokens, n_heads * head_dim] in place by positions pos [n_tokens] and
/// inv_freq [rot_dims / 2]; angles and their cos/sin in double, as the reference.
cudaError_t rope(float* x, const int32_t* pos, const float* inv_freq, const RopeArgs& a, cudaStream_t stream);
/// The attention prologue of a layer in one kernel: q_norm / k_norm (per-head RMSNorm, either
/// may be null), RoPE of q [n, n_heads * head_dim] and k [n, n_kv_heads * head_dim] in place,
/// and the cache write of k and v as kv_write(). head_dim <= 256; for a Q8_0 cache head_dim is
/// a multiple of 32.
struct QkvArgs {
  RopeArgs rope;  // rope.n_heads: heads of q
  int n_kv_heads = 0;
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float eps = 0.0f;
  CacheKind cache = CacheKind::kF16;
  int64_t n_ctx = 0;
};
/// The partial products of q / k / v's stacked prefill GEMM (CudaBackend::gemm_products over their
/// rows, q's then k's then v's), as rope_kv_write's input instead of q, k and v: element (t, r) is
/// (sum_b yp[b][t][r]) * inv_scale[t] (+ bias), as combine_parts sums it.
struct QkvParts {
  const float* yp = nullptr;  // [blocks][n][ld], 16-byte aligned
  int blocks = 0;
  int64_t ld = 0;                      // at least (n_heads + 2 n_kv_heads) * head_dim; a multiple of 4
  const float* inv_scale = nullptr;    // [n] or null (1)
  const float* bias[3] = {};           // of q, k, v, or null
  float* v = nullptr;                  // v's output [n, n_kv_heads * head_dim]
};
/// Runs the prologue above: q [n, n_heads * head_dim] and k [n, n_kv_heads * head_dim] normed and
/// rotated in place, k and v stored at cache rows pos[i] (skipped outside [0, n_ctx)). With
/// parts, q, k and v are first summed from them (v written to parts->v; the v argument unused),
/// so the products need no combine pass of their own.
/// Errors: cudaErrorInvalidValue for head_dim > 256, odd rot_dims or rot_dims > head_dim, a Q8_0
/// cache with head_dim % 32 != 0 (the backend composes the plain ops instead); with parts, also
/// a null yp or v, blocks < 1, head_dim or ld not a multiple of 4, ld short of the rows, or yp
/// not 16-byte aligned.
cudaError_t rope_kv_write(float* q, float* k, const float* v, const int32_t* pos, const float* inv_freq,
                          const QkvArgs& a, void* k_cache, void* v_cache, cudaStream_t stream,
                          const QkvParts* parts = nullptr);
/// Stores k and v rows (f32 [n, width]) at cache rows pos[i] (caches [n_ctx, width] of `kind`;
/// Q8_0 rows quantized as ggml's quantize_row_q8_0_ref). Positions outside [0, n_ctx) are skipped.
cudaError_t kv_write(void* k_cache, void* v_cache, CacheKind kind, int64_t n_ctx, int64_t width, const float* k,
                     const float* v, int64_t n, const int32_t* pos, cudaStream_t stream);

// ---- attention.cu ---------------------------------------------------------------------------
/// The prologue of rope_kv_write (QkvArgs) run inside decode attention (rope_kv_attention in
/// attention_decode_mma.cu): q is the raw projection; the kernel norms and rotates the q rows it
/// reads, and stores the step's k (normed, rotated) and v rows (f32 [n_tokens, n_kv_heads *
/// head_dim]) at cache rows pos[t] (skipped outside [0, n_ctx)).
struct AttnRope {
  const float* k = nullptr;
  const float* v = nullptr;
  // The second partials of a split-K q / k / v GEMV (GemvOpts::split_k; shaped as q, k, v), or
  // null: the kernel reads (q + q2) / rms, (k + k2) / rms, (v + v2) / rms, the rms of the input
  // RMSNorm from in_ss[0] + in_ss[1] (sum of x^2 over in_cols values; GemvOpts::split_ss) and
  // in_eps, or 1 without in_ss.
  const float* q2 = nullptr;
  const float* k2 = nullptr;
  const float* v2 = nullptr;
  const float* in_ss = nullptr;
  int64_t in_cols = 0;
  float in_eps = 0.0f;
  const float* q_norm = nullptr;  // [head_dim] or null
  const float* k_norm = nullptr;
  float eps = 0.0f;
  const float* inv_freq = nullptr;  // [rot_dims / 2]
  int rot_dims = 0;
  bool interleaved = false;
  float attn_factor = 1.0f;
};
struct AttnArgs {
  int64_t n_tokens = 0;
  int64_t n_ctx = 0;  // cache rows
  int n_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 0.0f;
  int sliding_window = 0;
  float softcap = 0.0f;
  CacheKind cache = CacheKind::kF16;
  // The kernel just before this call wrote these caches only at the rows of pos (the KV write
  // of the same step): decode attention may load the other rows before its PDL wait.
  bool early_kv = false;
  // Keys a call attends at most (attention_keys_bound; 0: n_ctx). It picks the decode plan only:
  // a call that attends more is still exact, at the speed of a plan for fewer keys.
  int64_t max_keys = 0;
  // Prefill on the tensor cores: q and p as one f16 part each instead of hi + lo (half the
  // products, ~2^-11 relative; BackendOptions::half_prefill, as llama.cpp's flash attention).
  bool one_part = false;
};
/// The AttnArgs::max_keys to plan decode attention with when a step of n_tokens tokens attends at
/// most `keys` keys: the cluster plan's limit (1792) when keys fit under it, else 0 (a plan for
/// the whole cache); also 0 where no plan depends on it (steps of more than kDecodeAttnMaxTokens
/// tokens, or a device without clusters). On the H200 (Llama-3-8B heads, us per layer) one
/// cluster of 8 splits takes 5.8 at 576 keys vs 7.5 for up to 32 splits and the combine, but 14.9
/// vs 11.5 at 4096 keys: they cross near 1800 (docs/cuda.md, v28).
int64_t attention_keys_bound(int64_t keys, int n_tokens);
/// Bytes of scratch attention() needs for these arguments (split partial results): the most any
/// call of 1..a.n_tokens tokens with otherwise these arguments needs, so that a step of the
/// largest size (Slice::warm_up) has allocated the scratch of every smaller one.
uint64_t attention_scratch_bytes(const AttnArgs& a);
/// Bytes of scratch one attention() call of exactly a.n_tokens tokens uses (its splits' partial
/// o, m and l in f32; none on a cluster plan); attention_scratch_bytes is the most of these over
/// 1..n_tokens.
uint64_t attention_call_scratch_bytes(const AttnArgs& a);
/// Causal attention of q [n_tokens, n_heads * head_dim] against the caches, keys up to pos[t]
/// (read on the device), split along the sequence where a call has few blocks (flash-decoding,
/// at most 32 splits), the splits combined by a second kernel, or on sm_90 by a thread-block
/// cluster (calls of up to kDecodeAttnMaxTokens tokens with an f16 or Q8_0 cache, at most 1792
/// keys by AttnArgs::max_keys or n_ctx).
/// f16 and Q8_0 caches with head_dim 64 / 128 run on the tensor cores (attention_mma.h), except
/// decode with a softcap (the tiled kernel).
/// head_dim must be a multiple of 8 and at most 256; out 16-byte aligned. The decode kernel reads
/// pos before its PDL wait: pos must not be written by the kernel just before (the engine writes
/// it by host copies).
/// (Combining in the split kernel, by the last block of each head group to finish, measured
/// slower on the H200: 12.3 vs 11.7 us per layer at context 512.)
cudaError_t attention(const float* q, const void* k_cache, const void* v_cache, const int32_t* pos, const AttnArgs& a,
                      void* scratch, float* out, cudaStream_t stream);
/// Whether attention() runs these arguments on the tensor-core kernels (attention_mma.h).
bool attention_on_tensor_cores(const AttnArgs& a);
/// Whether attention() runs these arguments on the tensor-core decode kernel (attention_mma.h).
bool attention_on_decode_kernel(const AttnArgs& a);
/// Whether rope_kv_attention() takes these arguments: the decode kernel's (1..kGemvMaxTokens
/// tokens, f16 or Q8_0 caches, head_dim 64 / 128, no softcap) and an even rot_dims <= head_dim.
bool rope_kv_attention_supported(const AttnArgs& a, int rot_dims);
/// rope_kv_write() then attention() in one kernel (decode): q (raw, [n_tokens, n_heads *
/// head_dim]) normed and rotated as it is read, never written back; k and v of `r` stored in
/// the caches, the step's own rows also straight into the kernel's tiles. Saves the prologue
/// kernel and its wait on the decode path. pos, inv_freq, the norm weights and the caches' older
/// rows are read before the PDL wait (launch.cuh), so the kernel just before must write none of
/// them; r.v rows are read as float2 (8-byte aligned). With r.q2 / k2 / v2 (all or none) q, k
/// and v are each the sum of two partials. Errors: cudaErrorInvalidValue where
/// rope_kv_attention_supported() is false, for a misaligned v / v2 or some partials missing.
cudaError_t rope_kv_attention(const float* q, const AttnRope& r, void* k_cache, void* v_cache, const int32_t* pos,
                              const AttnArgs& a, void* scratch, float* out, cudaStream_t stream);

// ---- sampling.cu ----------------------------------------------------------------------------
/// Bytes of scratch argmax / top_k (and top_k_sample) need.
uint64_t argmax_scratch_bytes(int64_t rows, int64_t vocab);
uint64_t top_k_scratch_bytes(int64_t vocab, int k);
/// out[r] = the lowest index of the largest value of row r of logits [rows, vocab].
cudaError_t argmax(const float* logits, int64_t rows, int64_t vocab, void* scratch, int32_t* out, cudaStream_t stream);
/// The k largest of logits [vocab] into ids / vals [k], descending, ties by lower index (a NaN
/// ranks above +inf or below -inf by its sign bit; -0 and +0 tie). Errors: cudaErrorInvalidValue
/// for k outside 1..min(kTopKMax, vocab) or more first-stage candidates than the scratch holds.
constexpr int kTopKMax = 1024;
cudaError_t top_k(const float* logits, int64_t vocab, int k, void* scratch, int32_t* ids, float* vals,
                  cudaStream_t stream);
/// top_k, then in its final kernel the draw of sample from those candidates: ids / vals as top_k
/// writes them, out[0] the drawn id, state->draw += 1 (a sampled step of a chained decode).
/// Errors: top_k's, and cudaErrorInvalidValue for a null state or out.
cudaError_t top_k_sample(const float* logits, int64_t vocab, int k, void* scratch, int32_t* ids, float* vals,
                         shoal::DeviceSampling* state, int32_t* out, cudaStream_t stream);
/// out[0] = ids[pick_candidate(vals, k, ...)] with the settings and draw of *state, then
/// state->draw += 1 (sampling_math.h; one block). k <= kTopKMax.
cudaError_t sample(const int32_t* ids, const float* vals, int k, shoal::DeviceSampling* state, int32_t* out,
                   cudaStream_t stream);
/// Words per publication slot of advance_decode: [0] the tag, [1] the count, [2..] the ids.
constexpr int kDecodedWords = 16;
/// The next decode step's inputs: ids[i] = next[i], pos[i] += n for i < n (1 <= n <=
/// kDecodedWords - 2; one thread), and the publication into slot pos[0] % slots (unsigned) of
/// `published` (mapped pinned memory, slots x kDecodedWords i32), as a sequence lock: tag -1,
/// a system-scope fence, n and next[0..n), a fence, then pos[0] as the tag
/// (Backend::wait_decoded).
cudaError_t advance_decode(const int32_t* next, int n, int32_t* ids, int32_t* pos, int32_t* published, int slots,
                           cudaStream_t stream);

// ---- probe_kernels.cu: for benchmarks (cuda_probe.h) ------------------------------------------
enum class FillKind : int { kF32, kF16, kBF16, kBytes, kScales };
/// Fills n elements with pseudo-random values: plain kinds uniform in [-scale, scale], kBytes
/// random bytes, kScales f16 values in [scale / 64, 1.5 * scale / 64].
cudaError_t fill_random(void* p, int64_t n, FillKind kind, uint64_t seed, float scale, cudaStream_t stream);
/// Reads `bytes` (a multiple of 16) once with 16-byte loads on `grid` blocks; `sink` keeps the
/// loads from being optimised away.
cudaError_t read_all(const void* p, uint64_t bytes, int grid, uint32_t* sink, cudaStream_t stream);

// ---- wgmma_probe.cu: tensor-core rates for benchmarks (cuda_probe.h) --------------------------
/// `grid` blocks of `warpgroups` (1..3; 1..2 at 128 columns) warpgroups, each running `iters`
/// stages of four wgmma.m64nNk16 (A in registers; n_cols 16, 32, 64 or 128) as gemm_quant does
/// with its parts side by side; mode 0: one group kept in flight, 1: the product's waits, 2: its
/// waits and promotions. `sink`: one device float, written only on a practically impossible sum
/// (it keeps the products). Without sm_90a code (!gemm_quant_available) the kernel does nothing
/// and returns cudaSuccess. Errors: cudaErrorInvalidValue for other widths, warpgroups or modes;
/// launch errors.
cudaError_t wgmma_rate(int n_cols, int warpgroups, int mode, int iters, int grid, float* sink, cudaStream_t stream);
/// `grid` blocks of `warps` (1..32) warps, each running `iters` x 8 independent mma.sync.m16n8k16
/// (f16, f32 accumulators); `sink` as wgmma_rate's. Errors: cudaErrorInvalidValue for other warp
/// counts; launch errors.
cudaError_t mma_sync_rate(int warps, int iters, int grid, float* sink, cudaStream_t stream);

}  // namespace shoal::cuda
