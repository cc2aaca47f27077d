// Measurements for the CUDA benchmarks (bench/cuda_kernels.cc): the device's ceilings (a pure
// read kernel, a device-to-device copy, a cuBLAS bf16 GEMM) and event timing of backend work
// replayed as a CUDA graph. This header includes no CUDA headers; it exists only in builds with
// the CUDA backend (SHOAL_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "backend/backend.h"
#include "core/status.h"

namespace shoal::cuda_probe {

struct DeviceInfo {
  std::string name;
  int sms = 0;
  uint64_t l2_bytes = 0;
  uint64_t memory_bytes = 0;
};
/// Facts about GPU `device`. Errors: kUnavailable.
Result<DeviceInfo> device_info(int device);

/// Median GB/s of a read-only kernel (16-byte loads, XOR-reduced) over `bytes` of device memory.
Result<double> read_bandwidth_gbs(int device, uint64_t bytes, int reps);
/// Median GB/s of a device-to-device cudaMemcpy of `bytes`, counting bytes read plus written.
Result<double> copy_bandwidth_gbs(int device, uint64_t bytes, int reps);
/// Median TFLOP/s (2*m*n*k per product) of cuBLAS bf16 x bf16 -> bf16 with f32 accumulation on
/// random data.
Result<double> cublas_bf16_tflops(int device, int m, int n, int k, int reps);

/// Median TFLOP/s (2 * 64 * n_cols * 16 per wgmma) of wgmma.m64nNk16 f16 with A in registers, one
/// block of `warpgroups` (1..3) per SM, each warpgroup running stages of four products as the
/// quantized prefill GEMM does with its parts side by side (mode 0: one commit group kept in
/// flight; 1: the GEMM's waits; 2: its waits and promotions; cuda::wgmma_rate). Errors:
/// kUnavailable without sm_90a code.
Result<double> wgmma_tflops(int device, int n_cols, int warpgroups, int mode, int reps);
/// Median TFLOP/s of mma.sync.m16n8k16 f16 (8 independent products per warp in turn), one block
/// of `warps` warps per SM.
Result<double> mma_sync_tflops(int device, int warps, int reps);

/// Median milliseconds of `record` (ops on the CUDA backend `b`) recorded once with run_graph and
/// replayed `reps` times, timed by CUDA events on b's stream. Errors: kInvalidArgument if b is not
/// a CUDA backend; the backend's errors. Builds with SHOAL_CUDA_TIMELINE: with the environment
/// variable SHOAL_TIMELINE=<csv>, one more replay is recorded block by block into that file
/// (timeline.cuh; scripts/timeline.py reads it).
Result<double> time_graph_ms(Backend& b, const std::function<void()>& record, int reps);

/// Milliseconds per step of a chain of decode steps: `record` (one step ending in
/// advance_decode of out) recorded once with run_graph and replayed `steps` times from position
/// pos0 after `reset()`, three ways. graphs: back to back, one event pair around all (then once
/// more, graphs_again, for drift); copy: each replay followed by a 4-byte copy of `out` into
/// pinned memory and an event (a read-back in the stream); host: the host waiting for step k's
/// publication (Backend::wait_decoded) after queuing step k + 1, wall clock, as Slice::decode.
/// Errors as time_graph_ms.
struct ChainTimes {
  double graphs = 0, copy = 0, host = 0, graphs_again = 0;
};
Result<ChainTimes> time_chain_ms(Backend& b, const std::function<void()>& record, const Tensor& out, int32_t pos0,
                                 const std::function<Status()>& reset, int steps);

/// Fills a tensor of the CUDA backend `b` (a weight from alloc_weight, or a plain F32/F16/BF16/
/// Q8_0 tensor) with pseudo-random values on the device: plain values uniform in
/// [-scale, scale]; quantized blocks random quants with scales near scale / 64.
Status fill_random(Backend& b, Tensor& t, uint64_t seed, float scale = 1.0f);

/// GEMV launches of the CUDA backend b so far that read their bias / old y before the PDL wait
/// (GemvOpts::early_epilogue); -1 if b is not a CUDA backend. For tests.
int64_t early_epilogue_launches(Backend& b);
/// qkv_attention calls of the CUDA backend b so far that rotated q / k and wrote the caches in
/// the GEMV's epilogue (cuda::GemvRope); -1 if b is not a CUDA backend. For tests.
int64_t rope_epilogue_launches(Backend& b);
/// GEMV launches of the CUDA backend b so far that took their input as activation fragments
/// written by the GEMV before (cuda::GemvOpts::frags_in); -1 if b is not a CUDA backend.
int64_t fragment_handoffs(Backend& b);
/// Attention calls over Q8_0 KV caches that the CUDA backend b ran on the tensor-core kernels so
/// far; -1 if b is not a CUDA backend. For tests.
int64_t q8_tensor_core_attention(Backend& b);
/// Attention calls of more than 8 tokens (up to cuda::kDecodeAttnMaxTokens) that the CUDA backend
/// b ran on the decode kernel so far; -1 if b is not a CUDA backend. For tests.
int64_t decode_kernel_batches(Backend& b);
/// Graphs the CUDA backend b holds (recorded by run_graph); -1 if b is not a CUDA backend. For tests.
int64_t recorded_graphs(Backend& b);
/// Scratch buffers the CUDA backend b allocated so far (first uses and growth); -1 if b is not a
/// CUDA backend. For tests.
int64_t scratch_allocations(Backend& b);
/// Turns those fragment handoffs on or off for b's ops from now on (no-op if b is not CUDA).
void set_fragment_handoff(Backend& b, bool on);
/// Decode qkv_attention calls of the CUDA backend b so far whose one-token Q8_0 q / k / v
/// GEMV split K in two halves, summed by rope_kv_attention; -1 if b is not a CUDA backend. For tests.
int64_t qkv_split_launches(Backend& b);
/// Turns that split on or off for b's ops from now on (no-op if b is not CUDA).
void set_qkv_split(Backend& b, bool on);

/// gemm_quant launches (Hopper's wgmma instead of cuBLAS for quantized prefill products; one
/// per product, or one for q / k / v together) of the CUDA backend b so far; -1 if b is not a
/// CUDA backend. For tests.
int64_t quant_gemm_launches(Backend& b);
/// Those of them that split K over several blocks (few work items); -1 if b is not a CUDA backend.
/// For tests.
int64_t quant_gemm_split_launches(Backend& b);
/// Those of them that ran two blocks per SM (Q4_0 at 32 columns, where the shared memory and
/// registers allow); -1 if b is not a CUDA backend. For tests.
int64_t quant_gemm_two_block_launches(Backend& b);
/// Those of them whose work items held 128 tokens in two parts (exact prefill of many items);
/// -1 if b is not a CUDA backend. For tests.
int64_t quant_gemm_wide_launches(Backend& b);
/// Prefill inputs of the CUDA backend b so far split into one 16-bit part
/// (BackendOptions::half_prefill, for calls whose products all take it); -1 if b is not a CUDA
/// backend. For tests.
int64_t half_prefill_inputs(Backend& b);
/// Prefill products of the CUDA backend b so far that shared one GEMM with others whose weights
/// lie next to theirs in device memory (F16 / BF16 q / k / v, as allocations usually fall); -1 if
/// b is not a CUDA backend. For tests and benchmarks.
int64_t stacked_products(Backend& b);
/// Prefill qkv_attention calls of the CUDA backend b so far whose RoPE + KV-write kernel summed
/// q / k / v from their stacked GEMM's partial products (no combine pass); -1 if b is not a CUDA
/// backend. For tests.
int64_t qkv_part_ropes(Backend& b);
/// Prefill gated_ffn calls of the CUDA backend b so far whose GLU wrote the down product's input
/// parts (cuda::glu_parts); -1 if b is not a CUDA backend. For tests.
int64_t glu_part_ffns(Backend& b);
/// Prefill inputs of the CUDA backend b so far taken as parts from the residual add just before
/// them (MatmulOut::next); -1 if b is not a CUDA backend. For tests.
int64_t split_handoffs(Backend& b);
/// BF16 weights the CUDA backend b rewrote as F16 (Backend::settle_weights) so far; -1 if b is not
/// a CUDA backend. For tests.
int64_t bf16_as_f16_weights(Backend& b);
/// Turns that rewrite on or off for b's settle_weights calls from now on (no-op if b is not CUDA).
void set_bf16_as_f16(Backend& b, bool on);
/// Whether b's device runs gemm_quant (false if b is not a CUDA backend).
bool quant_gemm_available(Backend& b);
/// Turns gemm_quant on (where the device runs it) or off for b's prefill products from now on.
void set_quant_gemm(Backend& b, bool on);
/// gemm_quant's work items for b's calls with two activation parts from now on: `tokens` tokens
/// each (16, 32, 64 or 128; a call then fails on others), or 0 for gemm_quant's choice (no-op if
/// b is not CUDA). For tests and benchmarks of each width.
void set_quant_gemm_item_tokens(Backend& b, int tokens);

/// GEMV rows per block, to compare variants: 0 the per-dtype default; plain weights 1, 2 or 4;
/// quantized weights 16 or 32 (one or two tensor-core tiles).
void set_gemv_rows(int rows_per_block);

/// Prefill attention's key tiles taken by two sets of warps per block (PrefillPlan::halves): 1 or 2
/// forced, 0 where the plan says, for calls planned from now on.
void set_prefill_halves(int halves);

/// Attention's scratch bytes for a call of `tokens` tokens (n_heads / n_kv_heads heads of
/// head_dim) over a cache of `rows` rows of type `cache` (F32, F16 or Q8_0),
/// planned for `max_keys` keys (0: the cache): with `every_count` the bound the backend allocates
/// (cuda::attention_scratch_bytes, the most over 1..tokens), else that call's own
/// (cuda::attention_call_scratch_bytes). For tests.
uint64_t attention_scratch_bytes(int64_t tokens, int n_heads, int n_kv_heads, int head_dim, int64_t rows, DType cache,
                                 int64_t max_keys, bool every_count);

/// Decode attention's cluster plan allowed or not for calls planned from now on (each CUDA
/// backend sets it again as it starts); returns the setting before. For tests.
bool set_clusters(bool on);

/// Programmatic dependent launch on or off for kernels recorded from now on (sm_90+ only).
void set_pdl(bool on);

}  // namespace shoal::cuda_probe
