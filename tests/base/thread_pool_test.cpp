#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <time.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

namespace kvasir {
namespace {

TEST(ThreadPoolTest, RunCallsEveryThreadOnce) {
  for (int n : {1, 2, 3, 4}) {
    ThreadPool pool(n);
    std::vector<std::atomic<int>> hits(n);
    for (int rep = 0; rep < 100; ++rep) {
      pool.Run([&](int i, int nt) {
        EXPECT_EQ(nt, n);
        hits[i].fetch_add(1);
      });
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 100);
  }
}

TEST(ThreadPoolTest, ParallelForCoversRangeExactlyOnce) {
  ThreadPool pool(3);
  for (int64_t n : {0, 1, 7, 64, 1001}) {
    std::vector<std::atomic<int>> seen(n);
    pool.ParallelFor(n, 4, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) seen[i].fetch_add(1);
    });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(seen[i].load(), 1) << "n=" << n << " i=" << i;
  }
}

}  // namespace
}  // namespace kvasir

// An idle pool sleeps: a ring stage waits for its predecessor most of the time, and its workers
// must leave the cores to the other stages on the host. Over 300 ms of idleness after a job, the
// process uses a few milliseconds of CPU at most, where spinning workers would use ~300 ms each.
TEST(ThreadPoolTest, IdleWorkersSleepInsteadOfSpinning) {
  kvasir::ThreadPool pool(4);
  std::atomic<int> ran{0};
  pool.Run([&](int, int) { ++ran; });
  ASSERT_EQ(ran.load(), 4);
  auto cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return static_cast<double>(ts.tv_sec) * 1e3 + static_cast<double>(ts.tv_nsec) / 1e6;
  };
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // past the spin
  const double before = cpu_ms();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_LT(cpu_ms() - before, 30.0);
  // And it still wakes for the next job.
  pool.Run([&](int, int) { ++ran; });
  EXPECT_EQ(ran.load(), 8);
}
