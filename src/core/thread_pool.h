// A fixed pool of worker threads for data-parallel loops on the decode path.
// Work is split into chunks taken from an atomic counter; which thread runs a chunk never changes
// what the chunk computes, so results do not depend on the thread count.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <thread>
#include <vector>

namespace shoal {

class ThreadPool {
 public:
  /// n_threads counts the calling thread too (n_threads - 1 workers are started); <= 0 means
  /// one per hardware thread.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  /// Calls fn(begin, end) over [0, n) in chunks of `grain` (the last may be shorter), on all
  /// threads, and returns when every chunk is done. Not reentrant: fn must not call parallel_for.
  template <typename Fn>
  void parallel_for(int64_t n, int64_t grain, Fn&& fn) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (n_threads_ == 1 || n <= grain) {
      fn(int64_t(0), n);
      return;
    }
    run_job(n, grain, [](void* ctx, int64_t b, int64_t e) { (*static_cast<Fn*>(ctx))(b, e); },
            static_cast<void*>(&fn));
  }

  /// Chooses a grain that gives each thread several chunks of at least `min_grain` items.
  int64_t grain_for(int64_t n, int64_t min_grain = 1) const;

 private:
  using Kernel = void (*)(void*, int64_t, int64_t);
  void run_job(int64_t n, int64_t grain, Kernel k, void* ctx);
  void worker_loop();
  void work_on_job();

  // state_ = job generation << 32 | kClosed while no job accepts helpers | workers inside the job.
  // A worker joins a job only while it is open (a CAS that counts it in), so run_job waits for the
  // workers that joined, never for one the OS has not scheduled yet: that one sees the job closed
  // and goes back to waiting.
  static constexpr uint64_t kClosed = uint64_t(1) << 31;
  static constexpr uint64_t kInsideMask = kClosed - 1;

  int n_threads_;
  std::vector<std::thread> workers_;
  // The current job (written only while closed with nobody inside).
  Kernel kernel_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0, grain_ = 1;
  std::atomic<int64_t> next_{0};
  std::atomic<uint64_t> state_{kClosed};
  std::atomic<bool> stop_{false};
};

}  // namespace shoal
