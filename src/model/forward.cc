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

/// Attention block: h (normed input) -> act.o (before the residual add).
void attention_block(const ForwardContext& c, const LayerConfig& L, const LayerWeights& w, LayerCache& kv,
                     int n, const Tensor& h) {
  Backend& be = *c.backend;
  Activations& a = *c.act;
  const int qw = L.n_heads * L.head_dim, kw = L.n_kv_heads * L.head_dim;
  Tensor q = a.q.rows_view(0, n).reshaped({n, qw});
  Tensor k = a.k.rows_view(0, n).reshaped({n, kw});
  Tensor v = a.v.rows_view(0, n).reshaped({n, kw});
  be.matmul(w.wq, h, q, has(w.bq) ? &w.bq : nullptr);
  be.matmul(w.wk, h, k, has(w.bk) ? &w.bk : nullptr);
  be.matmul(w.wv, h, v, has(w.bv) ? &w.bv : nullptr);
  if (has(w.q_norm)) be.rms_norm(q, w.q_norm, c.cfg->norm_eps, q);
  if (has(w.k_norm)) be.rms_norm(k, w.k_norm, c.cfg->norm_eps, k);
  Tensor pos = rows(a.pos, n).reshaped({n});
  RopeSpec rs{L.n_heads, L.head_dim, c.cfg->rope.rot_dims, c.cfg->rope.interleaved, c.cfg->rope.attn_factor};
  const Tensor& freqs = L.use_local_rope ? a.inv_freq_local : a.inv_freq;
  be.rope(q, pos, freqs, rs);
  rs.n_heads = L.n_kv_heads;
  be.rope(k, pos, freqs, rs);
  be.kv_write(kv.k, kv.v, k, v, pos);
  AttentionSpec as;
  as.n_heads = L.n_heads;
  as.n_kv_heads = L.n_kv_heads;
  as.head_dim = L.head_dim;
  as.scale = c.cfg->attn_scale > 0 ? c.cfg->attn_scale : float(1.0 / std::sqrt(double(L.head_dim)));
  as.sliding_window = L.sliding_window;
  as.softcap = c.cfg->attn_logit_softcap;
  Tensor att = a.att.rows_view(0, n).reshaped({n, qw});
  be.attention(q, kv.k, kv.v, pos, as, att);
  Tensor o = rows(a.o, n);
  be.matmul(w.wo, att, o, has(w.bo) ? &w.bo : nullptr);
  if (has(w.post_attn_norm)) be.rms_norm(o, w.post_attn_norm, c.cfg->norm_eps, o);
}

/// Dense FFN: h -> out.
void ffn_block(const ForwardContext& c, const LayerConfig& L, const LayerWeights& w, int n, const Tensor& h,
               Tensor& out) {
  Backend& be = *c.backend;
  Activations& a = *c.act;
  Tensor gate = a.gate.rows_view(0, n).reshaped({n, L.d_ff});
  Tensor up = a.up.rows_view(0, n).reshaped({n, L.d_ff});
  if (c.cfg->gated_ffn) {
    be.matmul_glu(w.w_gate, w.w_up, h, c.cfg->act, gate, up, gate);
  } else {
    be.matmul(w.w_up, h, gate, has(w.b_up) ? &w.b_up : nullptr);
    be.activation(gate, c.cfg->act, gate);
  }
  be.matmul(w.w_down, gate, out, has(w.b_down) ? &w.b_down : nullptr);
  if (has(w.post_ffn_norm)) be.rms_norm(out, w.post_ffn_norm, c.cfg->norm_eps, out);
}

}  // namespace

void forward_layers(const ForwardContext& c, const std::vector<LayerWeights>& weights,
                    std::vector<LayerCache>& cache, int first, int end, int n) {
  Backend& be = *c.backend;
  Activations& a = *c.act;
  Tensor x = rows(a.x, n), h = rows(a.h, n), o = rows(a.o, n);
  // The residual add of a block is fused into the next norm (add_rms_norm); `pending` says
  // whether act.o still has to be added to x.
  bool pending = false;
  const bool rms = c.cfg->norm == NormKind::kRms;
  for (int l = first; l < end; ++l) {
    const LayerConfig& L = c.cfg->layers[size_t(l)];
    const LayerWeights& w = weights[size_t(l - first)];
    if (pending && rms) {
      be.add_rms_norm(x, o, w.attn_norm, c.cfg->norm_eps, h);
    } else {
      if (pending) be.add(x, o, x);
      norm(c, x, w.attn_norm, w.attn_norm_b, h);
    }
    if (c.cfg->parallel_block) {
      // x = x + attn(h) + ffn(h), both from the same normed input (Phi-1.5/2).
      attention_block(c, L, w, cache[size_t(l - first)], n, h);
      be.add(x, o, x);
      ffn_block(c, L, w, n, h, o);
      pending = true;
      continue;
    }
    attention_block(c, L, w, cache[size_t(l - first)], n, h);
    if (rms) {
      be.add_rms_norm(x, o, w.ffn_norm, c.cfg->norm_eps, h);
    } else {
      be.add(x, o, x);
      norm(c, x, w.ffn_norm, w.ffn_norm_b, h);
    }
    ffn_block(c, L, w, n, h, o);
    pending = true;
  }
  if (pending) be.add(x, o, x);
}

void forward_head(const ForwardContext& c, const GlobalWeights& g, int row, int n_rows, Tensor& logits) {
  Backend& be = *c.backend;
  Tensor x = c.act->x.rows_view(row, n_rows);
  Tensor h = c.act->h.rows_view(0, n_rows);
  norm(c, x, g.output_norm, g.output_norm_b, h);
  be.matmul(g.output, h, logits);
}

}  // namespace shoal
