#include "backend/cpu/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "backend/cpu/matmul_kernels.h"
#include "core/check.h"

namespace shoal {

using namespace cpu_detail;

namespace {

const IsaKernels& matmul_kernels_for(CpuIsa isa) {
  SHOAL_CHECK(int(isa) <= int(cpu_isa_supported()), "CPU kernels {} requested on a CPU that supports only {}",
              cpu_isa_name(isa), cpu_isa_name(cpu_isa_supported()));
  switch (isa) {
    case CpuIsa::kAvx512: return kernels_avx512();
    case CpuIsa::kAvx2: return kernels_avx2();
    case CpuIsa::kScalar: break;
  }
  return kernels_scalar();
}

// A 64-byte aligned scratch buffer per calling thread for the quantized activations (QX).
uint8_t* qx_scratch(size_t bytes) {
  struct Buffer {
    std::unique_ptr<uint8_t, decltype(&std::free)> p{nullptr, &std::free};
    size_t size = 0;
  };
  thread_local Buffer buf;
  if (buf.size < bytes) {
    const size_t size = (bytes + 63) / 64 * 64;
    buf.p.reset(static_cast<uint8_t*>(std::aligned_alloc(64, size)));
    SHOAL_CHECK(buf.p != nullptr, "out of memory for {} bytes of matmul scratch", size);
    buf.size = size;
  }
  return buf.p.get();
}

// Weight bytes a task should cover so that its rows stay in L2 while blocks of tokens stream past.
constexpr uint64_t kGemmTileBytes = 256 << 10;
// Tokens per block in a GEMM: their activations (f32 or QX) stay in L2 across a task's rows.
constexpr int64_t kTokenBlock = 32;

}  // namespace

void fast_matmul_isa(ThreadPool& pool, CpuIsa isa, const Tensor& w, const Tensor& x, Tensor& y,
                     const Tensor* bias) {
  const int64_t out = w.rows(), in = w.cols(), n = x.rows();
  SHOAL_CHECK(w.nd >= 1 && w.aux == nullptr, "matmul weight {} must be a plain tensor", w.shape_string());
  SHOAL_CHECK(x.dtype == DType::kF32 && y.dtype == DType::kF32, "matmul activations must be f32");
  SHOAL_CHECK(x.cols() == in, "matmul x {} does not match w {}", x.shape_string(), w.shape_string());
  SHOAL_CHECK(y.rows() == n && y.cols() == out, "matmul y {} for x {} and w {}", y.shape_string(),
              x.shape_string(), w.shape_string());
  SHOAL_CHECK(!bias || (bias->dtype == DType::kF32 && bias->n_elements() == out), "matmul bias shape");
  SHOAL_CHECK(y.data != x.data, "matmul y must not alias x");
  if (n == 0 || out == 0) return;

  const IsaKernels& k = matmul_kernels_for(isa);
  MatmulJob job;
  job.w = static_cast<const uint8_t*>(w.data);
  job.w_row_bytes = w.row_bytes();
  job.wtype = w.dtype;
  job.in = in;
  job.out = out;
  job.n = n;
  job.x = static_cast<const float*>(x.data);
  job.y = static_cast<float*>(y.data);
  job.bias = bias ? static_cast<const float*>(bias->data) : nullptr;

  RowsFn fn = nullptr;
  switch (w.dtype) {
    case DType::kF32: fn = k.f32; break;
    case DType::kF16: fn = k.f16; break;
    case DType::kBF16: fn = k.bf16; break;
    case DType::kQ8_0: fn = k.q8_0; break;
    case DType::kQ4_0: fn = k.q4_0; break;
    default: SHOAL_CHECK(false, "fast_matmul: weight dtype {} is not supported", dtype_name(w.dtype));
  }
  if (w.dtype == DType::kQ8_0 || w.dtype == DType::kQ4_0) {
    SHOAL_CHECK(in % 32 == 0, "quantized weight rows of {} values", in);
    job.nbp = (in / 32 + 1) / 2 * 2;
    const int64_t rec = (36 * job.nbp + 63) / 64 * 64;
    job.qx_stride = rec;
    uint8_t* qx = qx_scratch(size_t(rec * n));
    const float* xs = job.x;
    pool.parallel_for(n, pool.grain_for(n, 4), [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) k.quantize_x(xs + t * in, in, job.nbp, qx + t * rec);
    });
    job.qx = qx;
  }

  // Tasks are runs of whole 4-row groups. GEMV: enough tasks to balance the threads. GEMM: about
  // kGemmTileBytes of weights per task, so they are read from memory once per task.
  const int64_t groups = (out + kTileRows - 1) / kTileRows;
  int64_t grain = pool.grain_for(groups, 1);
  if (n > 1) {
    const int64_t fit = std::max<int64_t>(1, int64_t(kGemmTileBytes / (job.w_row_bytes * kTileRows)));
    grain = std::min(grain, fit);
  }
  pool.parallel_for(groups, grain, [&](int64_t g0, int64_t g1) {
    fn(job, g0 * kTileRows, std::min(out, g1 * kTileRows), kTokenBlock);
  });
}

void fast_matmul(ThreadPool& pool, const Tensor& w, const Tensor& x, Tensor& y, const Tensor* bias) {
  fast_matmul_isa(pool, cpu_isa(), w, x, y, bias);
}

}  // namespace shoal
