// The fast CPU backend's attention: causal attention of a batch of queries against a layer's KV
// cache, multi-threaded over (query, KV head) pairs, with an online softmax (Milakov & Gimelshein
// 2018, "Online normalizer calculation for softmax"; as in FlashAttention, Dao et al. 2022) over
// chunks of keys. Semantics and shapes are those of Backend::attention (src/backend/backend.h)
// and its reference ref::attention (ref_ops.h): GQA, sliding window, softcap; caches of F32, F16
// or Q8_0 rows.
//
// Precision: f32 scores, exponentials and sums (the reference accumulates in double): absolute
// error ~1e-6 for V values of order 1 (1.2e-6 the largest seen in tests/cpu_attention_test.cc). Determinism: a query's result depends only on its own q row,
// its position and the cache — never on the thread count or on the other queries in the batch
// (key chunks start at the query's first visible key).
#pragma once

#include "backend/backend.h"
#include "backend/cpu/cpu_features.h"
#include "core/thread_pool.h"

namespace shoal {

/// out[i] = softmax(q[i] · Kᵀ · scale (softcapped), keys visible from pos[i]) · V per head.
/// q: f32 [n, n_heads * head_dim]; k_cache, v_cache: [n_ctx, n_kv_heads * head_dim] of F32, F16
/// or Q8_0; pos: i32 [n], each < n_ctx; out: f32 [n, n_heads * head_dim], not aliasing q.
/// Shapes, dtypes and positions are CHECKed. Uses the kernels of cpu_isa().
void fast_attention(ThreadPool& pool, const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                    const Tensor& pos, const AttentionSpec& spec, Tensor& out);

/// As fast_attention with the kernels of a given level (CHECKs the CPU supports it).
void fast_attention_isa(ThreadPool& pool, CpuIsa isa, const Tensor& q, const Tensor& k_cache,
                        const Tensor& v_cache, const Tensor& pos, const AttentionSpec& spec, Tensor& out);

}  // namespace shoal
