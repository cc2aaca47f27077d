// The speed probe a device reports in its hello (and the host measures of itself): how fast its
// backend streams weights (GEMV: memory bound, as decode is) and multiplies (a batched matmul:
// compute bound, as prefill is). The planner deals layers by these figures.
#pragma once

#include <chrono>

#include "backend/backend.h"
#include "core/status.h"

namespace shoal::pool {

struct SpeedProbe {
  double mem_gbps = 0;       // weight bytes streamed per second by a GEMV over an F16 matrix, GB/s
  double matmul_gflops = 0;  // GFLOP/s of a 32-row F16 matmul (2 FLOPs per multiply-add)
  double seconds = 0;        // time the probe took
};

/// Measures the backend within about `budget` (at least one run of each kernel): a GEMV over a
/// 32 MiB F16 weight (larger than most caches) and a [32 x 1024] x [512 x 1024]ᵀ matmul.
/// Errors: allocation and copy errors of the backend (kOutOfMemory naming the size).
Result<SpeedProbe> probe_speed(Backend& backend, std::chrono::milliseconds budget);

/// Warns on stderr when `lent` bytes (--mem; 0: not given) are more than the backend has free: a
/// plan that counts on them may fail to load.
void warn_if_more_than_free(uint64_t lent, const Backend& backend);

}  // namespace shoal::pool
