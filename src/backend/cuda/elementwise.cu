// Elementwise ops: add, scale, GLU and activations, dtype conversion, embedding lookup.
// Twins: the ops of the same names in src/backend/cpu/ref_ops.cc; tests: tests/cuda/cuda_ops_test.cc.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#ifdef SHOAL_CUDA_TIMELINE
#include <vector>
#endif

#include "backend/cuda/cuda_util.h"
#include "backend/cuda/device_math.cuh"
#include "backend/cuda/kernels.h"
#include "backend/cuda/launch.cuh"

namespace shoal::cuda {
namespace {

constexpr int kF32 = 0, kF16 = 1;  // DType ids (anything else: BF16 = 30)

__device__ __forceinline__ int64_t global_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }

__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {
  pdl_prologue();
  const int64_t i = global_index();
  if (i < n) y[i] = a[i] + b[i];
}

__global__ void scale_kernel(float* x, float s, int64_t n) {
  pdl_prologue();
  const int64_t i = global_index();
  if (i < n) x[i] *= s;
}

__global__ void glu_kernel(const float* gate, const float* up, Act act, float* out, int64_t n) {
  pdl_prologue();
  const int64_t i = global_index();
  if (i < n) out[i] = apply_act(gate[i], act) * up[i];
}

__global__ void activation_kernel(const float* x, Act act, float* out, int64_t n) {
  pdl_prologue();
  const int64_t i = global_index();
  if (i < n) out[i] = apply_act(x[i], act);
}

__device__ __forceinline__ float load_as_f32(const void* p, int dtype, int64_t i) {
  if (dtype == kF32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return dtype == kF16 ? f16_bits_to_float(h) : __uint_as_float(uint32_t(h) << 16);
}

__global__ void convert_kernel(const void* src, int src_dtype, void* dst, int dst_dtype, int64_t n) {
  pdl_prologue();
  const int64_t i = global_index();
  if (i >= n) return;
  const float v = load_as_f32(src, src_dtype, i);
  if (dst_dtype == kF32)
    static_cast<float*>(dst)[i] = v;
  else if (dst_dtype == kF16)
    static_cast<uint16_t*>(dst)[i] = __half_as_ushort(__float2half_rn(v));
  else
    static_cast<uint16_t*>(dst)[i] = __bfloat16_as_ushort(__float2bfloat16_rn(v));
}

__global__ void embed_kernel(const WeightRef table, const int32_t* __restrict__ ids, int64_t n,
                             float* __restrict__ out) {
  pdl_prologue();
  const int64_t i = global_index();
  if (i >= n * table.cols) return;
  const int64_t t = i / table.cols, c = i % table.cols;
  const int32_t id = ids[t];
  out[i] = (id >= 0 && id < table.rows) ? weight_value(table, int64_t(id) * table.cols + c) : NAN;
}

unsigned grid_for(int64_t n) { return unsigned(div_up(n, kBlock)); }

bool g_pdl = false;

}  // namespace

void set_pdl(bool on) { g_pdl = on; }
bool pdl_enabled() { return g_pdl; }

#ifdef SHOAL_CUDA_TIMELINE
namespace {
std::vector<cudaError_t (*)(const TimelineSink&)>& timeline_setters() {
  static std::vector<cudaError_t (*)(const TimelineSink&)> v;
  return v;
}
}  // namespace
int timeline_register(cudaError_t (*set)(const TimelineSink&)) {
  timeline_setters().push_back(set);
  return 0;
}
cudaError_t timeline_start(TimelineRecord* recs, unsigned* count, unsigned cap) {
  const TimelineSink s{recs, count, cap};
  for (auto* set : timeline_setters())
    if (const cudaError_t e = set(s); e != cudaSuccess) return e;
  return cudaDeviceSynchronize();  // (the copies run on the legacy stream, not the backend's)
}
#endif

bool device_code_sm90() {
  // The code the driver runs for this device: a build for older architectures only (PTX JIT)
  // compiles griddepcontrol and clusters out of the kernels.
  cudaFuncAttributes fa{};
  if (cudaFuncGetAttributes(&fa, glu_kernel) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return fa.binaryVersion >= 90;
}

cudaError_t add(const float* a, const float* b, float* y, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SHOAL_TRY_LAUNCH(launch(add_kernel, grid_for(n), kBlock, 0, stream, a, b, y, n));
  return cudaGetLastError();
}

cudaError_t scale(float* x, float s, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SHOAL_TRY_LAUNCH(launch(scale_kernel, grid_for(n), kBlock, 0, stream, x, s, n));
  return cudaGetLastError();
}

cudaError_t glu(const float* gate, const float* up, Act act, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SHOAL_TRY_LAUNCH(launch(glu_kernel, grid_for(n), kBlock, 0, stream, gate, up, act, out, n));
  return cudaGetLastError();
}

cudaError_t activation(const float* x, Act act, float* out, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SHOAL_TRY_LAUNCH(launch(activation_kernel, grid_for(n), kBlock, 0, stream, x, act, out, n));
  return cudaGetLastError();
}

cudaError_t convert(const void* src, int src_dtype, void* dst, int dst_dtype, int64_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  SHOAL_TRY_LAUNCH(launch(convert_kernel, grid_for(n), kBlock, 0, stream, src, src_dtype, dst, dst_dtype, n));
  return cudaGetLastError();
}

cudaError_t embed(const WeightRef& table, const int32_t* ids, int64_t n, float* out, cudaStream_t stream) {
  if (n * table.cols == 0) return cudaSuccess;
  SHOAL_TRY_LAUNCH(launch(embed_kernel, grid_for(n * table.cols), kBlock, 0, stream, table, ids, n, out));
  return cudaGetLastError();
}

}  // namespace shoal::cuda
