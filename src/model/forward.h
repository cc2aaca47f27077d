// The forward pass, written once over ModelConfig features and Backend ops. Shared blocks:
// attention (GQA, RoPE, optional q/k norm and biases, sliding window), dense FFN (GLU or plain),
// the head (final norm + LM head). Architecture files only describe; this file computes.
#pragma once

#include <vector>

#include "backend/backend.h"
#include "model/model_config.h"

namespace shoal {

/// One layer's weights on a backend. Absent optional weights have data == nullptr.
struct LayerWeights {
  Tensor attn_norm, attn_norm_b;           // f32 [d_model]
  Tensor wq, wk, wv, wo;                   // [H*hd, d], [KV*hd, d], [KV*hd, d], [d, H*hd]
  Tensor bq, bk, bv, bo;                   // f32 biases
  Tensor q_norm, k_norm;                   // f32 [head_dim] (qk_norm)
  Tensor ffn_norm, ffn_norm_b;             // f32 [d_model]
  Tensor w_gate, w_up, w_down;             // [d_ff, d], [d_ff, d], [d, d_ff]
  Tensor b_up, b_down;                     // f32 biases (ffn_bias)
  Tensor post_attn_norm, post_ffn_norm;    // f32 [d_model] (post_norms)
};

/// Weights outside the layers. The host's slice holds these.
struct GlobalWeights {
  Tensor token_embd;                 // [vocab, d_model] any weight dtype
  Tensor output_norm, output_norm_b; // f32 [d_model]
  Tensor output;                     // [vocab, d_model]; aliases token_embd when tied
  Tensor rope_freqs;                 // optional f32 [rot_dims / 2] divisors (llama3, GGUF)
};

/// One layer's KV cache: [n_ctx, n_kv_heads * head_dim] of F32, F16 or Q8_0.
struct LayerCache {
  Tensor k, v;
};

/// Work buffers for up to `max_tokens` tokens per forward call.
struct Activations {
  int max_tokens = 0;
  Tensor x;         // f32 [B, d_model] the residual stream
  Tensor h;         // f32 [B, d_model] normed input of a block
  Tensor q, att;    // f32 [B, max_heads * head_dim]
  Tensor k, v;      // f32 [B, max_kv_heads * head_dim]
  Tensor o;         // f32 [B, d_model] block output (the pending residual delta)
  Tensor gate, up;  // f32 [B, max d_ff]
  Tensor ids, pos;  // i32 [B]
  Tensor inv_freq, inv_freq_local;  // f32 [rot_dims / 2]
};

/// Everything one forward call over a layer range needs.
struct ForwardContext {
  Backend* backend = nullptr;
  const ModelConfig* cfg = nullptr;
  Activations* act = nullptr;
};

/// Runs layers [first, end) on act.x (f32 [n, d_model]) in place, writing K/V at act.pos.
/// keep (0..n, default n): only rows [n - keep, n) of the output are needed (a head that reads
/// the last row, or none). The last layer then writes K/V for all n rows but runs its output
/// projection and FFN only for the kept rows (up to 3 more, so that they start 16-byte aligned);
/// the other rows of act.x are left as that layer's input. llama.cpp does the same for tokens
/// without outputs (`inp_out_ids`); on a 512-token prompt of a 32-layer model it spares ~3% of
/// the products.
void forward_layers(const ForwardContext& ctx, const std::vector<LayerWeights>& weights,
                    std::vector<LayerCache>& cache, int first, int end, int n, int keep = -1);

/// Final norm + LM head on rows [row, row + n_rows) of act.x; logits: f32 [n_rows, vocab].
/// May clobber act.h (backends that fuse the norm into the LM head leave it unwritten).
void forward_head(const ForwardContext& ctx, const GlobalWeights& g, int row, int n_rows, Tensor& logits);

}  // namespace shoal
