// CudaBackend ops: shape checks (bugs are SHOAL_CHECK, as in the reference) and dispatch to the
// kernels of kernels.h, or cuBLAS / gemm_quant for matmuls of more tokens than the GEMV takes
// (kGemvMaxTokens; Q8_0 / Q4_0 kQuantGemmMinTokens - 1 where gemm_quant runs: gemv_max_tokens).
#include <algorithm>
#include <cstdint>

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/tensor_args.h"

namespace shoal {

namespace {

using cuda::Act;
using cuda::WKind;
using cuda::act_of;
using cuda::cache_kind;
using cuda::f32;
using cuda::i32;

// ggml ids of the types convert() handles.
int plain_id(DType t) {
  SHOAL_CHECK(t == DType::kF32 || t == DType::kF16 || t == DType::kBF16, "convert of {}", dtype_name(t));
  return int(t);
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// Whether matmuls(x, norm, outs) runs as GEMV launches (gemv_multi): n <= max_tokens
// (CudaBackend::gemv_max_tokens), 16-byte aligned x and norm weight (a row view of x at an odd
// row of a width that is not a multiple of 4 is not), and GLU pairs of one weight kind.
bool gemv_launches(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs, int64_t max_tokens) {
  const int64_t n = x.rows();
  bool ok = n >= 1 && n <= max_tokens && aligned16(x.data) && (!norm.w || aligned16(norm.w->data));
  for (const MatmulOut& o : outs) ok = ok && (!o.up || (o.up->dtype == o.w->dtype && !o.accumulate && !o.bias));
  return ok;
}

}  // namespace

int64_t CudaBackend::gemv_max_tokens(std::initializer_list<const Tensor*> ws) const {
  bool quantized = qgemm_;
  for (const Tensor* w : ws)
    if (w) quantized = quantized && (w->dtype == DType::kQ8_0 || w->dtype == DType::kQ4_0);
  return quantized ? cuda::kQuantGemmMinTokens - 1 : cuda::kGemvMaxTokens;
}

int64_t CudaBackend::gemv_max_tokens(std::span<const MatmulOut> outs) const {
  for (const MatmulOut& o : outs)  // (mixed kinds: the GEMV)
    if (gemv_max_tokens({o.w, o.up}) == cuda::kGemvMaxTokens) return cuda::kGemvMaxTokens;
  return outs.empty() ? cuda::kGemvMaxTokens : cuda::kQuantGemmMinTokens - 1;
}

cuda::WeightRef CudaBackend::weight_ref(const Tensor& w) const {
  cuda::WeightRef r;
  r.data = w.data;
  r.rows = w.rows();
  r.cols = w.cols();
  switch (w.dtype) {
    case DType::kF32:
      r.kind = WKind::kF32;
      break;
    case DType::kF16:
      r.kind = WKind::kF16;
      break;
    case DType::kBF16:
      r.kind = WKind::kBF16;
      break;
    case DType::kQ8_0:
    case DType::kQ4_0:
      SHOAL_CHECK(w.aux != nullptr, "{} weight {} was not allocated by alloc_weight", dtype_name(w.dtype),
                  w.shape_string());
      r.kind = w.dtype == DType::kQ8_0 ? WKind::kQ8_0 : WKind::kQ4_0;
      r.scales = static_cast<const uint16_t*>(w.aux);
      break;
    default:
      SHOAL_CHECK(false, "weight of type {}", dtype_name(w.dtype));
  }
  return r;
}

void CudaBackend::embed(const Tensor& table, const Tensor& ids, Tensor& out) {
  const int64_t n = ids.n_elements(), d = table.cols();
  SHOAL_CHECK(out.rows() == n && out.cols() == d, "embed out {} for {} ids x {}", out.shape_string(), n, d);
  if (failed() || !use_device()) return;
  note(cuda::embed(weight_ref(table), i32(ids), n, f32(out), stream_), "embed");
}

void CudaBackend::matmul(const Tensor& w, const Tensor& x, Tensor& y, const Tensor* bias) {
  const int64_t n = x.rows(), in = x.cols(), out = w.rows();
  SHOAL_CHECK(w.cols() == in, "matmul: w {} vs x {}", w.shape_string(), x.shape_string());
  SHOAL_CHECK(y.rows() == n && y.cols() == out, "matmul: y {} for n={} out={}", y.shape_string(), n, out);
  SHOAL_CHECK(!bias || bias->n_elements() == out, "matmul: bias {} for out={}", bias->shape_string(), out);
  const cuda::WeightRef wr = weight_ref(w);
  const float* xs = f32(x);
  SHOAL_CHECK(aligned16(xs), "matmul input not 16-byte aligned");
  if (failed() || !use_device()) return;
  const float* b = bias ? f32(*bias) : nullptr;
  if (n <= gemv_max_tokens({&w}))
    note(cuda::gemv(wr, xs, int(n), b, f32(y), stream_), "gemv");
  else
    gemm(wr, xs, n, f32(y), b, one_part(w.dtype, n));
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) {
  const int64_t g = w.n_elements();
  SHOAL_CHECK(g > 0 && x.n_elements() % g == 0 && y.n_elements() == x.n_elements(), "rms_norm shapes");
  if (failed() || !use_device()) return;
  note(cuda::rms_norm(f32(x), f32(w), x.n_elements() / g, g, eps, f32(y), stream_), "rms_norm");
}

void CudaBackend::add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y) {
  const int64_t d = x.cols();
  SHOAL_CHECK(w.n_elements() == d && delta.n_elements() == x.n_elements() && y.n_elements() == x.n_elements(),
              "add_rms_norm shapes");
  if (failed() || !use_device()) return;
  note(cuda::add_rms_norm(f32(x), f32(delta), f32(w), x.rows(), d, eps, f32(y), stream_), "add_rms_norm");
}

void CudaBackend::layer_norm(const Tensor& x, const Tensor& w, const Tensor* b, float eps, Tensor& y) {
  const int64_t d = x.cols();
  SHOAL_CHECK(w.n_elements() == d && y.n_elements() == x.n_elements() && (!b || b->n_elements() == d),
              "layer_norm shapes");
  if (failed() || !use_device()) return;
  note(cuda::layer_norm(f32(x), f32(w), b ? f32(*b) : nullptr, x.rows(), d, eps, f32(y), stream_), "layer_norm");
}

void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& y) {
  SHOAL_CHECK(a.n_elements() == b.n_elements() && y.n_elements() == a.n_elements(), "add shapes");
  if (failed() || !use_device()) return;
  note(cuda::add(f32(a), f32(b), f32(y), a.n_elements(), stream_), "add");
}

void CudaBackend::scale(Tensor& x, float s) {
  if (failed() || !use_device()) return;
  note(cuda::scale(f32(x), s, x.n_elements(), stream_), "scale");
}

void CudaBackend::rope(Tensor& x, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec) {
  const int64_t n = x.rows();
  SHOAL_CHECK(
      x.cols() == int64_t(spec.n_heads) * spec.head_dim && spec.rot_dims <= spec.head_dim && spec.rot_dims % 2 == 0,
      "rope shapes");
  SHOAL_CHECK(pos.n_elements() == n && inv_freq.n_elements() == spec.rot_dims / 2, "rope pos/freq shapes");
  if (failed() || !use_device()) return;
  cuda::RopeArgs a;
  a.n_tokens = n;
  a.n_heads = spec.n_heads;
  a.head_dim = spec.head_dim;
  a.rot_dims = spec.rot_dims;
  a.interleaved = spec.interleaved;
  a.attn_factor = spec.attn_factor;
  note(cuda::rope(f32(x), i32(pos), f32(inv_freq), a, stream_), "rope");
}

void CudaBackend::kv_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& pos) {
  const int64_t n = k.rows(), width = k.cols();
  SHOAL_CHECK(k_cache.cols() == width && v_cache.cols() == width && v.cols() == width && v.rows() == n &&
                  k_cache.dtype == v_cache.dtype && k_cache.rows() == v_cache.rows() && pos.n_elements() == n,
              "kv_write shapes");
  const cuda::CacheKind kind = cache_kind(k_cache.dtype);
  if (failed() || !use_device()) return;
  note(cuda::kv_write(k_cache.data, v_cache.data, kind, k_cache.rows(), width, f32(k), f32(v), n, i32(pos), stream_),
       "kv_write");
  if (n > 0) kv_written_ = {ops_, k_cache.data, v_cache.data, pos.data, n};
}

namespace {

// The kernels' view of an attention call; the shape checks of CudaBackend::attention.
cuda::AttnArgs attn_args(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                         const AttentionSpec& spec, const Tensor& out, int64_t max_keys) {
  const int64_t n = q.rows();
  SHOAL_CHECK(spec.n_kv_heads > 0 && spec.n_heads % spec.n_kv_heads == 0, "n_heads not a multiple of n_kv_heads");
  SHOAL_CHECK(q.cols() == int64_t(spec.n_heads) * spec.head_dim && out.n_elements() == q.n_elements(),
              "attention q/out shapes");
  SHOAL_CHECK(k_cache.cols() == int64_t(spec.n_kv_heads) * spec.head_dim && v_cache.cols() == k_cache.cols() &&
                  k_cache.dtype == v_cache.dtype && pos.n_elements() == n,
              "attention cache shapes");
  SHOAL_CHECK(spec.head_dim % 8 == 0 && spec.head_dim <= 256,
              "CUDA attention needs head_dim % 8 == 0 and <= 256, got {}", spec.head_dim);
  SHOAL_CHECK(n <= 65535, "attention over {} tokens in one call (at most 65535)", n);
  SHOAL_CHECK(aligned16(out.data), "attention out not 16-byte aligned");
  cuda::AttnArgs a;
  a.n_tokens = n;
  a.n_ctx = k_cache.rows();
  a.n_heads = spec.n_heads;
  a.n_kv_heads = spec.n_kv_heads;
  a.head_dim = spec.head_dim;
  a.scale = spec.scale;
  a.sliding_window = spec.sliding_window;
  a.softcap = spec.softcap;
  a.cache = cache_kind(k_cache.dtype);
  a.max_keys = max_keys;
  return a;
}

}  // namespace

void CudaBackend::check_pos_not_just_advanced(const Tensor& pos, uint64_t prev) const {
  const auto b = reinterpret_cast<uintptr_t>(pos.data), e = b + pos.nbytes();
  SHOAL_CHECK(pos_advanced_.op != prev || prev == 0 || e <= pos_advanced_.begin || pos_advanced_.end <= b,
              "decode attention reads pos before its PDL wait: it cannot directly follow advance_decode of pos");
}

void CudaBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                            const AttentionSpec& spec, Tensor& out) {
  cuda::AttnArgs a = attn_args(q, k_cache, v_cache, pos, spec, out, attn_keys_);
  a.one_part = half_prefill_;
  check_pos_not_just_advanced(pos, ops_);
  if (failed() || !use_device()) return;
  a.early_kv = kv_written_.op + 1 == ops_ && kv_written_.k == k_cache.data && kv_written_.v == v_cache.data &&
               kv_written_.pos == pos.data && kv_written_.n == a.n_tokens;
  void* s = scratch(kAttnScratch, cuda::attention_scratch_bytes(a));
  if (!s) return;
  if (a.cache == cuda::CacheKind::kQ8_0 && cuda::attention_on_tensor_cores(a)) ++q8_mma_attention_;
  if (a.n_tokens > cuda::kGemvMaxTokens && cuda::attention_on_decode_kernel(a)) ++decode_kernel_batches_;
  note(cuda::attention(f32(q), k_cache.data, v_cache.data, i32(pos), a, s, f32(out), stream_), "attention");
  wrote({&out});
}

bool CudaBackend::rope_attention_fusable(const cuda::AttnArgs& a, const Tensor& v, const Tensor* q_norm,
                                         const Tensor* k_norm, const RopeSpec& spec, const AttentionSpec& attn,
                                         bool after_cache_write) const {
  const int64_t hd = attn.head_dim;
  return cuda::rope_kv_attention_supported(a, spec.rot_dims) && spec.head_dim == hd && spec.n_heads == attn.n_heads &&
         (!q_norm || q_norm->n_elements() == hd) && (!k_norm || k_norm->n_elements() == hd) && !after_cache_write &&
         reinterpret_cast<uintptr_t>(v.data) % 8 == 0;  // (v rows read as float2)
}

void CudaBackend::rope_kv_attention(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm,
                                    float eps, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec,
                                    Tensor& k_cache, Tensor& v_cache, const AttentionSpec& attn, Tensor& out) {
  rope_kv_attention_parts(q, k, v, q_norm, k_norm, eps, pos, inv_freq, spec, k_cache, v_cache, attn, out, nullptr);
}

void CudaBackend::rope_kv_attention_parts(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm,
                                          const Tensor* k_norm, float eps, const Tensor& pos, const Tensor& inv_freq,
                                          const RopeSpec& spec, Tensor& k_cache, Tensor& v_cache,
                                          const AttentionSpec& attn, Tensor& out, const cuda::AttnRope* parts) {
  const cuda::AttnArgs a = attn_args(q, k_cache, v_cache, pos, attn, out, attn_keys_);
  check_pos_not_just_advanced(pos, ops_);
  const int64_t hd = attn.head_dim, width = int64_t(attn.n_kv_heads) * hd;
  // The kernel loads the caches' older rows before its PDL wait: not right after an op that wrote
  // these caches (that kernel may still be running). ops_ counts up to the previous op here.
  const bool after_cache_write =
      kv_written_.op == ops_ && (kv_written_.k == k_cache.data || kv_written_.v == v_cache.data);
  const bool fusable = rope_attention_fusable(a, v, q_norm, k_norm, spec, attn, after_cache_write);
  SHOAL_CHECK(fusable || !parts, "rope_kv_attention: q / k / v partials need the fused kernel");
  if (!fusable) {
    Backend::rope_kv_attention(q, k, v, q_norm, k_norm, eps, pos, inv_freq, spec, k_cache, v_cache, attn, out);
    return;
  }
  SHOAL_CHECK(k.rows() == a.n_tokens && k.cols() == width && v.rows() == a.n_tokens && v.cols() == width &&
                  inv_freq.n_elements() == spec.rot_dims / 2 && k_cache.rows() == v_cache.rows(),
              "rope_kv_attention: k {} v {} for {} KV heads of {}, {} rope dims, caches {} / {}", k.shape_string(),
              v.shape_string(), attn.n_kv_heads, hd, spec.rot_dims, k_cache.shape_string(), v_cache.shape_string());
  cuda::AttnRope r = parts ? *parts : cuda::AttnRope{};  // (parts: q2, k2, v2, in_ss, in_cols, in_eps)
  r.k = f32(k);
  r.v = f32(v);
  r.q_norm = q_norm ? f32(*q_norm) : nullptr;
  r.k_norm = k_norm ? f32(*k_norm) : nullptr;
  r.eps = eps;
  r.inv_freq = f32(inv_freq);
  r.rot_dims = spec.rot_dims;
  r.interleaved = spec.interleaved;
  r.attn_factor = spec.attn_factor;
  if (failed() || !use_device()) return;
  void* s = scratch(kAttnScratch, cuda::attention_scratch_bytes(a));
  if (!s) return;
  note(cuda::rope_kv_attention(f32(q), r, k_cache.data, v_cache.data, i32(pos), a, s, f32(out), stream_),
       "rope_kv_attention");
  wrote({&out, &k_cache, &v_cache});
  kv_written_ = {ops_, k_cache.data, v_cache.data, pos.data, a.n_tokens};  // (a next fused call composes)
}

void CudaBackend::glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) {
  SHOAL_CHECK(gate.n_elements() == up.n_elements() && out.n_elements() == up.n_elements(), "glu shapes");
  if (failed() || !use_device()) return;
  note(cuda::glu(f32(gate), f32(up), act_of(act), f32(out), gate.n_elements(), stream_), "glu");
  wrote({&out});
}

void CudaBackend::matmul_glu(const Tensor& w_gate, const Tensor& w_up, const Tensor& x, Activation act,
                             Tensor& gate_buf, Tensor& up_buf, Tensor& out) {
  const int64_t n = x.rows();
  if (n > gemv_max_tokens({&w_gate, &w_up}) || w_gate.dtype != w_up.dtype) {
    Backend::matmul_glu(w_gate, w_up, x, act, gate_buf, up_buf, out);
    return;
  }
  SHOAL_CHECK(w_gate.rows() == w_up.rows() && w_gate.cols() == w_up.cols() && w_gate.cols() == x.cols(),
              "matmul_glu: gate {} up {} x {}", w_gate.shape_string(), w_up.shape_string(), x.shape_string());
  SHOAL_CHECK(out.rows() == n && out.cols() == w_gate.rows(), "matmul_glu out {}", out.shape_string());
  const float* xs = f32(x);
  SHOAL_CHECK(aligned16(xs), "matmul input not 16-byte aligned");
  if (failed() || !use_device()) return;
  note(cuda::gemv_glu(weight_ref(w_gate), weight_ref(w_up), xs, int(n), act_of(act), f32(out), stream_), "gemv_glu");
}

void CudaBackend::check_matmul_shapes(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs) {
  const int64_t n = x.rows(), in = x.cols();
  SHOAL_CHECK(!norm.w || norm.w->n_elements() == in, "matmuls: norm {} for x {}", norm.w->shape_string(),
              x.shape_string());
  for (const MatmulOut& o : outs) {
    const Tensor& w = *o.w;
    SHOAL_CHECK(w.cols() == in, "matmuls: w {} vs x {}", w.shape_string(), x.shape_string());
    SHOAL_CHECK(o.y->rows() == n && o.y->cols() == w.rows(), "matmuls: y {} for n={} out={}", o.y->shape_string(),
                n, w.rows());
    SHOAL_CHECK(!o.bias || o.bias->n_elements() == w.rows(), "matmuls: bias for out={}", w.rows());
    SHOAL_CHECK(!o.up || (o.up->rows() == w.rows() && o.up->cols() == in && !o.bias && !o.accumulate),
                "matmuls: up {} vs gate {}", o.up ? o.up->shape_string() : "", w.shape_string());
  }
}

void CudaBackend::matmuls(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs) {
  launch_matmuls(x, norm, outs, nullptr);
}

bool CudaBackend::rope_in_products(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> qkv,
                                   const Tensor* q_norm, const Tensor* k_norm, const Tensor& pos,
                                   const Tensor& inv_freq, const RopeSpec& spec, const Tensor& k_cache,
                                   const Tensor& v_cache, const AttentionSpec& attn) const {
  // Pairs (2i, 2i + 1) of whole heads lie in one GEMV block; the per-head q / k norms need whole
  // heads (not fused); the epilogue stores f16 rows.
  const int hd = spec.head_dim;
  if (x.rows() != 1 || qkv.size() != 3 || q_norm || k_norm || !spec.interleaved || hd != attn.head_dim ||
      spec.n_heads != attn.n_heads || attn.n_kv_heads <= 0 || hd <= 0 || hd % 2 != 0 || spec.rot_dims < 0 ||
      spec.rot_dims % 2 != 0 || spec.rot_dims > hd || (spec.rot_dims > 0 && inv_freq.n_elements() != spec.rot_dims / 2))
    return false;
  const int64_t q_rows = int64_t(attn.n_heads) * hd, kv_rows = int64_t(attn.n_kv_heads) * hd;
  if (k_cache.dtype != DType::kF16 || v_cache.dtype != DType::kF16 || k_cache.cols() != kv_rows ||
      v_cache.cols() != kv_rows || k_cache.rows() != v_cache.rows() || pos.dtype != DType::kI32 ||
      pos.n_elements() != 1)
    return false;
  const DType wt = qkv[0].w ? qkv[0].w->dtype : DType::kF32;
  const int64_t vals = wt == DType::kF32 ? 4 : 8;  // per 16-byte vector (the GEMV's vector path)
  if ((wt != DType::kF32 && wt != DType::kF16 && wt != DType::kBF16) || x.cols() % vals != 0) return false;
  for (size_t i = 0; i < 3; ++i) {
    const MatmulOut& o = qkv[i];
    if (!o.w || !o.y || o.up || o.accumulate || o.w->dtype != wt || o.w->cols() != x.cols() ||
        o.w->rows() != (i == 0 ? q_rows : kv_rows) || o.y->n_elements() != o.w->rows())
      return false;
  }
  return gemv_launches(x, norm, qkv, gemv_max_tokens(qkv));
}

void CudaBackend::qkv_attention(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> qkv,
                                const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& pos,
                                const Tensor& inv_freq, const RopeSpec& spec, Tensor& k_cache, Tensor& v_cache,
                                const AttentionSpec& attn, Tensor& out) {
  if (!rope_in_products(x, norm, qkv, q_norm, k_norm, pos, inv_freq, spec, k_cache, v_cache, attn)) {
    if (!qkv_split_attention(x, norm, qkv, q_norm, k_norm, eps, pos, inv_freq, spec, k_cache, v_cache, attn, out) &&
        !qkv_parts_attention(x, norm, qkv, q_norm, k_norm, eps, pos, inv_freq, spec, k_cache, v_cache, attn, out))
      Backend::qkv_attention(x, norm, qkv, q_norm, k_norm, eps, pos, inv_freq, spec, k_cache, v_cache, attn, out);
    return;
  }
  cuda::GemvRope r;
  r.pos = static_cast<const int32_t*>(pos.data);
  r.inv_freq = spec.rot_dims > 0 ? f32(inv_freq) : nullptr;
  r.head_dim = spec.head_dim;
  r.rot_dims = spec.rot_dims;
  r.attn_factor = spec.attn_factor;
  r.k_cache = k_cache.data;
  r.v_cache = v_cache.data;
  r.n_ctx = k_cache.rows();
  launch_matmuls(x, norm, qkv, &r);
  if (failed()) return;
  // Only the step's rows of the caches are written: attention loads the older ones before its wait.
  kv_written_ = {ops_, k_cache.data, v_cache.data, pos.data, 1};
  ++rope_epilogues_;
  attention(*qkv[0].y, k_cache, v_cache, pos, attn, out);
}

bool CudaBackend::qkv_split_attention(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> qkv,
                                      const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& pos,
                                      const Tensor& inv_freq, const RopeSpec& spec, Tensor& k_cache, Tensor& v_cache,
                                      const AttentionSpec& attn, Tensor& out) {
  if (!qkv_split_ || x.rows() != 1 || qkv.size() != 3) return false;
  for (const MatmulOut& o : qkv)  // (no bias: the reader applies 1 / rms to the partials' sum)
    if (!o.w || !o.y || o.up || o.bias || o.accumulate || o.w->dtype != qkv[0].w->dtype || o.w->cols() != x.cols())
      return false;
  // Q8_0 only: on an H100 the split took a Llama-3-8B Q8_0 step from 3.311-3.316 to 3.268-3.277 ms
  // and a Q4_0 step from 2.187-2.190 to 2.205-2.206 (docs/cuda.md, v58). Rows of a multiple of 16
  // chunks of 32 columns, so each half is a multiple of 8 (cuda::GemvOpts::split_k).
  if (qkv[0].w->dtype != DType::kQ8_0 || x.cols() % 512 != 0) return false;
  if (!gemv_launches(x, norm, qkv, gemv_max_tokens(qkv))) return false;
  Tensor& q = *qkv[0].y;
  const cuda::AttnArgs a = attn_args(q, k_cache, v_cache, pos, attn, out, attn_keys_);
  // (rope_kv_attention follows the GEMV, which writes no cache: not after a cache write.)
  if (!rope_attention_fusable(a, *qkv[2].y, q_norm, k_norm, spec, attn, false)) return false;
  check_matmul_args(x, norm, qkv);
  check_matmul_shapes(x, norm, qkv);
  const int64_t q_n = q.n_elements(), k_n = qkv[1].y->n_elements(), v_n = qkv[2].y->n_elements();
  // The partials of k and v start 16-byte aligned (v's rows are read as float2), then the halves'
  // sums of squares.
  auto at4 = [](int64_t n) { return int64_t(cuda::align_up(uint64_t(n), 4)); };
  const int64_t k_at = at4(q_n), v_at = k_at + at4(k_n), ss_at = v_at + at4(v_n);
  // (The device made current for the scratch without counting an op: the GEMV's launch counts it.)
  if (failed() || !note(make_current(), "cudaSetDevice")) return true;
  float* p2 = static_cast<float*>(scratch(kQkvParts, uint64_t(ss_at + 2) * sizeof(float)));
  if (!p2) return true;  // (the sticky error)
  float* const y2[3] = {p2, p2 + k_at, p2 + v_at};
  launch_matmuls(x, norm, qkv, nullptr, y2, norm.w ? p2 + ss_at : nullptr);
  if (failed()) return true;
  cuda::AttnRope parts;
  parts.q2 = y2[0];
  parts.k2 = y2[1];
  parts.v2 = y2[2];
  parts.in_ss = norm.w ? p2 + ss_at : nullptr;
  parts.in_cols = x.cols();
  parts.in_eps = norm.eps;
  rope_kv_attention_parts(q, *qkv[1].y, *qkv[2].y, q_norm, k_norm, eps, pos, inv_freq, spec, k_cache, v_cache, attn,
                          out, &parts);
  ++qkv_splits_;
  return true;
}

void CudaBackend::check_matmul_args(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs) {
  SHOAL_CHECK(!norm.w || norm.h != nullptr, "matmuls: a norm needs its output tensor h");
  SHOAL_CHECK(!norm.w || norm.h->data != x.data, "matmuls: h must not alias x");
  for (size_t i = 0; i < outs.size(); ++i) {
    SHOAL_CHECK(outs[i].w && outs[i].y, "matmuls: an output without weight or y");
    SHOAL_CHECK(outs[i].y->data != x.data, "matmuls: y must not alias x");
    for (size_t j = 0; j < i; ++j) SHOAL_CHECK(outs[j].y->data != outs[i].y->data, "matmuls: two outputs share y");
  }
}

void CudaBackend::launch_matmuls(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs,
                                 const cuda::GemvRope* rope, float* const* y2, float* split_ss) {
  const int64_t n = x.rows();
  check_matmul_args(x, norm, outs);
  const int64_t gemv_most = gemv_max_tokens(outs);
  const bool fusable = gemv_launches(x, norm, outs, gemv_most);
  SHOAL_CHECK(!rope || fusable, "matmuls: the RoPE epilogue needs the one-launch GEMV path");
  if (!fusable) {
    if (n <= gemv_most || !gemm_matmuls(x, norm, outs)) Backend::matmuls(x, norm, outs);
    return;
  }
  check_matmul_shapes(x, norm, outs);
  const float* xs = f32(x);
  cuda::GemvOut g[cuda::kGemvMaxOuts];
  cuda::WeightRef ups[cuda::kGemvMaxOuts];
  cuda::GemvOpts opts;
  opts.norm_w = norm.w ? f32(*norm.w) : nullptr;
  opts.eps = norm.eps;
  opts.rope = rope;
  opts.split_k = y2 != nullptr;
  opts.split_ss = split_ss;
  const MatmulOut* launched[cuda::kGemvMaxOuts];
  const Tensor* ys[cuda::kGemvMaxOuts];
  int count = 0;
  auto flush = [&] {
    if (count == 0) return;
    if (failed()) {
      count = 0;
      return;
    }
    // Bias and old y before the kernel's PDL wait: only if the kernel before writes neither.
    opts.early_epilogue = true;
    for (int i = 0; i < count; ++i) {
      const MatmulOut& o = *launched[i];
      if ((o.accumulate && last_op_may_write(o.y->data, o.y->nbytes())) ||
          (o.bias && last_op_may_write(o.bias->data, o.bias->nbytes())))
        opts.early_epilogue = false;
    }
    // Activation fragments (GemvOpts::frags_in / frags_out; one token): a quantized GEMV takes x
    // as fragments when the op just before (ops_, not yet counted for this one) wrote them of
    // x (Q4_0: whole 64-value chunks only); a quantized GLU product (gate / up, whose output
    // the down projection reads next) writes them of its output.
    const WKind kind = g[0].w.kind;
    const bool quant = kind == WKind::kQ8_0 || kind == WKind::kQ4_0;
    const bool take = frags_ && quant && n == 1 && !opts.norm_w && !g[0].up && frags_written_.op == ops_ &&
                      frags_written_.y == xs && frags_written_.cols == x.cols() &&
                      (kind != WKind::kQ4_0 || x.cols() % 64 == 0);
    opts.frags_in = take && !opts.split_k ? frags_written_.data : nullptr;
    opts.frags_out = nullptr;
    if (frags_ && quant && n == 1 && count == 1 && g[0].up && g[0].w.rows % 32 == 0) {
      opts.frags_out = scratch(kFrags, uint64_t(cuda::gemv_frag_bytes(g[0].w.rows)));
      if (!opts.frags_out) {  // (the sticky error)
        count = 0;
        return;
      }
    }
    if (!use_device()) {
      count = 0;
      return;
    }
    note(cuda::gemv_multi(g, count, xs, int(n), opts, stream_), "gemv");
    if (opts.early_epilogue) ++early_epilogues_;
    if (opts.frags_in) ++frag_handoffs_;
    if (opts.frags_out) frags_written_ = {ops_, g[0].y, g[0].w.rows, opts.frags_out};
    for (int i = 0; i < count; ++i) ys[i] = launched[i]->y;
    wrote(std::span<const Tensor* const>(ys, size_t(count)));
    count = 0;
  };
  for (const MatmulOut& o : outs) {
    const Tensor& w = *o.w;
    const cuda::WeightRef wr = weight_ref(w);
    // A launch takes up to kGemvMaxOuts products of one weight kind, GLU or not, sharing
    // accumulate and the activation.
    if (count > 0 && (count == cuda::kGemvMaxOuts || g[0].w.kind != wr.kind || (g[0].up != nullptr) != (o.up != nullptr) ||
                      opts.accumulate != o.accumulate || (o.up && opts.act != act_of(o.act))))
      flush();
    if (o.up) ups[count] = weight_ref(*o.up);
    g[count] = cuda::GemvOut{wr, o.up ? &ups[count] : nullptr, o.bias ? f32(*o.bias) : nullptr, f32(*o.y),
                             y2 ? y2[&o - outs.data()] : nullptr};
    launched[count] = &o;
    opts.accumulate = o.accumulate;
    opts.act = act_of(o.act);
    ++count;
  }
  flush();
}

bool CudaBackend::qkv_args(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* q_norm,
                           const Tensor* k_norm, float eps, const Tensor& pos, const Tensor& inv_freq,
                           const RopeSpec& spec, int n_kv_heads, const Tensor& k_cache, const Tensor& v_cache,
                           cuda::QkvArgs& a) const {
  const int64_t n = q.rows(), hd = spec.head_dim;
  // (The kernel copies heads of head_dim % 4 == 0 a float4 per lane: 16-byte aligned tensors.)
  auto aligned = [](const Tensor& t) { return reinterpret_cast<uintptr_t>(t.data) % 16 == 0; };
  const bool all_aligned = aligned(q) && aligned(k) && aligned(v) && aligned(k_cache) && aligned(v_cache);
  const bool fusable = hd <= 256 && (k_cache.dtype != DType::kQ8_0 || hd % 32 == 0) &&
                       (!q_norm || q_norm->n_elements() == hd) && (!k_norm || k_norm->n_elements() == hd) &&
                       (hd % 4 != 0 || all_aligned);
  if (!fusable) return false;
  const int64_t width = int64_t(n_kv_heads) * hd;
  SHOAL_CHECK(q.cols() == int64_t(spec.n_heads) * hd && k.rows() == n && k.cols() == width && v.rows() == n &&
                  v.cols() == width,
              "rope_kv_write: q {} k {} v {} for {} / {} heads of {}", q.shape_string(), k.shape_string(),
              v.shape_string(), spec.n_heads, n_kv_heads, hd);
  SHOAL_CHECK(spec.rot_dims <= hd && spec.rot_dims % 2 == 0 && inv_freq.n_elements() == spec.rot_dims / 2 &&
                  pos.n_elements() == n,
              "rope_kv_write: rope dims / positions");
  SHOAL_CHECK(k_cache.cols() == width && v_cache.cols() == width && k_cache.dtype == v_cache.dtype &&
                  k_cache.rows() == v_cache.rows(),
              "rope_kv_write: caches {} / {}", k_cache.shape_string(), v_cache.shape_string());
  a.rope.n_tokens = n;
  a.rope.n_heads = spec.n_heads;
  a.rope.head_dim = spec.head_dim;
  a.rope.rot_dims = spec.rot_dims;
  a.rope.interleaved = spec.interleaved;
  a.rope.attn_factor = spec.attn_factor;
  a.n_kv_heads = n_kv_heads;
  a.q_norm = q_norm ? f32(*q_norm) : nullptr;
  a.k_norm = k_norm ? f32(*k_norm) : nullptr;
  a.eps = eps;
  a.cache = cache_kind(k_cache.dtype);
  a.n_ctx = k_cache.rows();
  return true;
}

void CudaBackend::rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm,
                                float eps, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec,
                                int n_kv_heads, Tensor& k_cache, Tensor& v_cache) {
  cuda::QkvArgs a;
  if (!qkv_args(q, k, v, q_norm, k_norm, eps, pos, inv_freq, spec, n_kv_heads, k_cache, v_cache, a)) {
    Backend::rope_kv_write(q, k, v, q_norm, k_norm, eps, pos, inv_freq, spec, n_kv_heads, k_cache, v_cache);
    return;
  }
  if (failed() || !use_device()) return;
  note(cuda::rope_kv_write(f32(q), f32(k), f32(v), i32(pos), f32(inv_freq), a, k_cache.data, v_cache.data, stream_),
       "rope_kv_write");
  if (q.rows() > 0) kv_written_ = {ops_, k_cache.data, v_cache.data, pos.data, q.rows()};
}

void CudaBackend::activation(const Tensor& x, Activation act, Tensor& out) {
  SHOAL_CHECK(out.n_elements() == x.n_elements(), "activation shapes");
  if (failed() || !use_device()) return;
  note(cuda::activation(f32(x), act_of(act), f32(out), x.n_elements(), stream_), "activation");
  wrote({&out});
}

void CudaBackend::convert(const Tensor& src, Tensor& dst) {
  SHOAL_CHECK(dst.n_elements() == src.n_elements(), "convert shapes");
  const int s = plain_id(src.dtype), d = plain_id(dst.dtype);
  if (failed() || !use_device()) return;
  note(cuda::convert(src.data, s, dst.data, d, src.n_elements(), stream_), "convert");
}

void CudaBackend::argmax(const Tensor& logits, Tensor& out) {
  SHOAL_CHECK(out.n_elements() == logits.rows() && out.dtype == DType::kI32, "argmax shapes");
  if (failed() || !use_device()) return;
  void* s = scratch(kSampleScratch, cuda::argmax_scratch_bytes(logits.rows(), logits.cols()));
  if (!s) return;
  note(cuda::argmax(f32(logits), logits.rows(), logits.cols(), s, static_cast<int32_t*>(out.data), stream_), "argmax");
}

void CudaBackend::sample(const Tensor& ids, const Tensor& vals, Tensor& state, Tensor& out) {
  const int64_t k = ids.n_elements();
  SHOAL_CHECK(k >= 1 && k <= cuda::kTopKMax && vals.n_elements() == k && ids.dtype == DType::kI32 &&
                  vals.dtype == DType::kF32 && state.nbytes() == sizeof(DeviceSampling) && out.n_elements() == 1 &&
                  out.dtype == DType::kI32,
              "sample shapes");
  if (failed() || !use_device()) return;
  note(cuda::sample(static_cast<const int32_t*>(ids.data), f32(vals), int(k), static_cast<DeviceSampling*>(state.data),
                    static_cast<int32_t*>(out.data), stream_),
       "sample");
}

void CudaBackend::advance_decode(const Tensor& next, Tensor& ids, Tensor& pos) {
  const int64_t n = next.n_elements();
  SHOAL_CHECK(next.dtype == DType::kI32 && ids.dtype == DType::kI32 && pos.dtype == DType::kI32 &&
                  ids.n_elements() == n && pos.n_elements() == n && next.data != ids.data &&
                  next.data != pos.data && ids.data != pos.data && n >= 1 && n <= kDecodedMax,
              "advance_decode shapes");
  if (failed() || !use_device()) return;
  const auto b = reinterpret_cast<uintptr_t>(pos.data);
  pos_advanced_ = {ops_, b, b + pos.nbytes()};
  note(cuda::advance_decode(static_cast<const int32_t*>(next.data), int(n), static_cast<int32_t*>(ids.data),
                            static_cast<int32_t*>(pos.data), decoded_device_, kDecodedSlots, stream_),
       "advance_decode");
}

void CudaBackend::top_k(const Tensor& logits, int k, Tensor& ids, Tensor& vals) {
  check_top_k(logits, k, ids, vals);
  if (failed() || !use_device()) return;
  void* s = scratch(kSampleScratch, cuda::top_k_scratch_bytes(logits.cols(), k));
  if (!s) return;
  note(cuda::top_k(f32(logits), logits.cols(), k, s, static_cast<int32_t*>(ids.data), f32(vals), stream_), "top_k");
}

void CudaBackend::top_k_sample(const Tensor& logits, int k, Tensor& ids, Tensor& vals, Tensor& state, Tensor& out) {
  check_top_k(logits, k, ids, vals);
  SHOAL_CHECK(ids.n_elements() == k && vals.n_elements() == k && state.nbytes() == sizeof(DeviceSampling) &&
                  out.n_elements() == 1 && out.dtype == DType::kI32,
              "top_k_sample shapes");
  if (failed() || !use_device()) return;
  void* s = scratch(kSampleScratch, cuda::top_k_scratch_bytes(logits.cols(), k));
  if (!s) return;
  note(cuda::top_k_sample(f32(logits), logits.cols(), k, s, static_cast<int32_t*>(ids.data), f32(vals),
                          static_cast<DeviceSampling*>(state.data), static_cast<int32_t*>(out.data), stream_),
       "top_k_sample");
}

void CudaBackend::check_top_k(const Tensor& logits, int k, const Tensor& ids, const Tensor& vals) {
  SHOAL_CHECK(k > 0 && k <= logits.cols() && ids.n_elements() >= k && vals.n_elements() >= k &&
                  ids.dtype == DType::kI32 && vals.dtype == DType::kF32,
              "top_k shapes");
  SHOAL_CHECK(k <= cuda::kTopKMax, "CUDA top_k supports k <= {}, got {}", cuda::kTopKMax, k);
}

}  // namespace shoal
