// CudaBackend: device, memory, staging uploads, graphs (ops are in cuda_ops.cc).
#include "backend/cuda/cuda_backend.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <thread>

#include "backend/cuda/cuda_util.h"
#include "core/log.h"
#include "core/spin.h"

namespace shoal {

namespace {

constexpr uint64_t kStagingHalf = 32ull << 20;  // 2 x 32 MiB pinned
constexpr uint64_t kCublasWorkspace = 32ull << 20;

Status cuda_status(cudaError_t e, std::string_view what) {
  return make_error(Code::kInternal, "{} failed: {} ({})", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

#define SHOAL_CUDA_TRY(call)                                                    \
  do {                                                                          \
    const cudaError_t shoal_cuda_e_ = (call);                                   \
    if (shoal_cuda_e_ != cudaSuccess) return cuda_status(shoal_cuda_e_, #call); \
  } while (0)

bool is_repacked(DType t) { return t == DType::kQ8_0 || t == DType::kQ4_0; }

Result<uint64_t> checked_bytes(DType dtype, const Tensor& t) {
  for (int i = 0; i < t.nd; ++i)
    if (t.shape[size_t(i)] < 0) return make_error(Code::kInvalidArgument, "negative dimension in {}", t.shape_string());
  int64_t n = 1;
  for (int i = 0; i < t.nd; ++i)
    if (__builtin_mul_overflow(n, t.shape[size_t(i)], &n))
      return make_error(Code::kInvalidArgument, "tensor {} has too many elements", t.shape_string());
  if (t.cols() % dtype_info(dtype).block_size != 0)
    return make_error(Code::kInvalidArgument, "{} row of {} values is not whole blocks", dtype_name(dtype), t.cols());
  auto bytes = dtype_bytes(dtype, n);
  if (!bytes)
    return make_error(Code::kInvalidArgument, "tensor {} of {} is too large", t.shape_string(), dtype_name(dtype));
  return *bytes;
}

// Device bytes of weight t in the backend's layout and, for repacked weights, where the scales
// start (cuda_util.h); errors: dtypes the backend cannot hold, sizes that overflow.
struct WeightLayout {
  uint64_t bytes = 0, scales_at = 0;
};
Result<WeightLayout> weight_layout(const Tensor& t) {
  if (!dtype_is_native(t.dtype))
    return make_error(Code::kUnsupported, "CUDA weights of type {} (expected F32, F16, BF16, Q8_0 or Q4_0)",
                      dtype_name(t.dtype));
  SHOAL_ASSIGN_OR_RETURN(const uint64_t bytes, checked_bytes(t.dtype, t));
  if (!is_repacked(t.dtype)) return WeightLayout{bytes, 0};
  const bool q4 = t.dtype == DType::kQ4_0;
  return WeightLayout{cuda::repacked_bytes(q4, t.rows(), t.cols()), cuda::scale_offset(q4, t.rows(), t.cols())};
}

// Places weight t (laid out as `l`) at p; the scales of a repacked weight follow its quants.
void place_weight(Tensor& t, const WeightLayout& l, void* p) {
  t.data = p;
  if (is_repacked(t.dtype)) t.aux = static_cast<uint8_t*>(p) + l.scales_at;  // (zeroed by upload_weight)
}

}  // namespace

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(int device, const BackendOptions& opts) {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    // No GPU and no driver reads as cudaErrorInsufficientDriver: name the likely cause first.
    const bool no_driver = e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice;
    return make_error(Code::kUnavailable, "no CUDA device{}: cudaGetDeviceCount says {} ({})",
                      no_driver ? " (no NVIDIA GPU or driver found, or a driver older than this CUDA runtime)" : "",
                      cudaGetErrorName(e), cudaGetErrorString(e));
  }
  if (device < 0 || device >= count)
    return make_error(Code::kUnavailable, "cuda:{} asked for, but this machine has {} CUDA device(s)", device, count);
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  b->half_prefill_ = opts.half_prefill;
  SHOAL_RETURN_IF_ERROR(b->init(device).with_context(fmt::format("opening cuda:{}", device)));
  return b;
}

Status CudaBackend::init(int device) {
  device_ = device;
  SHOAL_CUDA_TRY(cudaSetDevice(device));
  cudaDeviceProp prop{};
  SHOAL_CUDA_TRY(cudaGetDeviceProperties(&prop, device));
  name_ = fmt::format("cuda:{} {}", device, prop.name);
  // Programmatic dependent launch (sm_90+) hides launch gaps between the kernels of a step;
  // thread-block clusters (sm_90+) let decode attention merge its splits in one kernel.
  // Hopper runs quantized prefill products on gemm_quant (wgmma). SHOAL_CUDA_PDL=0 /
  // SHOAL_CUDA_CLUSTERS=0 / SHOAL_CUDA_FRAGS=0 (set_fragment_handoff) / SHOAL_CUDA_QKV_SPLIT=0
  // (set_qkv_split) / SHOAL_CUDA_QGEMM=0 turn them off (for comparisons), and
  // SHOAL_CUDA_BF16_AS_F16=0 keeps BF16 weights as they are (settle_weights, set_bf16_as_f16).
  const auto off = [](const char* name) {
    const char* v = std::getenv(name);
    return v && std::string_view(v) == "0";
  };
  const bool sm90 = prop.major >= 9 && cuda::device_code_sm90();
  cuda::set_pdl(sm90 && !off("SHOAL_CUDA_PDL"));
  cuda::set_clusters(sm90 && !off("SHOAL_CUDA_CLUSTERS"));
  frags_ = !off("SHOAL_CUDA_FRAGS");
  qkv_split_ = !off("SHOAL_CUDA_QKV_SPLIT");
  qgemm_available_ = cuda::gemm_quant_available();  // (the current device: set above)
  qgemm_ = qgemm_available_ && !off("SHOAL_CUDA_QGEMM");
  bf16_as_f16_ = !off("SHOAL_CUDA_BF16_AS_F16");
  SHOAL_CUDA_TRY(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  SHOAL_CUDA_TRY(cudaMallocHost(reinterpret_cast<void**>(&pinned_), 2 * kStagingHalf));
  for (auto& ev : staged_) SHOAL_CUDA_TRY(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  SHOAL_CUDA_TRY(cudaHostAlloc(reinterpret_cast<void**>(&decoded_), kDecodedSlots * cuda::kDecodedWords * 4,
                               cudaHostAllocMapped));
  SHOAL_CUDA_TRY(cudaHostGetDevicePointer(reinterpret_cast<void**>(&decoded_device_), decoded_, 0));
  std::fill_n(decoded_, kDecodedSlots * cuda::kDecodedWords, -1);
  const cublasStatus_t s = cublasCreate(&cublas_);
  if (s != CUBLAS_STATUS_SUCCESS)
    return make_error(Code::kInternal, "cublasCreate failed: {}", cublasGetStatusString(s));
  SHOAL_ASSIGN_OR_RETURN(cublas_workspace_, device_malloc(kCublasWorkspace, "cuBLAS workspace"));
  if (qgemm_available_) {  // gemm_quant's split K: partial sums, then counters zeroed once (launches leave them zero)
    cuda::DeviceLimits lim;
    SHOAL_CUDA_TRY(cuda::device_limits(lim));
    const uint64_t floats = cuda::gemm_quant_split_floats(lim.sms);
    SHOAL_ASSIGN_OR_RETURN(void* p, device_malloc(floats * 4 + uint64_t(lim.sms) * 4, "gemm_quant split K scratch"));
    qsplit_ = cuda::QuantGemmSplit{static_cast<float*>(p), floats,
                                   reinterpret_cast<unsigned*>(static_cast<uint8_t*>(p) + floats * 4), lim.sms};
    SHOAL_CUDA_TRY(cudaMemsetAsync(qsplit_.counters, 0, uint64_t(lim.sms) * 4, stream_));
  }
  if (cublasSetStream(cublas_, stream_) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(cublas_, cublas_workspace_, kCublasWorkspace) != CUBLAS_STATUS_SUCCESS)
    return make_error(Code::kInternal, "cuBLAS stream/workspace setup failed");
  return Status::Ok();
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  for (auto& [p, n] : scratch_) cudaFree(p);
  for (void* p : retired_) cudaFree(p);
  for (void* p : raw_) cudaFree(p);
  for (auto ev : staged_)
    if (ev) cudaEventDestroy(ev);
  if (decoded_) cudaFreeHost(decoded_);
  if (cublas_) cublasDestroy(cublas_);
  cudaFree(cublas_workspace_);
  cudaFree(qsplit_.partial);
  if (pinned_) cudaFreeHost(pinned_);
  if (stream_) cudaStreamDestroy(stream_);
}

bool CudaBackend::note(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  if (e == cudaErrorMemoryAllocation) {  // not sticky in CUDA: a launch or instantiation not done
    cudaGetLastError();
    if (error_.ok()) {
      error_ = make_error(Code::kOutOfMemory, "{}: out of device memory ({} free)", what, format_bytes(free_memory()));
      oom_only_ = true;
      spdlog::error("{}: {}", name_, error_.message());
    }
    return false;
  }
  if (error_.ok() || oom_only_) {
    error_ = cuda_status(e, what);
    oom_only_ = false;
    spdlog::error("{}: {}", name_, error_.message());
  }
  return false;
}

bool CudaBackend::note_cublas(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return true;
  if (error_.ok() || oom_only_) {
    error_ = make_error(Code::kInternal, "{} failed: {}", what, cublasGetStatusString(s));
    oom_only_ = false;
    spdlog::error("{}: {}", name_, error_.message());
  }
  return false;
}

Status CudaBackend::take_error() {
  Status s = error_;
  if (oom_only_) {
    error_ = Status::Ok();
    oom_only_ = false;
    ++ops_;  // no later op takes a handoff from an op skipped or recorded before this
  }
  return s;
}

void CudaBackend::wrote(std::span<const Tensor* const> ts) {
  written_.op = ops_;
  written_.n = 0;
  for (const Tensor* t : ts) {
    // More ranges than we keep, or an empty one (an op with nothing to do may launch nothing,
    // and then the kernel before it is still the last): as if unrecorded.
    if (written_.n == int(written_.ranges.size()) || t->nbytes() == 0) {
      written_.op = 0;
      return;
    }
    const auto b = reinterpret_cast<uintptr_t>(t->data);
    written_.ranges[size_t(written_.n++)] = {b, b + t->nbytes()};
  }
}

bool CudaBackend::last_op_may_write(const void* p, uint64_t n) const {
  if (written_.op == 0 || written_.op != ops_) return true;
  const auto b = reinterpret_cast<uintptr_t>(p), e = b + n;
  for (int i = 0; i < written_.n; ++i)
    if (b < written_.ranges[size_t(i)].second && written_.ranges[size_t(i)].first < e) return true;
  return false;
}

cudaError_t CudaBackend::make_current() const {
  int current = -1;
  if (cudaGetDevice(&current) == cudaSuccess && current == device_) return cudaSuccess;
  return cudaSetDevice(device_);
}

bool CudaBackend::use_device() {
  ++ops_;
  return note(make_current(), "cudaSetDevice");
}

uint64_t CudaBackend::free_memory() const {
  size_t free_b = 0, total_b = 0;
  cudaError_t e = make_current();
  if (e == cudaSuccess) e = cudaMemGetInfo(&free_b, &total_b);
  if (e != cudaSuccess) {
    cudaGetLastError();
    spdlog::warn("{}: no free memory figure: {} ({}); counting none", name_, cudaGetErrorName(e),
                 cudaGetErrorString(e));
    return 0;
  }
  return free_b;
}

Result<void*> CudaBackend::device_malloc(uint64_t bytes, const char* what) {
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, std::max<uint64_t>(bytes, 1));
  if (e == cudaSuccess) return p;
  cudaGetLastError();  // clear the allocation error so it does not surface at a later launch
  size_t free_b = 0, total_b = 0;
  const bool known = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess;
  cudaGetLastError();
  if (e == cudaErrorMemoryAllocation && !known)
    return make_error(Code::kOutOfMemory, "{}: cannot allocate {} bytes ({:.1f} MiB) on {} (free memory unknown)",
                      what, bytes, double(bytes) / 1048576.0, name_);
  if (e == cudaErrorMemoryAllocation)
    return make_error(Code::kOutOfMemory,
                      "{}: cannot allocate {} bytes ({:.1f} MiB) on {}: {:.1f} MiB free of {:.1f} MiB", what, bytes,
                      double(bytes) / 1048576.0, name_, double(free_b) / 1048576.0, double(total_b) / 1048576.0);
  return cuda_status(e, fmt::format("cudaMalloc of {} bytes for {}", bytes, what));
}

void* CudaBackend::scratch(Scratch slot, uint64_t bytes) {
  auto& [p, cap] = scratch_[size_t(slot)];
  if (cap >= bytes && p) return p;
  const uint64_t want = std::max<uint64_t>(cuda::align_up(bytes + bytes / 2, 1 << 20), 1 << 20);
  auto r = device_malloc(want, "scratch");
  if (!r.ok()) {
    if (error_.ok()) {
      error_ = r.status();
      oom_only_ = error_.code() == Code::kOutOfMemory;
      spdlog::error("{}: {}", name_, error_.message());
    }
    return nullptr;
  }
  if (p) retired_.push_back(p);
  p = *r;
  cap = want;
  ++scratch_allocs_;
  return p;
}

Result<Tensor> CudaBackend::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t = Tensor::make(nullptr, dtype, shape);
  SHOAL_ASSIGN_OR_RETURN(uint64_t bytes, checked_bytes(dtype, t));
  // Q8_0 tensors (KV caches) get 16 bytes of slack: the tensor-core attention copies each row's
  // 16-byte aligned window, which may end up to 15 bytes past the last row (load_tile_q8).
  if (dtype == DType::kQ8_0) bytes += 16;
  if (!use_device()) return error_;
  SHOAL_ASSIGN_OR_RETURN(
      t.data, device_malloc(bytes, fmt::format("{} tensor {}", dtype_name(dtype), t.shape_string()).c_str()));
  // Zeroed (in stream order), so a KV cache's rows are finite before they are written: the
  // tensor-core attention loads every row between a block's first and last attended key.
  if (!capturing_) {
    if (const cudaError_t e = cudaMemsetAsync(t.data, 0, bytes, stream_); e != cudaSuccess) {
      free(t);
      return cuda_status(e, "cudaMemsetAsync (zeroing a new tensor)");
    }
  }
  return t;
}

Result<Tensor> CudaBackend::alloc_weight(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t = Tensor::make(nullptr, dtype, shape);
  SHOAL_ASSIGN_OR_RETURN(const WeightLayout l, weight_layout(t));
  if (!use_device()) return error_;
  if (is_repacked(dtype)) SHOAL_RETURN_IF_ERROR(ensure_repack_buffers());
  const std::string what = fmt::format("{} weight {}", dtype_name(dtype), t.shape_string());
  SHOAL_ASSIGN_OR_RETURN(void* p, device_malloc(l.bytes, what.c_str()));
  place_weight(t, l, p);
  return t;
}

Result<std::vector<Tensor>> CudaBackend::alloc_weights(DType dtype, std::span<const std::array<int64_t, 2>> shapes) {
  if (shapes.size() < 2) return Backend::alloc_weights(dtype, shapes);
  // One block, each weight at a 256-byte aligned offset: weights whose sizes are multiples of 256
  // bytes (F16 / BF16 rows of 128 values) lie back to back, as gemm_matmuls looks for.
  std::vector<Tensor> out;
  std::vector<WeightLayout> layouts;
  std::vector<uint64_t> at;
  uint64_t total = 0;
  for (const auto& [rows, cols] : shapes) {
    out.push_back(Tensor::make(nullptr, dtype, {rows, cols}));
    SHOAL_ASSIGN_OR_RETURN(const WeightLayout l, weight_layout(out.back()));
    layouts.push_back(l);
    at.push_back(total);
    total += cuda::align_up(std::max<uint64_t>(l.bytes, 1), 256);
  }
  if (!use_device()) return error_;
  if (is_repacked(dtype)) SHOAL_RETURN_IF_ERROR(ensure_repack_buffers());
  const std::string what = fmt::format("{} {} weights of {} bytes", out.size(), dtype_name(dtype), total);
  SHOAL_ASSIGN_OR_RETURN(void* block, device_malloc(total, what.c_str()));
  for (size_t i = 0; i < out.size(); ++i) {
    place_weight(out[i], layouts[i], static_cast<uint8_t*>(block) + at[i]);
    weight_block_[out[i].data] = block;
  }
  weight_blocks_[block] = out.size();
  return out;
}

void CudaBackend::free(Tensor& t) {
  if (t.data) {
    use_device();
    void* p = t.data;
    if (auto it = weight_block_.find(p); it != weight_block_.end()) {  // a weight of alloc_weights' block
      p = it->second;
      weight_block_.erase(it);
      if (--weight_blocks_[p] > 0) p = nullptr;  // others still use the block
      else weight_blocks_.erase(p);
    } else if (weight_blocks_.count(p)) {  // the block's first weight, freed before: not the block
      note(cudaErrorInvalidValue, "free of a weight freed before");
      p = nullptr;
    }
    if (p) note(cudaFree(p), "cudaFree");
  }
  t.data = nullptr;
  t.aux = nullptr;
}

Status CudaBackend::ensure_repack_buffers() {
  for (auto& r : raw_) {
    if (r) continue;
    SHOAL_ASSIGN_OR_RETURN(void* p, device_malloc(kStagingHalf, "repacking buffer"));
    r = static_cast<uint8_t*>(p);
  }
  return Status::Ok();
}

Status CudaBackend::stage_upload(const uint8_t* src, uint64_t n, uint8_t* dst, const Tensor* repack) {
  const bool q4 = repack && repack->dtype == DType::kQ4_0;
  const uint64_t block_bytes = repack ? uint64_t(dtype_info(repack->dtype).type_size) : 1;
  const uint64_t chunk = kStagingHalf / block_bytes * block_bytes;
  if (repack) SHOAL_RETURN_IF_ERROR(ensure_repack_buffers());
  for (uint64_t off = 0; off < n; off += chunk) {
    const uint64_t len = std::min(chunk, n - off);
    const int h = next_half_;
    next_half_ ^= 1;
    uint8_t* host = pinned_ + uint64_t(h) * kStagingHalf;
    SHOAL_CUDA_TRY(cudaEventSynchronize(staged_[h]));  // the last copy out of this half is done
    std::memcpy(host, src + off, len);
    if (repack) {
      SHOAL_CUDA_TRY(cudaMemcpyAsync(raw_[h], host, len, cudaMemcpyHostToDevice, stream_));
      const int64_t first = int64_t(off / block_bytes), nb = int64_t(len / block_bytes);
      SHOAL_CUDA_TRY(cuda::repack_blocks(q4, raw_[h], first, nb, repack->cols(), dst,
                                         static_cast<uint16_t*>(repack->aux), stream_));
    } else {
      SHOAL_CUDA_TRY(cudaMemcpyAsync(dst + off, host, len, cudaMemcpyHostToDevice, stream_));
    }
    SHOAL_CUDA_TRY(cudaEventRecord(staged_[h], stream_));
  }
  return Status::Ok();
}

Status CudaBackend::upload_weight(Tensor& t, const void* bytes, uint64_t nbytes) {
  if (nbytes != t.nbytes())
    return make_error(Code::kInvalidArgument, "weight of {} bytes uploaded into a {} {} tensor of {} bytes", nbytes,
                      dtype_name(t.dtype), t.shape_string(), t.nbytes());
  if (capturing_) return make_error(Code::kFailedPrecondition, "upload_weight inside run_graph");
  if (failed()) return take_error();
  if (!use_device()) return error_;
  if (is_repacked(t.dtype) && !t.aux)
    return make_error(Code::kInvalidArgument, "{} weight was not allocated by alloc_weight", dtype_name(t.dtype));
  // Padding rows and columns of the tile layout enter the products as zeros, and the Q4_0
  // repack ORs nibbles into zeroed words: clear the whole tensor (and what an earlier upload left).
  if (is_repacked(t.dtype))
    SHOAL_CUDA_TRY(cudaMemsetAsync(t.data, 0, cuda::repacked_bytes(t.dtype == DType::kQ4_0, t.rows(), t.cols()),
                                   stream_));
  return stage_upload(static_cast<const uint8_t*>(bytes), nbytes, static_cast<uint8_t*>(t.data),
                      is_repacked(t.dtype) ? &t : nullptr);
}

Result<int> CudaBackend::settle_weights(std::span<Tensor* const> ws) {
  std::vector<Tensor*> bf;
  for (Tensor* t : ws)
    if (t && t->data && t->dtype == DType::kBF16) bf.push_back(t);
  if (!bf16_as_f16_ || bf.empty()) return 0;
  if (capturing_) return make_error(Code::kFailedPrecondition, "settle_weights inside run_graph");
  if (failed()) return take_error();
  if (!use_device()) return error_;
  int* bad = nullptr;  // (its own 4 bytes: a failure here keeps BF16 instead of failing the backend)
  if (cudaMalloc(&bad, sizeof(int)) != cudaSuccess) {
    (void)cudaGetLastError();
    spdlog::warn("{}: no device memory to check {} BF16 weights; they stay BF16", name_, bf.size());
    return 0;
  }
  int n_bad = 0;
  cudaError_t e = cudaMemsetAsync(bad, 0, sizeof(int), stream_);
  for (const Tensor* t : bf)
    if (e == cudaSuccess)
      e = cuda::bf16_rows_not_f16(static_cast<const uint16_t*>(t->data), t->rows(), t->cols(), bad, stream_);
  if (e == cudaSuccess) e = cudaMemcpyAsync(&n_bad, bad, sizeof(int), cudaMemcpyDeviceToHost, stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  cudaFree(bad);
  if (!note(e, "settle_weights")) return take_error();
  if (n_bad > 0) {
    spdlog::debug("{}: {} BF16 weights ({} first) stay BF16: {} rows that F16 would not hold to 2^-20", name_,
                  bf.size(), bf[0]->shape_string(), n_bad);
    return 0;
  }
  for (Tensor* t : bf) {
    if (!note(cuda::bf16_to_f16_in_place(static_cast<uint16_t*>(t->data), t->n_elements(), stream_),
              "bf16_to_f16_in_place"))
      return take_error();
    t->dtype = DType::kF16;
  }
  bf16_as_f16_weights_ += bf.size();
  return int(bf.size());
}

Status CudaBackend::to_device(Tensor& t, const void* src, uint64_t nbytes, uint64_t offset) {
  if (offset > t.nbytes() || nbytes > t.nbytes() - offset)
    return make_error(Code::kOutOfRange, "copy of {} bytes at {} into a tensor of {}", nbytes, offset, t.nbytes());
  if (t.aux) return make_error(Code::kInvalidArgument, "to_device into a repacked weight (use upload_weight)");
  if (capturing_) return make_error(Code::kFailedPrecondition, "to_device inside run_graph");
  if (failed()) return take_error();
  if (!use_device()) return error_;
  return stage_upload(static_cast<const uint8_t*>(src), nbytes, static_cast<uint8_t*>(t.data) + offset, nullptr);
}

Status CudaBackend::to_host(void* dst, const Tensor& t, uint64_t nbytes, uint64_t offset) {
  if (offset > t.nbytes() || nbytes > t.nbytes() - offset)
    return make_error(Code::kOutOfRange, "copy of {} bytes at {} from a tensor of {}", nbytes, offset, t.nbytes());
  if (capturing_) return make_error(Code::kFailedPrecondition, "to_host inside run_graph");
  if (failed()) return take_error();
  if (!use_device()) return error_;
  const auto* src = static_cast<const uint8_t*>(t.data) + offset;
  for (uint64_t off = 0; off < nbytes; off += kStagingHalf) {
    const uint64_t len = std::min(kStagingHalf, nbytes - off);
    SHOAL_CUDA_TRY(cudaMemcpyAsync(pinned_, src + off, len, cudaMemcpyDeviceToHost, stream_));
    const cudaError_t e = cudaStreamSynchronize(stream_);
    if (!note(e, "cudaStreamSynchronize (to_host)")) return take_error();
    std::memcpy(static_cast<uint8_t*>(dst) + off, pinned_, len);
  }
  return Status::Ok();
}

Status CudaBackend::wait_decoded(int64_t pos, int32_t* dst, int n) {
  static_assert(kDecodedMax + 2 <= cuda::kDecodedWords, "a slot holds the tag, the count and the ids");
  SHOAL_RETURN_IF_ERROR(check_decoded_wait(pos, n));
  if (capturing_) return make_error(Code::kFailedPrecondition, "wait_decoded inside run_graph");
  if (failed()) return take_error();
  int32_t* slot = decoded_ + (pos % kDecodedSlots) * cuda::kDecodedWords;
  const std::atomic_ref<int32_t> tag(slot[0]);
  // The kernel writes the slot as a sequence lock (tag -1, fence, count and ids, fence, tag):
  // once the tag reads pos, the ids are there; a tag changed after they were read means a later
  // step replaced them meanwhile. The tag is polled; every 50 us the stream says whether
  // anything is still queued (a fault or an idle stream ends the wait), and after 2 ms of
  // waiting the thread sleeps 20 us between polls (the next step is already queued: a late
  // wake-up delays the host, not the device).
  using Clock = std::chrono::steady_clock;
  const Clock::time_point start = Clock::now();
  Clock::time_point next_query = start;
  while (tag.load(std::memory_order_acquire) != int32_t(pos)) {
    const Clock::time_point now = Clock::now();
    if (now >= next_query) {
      const cudaError_t e = cudaStreamQuery(stream_);
      if (e == cudaSuccess) {
        if (tag.load(std::memory_order_acquire) == int32_t(pos)) break;  // published as the stream went idle
        return make_error(Code::kFailedPrecondition, "no decode step at position {} was published", pos);
      }
      if (e != cudaErrorNotReady && !note(e, "cudaStreamQuery (wait_decoded)")) return take_error();
      next_query = now + std::chrono::microseconds(50);
    }
    if (now - start > std::chrono::milliseconds(2))
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    else
      cpu_relax();
  }
  const int32_t count = std::atomic_ref<int32_t>(slot[1]).load(std::memory_order_relaxed);
  int32_t ids[kDecodedMax];
  for (int i = 0; i < n; ++i) ids[i] = std::atomic_ref<int32_t>(slot[2 + i]).load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (tag.load(std::memory_order_relaxed) != int32_t(pos))
    return make_error(Code::kFailedPrecondition,
                      "the publication of the step at position {} was replaced while read (more steps in flight "
                      "than slots)",
                      pos);
  if (count != n)
    return make_error(Code::kInvalidArgument, "the step at position {} published {} ids, not {}", pos, count, n);
  std::copy(ids, ids + n, dst);
  return Status::Ok();
}

Status CudaBackend::clear_decoded() {
  SHOAL_RETURN_IF_ERROR(synchronize());
  std::fill_n(decoded_, kDecodedSlots * cuda::kDecodedWords, -1);
  return Status::Ok();
}

Status CudaBackend::synchronize() {
  if (capturing_) return make_error(Code::kFailedPrecondition, "synchronize inside run_graph");
  if (!use_device()) return error_;
  note(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  return take_error();
}

Status CudaBackend::run_graph(uint64_t key, const std::function<void()>& record, uint64_t owner) {
  if (capturing_) {  // nested: part of the outer recording
    record();
    return Status::Ok();
  }
  if (failed()) return take_error();
  if (!use_device()) return error_;
  auto it = graphs_.find({owner, key});
  if (it == graphs_.end()) {
    // Relaxed mode: scratch buffers may be allocated (never freed) while recording.
    SHOAL_CUDA_TRY(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
    capturing_ = true;
    try {
      record();
    } catch (...) {  // (bad_alloc) the stream must not stay in capture mode
      capturing_ = false;
      cudaGraph_t partial = nullptr;
      if (cudaStreamEndCapture(stream_, &partial) == cudaSuccess && partial) cudaGraphDestroy(partial);
      throw;
    }
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    const cudaError_t e = cudaStreamEndCapture(stream_, &graph);
    const bool ended = note(e, "cudaStreamEndCapture");  // (replaces a scratch out-of-memory)
    if (failed() || !ended) {  // a step without an op that failed: not kept
      if (graph) cudaGraphDestroy(graph);
      return take_error();
    }
    cudaGraphExec_t exec = nullptr;
    const cudaError_t ei = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    if (!note(ei, "cudaGraphInstantiate")) return take_error();
    it = graphs_.emplace(std::make_pair(owner, key), exec).first;
  }
  note(cudaGraphLaunch(it->second, stream_), "cudaGraphLaunch");
  return take_error();
}

int CudaBackend::plan_attention_keys(int64_t keys, int n_tokens) {
  attn_keys_ = keys > 0 ? cuda::attention_keys_bound(keys, n_tokens) : 0;
  return attn_keys_ > 0 ? 1 : 0;
}

void CudaBackend::reset_graphs() {
  use_device();
  note(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (reset_graphs)");
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
  for (void* p : retired_) cudaFree(p);
  retired_.clear();
}

void CudaBackend::drop_graphs(uint64_t owner) {
  auto first = graphs_.lower_bound({owner, 0});
  auto last = graphs_.lower_bound({owner + 1, 0});
  if (first == last && (retired_.empty() || !graphs_.empty())) return;
  use_device();
  note(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (drop_graphs)");
  for (auto it = first; it != last; ++it) note(cudaGraphExecDestroy(it->second), "cudaGraphExecDestroy");
  graphs_.erase(first, last);
  if (!graphs_.empty()) return;
  for (void* p : retired_) cudaFree(p);  // scratch outgrown while graphs used it
  retired_.clear();
}

Result<std::unique_ptr<Backend>> create_cuda_backend(int device, const BackendOptions& opts) {
  SHOAL_ASSIGN_OR_RETURN(auto b, CudaBackend::create(device, opts));
  return std::unique_ptr<Backend>(std::move(b));
}

}  // namespace shoal
