#include "backend/backend.h"

#include <charconv>

#include "backend/cpu/cpu_backend.h"

namespace shoal {

#ifdef SHOAL_HAVE_CUDA
// Defined in src/backend/cuda/ (the shoal_cuda library).
Result<std::unique_ptr<Backend>> create_cuda_backend(int device, const BackendOptions& opts);
#endif

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

Result<std::unique_ptr<Backend>> create_backend(std::string_view device, const BackendOptions& opts) {
  if (device == "cpu" || device == "cpu-ref") {
    BackendOptions o = opts;
    if (device == "cpu-ref") o.reference = true;
    return std::unique_ptr<Backend>(new CpuBackend(o));
  }
  if (device == "cuda" || device.starts_with("cuda:")) {
    int index = 0;
    if (device.size() > 5) {
      auto digits = device.substr(5);
      auto [p, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
      if (ec != std::errc() || p != digits.data() + digits.size() || index < 0)
        return make_error(Code::kInvalidArgument, "bad device '{}': expected cuda:N", device);
    }
#ifdef SHOAL_HAVE_CUDA
    return create_cuda_backend(index, opts);
#else
    return make_error(Code::kUnavailable,
                      "device '{}' asked for, but this build of shoal has no CUDA backend "
                      "(rebuild where nvcc is installed)", device);
#endif
  }
  return make_error(Code::kInvalidArgument, "unknown device '{}' (expected cpu, cpu-ref or cuda:N)",
                    device);
}

}  // namespace shoal
