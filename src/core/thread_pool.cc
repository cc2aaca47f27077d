#include "core/thread_pool.h"

#include <algorithm>

#include "core/spin.h"

namespace shoal {

namespace {
constexpr int kSpinIterations = 20000;  // ~ tens of microseconds before sleeping or yielding
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  state_.fetch_add(uint64_t(1) << 32, std::memory_order_acq_rel);  // a new (closed) generation wakes all
  state_.notify_all();
  for (auto& t : workers_) t.join();
}

int64_t ThreadPool::grain_for(int64_t n, int64_t min_grain) const {
  const int64_t target_chunks = int64_t(n_threads_) * 4;
  int64_t g = (n + target_chunks - 1) / target_chunks;
  return std::max<int64_t>(g, std::max<int64_t>(1, min_grain));
}

void ThreadPool::work_on_job() {
  for (;;) {
    const int64_t b = next_.fetch_add(grain_, std::memory_order_relaxed);
    if (b >= n_) break;
    kernel_(ctx_, b, std::min(n_, b + grain_));
  }
}

void ThreadPool::run_job(int64_t n, int64_t grain, Kernel k, void* ctx) {
  kernel_ = k;
  ctx_ = ctx;
  n_ = n;
  grain_ = grain;
  next_.store(0, std::memory_order_relaxed);
  const uint64_t gen = (state_.load(std::memory_order_relaxed) >> 32) + 1;
  state_.store(gen << 32, std::memory_order_release);  // open, nobody inside: publishes the job
  state_.notify_all();
  work_on_job();
  // Close the job to late workers, then wait for those inside to finish their chunks.
  state_.fetch_or(kClosed, std::memory_order_acq_rel);
  for (int spin = 0; (state_.load(std::memory_order_acquire) & kInsideMask) != 0; ++spin) {
    if (spin < kSpinIterations)
      cpu_relax();
    else
      std::this_thread::yield();  // a joined worker was descheduled mid-chunk
  }
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;  // the last generation this worker looked at
  for (;;) {
    uint64_t s = state_.load(std::memory_order_acquire);
    for (int spin = 0; (s >> 32) == seen && spin < kSpinIterations; ++spin) {
      cpu_relax();
      s = state_.load(std::memory_order_acquire);
    }
    while ((s >> 32) == seen) {
      state_.wait(s, std::memory_order_acquire);
      s = state_.load(std::memory_order_acquire);
    }
    if (stop_.load(std::memory_order_acquire)) return;
    // Join the job if it is still open; a failed CAS re-reads the state and tries again.
    while ((s & kClosed) == 0 && !state_.compare_exchange_weak(s, s + 1, std::memory_order_acq_rel,
                                                               std::memory_order_acquire)) {
    }
    if ((s & kClosed) == 0 && (s >> 32) != seen) {
      work_on_job();
      state_.fetch_sub(1, std::memory_order_release);
    }
    seen = s >> 32;
  }
}

}  // namespace shoal
