// Attention on the tensor cores for f16 and Q8_0 KV caches (attention_mma.cuh): the plans attention.cu
// shares with the prefill kernel (attention_prefill.cu) and the decode kernel
// (attention_decode_mma.cu), their parameters and their launchers. Only included by .cu files of src/backend/cuda/.
#pragma once

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.h"

namespace shoal::cuda {

/// Whether attention() runs these arguments on the tensor-core prefill kernel: more than
/// kGemvMaxTokens tokens that the decode kernel does not take, an f16 or Q8_0 cache, head_dim 64
/// or 128.
bool use_prefill_mma(const AttnArgs& a);

/// How the prefill kernel divides a call: blocks of 4 warps, each warp 16 consecutive tokens of
/// one query head; the warps of a block share a KV head (gb heads x 4 / gb token slices), so
/// each K/V tile is read once for them. Splits along the keys (combined by
/// attention_combine_flat_kernel) only when the call has too few blocks to fill the GPU; with
/// no split and at most two blocks per SM, blocks of 8 warps whose two sets of 4 take every other
/// key tile (halves = 2).
struct PrefillPlan {
  int gb = 1;            // query heads per block
  int groups = 1;        // blocks per KV head along the query heads (G / gb)
  int block_tokens = 0;  // tokens per block: 16 * 4 / gb
  int token_tiles = 0;   // blocks along the tokens
  int n_splits = 1;      // splits along the keys: each takes an even share (whole 64-key tiles) of
                         // the keys its block attends, found at run time
  int halves = 1;        // 2: two sets of warps share a block's key tiles (every other one)
};
PrefillPlan prefill_plan(const AttnArgs& a);

/// Causal attention of q (f32 [n_tokens, n_heads * head_dim]) against f16 caches [n_ctx,
/// n_kv_heads * head_dim] or Q8_0 rows of them (a.cache; always exact: a.one_part is for f16
/// caches), keys first(t)..pos[t] (first from the sliding window), as `plan` says. With one split the normalised output goes to out; otherwise each split's unnormalised
/// output and (running max, sum) go to part_o [n_tokens, n_heads, n_splits, head_dim] and
/// part_ml [.., 2] for attention_combine_flat_kernel (attention.cu). Errors: the launch's.
cudaError_t attention_prefill(const float* q, const void* k_cache, const void* v_cache, const int32_t* pos,
                              const AttnArgs& a, const PrefillPlan& plan, float* part_o, float* part_ml, float* out,
                              cudaStream_t stream);

/// The arguments of both tensor-core kernels (Plan: PrefillPlan or DecodePlan), as their
/// launchers take them; `of` copies the ones of AttnArgs the kernels read.
template <class Plan>
struct MmaParams {
  const float* q;
  const void* k;  // f16 caches; the decode kernel also takes Q8_0 rows (AttnArgs::cache)
  const void* v;
  const int32_t* pos;
  int64_t n_tokens;
  int n_ctx, n_heads, n_kv_heads, window;
  float scale, softcap;
  bool early_kv;  // AttnArgs::early_kv (read by the decode kernel)
  Plan plan;
  float* part_o;
  float* part_ml;
  float* out;
  AttnRope rope;  // the decode kernel with the rope prologue: q raw, k / v rows to store

  static MmaParams of(const float* q, const void* k, const void* v, const int32_t* pos, const AttnArgs& a,
                      const Plan& plan, float* part_o, float* part_ml, float* out, const AttnRope& rope = {}) {
    return {q, k, v, pos, a.n_tokens, int(a.n_ctx), a.n_heads, a.n_kv_heads, a.sliding_window, a.scale, a.softcap,
            a.early_kv, plan, part_o, part_ml, out, rope};
  }
};

/// Whether attention() runs these arguments on the tensor-core decode kernel: 1..kGemvMaxTokens
/// tokens, or up to kDecodeAttnMaxTokens where decode_plan() makes one cluster of them; an f16 or
/// Q8_0 cache, head_dim 64 or 128, no softcap (the tiled kernel takes those: the decode kernel's
/// code stays small; docs/cuda.md, v18).
bool use_decode_mma(const AttnArgs& a);

/// How the decode kernel divides a call: blocks of 4 warps over the (token, query head) rows of
/// one KV head, 16 rows per block (row_groups blocks per KV head), every warp the same rows and
/// a quarter of each 64-key tile; the attended keys are divided evenly over n_splits blocks at
/// run time. With `cluster` (sm_90) the splits of a row group form a thread-block cluster and
/// merge through distributed shared memory, so no combine kernel runs; otherwise they write
/// partial results for attention_combine_kernel.
struct DecodePlan {
  int row_groups = 1;
  int n_splits = 1;
  bool cluster = false;
};
DecodePlan decode_plan(const AttnArgs& a);

/// The decode kernel as `plan` says: the output to out, or (n_splits > 1, no cluster) partial
/// results to part_o / part_ml as attention_prefill(). The caches are f16 or Q8_0 rows (GGUF
/// blocks, a.cache). Errors: the launch's.
/// With `rope` (not null) the kernel runs the rope prologue (AttnRope, rope_kv_attention()):
/// q raw, the caches written (hence not const).
cudaError_t attention_decode_mma(const float* q, const void* k_cache, const void* v_cache, const int32_t* pos,
                                 const AttnArgs& a, const DecodePlan& plan, float* part_o, float* part_ml, float* out,
                                 cudaStream_t stream, const AttnRope* rope = nullptr);

}  // namespace shoal::cuda
