// A diagnostic timeline of kernel blocks, compiled only with CMake -DSHOAL_CUDA_TIMELINE=ON
// (off by default; nothing of it exists in other builds). Every block started by launch()
// records, in pdl_prologue (launch.cuh), when it reached its PDL wait and when the wait returned
// (%globaltimer, ns), its SM, index and grid; kernels may add marks (SHOAL_MARK) after the wait.
// `cuda_kernels` writes the records of one graph replay to the CSV named by SHOAL_TIMELINE
// (cuda_probe.cc); scripts/timeline.py turns them into per-kernel slots: when the kernel's blocks
// arrived, when the previous kernel released them, when the next kernel was released
// (docs/cuda.md, v13). Each .cu file has its own copy of the sink, registered with the host side
// (kernels.h timeline_start) at static initialisation. (pdl_prologue and timeline_mark refer to
// their file's sink: fine while the .cu files are compiled whole, without relocatable device code.)
// Only included by launch.cuh.
#pragma once

#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

#ifdef SHOAL_CUDA_TIMELINE
namespace {
__device__ shoal::cuda::TimelineSink g_timeline;
cudaError_t timeline_set_tu(const shoal::cuda::TimelineSink& s) { return cudaMemcpyToSymbol(g_timeline, &s, sizeof s); }
[[maybe_unused]] const int g_timeline_registered = shoal::cuda::timeline_register(&timeline_set_tu);
}  // namespace

namespace shoal::cuda {

constexpr unsigned kTimelineMarks = 8;  // record slots reserved per block after its own
constexpr unsigned kNoTimelineSlot = ~0u;

/// %globaltimer: ns, the same clock on every SM.
__device__ __forceinline__ unsigned long long timeline_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// A record of this block (thread 0 only) into `sink` (read before the wait: the host sets it
// between graphs); returns its index, the first of the block's slots, or kNoTimelineSlot when
// the buffer is full.
__device__ __forceinline__ unsigned timeline_record(const TimelineSink& sink, unsigned long long arrive,
                                                    unsigned long long release, unsigned threads) {
  unsigned sm;
  asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
  const unsigned i = atomicAdd(sink.count, 1u + kTimelineMarks);
  if (i >= sink.cap || sink.cap - i <= kTimelineMarks) return kNoTimelineSlot;
  sink.recs[i] = TimelineRecord{arrive, release, sm, blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z),
                                gridDim.x * gridDim.y * gridDim.z, threads};
  return i;
}

/// Mark `id` (< kTimelineMarks) of this block, stored by thread 0 in the slots reserved after the
/// block's record `slot` (pdl_prologue's result in thread 0; none: kNoTimelineSlot): a record
/// whose `threads` is 0x80000000 | id.
__device__ __forceinline__ void timeline_mark(unsigned slot, unsigned id) {
  if (threadIdx.x + threadIdx.y + threadIdx.z == 0 && slot != kNoTimelineSlot && g_timeline.recs) {
    unsigned sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    g_timeline.recs[slot + 1 + id] = TimelineRecord{timeline_now(), id, sm,
                                                    blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z),
                                                    gridDim.x * gridDim.y * gridDim.z, 0x80000000u | id};
  }
}

}  // namespace shoal::cuda

#define SHOAL_MARK(slot, id)                                                     \
  do {                                                                           \
    static_assert((id) < ::shoal::cuda::kTimelineMarks, "a mark id per slot"); \
    ::shoal::cuda::timeline_mark(slot, id);                                      \
  } while (0)
#else
#define SHOAL_MARK(slot, id) ((void)0)
#endif
