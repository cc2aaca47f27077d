#include "backend/cpu/cpu_backend.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "backend/cpu/attention_fast.h"
#include "backend/cpu/matmul.h"
#include "backend/cpu/ref_ops.h"

namespace shoal {

namespace {

constexpr uint64_t kAlign = 64;

uint64_t mem_available_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t value = 0;
  std::string unit;
  while (in >> key >> value >> unit) {
    if (key == "MemAvailable:") return value * 1024;
  }
  return uint64_t(::sysconf(_SC_PHYS_PAGES)) * uint64_t(::sysconf(_SC_PAGESIZE));
}

Result<Tensor> alloc_host(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t = Tensor::make(nullptr, dtype, shape);
  for (int i = 0; i < t.nd; ++i)
    if (t.shape[size_t(i)] < 0) return make_error(Code::kInvalidArgument, "negative dimension");
  if (t.cols() % dtype_info(dtype).block_size != 0)
    return make_error(Code::kInvalidArgument, "{} row of {} values is not whole blocks", dtype_name(dtype), t.cols());
  const uint64_t bytes = std::max<uint64_t>(kAlign, (t.nbytes() + kAlign - 1) / kAlign * kAlign);
  t.data = std::aligned_alloc(kAlign, bytes);
  if (!t.data)
    return make_error(Code::kOutOfMemory, "cannot allocate {} bytes of host memory ({} available)", bytes,
                      mem_available_bytes());
  return t;
}

}  // namespace

CpuBackend::CpuBackend(const BackendOptions& opts)
    : reference_(opts.reference), pool_(std::make_unique<ThreadPool>(opts.reference ? 1 : opts.threads)) {}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::name() const {
  return reference_ ? std::string("cpu-ref (reference, 1 thread)")
                    : fmt::format("cpu ({} thread{})", pool_->size(), pool_->size() == 1 ? "" : "s");
}

uint64_t CpuBackend::free_memory() const { return mem_available_bytes(); }

Result<Tensor> CpuBackend::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  return alloc_host(dtype, shape);
}

Result<Tensor> CpuBackend::alloc_weight(DType dtype, std::initializer_list<int64_t> shape) {
  return alloc_host(dtype, shape);
}

Status CpuBackend::upload_weight(Tensor& t, const void* bytes, uint64_t nbytes) {
  if (nbytes != t.nbytes())
    return make_error(Code::kInvalidArgument, "weight of {} bytes uploaded into a tensor of {}", nbytes, t.nbytes());
  std::memcpy(t.data, bytes, nbytes);
  return Status::Ok();
}

void CpuBackend::free(Tensor& t) {
  std::free(t.data);
  t.data = nullptr;
}

Status CpuBackend::to_device(Tensor& t, const void* src, uint64_t nbytes, uint64_t offset) {
  if (offset > t.nbytes() || nbytes > t.nbytes() - offset)
    return make_error(Code::kOutOfRange, "copy of {} bytes at {} into a tensor of {}", nbytes, offset, t.nbytes());
  std::memcpy(static_cast<uint8_t*>(t.data) + offset, src, nbytes);
  return Status::Ok();
}

Status CpuBackend::to_host(void* dst, const Tensor& t, uint64_t nbytes, uint64_t offset) {
  if (offset > t.nbytes() || nbytes > t.nbytes() - offset)
    return make_error(Code::kOutOfRange, "copy of {} bytes at {} from a tensor of {}", nbytes, offset, t.nbytes());
  std::memcpy(dst, static_cast<const uint8_t*>(t.data) + offset, nbytes);
  return Status::Ok();
}

void CpuBackend::embed(const Tensor& table, const Tensor& ids, Tensor& out) { ref::embed(table, ids, out); }

void CpuBackend::matmul(const Tensor& w, const Tensor& x, Tensor& y, const Tensor* bias) {
  if (reference_) {
    ref::matmul(w, x, y, bias);
  } else {
    fast_matmul(*pool_, w, x, y, bias);
  }
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) { ref::rms_norm(x, w, eps, y); }

void CpuBackend::layer_norm(const Tensor& x, const Tensor& w, const Tensor* b, float eps, Tensor& y) {
  ref::layer_norm(x, w, b, eps, y);
}

void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& y) { ref::add(a, b, y); }

void CpuBackend::scale(Tensor& x, float s) { ref::scale(x, s); }

void CpuBackend::rope(Tensor& x, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec) {
  ref::rope(x, pos, inv_freq, spec);
}

void CpuBackend::kv_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v, const Tensor& pos) {
  ref::kv_write(k_cache, v_cache, k, v, pos);
}

void CpuBackend::attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                           const AttentionSpec& spec, Tensor& out) {
  if (reference_) {
    ref::attention(q, k_cache, v_cache, pos, spec, out);
  } else {
    fast_attention(*pool_, q, k_cache, v_cache, pos, spec, out);
  }
}

void CpuBackend::glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) {
  ref::glu(gate, up, act, out);
}

void CpuBackend::activation(const Tensor& x, Activation act, Tensor& out) { ref::activation(x, act, out); }

void CpuBackend::convert(const Tensor& src, Tensor& dst) { ref::convert(src, dst); }

void CpuBackend::argmax(const Tensor& logits, Tensor& out) { ref::argmax(logits, out); }
void CpuBackend::sample(const Tensor& ids, const Tensor& vals, Tensor& state, Tensor& out) {
  ref::sample(ids, vals, state, out);
}
void CpuBackend::advance_decode(const Tensor& next, Tensor& ids, Tensor& pos) {
  SHOAL_CHECK(pos.dtype == DType::kI32 && pos.n_elements() >= 1, "advance_decode shapes");
  const int32_t p0 = static_cast<const int32_t*>(pos.data)[0];
  ref::advance_decode(next, ids, pos);  // checks the rest
  publish_decoded(p0, static_cast<const int32_t*>(ids.data), int(ids.n_elements()));  // ids = next now
}

void CpuBackend::top_k(const Tensor& logits, int k, Tensor& ids, Tensor& vals) { ref::top_k(logits, k, ids, vals); }

}  // namespace shoal
