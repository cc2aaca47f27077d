// Kernel launches with programmatic dependent launch (PDL, sm_90+): a kernel may be scheduled while
// the previous one in the stream finishes, and waits (griddepcontrol.wait) for it before touching
// memory. In a decode step of hundreds of small kernels this hides most of the launch gap between
// them. Every kernel launched through launch() must call pdl_prologue() before it touches memory
// that the previous kernel may write, and never lets the next kernel start before its own wait
// (pdl_prologue waits first). (The vector and tensor-core GEMVs load their first weights before it:
// weights are written only by uploads, i.e. copies, repack kernels and the BF16-to-F16 rewrite of
// settle_weights, none of them directly followed by a GEMV. Decode attention reads pos (the backend
// checks that advance_decode, the one kernel writing it, did not run just before), and with
// AttnArgs::early_kv (after a KV write or a q/k/v GEMV with the RoPE epilogue, which write only the
// step's rows) or the rope prologue (rope_kv_attention: also inv_freq, uploaded by copies) the
// cache rows of earlier steps, before it; the GEMVs with GemvOpts::early_epilogue their bias and
// the old y of a residual add: a kernel may start only once the previous one passed its own wait,
// so everything before the previous kernel is complete; the backend takes these paths only when the
// previous kernel did not write those bytes: kv_written_ and last_op_may_write() in
// cuda_backend.h.)
// Only included by .cu files of src/backend/cuda/.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/timeline.cuh"

namespace shoal::cuda {

/// Whether launch() asks for PDL (set once per process by the backend from the device's
/// compute capability; see kernels.h set_pdl()).
bool pdl_enabled();

/// Lets the next kernel be scheduled (after pdl_prologue<false>()).
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/// Called by every kernel started by launch() before it touches memory the previous kernel may
/// write (at the start, or after loads that cannot depend on it): waits for the previous kernel's results
/// (and for it to stop reading what this kernel writes), then lets the next kernel be scheduled.
/// Returns 0, or in timeline builds (timeline.cuh) the block's record for SHOAL_MARK (in thread
/// 0; kNoTimelineSlot elsewhere and when not recording). kTrigger = false: only the wait; the
/// kernel then calls pdl_trigger() later itself (or the next kernel starts as this one exits).
template <bool kTrigger = true>
__device__ __forceinline__ unsigned pdl_prologue() {
#if defined(SHOAL_CUDA_TIMELINE)
  unsigned slot = kNoTimelineSlot;
#else
  unsigned slot = 0;
#endif
#if defined(SHOAL_CUDA_TIMELINE) && defined(__CUDA_ARCH__)
  const unsigned long long arrive = timeline_now();
  const TimelineSink sink = g_timeline;
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#if defined(SHOAL_CUDA_TIMELINE) && defined(__CUDA_ARCH__)
  if (threadIdx.x + threadIdx.y + threadIdx.z == 0 && sink.recs)
    slot = timeline_record(sink, arrive, timeline_now(), blockDim.x * blockDim.y * blockDim.z);
#endif
  if constexpr (kTrigger) pdl_trigger();
  return slot;
}

/// Launches kernel<<<grid, block, smem, stream>>>(args...) with the PDL attribute when enabled;
/// returns the launch status.
template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl_enabled() ? 1 : 0;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<KArgs>(args)...);
  return e != cudaSuccess ? e : cudaGetLastError();
}

}  // namespace shoal::cuda

/// Returns the error of a launch() from the enclosing function (a single statement, safe in
/// brace-less if/else chains).
#define SHOAL_TRY_LAUNCH(call)                                  \
  do {                                                          \
    const cudaError_t shoal_launch_e_ = (call);                 \
    if (shoal_launch_e_ != cudaSuccess) return shoal_launch_e_; \
  } while (0)
