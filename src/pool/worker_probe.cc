#include "pool/worker_probe.h"

#include <vector>

#include "core/half.h"
#include "core/log.h"

namespace shoal::pool {
namespace {

using SteadyClock = std::chrono::steady_clock;

/// Allocates and fills one F16 weight [rows, cols] with small values.
Result<Tensor> make_weight(Backend& be, int64_t rows, int64_t cols) {
  SHOAL_ASSIGN_OR_RETURN(Tensor w, be.alloc_weight(DType::kF16, {rows, cols}));
  std::vector<uint16_t> bytes(size_t(rows * cols), f32_to_f16(0.01f));
  if (Status st = be.upload_weight(w, bytes.data(), bytes.size() * 2); !st.ok()) {
    be.free(w);
    return st;
  }
  return w;
}

/// Runs y = x · wᵀ until `budget` passed (at least once); seconds per run.
Result<double> time_matmul(Backend& be, const Tensor& w, const Tensor& x, Tensor& y, SteadyClock::duration budget) {
  const auto t0 = SteadyClock::now();
  int runs = 0;
  do {
    be.matmul(w, x, y);
    SHOAL_RETURN_IF_ERROR(be.synchronize());
    ++runs;
  } while (SteadyClock::now() - t0 < budget);
  return std::chrono::duration<double>(SteadyClock::now() - t0).count() / runs;
}

}  // namespace

Result<SpeedProbe> probe_speed(Backend& be, std::chrono::milliseconds budget) {
  const auto t0 = SteadyClock::now();
  constexpr int64_t kBigRows = 4096, kBigCols = 4096;  // 32 MiB of F16
  constexpr int64_t kRows = 512, kCols = 1024, kBatch = 32;
  SpeedProbe p;
  std::vector<Tensor> owned;
  auto cleanup = [&] {
    for (Tensor& t : owned) be.free(t);
  };
  auto run = [&]() -> Status {
    SHOAL_ASSIGN_OR_RETURN(Tensor big, make_weight(be, kBigRows, kBigCols));
    owned.push_back(big);
    SHOAL_ASSIGN_OR_RETURN(Tensor small, make_weight(be, kRows, kCols));
    owned.push_back(small);
    SHOAL_ASSIGN_OR_RETURN(Tensor x, be.alloc(DType::kF32, {kBatch, kBigCols}));
    owned.push_back(x);
    SHOAL_ASSIGN_OR_RETURN(Tensor y, be.alloc(DType::kF32, {kBatch, kBigRows}));
    owned.push_back(y);
    std::vector<float> ones(size_t(kBatch * kBigCols), 1.0f);
    SHOAL_RETURN_IF_ERROR(be.to_device(x, ones.data(), ones.size() * 4));
    Tensor x1 = x.rows_view(0, 1), y1 = y.rows_view(0, 1);
    SHOAL_ASSIGN_OR_RETURN(double gemv_s, time_matmul(be, big, x1, y1, budget / 2));
    p.mem_gbps = double(big.nbytes()) / gemv_s / 1e9;
    Tensor xb = x.reshaped({kBatch * kBigCols / kCols, kCols}).rows_view(0, kBatch);
    Tensor yb = y.reshaped({kBatch * kBigRows / kRows, kRows}).rows_view(0, kBatch);
    SHOAL_ASSIGN_OR_RETURN(double gemm_s, time_matmul(be, small, xb, yb, budget / 2));
    p.matmul_gflops = 2.0 * kRows * kCols * kBatch / gemm_s / 1e9;
    return Status::Ok();
  };
  Status st = run();
  cleanup();
  SHOAL_RETURN_IF_ERROR(st);
  p.seconds = std::chrono::duration<double>(SteadyClock::now() - t0).count();
  return p;
}

void warn_if_more_than_free(uint64_t lent, const Backend& backend) {
  const uint64_t free = backend.free_memory();
  if (lent > free) {
    spdlog::warn("--mem {} is more than the {} free on {}: a plan that counts on it may fail to load",
                 format_bytes(lent), format_bytes(free), backend.name());
  }
}

}  // namespace shoal::pool
