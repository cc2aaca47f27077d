#include "model/forward.h"

#include <cmath>

namespace shoal {

namespace {

bool has(const Tensor& t) { return t.data != nullptr; }

Tensor rows(const Tensor& t, int n) { return t.rows_view(0, n); }

/// Applies the model's norm (RMSNorm or LayerNorm) of x into y.
void norm(const ForwardContext& c, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y) {
  if (c.cfg->norm == NormKind::kRms) {
    c.backend->rms_norm(x, w, c.cfg->norm_eps, y);
  } else {
    c.backend->layer_norm(x, w, has(b) ? &b : nullptr, c.cfg->norm_eps, y);
  }
}

/// The input of a block: with RMSNorm, x itself and the norm fused into the block's first
/// matmuls (`fused`); with LayerNorm, the normed rows written to h.
const Tensor& block_input(const ForwardContext& c, const Tensor& x, const Tensor& w, const Tensor& b, Tensor& h,
                          InputNorm& fused) {
  if (c.cfg->norm == NormKind::kRms) {
    fused = InputNorm{&w, c.cfg->norm_eps, &h};
    return x;
  }
  fused = InputNorm{};
  norm(c, x, w, b, h);
  return h;
}

/// The output projection of a block as a residual-adding product into x (tmp o); next: the
/// norm of the block after it (MatmulOut::next), or null.
MatmulOut residual_product(const Tensor& w_out, const Tensor& bias, Tensor& x, Tensor& o, const InputNorm* next) {
  MatmulOut out{&w_out, &x, has(bias) ? &bias : nullptr};
  out.accumulate = true;
  out.tmp = &o;
  out.next = next;
  return out;
}

/// x += in · w_outᵀ (+ bias), the block's output projection and residual add in one product;
/// with a post-norm (Gemma), x += post_norm(in · w_outᵀ) through `o`.
void block_output(const ForwardContext& c, const Tensor& w_out, const Tensor& in, const Tensor& bias,
                  const Tensor& post_norm, Tensor& x, Tensor& o, const InputNorm* next) {
  Backend& be = *c.backend;
  if (!has(post_norm)) {
    const MatmulOut out = residual_product(w_out, bias, x, o, next);
    be.matmuls(in, InputNorm{}, {&out, 1});
    return;
  }
  be.matmul(w_out, in, o, has(bias) ? &bias : nullptr);
  be.rms_norm(o, post_norm, c.cfg->norm_eps, o);
  be.add(x, o, x);
}

/// Attention block: x += attn(norm(in)) (norm as `an`; see block_input); next as in
/// block_output. K/V and attention are computed for all n rows of `in`; the output projection
/// only for the last m of them, whose rows of the residual stream are x ([m, d_model]; m = 0:
/// none).
void attention_block(const ForwardContext& c, const LayerConfig& L, const LayerWeights& w, LayerCache& kv,
                     int n, const Tensor& in, const InputNorm& an, Tensor& x, int m, const InputNorm* next) {
  Backend& be = *c.backend;
  Activations& a = *c.act;
  const int qw = L.n_heads * L.head_dim, kw = L.n_kv_heads * L.head_dim;
  Tensor q = a.q.rows_view(0, n).reshaped({n, qw});
  Tensor k = a.k.rows_view(0, n).reshaped({n, kw});
  Tensor v = a.v.rows_view(0, n).reshaped({n, kw});
  const MatmulOut qkv[3] = {{&w.wq, &q, has(w.bq) ? &w.bq : nullptr},
                            {&w.wk, &k, has(w.bk) ? &w.bk : nullptr},
                            {&w.wv, &v, has(w.bv) ? &w.bv : nullptr}};
  Tensor pos = rows(a.pos, n).reshaped({n});
  RopeSpec rs{L.n_heads, L.head_dim, c.cfg->rope.rot_dims, c.cfg->rope.interleaved, c.cfg->rope.attn_factor};
  const Tensor& freqs = L.use_local_rope ? a.inv_freq_local : a.inv_freq;
  AttentionSpec as;
  as.n_heads = L.n_heads;
  as.n_kv_heads = L.n_kv_heads;
  as.head_dim = L.head_dim;
  as.scale = c.cfg->attn_scale > 0 ? c.cfg->attn_scale : float(1.0 / std::sqrt(double(L.head_dim)));
  as.sliding_window = L.sliding_window;
  as.softcap = c.cfg->attn_logit_softcap;
  Tensor att = a.att.rows_view(0, n).reshaped({n, qw});
  be.qkv_attention(in, an, qkv, has(w.q_norm) ? &w.q_norm : nullptr, has(w.k_norm) ? &w.k_norm : nullptr,
                   c.cfg->norm_eps, pos, freqs, rs, kv.k, kv.v, as, att);
  if (m == 0) return;
  Tensor o = rows(a.o, m);
  block_output(c, w.wo, att.rows_view(n - m, m), w.bo, w.post_attn_norm, x, o, next);
}

/// Dense FFN block: x += ffn(norm(in)); next as in block_output.
void ffn_block(const ForwardContext& c, const LayerConfig& L, const LayerWeights& w, int n, const Tensor& in,
               const InputNorm& fn, Tensor& x, const InputNorm* next) {
  Backend& be = *c.backend;
  Activations& a = *c.act;
  Tensor gate = a.gate.rows_view(0, n).reshaped({n, L.d_ff});
  Tensor up = a.up.rows_view(0, n).reshaped({n, L.d_ff});
  MatmulOut first{&w.w_up, &gate, has(w.b_up) ? &w.b_up : nullptr};
  if (c.cfg->gated_ffn) {
    first = MatmulOut{&w.w_gate, &gate, nullptr, &w.w_up, c.cfg->act};
    first.tmp = &up;
  }
  Tensor o = rows(c.act->o, n);
  if (c.cfg->gated_ffn && !has(w.post_ffn_norm)) {  // (the backend may hand gate on in its own form)
    be.gated_ffn(in, fn, first, residual_product(w.w_down, w.b_down, x, o, next));
    return;
  }
  be.matmuls(in, fn, {&first, 1});
  if (!c.cfg->gated_ffn) be.activation(gate, c.cfg->act, gate);
  block_output(c, w.w_down, gate, w.b_down, w.post_ffn_norm, x, o, next);
}

}  // namespace

void forward_layers(const ForwardContext& c, const std::vector<LayerWeights>& weights,
                    std::vector<LayerCache>& cache, int first, int end, int n, int keep) {
  Activations& a = *c.act;
  Tensor x = rows(a.x, n), h = rows(a.h, n);
  if (keep < 0 || keep > n) keep = n;
  // The kept rows start 16-byte aligned (a few more rows where d_model % 4 != 0): backends read
  // matmul inputs in 16-byte vectors, and the parallel block's FFN reads its rows of h unnormed.
  while (keep < n && (int64_t(n - keep) * c.cfg->d_model) % 4 != 0) ++keep;
  InputNorm fused;
  for (int l = first; l < end; ++l) {
    const LayerConfig& L = c.cfg->layers[size_t(l)];
    const LayerWeights& w = weights[size_t(l - first)];
    LayerCache& kv = cache[size_t(l - first)];
    // The rows past attention: all n, or in the last layer the kept ones (xm: the last m of x;
    // hm: the first m of h, where the FFN's normed input goes).
    const int m = l + 1 == end ? keep : n;
    Tensor xm = x.rows_view(n - m, m), hm = h.rows_view(0, m);
    if (c.cfg->parallel_block) {
      // x = x + attn(h) + ffn(h), both from the same normed input (Phi-1.5/2).
      norm(c, x, w.attn_norm, w.attn_norm_b, h);
      attention_block(c, L, w, kv, n, h, InputNorm{}, xm, m, nullptr);
      if (m > 0) ffn_block(c, L, w, m, h.rows_view(n - m, m), InputNorm{}, xm, nullptr);
      continue;
    }
    // The norms the blocks after each residual add read x through (RMSNorm fused into their
    // products: block_input), as hints to the residual-adding products.
    const bool rms = c.cfg->norm == NormKind::kRms;
    const InputNorm ffn_next{&w.ffn_norm, c.cfg->norm_eps, &hm};
    const InputNorm attn_next = l + 1 < end ? InputNorm{&weights[size_t(l + 1 - first)].attn_norm, c.cfg->norm_eps, &h}
                                            : InputNorm{};
    const Tensor& ain = block_input(c, x, w.attn_norm, w.attn_norm_b, h, fused);
    attention_block(c, L, w, kv, n, ain, fused, xm, m, rms ? &ffn_next : nullptr);
    if (m == 0) continue;
    const Tensor& fin = block_input(c, xm, w.ffn_norm, w.ffn_norm_b, hm, fused);
    ffn_block(c, L, w, m, fin, fused, xm, rms && l + 1 < end ? &attn_next : nullptr);
  }
}

void forward_head(const ForwardContext& c, const GlobalWeights& g, int row, int n_rows, Tensor& logits) {
  Backend& be = *c.backend;
  Tensor x = c.act->x.rows_view(row, n_rows);
  Tensor h = c.act->h.rows_view(0, n_rows);
  InputNorm fused;
  const Tensor& in = block_input(c, x, g.output_norm, g.output_norm_b, h, fused);
  const MatmulOut out{&g.output, &logits};
  be.matmuls(in, fused, {&out, 1});
}

}  // namespace shoal
