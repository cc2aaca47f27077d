#include "core/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define SHOAL_PAUSE() _mm_pause()
#else
#define SHOAL_PAUSE() ((void)0)
#endif

namespace shoal {

namespace {
constexpr int kSpinIterations = 20000;  // ~ tens of microseconds before sleeping
}

ThreadPool::ThreadPool(int n_threads) {
  if (n_threads <= 0) n_threads = int(std::max(1u, std::thread::hardware_concurrency()));
  n_threads_ = n_threads;
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_release);
  generation_.fetch_add(1, std::memory_order_acq_rel);
  generation_.notify_all();
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
  pending_.store(int(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_acq_rel);  // publishes the job
  generation_.notify_all();
  work_on_job();
  while (pending_.load(std::memory_order_acquire) != 0) SHOAL_PAUSE();
}

void ThreadPool::worker_loop() {
  uint64_t seen = 0;
  for (;;) {
    uint64_t g = generation_.load(std::memory_order_acquire);
    for (int spin = 0; g == seen && spin < kSpinIterations; ++spin) {
      SHOAL_PAUSE();
      g = generation_.load(std::memory_order_acquire);
    }
    while (g == seen) {
      generation_.wait(seen, std::memory_order_acquire);
      g = generation_.load(std::memory_order_acquire);
    }
    seen = g;
    if (stop_.load(std::memory_order_acquire)) return;
    work_on_job();
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace shoal
