// The CPU backend. Two paths behind one class:
// - reference (BackendOptions::reference, device "cpu-ref"): plain single-threaded loops in f32
//   (ref_ops.h), written for reading; the oracle for every other backend and kernel.
// - fast (device "cpu"): multi-threaded, SIMD kernels chosen at run time (AVX2 / AVX-512)
//   for the matmuls and attention (matmul.h). Results do not depend on the thread count.
#pragma once

#include <memory>

#include "backend/backend.h"
#include "core/thread_pool.h"

namespace shoal {

class CpuBackend : public Backend {
 public:
  explicit CpuBackend(const BackendOptions& opts);
  ~CpuBackend() override;

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override;
  uint64_t free_memory() const override;
  bool reference() const { return reference_; }
  ThreadPool& pool() { return *pool_; }

  Result<Tensor> alloc(DType dtype, std::initializer_list<int64_t> shape) override;
  Result<Tensor> alloc_weight(DType dtype, std::initializer_list<int64_t> shape) override;
  Status upload_weight(Tensor& t, const void* bytes, uint64_t nbytes) override;
  void free(Tensor& t) override;
  Status to_device(Tensor& t, const void* src, uint64_t nbytes, uint64_t offset) override;
  Status to_host(void* dst, const Tensor& t, uint64_t nbytes, uint64_t offset) override;
  Status synchronize() override { return Status::Ok(); }

  void embed(const Tensor& table, const Tensor& ids, Tensor& out) override;
  void matmul(const Tensor& w, const Tensor& x, Tensor& y, const Tensor* bias) override;
  void rms_norm(const Tensor& x, const Tensor& w, float eps, Tensor& y) override;
  void layer_norm(const Tensor& x, const Tensor& w, const Tensor* b, float eps, Tensor& y) override;
  void add(const Tensor& a, const Tensor& b, Tensor& y) override;
  void scale(Tensor& x, float s) override;
  void rope(Tensor& x, const Tensor& pos, const Tensor& inv_freq, const RopeSpec& spec) override;
  void kv_write(Tensor& k_cache, Tensor& v_cache, const Tensor& k, const Tensor& v,
                const Tensor& pos) override;
  void attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache, const Tensor& pos,
                 const AttentionSpec& spec, Tensor& out) override;
  void glu(const Tensor& gate, const Tensor& up, Activation act, Tensor& out) override;
  void activation(const Tensor& x, Activation act, Tensor& out) override;
  void convert(const Tensor& src, Tensor& dst) override;
  void argmax(const Tensor& logits, Tensor& out) override;
  void top_k(const Tensor& logits, int k, Tensor& ids, Tensor& vals) override;
  void advance_decode(const Tensor& next, Tensor& ids, Tensor& pos) override;
  void sample(const Tensor& ids, const Tensor& vals, Tensor& state, Tensor& out) override;

 private:
  bool reference_;
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace shoal
