// ThreadPool: every index is visited exactly once, for many small jobs in a row (the decode
// pattern), for thread counts above the core count, and with a busy worker.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace shoal {
namespace {

TEST(ThreadPool, EveryIndexOnceOverManyJobs) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    std::vector<std::atomic<int>> hits(1000);
    for (int job = 0; job < 2000; ++job) {
      const int64_t n = 1 + job % 997;
      pool.parallel_for(n, 1 + job % 7, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) hits[size_t(i)].fetch_add(1, std::memory_order_relaxed);
      });
    }
    for (size_t i = 0; i < hits.size(); ++i) {
      int expect = 0;
      for (int job = 0; job < 2000; ++job) expect += int(int64_t(i) < 1 + job % 997);
      ASSERT_EQ(hits[i].load(), expect) << "threads " << threads << " index " << i;
    }
  }
}

TEST(ThreadPool, FinishesWhileOtherThreadsHogTheCores) {
  // More runnable threads than cores: a job must not wait for a worker that never joined it.
  std::atomic<bool> stop{false};
  std::vector<std::thread> hogs;
  for (int i = 0; i < 4; ++i)
    hogs.emplace_back([&] {
      while (!stop.load(std::memory_order_relaxed)) {
      }
    });
  ThreadPool pool(4);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 300; ++job)
    pool.parallel_for(64, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b, std::memory_order_relaxed); });
  stop.store(true);
  for (auto& t : hogs) t.join();
  EXPECT_EQ(sum.load(), 300 * 64);
}

TEST(ThreadPool, GrainFor) {
  ThreadPool pool(2);
  EXPECT_EQ(pool.grain_for(80), 10);  // 2 threads x 4 chunks
  EXPECT_EQ(pool.grain_for(3), 1);
  EXPECT_EQ(pool.grain_for(80, 16), 16);
}

}  // namespace
}  // namespace shoal
