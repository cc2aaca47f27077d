// Device ceilings and timing for the CUDA benchmarks (cuda_probe.h).
#include "backend/cuda/cuda_probe.h"

#include <cublas_v2.h>

#include <algorithm>
#include <chrono>
#include <numeric>
#include <vector>
#ifdef SHOAL_CUDA_TIMELINE
#include <cstdio>
#include <cstdlib>
#endif

#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_util.h"
#include "backend/cuda/kernels.h"
#include "backend/cuda/tensor_args.h"

namespace shoal::cuda_probe {
namespace {

Status err(cudaError_t e, const char* what) {
  return make_error(Code::kInternal, "{} failed: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
}
#define PROBE_TRY(call)                                       \
  do {                                                        \
    const cudaError_t probe_e_ = (call);                      \
    if (probe_e_ != cudaSuccess) return err(probe_e_, #call); \
  } while (0)

// A device buffer freed on scope exit.
struct Buffer {
  void* p = nullptr;
  ~Buffer() { cudaFree(p); }
};

// Events around `reps` calls of `enqueue`, one pair per call; the median in ms.
template <class F>
Result<double> median_ms(cudaStream_t s, int reps, F&& enqueue) {
  std::vector<cudaEvent_t> ev(size_t(2 * reps));
  for (auto& e : ev) PROBE_TRY(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    PROBE_TRY(cudaEventRecord(ev[size_t(2 * i)], s));
    SHOAL_RETURN_IF_ERROR(enqueue());
    PROBE_TRY(cudaEventRecord(ev[size_t(2 * i + 1)], s));
  }
  PROBE_TRY(cudaStreamSynchronize(s));
  std::vector<double> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) {
    float m = 0;
    PROBE_TRY(cudaEventElapsedTime(&m, ev[size_t(2 * i)], ev[size_t(2 * i + 1)]));
    ms[size_t(i)] = m;
  }
  for (auto e : ev) cudaEventDestroy(e);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Status fill(void* p, int64_t n, cuda::FillKind kind, uint64_t seed, float scale, cudaStream_t s) {
  PROBE_TRY(cuda::fill_random(p, n, kind, seed, scale, s));
  return Status::Ok();
}

CudaBackend* as_cuda(Backend& b) { return dynamic_cast<CudaBackend*>(&b); }

#ifdef SHOAL_CUDA_TIMELINE
// One more replay of graph `key` with every block's pass through its PDL wait recorded
// (timeline.cuh), appended to the CSV at `path` under a "# graph <ms> ms" header.
Status record_timeline(Backend& b, uint64_t key, const std::function<void()>& record, const char* path, double ms) {
  cudaStream_t s = as_cuda(b)->stream();
  constexpr unsigned kCap = 1u << 20;
  const size_t bytes = sizeof(cuda::TimelineRecord) * kCap + 16;
  Buffer buf;
  PROBE_TRY(cudaMalloc(&buf.p, bytes));
  struct Off {  // recording stops on every way out, before buf is freed
    ~Off() { (void)cuda::timeline_start(nullptr, nullptr, 0); }
  } off;
  auto* recs = static_cast<cuda::TimelineRecord*>(buf.p);
  auto* count = reinterpret_cast<unsigned*>(recs + kCap);
  PROBE_TRY(cudaMemsetAsync(buf.p, 0, bytes, s));  // (unused mark slots stay zero)
  PROBE_TRY(cuda::timeline_start(recs, count, kCap));
  SHOAL_RETURN_IF_ERROR(b.run_graph(key, record));
  PROBE_TRY(cudaStreamSynchronize(s));
  unsigned n = 0;
  PROBE_TRY(cudaMemcpy(&n, count, 4, cudaMemcpyDeviceToHost));
  std::vector<cuda::TimelineRecord> host(std::min(n, kCap));
  PROBE_TRY(cudaMemcpy(host.data(), recs, sizeof(cuda::TimelineRecord) * host.size(), cudaMemcpyDeviceToHost));
  FILE* f = std::fopen(path, "a");
  if (!f) return make_error(Code::kIoError, "cannot write the timeline to {}", path);
  std::fprintf(f, "# graph %.4f ms\narrive,release,sm,block,grid,threads\n", ms);
  for (const auto& r : host)
    if (r.threads != 0)  // (unused mark slots)
      std::fprintf(f, "%llu,%llu,%u,%u,%u,%u\n", r.arrive, r.release, r.sm, r.block, r.grid, r.threads);
  std::fclose(f);
  return Status::Ok();
}
#endif

}  // namespace

Result<DeviceInfo> device_info(int device) {
  cudaDeviceProp prop{};
  const cudaError_t e = cudaGetDeviceProperties(&prop, device);
  if (e != cudaSuccess) return make_error(Code::kUnavailable, "cuda:{}: {}", device, cudaGetErrorString(e));
  return DeviceInfo{prop.name, prop.multiProcessorCount, uint64_t(prop.l2CacheSize), uint64_t(prop.totalGlobalMem)};
}

Result<double> read_bandwidth_gbs(int device, uint64_t bytes, int reps) {
  PROBE_TRY(cudaSetDevice(device));
  cudaDeviceProp prop{};
  PROBE_TRY(cudaGetDeviceProperties(&prop, device));
  Buffer buf, sink;
  PROBE_TRY(cudaMalloc(&buf.p, bytes));
  PROBE_TRY(cudaMalloc(&sink.p, 4));
  SHOAL_RETURN_IF_ERROR(fill(buf.p, int64_t(bytes), cuda::FillKind::kBytes, 1, 1.0f, nullptr));
  const int grid = prop.multiProcessorCount * 4;
  auto launch = [&]() -> Status {
    PROBE_TRY(cuda::read_all(buf.p, bytes, grid, static_cast<uint32_t*>(sink.p), nullptr));
    return Status::Ok();
  };
  SHOAL_RETURN_IF_ERROR(launch());  // warm-up
  SHOAL_ASSIGN_OR_RETURN(const double ms, median_ms(nullptr, reps, launch));
  return double(bytes) / (ms * 1e-3) / 1e9;
}

Result<double> copy_bandwidth_gbs(int device, uint64_t bytes, int reps) {
  PROBE_TRY(cudaSetDevice(device));
  Buffer a, b;
  PROBE_TRY(cudaMalloc(&a.p, bytes));
  PROBE_TRY(cudaMalloc(&b.p, bytes));
  SHOAL_RETURN_IF_ERROR(fill(a.p, int64_t(bytes), cuda::FillKind::kBytes, 2, 1.0f, nullptr));
  auto copy = [&]() -> Status {
    PROBE_TRY(cudaMemcpyAsync(b.p, a.p, bytes, cudaMemcpyDeviceToDevice, nullptr));
    return Status::Ok();
  };
  SHOAL_RETURN_IF_ERROR(copy());
  SHOAL_ASSIGN_OR_RETURN(const double ms, median_ms(nullptr, reps, copy));
  return 2.0 * double(bytes) / (ms * 1e-3) / 1e9;
}

Result<double> cublas_bf16_tflops(int device, int m, int n, int k, int reps) {
  PROBE_TRY(cudaSetDevice(device));
  Buffer a, b, c;
  PROBE_TRY(cudaMalloc(&a.p, size_t(m) * k * 2));
  PROBE_TRY(cudaMalloc(&b.p, size_t(k) * n * 2));
  PROBE_TRY(cudaMalloc(&c.p, size_t(m) * n * 2));
  SHOAL_RETURN_IF_ERROR(fill(a.p, int64_t(m) * k, cuda::FillKind::kBF16, 3, 1.0f, nullptr));
  SHOAL_RETURN_IF_ERROR(fill(b.p, int64_t(k) * n, cuda::FillKind::kBF16, 4, 1.0f, nullptr));
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return make_error(Code::kInternal, "cublasCreate failed");
  const float one = 1.0f, zero = 0.0f;
  auto gemm = [&]() -> Status {
    const cublasStatus_t s =
        cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, a.p, CUDA_R_16BF, m, b.p, CUDA_R_16BF, k, &zero, c.p,
                     CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (s != CUBLAS_STATUS_SUCCESS) return make_error(Code::kInternal, "cublasGemmEx: {}", cublasGetStatusString(s));
    return Status::Ok();
  };
  Status warm = gemm();
  for (int i = 0; i < 2 && warm.ok(); ++i) warm = gemm();
  auto ms = warm.ok() ? median_ms(nullptr, reps, gemm) : Result<double>(warm);
  cublasDestroy(h);
  SHOAL_ASSIGN_OR_RETURN(const double t, std::move(ms));
  return 2.0 * m * n * double(k) / (t * 1e-3) / 1e12;
}

namespace {
constexpr int kRateIters = 4096;  // stages (wgmma) or rounds (mma.sync) per launch
// Median TFLOP/s of `launch(grid, sink)` (grid: one block per SM), `flop_per_block` each.
template <class Launch>
Result<double> tensor_rate(int device, int reps, double flop_per_block, Launch&& launch) {
  cudaDeviceProp prop{};
  PROBE_TRY(cudaGetDeviceProperties(&prop, device));
  Buffer sink;
  PROBE_TRY(cudaMalloc(&sink.p, 4));
  auto once = [&]() -> Status {
    PROBE_TRY(launch(prop.multiProcessorCount, static_cast<float*>(sink.p)));
    return Status::Ok();
  };
  SHOAL_RETURN_IF_ERROR(once());  // warm-up
  SHOAL_ASSIGN_OR_RETURN(const double ms, median_ms(nullptr, reps, once));
  return flop_per_block * prop.multiProcessorCount / (ms * 1e-3) / 1e12;
}
}  // namespace

Result<double> wgmma_tflops(int device, int n_cols, int warpgroups, int mode, int reps) {
  PROBE_TRY(cudaSetDevice(device));
  if (!cuda::gemm_quant_available()) return make_error(Code::kUnavailable, "cuda:{} runs no sm_90a code", device);
  // 4 wgmma of 64 x n_cols x 16 per stage and warpgroup
  const double flop = 2.0 * 64 * n_cols * 16 * 4 * double(kRateIters) * warpgroups;
  return tensor_rate(device, reps, flop, [&](int grid, float* sink) {
    return cuda::wgmma_rate(n_cols, warpgroups, mode, kRateIters, grid, sink, nullptr);
  });
}

Result<double> mma_sync_tflops(int device, int warps, int reps) {
  PROBE_TRY(cudaSetDevice(device));
  const double flop = 2.0 * 16 * 8 * 16 * 8 * double(kRateIters) * warps;  // 8 m16n8k16 per round and warp
  return tensor_rate(device, reps, flop, [&](int grid, float* sink) {
    return cuda::mma_sync_rate(warps, kRateIters, grid, sink, nullptr);
  });
}

Result<double> time_graph_ms(Backend& b, const std::function<void()>& record, int reps) {
  CudaBackend* cb = as_cuda(b);
  if (!cb) return make_error(Code::kInvalidArgument, "time_graph_ms needs a CUDA backend, got {}", b.name());
  static uint64_t next_key = 0xbe7c000000000000ull;
  const uint64_t key = next_key++;
  SHOAL_RETURN_IF_ERROR(b.run_graph(key, record));  // record + first replay (warm-up)
  SHOAL_RETURN_IF_ERROR(b.run_graph(key, record));
  auto ms = median_ms(cb->stream(), reps, [&] { return b.run_graph(key, record); });
#ifdef SHOAL_CUDA_TIMELINE
  if (const char* path = std::getenv("SHOAL_TIMELINE"); path && ms.ok())
    SHOAL_RETURN_IF_ERROR(record_timeline(b, key, record, path, *ms));
#endif
  return ms;
}

Result<ChainTimes> time_chain_ms(Backend& b, const std::function<void()>& record, const Tensor& out, int32_t pos0,
                                 const std::function<Status()>& reset, int steps) {
  CudaBackend* cb = as_cuda(b);
  if (!cb) return make_error(Code::kInvalidArgument, "time_chain_ms needs a CUDA backend, got {}", b.name());
  static uint64_t next_key = 0xc4a1000000000000ull;
  const uint64_t key = next_key++;
  cudaStream_t s = cb->stream();
  int32_t* pinned = nullptr;
  PROBE_TRY(cudaMallocHost(reinterpret_cast<void**>(&pinned), 64));
  struct Free {
    int32_t* p;
    std::vector<cudaEvent_t> ev;
    ~Free() {
      cudaFreeHost(p);
      for (auto e : ev) cudaEventDestroy(e);
    }
  } owned{pinned, std::vector<cudaEvent_t>(size_t(steps) + 2)};
  std::vector<cudaEvent_t>& ev = owned.ev;
  for (auto& e : ev) PROBE_TRY(cudaEventCreate(&e));
  // mode 0: graphs only; 1: + copy and event; 2: waiting for each publication as Slice::decode.
  auto run = [&](int mode) -> Result<double> {
    SHOAL_RETURN_IF_ERROR(reset());
    SHOAL_RETURN_IF_ERROR(b.run_graph(key, record));  // recorded on the first call; warms up
    SHOAL_RETURN_IF_ERROR(b.clear_decoded());
    SHOAL_RETURN_IF_ERROR(reset());
    PROBE_TRY(cudaStreamSynchronize(s));
    const auto t0 = std::chrono::steady_clock::now();
    PROBE_TRY(cudaEventRecord(ev[size_t(steps)], s));
    for (int k = 0; k < steps; ++k) {
      SHOAL_RETURN_IF_ERROR(b.run_graph(key, record));
      if (mode == 1) {
        PROBE_TRY(cudaMemcpyAsync(pinned + k % 4, out.data, 4, cudaMemcpyDeviceToHost, s));
        PROBE_TRY(cudaEventRecord(ev[size_t(k)], s));
      }
      int32_t id = 0;
      if (mode == 2 && k > 0) SHOAL_RETURN_IF_ERROR(b.wait_decoded(pos0 + k - 1, &id, 1));
    }
    PROBE_TRY(cudaEventRecord(ev[size_t(steps) + 1], s));
    PROBE_TRY(cudaStreamSynchronize(s));
    if (mode == 2) return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / steps;
    float ms = 0;
    PROBE_TRY(cudaEventElapsedTime(&ms, ev[size_t(steps)], ev[size_t(steps) + 1]));
    return double(ms) / steps;
  };
  ChainTimes t;
  SHOAL_ASSIGN_OR_RETURN(t.graphs, run(0));
  SHOAL_ASSIGN_OR_RETURN(t.copy, run(1));
  SHOAL_ASSIGN_OR_RETURN(t.host, run(2));
  SHOAL_ASSIGN_OR_RETURN(t.graphs_again, run(0));
  return t;
}

namespace {

// Plain Q8_0 rows (GGUF blocks: a Q8_0 KV cache [rows, cols]): random f32 rows quantized by the
// backend's kv_write (the same tensor as K and V cache).
Status fill_q8_rows(CudaBackend& b, Tensor& t, uint64_t seed, float scale) {
  SHOAL_ASSIGN_OR_RETURN(Tensor src, b.alloc(DType::kF32, {t.rows(), t.cols()}));
  auto pos = b.alloc(DType::kI32, {t.rows()});
  if (!pos.ok()) {
    b.free(src);
    return pos.status();
  }
  std::vector<int32_t> rows(static_cast<size_t>(t.rows()));
  std::iota(rows.begin(), rows.end(), 0);
  Status st = fill(src.data, src.n_elements(), cuda::FillKind::kF32, seed, scale, b.stream());
  if (st.ok()) st = b.to_device(*pos, rows.data(), rows.size() * 4, 0);
  if (st.ok()) {
    b.kv_write(t, t, src, src, *pos);
    st = b.synchronize();
  }
  b.free(src);
  b.free(*pos);
  return st;
}

}  // namespace

Status fill_random(Backend& b, Tensor& t, uint64_t seed, float scale) {
  CudaBackend* cb = as_cuda(b);
  if (!cb) return make_error(Code::kInvalidArgument, "fill_random needs a CUDA backend, got {}", b.name());
  const int64_t n = t.n_elements();
  cudaStream_t s = cb->stream();
  cb->forget_writes();  // (these kernels write t behind the backend's back)
  switch (t.dtype) {
    case DType::kF32:
      return fill(t.data, n, cuda::FillKind::kF32, seed, scale, s);
    case DType::kF16:
      return fill(t.data, n, cuda::FillKind::kF16, seed, scale, s);
    case DType::kBF16:
      return fill(t.data, n, cuda::FillKind::kBF16, seed, scale, s);
    case DType::kQ8_0:
      if (!t.aux && t.shape.size() == 2) return fill_q8_rows(*cb, t, seed, scale);
      [[fallthrough]];
    case DType::kQ4_0:
      if (!t.aux) break;  // repacked weights, or the plain Q8_0 rows above
    {
      const bool q4 = t.dtype == DType::kQ4_0;
      const int64_t quant_bytes = int64_t(cuda::scale_offset(q4, t.rows(), t.cols()));
      SHOAL_RETURN_IF_ERROR(fill(t.data, quant_bytes, cuda::FillKind::kBytes, seed, scale, s));
      return fill(t.aux, cuda::padded_rows(t.rows()) * cuda::quant_row_scales(q4, t.cols()), cuda::FillKind::kScales,
                  seed + 1, scale, s);
    }
    default:
      break;
  }
  return make_error(Code::kUnsupported, "fill_random of a {} tensor", dtype_name(t.dtype));
}

// A counter of the CUDA backend b (one of its getters), or -1 if b is not a CUDA backend.
template <class T>
int64_t counter(Backend& b, T (CudaBackend::*get)() const) {
  const CudaBackend* cb = as_cuda(b);
  return cb ? int64_t((cb->*get)()) : -1;
}

int64_t early_epilogue_launches(Backend& b) { return counter(b, &CudaBackend::early_epilogue_launches); }

int64_t rope_epilogue_launches(Backend& b) { return counter(b, &CudaBackend::rope_epilogue_launches); }

int64_t q8_tensor_core_attention(Backend& b) { return counter(b, &CudaBackend::q8_tensor_core_attention); }

int64_t decode_kernel_batches(Backend& b) { return counter(b, &CudaBackend::decode_kernel_batches); }

int64_t recorded_graphs(Backend& b) { return counter(b, &CudaBackend::recorded_graphs); }

int64_t scratch_allocations(Backend& b) { return counter(b, &CudaBackend::scratch_allocations); }

int64_t fragment_handoffs(Backend& b) { return counter(b, &CudaBackend::fragment_handoffs); }

void set_fragment_handoff(Backend& b, bool on) {
  if (CudaBackend* cb = as_cuda(b)) cb->set_fragment_handoff(on);
}

int64_t qkv_split_launches(Backend& b) { return counter(b, &CudaBackend::qkv_split_launches); }

void set_qkv_split(Backend& b, bool on) {
  if (CudaBackend* cb = as_cuda(b)) cb->set_qkv_split(on);
}

int64_t quant_gemm_launches(Backend& b) { return counter(b, &CudaBackend::quant_gemm_launches); }
int64_t quant_gemm_split_launches(Backend& b) { return counter(b, &CudaBackend::quant_gemm_split_launches); }
int64_t quant_gemm_two_block_launches(Backend& b) {
  return counter(b, &CudaBackend::quant_gemm_two_block_launches);
}
int64_t quant_gemm_wide_launches(Backend& b) { return counter(b, &CudaBackend::quant_gemm_wide_launches); }

int64_t half_prefill_inputs(Backend& b) { return counter(b, &CudaBackend::half_prefill_inputs); }

int64_t stacked_products(Backend& b) { return counter(b, &CudaBackend::stacked_products); }

int64_t qkv_part_ropes(Backend& b) { return counter(b, &CudaBackend::qkv_part_ropes); }

int64_t glu_part_ffns(Backend& b) { return counter(b, &CudaBackend::glu_part_ffns); }

int64_t split_handoffs(Backend& b) { return counter(b, &CudaBackend::split_handoffs); }

int64_t bf16_as_f16_weights(Backend& b) { return counter(b, &CudaBackend::bf16_as_f16_weights); }

void set_bf16_as_f16(Backend& b, bool on) {
  if (CudaBackend* cb = as_cuda(b)) cb->set_bf16_as_f16(on);
}

bool quant_gemm_available(Backend& b) {
  const CudaBackend* cb = as_cuda(b);
  return cb && cb->quant_gemm_available();
}

void set_quant_gemm(Backend& b, bool on) {
  if (CudaBackend* cb = as_cuda(b)) cb->set_quant_gemm(on);
}

void set_quant_gemm_item_tokens(Backend& b, int tokens) {
  if (CudaBackend* cb = as_cuda(b)) cb->set_quant_gemm_item_tokens(tokens);
}

void set_gemv_rows(int rows_per_block) { cuda::set_gemv_rows_override(rows_per_block); }

void set_pdl(bool on) { cuda::set_pdl(on); }

void set_prefill_halves(int halves) { cuda::set_prefill_halves(halves); }

bool set_clusters(bool on) { return cuda::set_clusters(on); }

uint64_t attention_scratch_bytes(int64_t tokens, int n_heads, int n_kv_heads, int head_dim, int64_t rows, DType cache,
                                 int64_t max_keys, bool every_count) {
  cuda::AttnArgs a;
  a.n_tokens = tokens;
  a.n_ctx = rows;
  a.n_heads = n_heads;
  a.n_kv_heads = n_kv_heads;
  a.head_dim = head_dim;
  a.cache = cuda::cache_kind(cache);
  a.max_keys = max_keys;
  return every_count ? cuda::attention_scratch_bytes(a) : cuda::attention_call_scratch_bytes(a);
}

}  // namespace shoal::cuda_probe
