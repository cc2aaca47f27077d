// The spin-wait hint of the loops that poll memory (the thread pool's workers, the CUDA
// backend's wait for a published decode step).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace shoal {

/// Tells the core the caller is spinning (x86 `pause`, Arm `yield`, nothing elsewhere): the
/// sibling hardware thread gets the pipeline and the loop draws less power.
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace shoal
