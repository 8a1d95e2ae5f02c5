// The threads that check signatures before the market's lock (market/verify_pool.h): every job
// queued runs, no more wait than the bound, and a stop answers what waits.
#include "market/verify_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

namespace kvasir::market {
namespace {

TEST(VerifyPoolTest, RunsEveryJobOnItsThreads) {
  std::atomic<int> done{0};
  {
    VerifyPool pool(2, 1000);
    for (int i = 0; i < 500; ++i) ASSERT_TRUE(pool.Submit([&] { ++done; }));
  }  // the destructor stops the pool once the waiting jobs ran
  EXPECT_EQ(done.load(), 500);
}

TEST(VerifyPoolTest, RefusesPastItsBoundAndAnswersWhatWaitsAtAStop) {
  std::mutex mu;
  std::condition_variable cv;
  bool release = false, started = false;
  std::atomic<int> done{0};
  VerifyPool pool(1, 2);
  // The one thread is held by the first job; two more may wait, the fourth is refused.
  ASSERT_TRUE(pool.Submit([&] {
    std::unique_lock<std::mutex> lock(mu);
    started = true;
    cv.notify_all();
    cv.wait(lock, [&] { return release; });
    ++done;
  }));
  {
    std::unique_lock<std::mutex> lock(mu);
    ASSERT_TRUE(cv.wait_for(lock, std::chrono::seconds(10), [&] { return started; }));
  }
  EXPECT_TRUE(pool.Submit([&] { ++done; }));
  EXPECT_TRUE(pool.Submit([&] { ++done; }));
  EXPECT_FALSE(pool.Submit([&] { ++done; }));
  {
    std::lock_guard<std::mutex> lock(mu);
    release = true;
  }
  cv.notify_all();
  pool.Stop();
  EXPECT_EQ(done.load(), 3);
  EXPECT_FALSE(pool.Submit([&] { ++done; }));  // stopped
}

}  // namespace
}  // namespace kvasir::market
