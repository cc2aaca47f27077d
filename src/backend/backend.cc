#include "backend/backend.h"

#include <algorithm>
#include <charconv>
#include <cstdint>

#include "backend/cpu/cpu_backend.h"

namespace shoal {

#ifdef SHOAL_HAVE_CUDA
// Defined in src/backend/cuda/ (the shoal_cuda library).
Result<std::unique_ptr<Backend>> create_cuda_backend(int device, const BackendOptions& opts);
#endif

Result<std::vector<Tensor>> Backend::alloc_weights(DType dtype, std::span<const std::array<int64_t, 2>> shapes) {
  std::vector<Tensor> out;
  for (const auto& [rows, cols] : shapes) {
    Result<Tensor> t = alloc_weight(dtype, {rows, cols});
    if (!t.ok()) {
      for (Tensor& done : out) free(done);
      return t.status();
    }
    out.push_back(*t);
  }
  return out;
}

Status Backend::check_decoded_wait(int64_t pos, int n) {
  if (n < 1 || n > Backend::kDecodedMax)
    return make_error(Code::kInvalidArgument, "wait for {} decoded ids (1..{})", n, Backend::kDecodedMax);
  if (pos < 0 || pos > INT32_MAX) return make_error(Code::kInvalidArgument, "wait for the step at position {}", pos);
  return Status::Ok();
}

void Backend::publish_decoded(int32_t pos, const int32_t* ids, int n) {
  SHOAL_CHECK(pos >= 0 && n >= 1 && n <= kDecodedMax, "publish_decoded: position {}, {} ids", pos, n);
  Decoded& d = decoded_[size_t(pos % kDecodedSlots)];
  d.pos = pos;
  d.n = n;
  std::copy(ids, ids + n, d.ids.begin());
}

Status Backend::wait_decoded(int64_t pos, int32_t* dst, int n) {
  SHOAL_RETURN_IF_ERROR(check_decoded_wait(pos, n));
  const Decoded& d = decoded_[size_t(pos % kDecodedSlots)];
  if (d.pos != pos) return make_error(Code::kFailedPrecondition, "no decode step at position {} was published", pos);
  if (d.n != n)
    return make_error(Code::kInvalidArgument, "the step at position {} published {} ids, not {}", pos, d.n, n);
  std::copy(d.ids.begin(), d.ids.begin() + n, dst);
  return Status::Ok();
}

Status Backend::clear_decoded() {
  SHOAL_RETURN_IF_ERROR(synchronize());
  for (Decoded& d : decoded_) d.pos = -1;
  return Status::Ok();
}

void Backend::top_k_sample(const Tensor& logits, int k, Tensor& ids, Tensor& vals, Tensor& state, Tensor& out) {
  SHOAL_CHECK(ids.n_elements() == k && vals.n_elements() == k, "top_k_sample: ids and vals of k elements");
  top_k(logits, k, ids, vals);
  sample(ids, vals, state, out);
}

void Backend::add_rms_norm(Tensor& x, const Tensor& delta, const Tensor& w, float eps, Tensor& y) {
  add(x, delta, x);
  rms_norm(x, w, eps, y);
}

void Backend::matmul_glu(const Tensor& w_gate, const Tensor& w_up, const Tensor& x, Activation act,
                         Tensor& gate_buf, Tensor& up_buf, Tensor& out) {
  matmul(w_gate, x, gate_buf);
  matmul(w_up, x, up_buf);
  glu(gate_buf, up_buf, act, out);
}

void Backend::matmuls(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> outs) {
  const Tensor* in = &x;
  if (norm.w) {
    SHOAL_CHECK(norm.h != nullptr && norm.h->data != x.data, "matmuls: a norm needs an output tensor h apart from x");
    rms_norm(x, *norm.w, norm.eps, *norm.h);
    in = norm.h;
  }
  for (const MatmulOut& o : outs) {
    SHOAL_CHECK(o.w && o.y, "matmuls: an output without weight or y");
    if (o.up) {
      SHOAL_CHECK(o.tmp && !o.bias && !o.accumulate, "matmuls: a GLU product takes tmp, no bias, no accumulate");
      matmul_glu(*o.w, *o.up, *in, o.act, *o.y, *o.tmp, *o.y);
    } else if (o.accumulate) {
      SHOAL_CHECK(o.tmp != nullptr, "matmuls: accumulate needs tmp");
      matmul(*o.w, *in, *o.tmp, o.bias);
      add(*o.y, *o.tmp, *o.y);
    } else {
      matmul(*o.w, *in, *o.y, o.bias);
    }
  }
}

void Backend::rope_kv_write(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm,
                            float eps, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec,
                            int n_kv_heads, Tensor& k_cache, Tensor& v_cache) {
  if (q_norm) rms_norm(q, *q_norm, eps, q);
  if (k_norm) rms_norm(k, *k_norm, eps, k);
  rope(q, pos, inv_freq, spec);
  RopeSpec ks = spec;
  ks.n_heads = n_kv_heads;
  rope(k, pos, inv_freq, ks);
  kv_write(k_cache, v_cache, k, v, pos);
}

void Backend::rope_kv_attention(Tensor& q, Tensor& k, const Tensor& v, const Tensor* q_norm, const Tensor* k_norm,
                                float eps, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec,
                                Tensor& k_cache, Tensor& v_cache, const AttentionSpec& attn, Tensor& out) {
  rope_kv_write(q, k, v, q_norm, k_norm, eps, pos, inv_freq, spec, attn.n_kv_heads, k_cache, v_cache);
  attention(q, k_cache, v_cache, pos, attn, out);
}

void Backend::qkv_attention(const Tensor& x, const InputNorm& norm, std::span<const MatmulOut> qkv,
                            const Tensor* q_norm, const Tensor* k_norm, float eps, const Tensor& pos,
                            const Tensor& inv_freq, const RopeSpec& spec, Tensor& k_cache, Tensor& v_cache,
                            const AttentionSpec& attn, Tensor& out) {
  SHOAL_CHECK(qkv.size() == 3 && qkv[0].y && qkv[1].y && qkv[2].y, "qkv_attention needs the q, k and v products");
  matmuls(x, norm, qkv);
  rope_kv_attention(*qkv[0].y, *qkv[1].y, *qkv[2].y, q_norm, k_norm, eps, pos, inv_freq, spec, k_cache, v_cache, attn,
                    out);
}

void Backend::gated_ffn(const Tensor& in, const InputNorm& norm, const MatmulOut& glu, const MatmulOut& down) {
  SHOAL_CHECK(glu.up && glu.y, "gated_ffn needs the gate / up product");
  matmuls(in, norm, {&glu, 1});
  matmuls(*glu.y, InputNorm{}, {&down, 1});
}

std::optional<int> cuda_device_index(std::string_view device, bool* bad_cuda) {
  if (bad_cuda) *bad_cuda = false;
  if (device != "cuda" && !device.starts_with("cuda:")) return std::nullopt;
  int index = 0;
  if (device.size() > 5) {
    const std::string_view digits = device.substr(5);
    const auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    if (ec != std::errc() || p != digits.data() + digits.size() || index < 0) {
      if (bad_cuda) *bad_cuda = true;
      return std::nullopt;
    }
  }
  return index;
}

Status check_device_name(std::string_view device) {
  if (device == "cpu" || device == "cpu-ref") return Status::Ok();
  bool bad = false;
  if (cuda_device_index(device, &bad)) return Status::Ok();
  if (bad) return make_error(Code::kInvalidArgument, "bad device '{}': expected cuda:N", device);
  return make_error(Code::kInvalidArgument, "unknown device '{}' (expected cpu, cpu-ref or cuda:N)", device);
}

Result<std::unique_ptr<Backend>> create_backend(std::string_view device, const BackendOptions& opts) {
  SHOAL_RETURN_IF_ERROR(check_device_name(device));
  if (device == "cpu" || device == "cpu-ref") {
    BackendOptions o = opts;
    if (device == "cpu-ref") o.reference = true;
    return std::unique_ptr<Backend>(new CpuBackend(o));
  }
  const int index = *cuda_device_index(device);  // (a CUDA name: checked above)
#ifdef SHOAL_HAVE_CUDA
  return create_cuda_backend(index, opts);
#else
  (void)index;
  return make_error(Code::kUnavailable,
                    "device '{}' asked for, but this build of shoal has no CUDA backend "
                    "(rebuild where nvcc is installed)", device);
#endif
}

}  // namespace shoal
