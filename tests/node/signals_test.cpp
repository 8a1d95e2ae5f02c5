// Running until a signal: the waiter returns on SIGINT/SIGTERM, SIGUSR1 only reports, and the
// runner stops what it runs on a signal but not when it ends on its own.
#include "node/signals.h"

#include <gtest/gtest.h>
#include <pthread.h>

#include <atomic>
#include <condition_variable>
#include <mutex>

namespace kvasir::node {
namespace {

class SignalsTest : public ::testing::Test {
 protected:
  void SetUp() override { pthread_sigmask(SIG_SETMASK, nullptr, &saved_); }
  void TearDown() override {
    // Nothing may be left pending before the old mask returns (a pending SIGTERM would end the
    // test binary).
    sigset_t pending;
    sigpending(&pending);
    EXPECT_EQ(sigismember(&pending, SIGTERM), 0);
    EXPECT_EQ(sigismember(&pending, SIGINT), 0);
    EXPECT_EQ(sigismember(&pending, SIGUSR1), 0);
    pthread_sigmask(SIG_SETMASK, &saved_, nullptr);
  }
  sigset_t saved_;
};

TEST_F(SignalsTest, WaiterReturnsOnSigtermAfterReportingSigusr1) {
  const sigset_t set = BlockStopSignals();
  int reports = 0;
  // Both pending before the wait: standard signals are taken lowest number first (SIGUSR1 = 10,
  // SIGTERM = 15), so the report comes first and the wait ends on SIGTERM.
  ASSERT_EQ(pthread_kill(pthread_self(), SIGUSR1), 0);
  ASSERT_EQ(pthread_kill(pthread_self(), SIGTERM), 0);
  EXPECT_EQ(WaitForStopSignal(set, [&] { ++reports; }), SIGTERM);
  EXPECT_EQ(reports, 1);
}

TEST_F(SignalsTest, WaiterReturnsOnSigint) {
  const sigset_t set = BlockStopSignals();
  ASSERT_EQ(pthread_kill(pthread_self(), SIGINT), 0);
  EXPECT_EQ(WaitForStopSignal(set), SIGINT);
  EXPECT_STREQ(StopSignalName(SIGINT), "interrupt");
  EXPECT_STREQ(StopSignalName(SIGTERM), "terminate");
}

// What a command runs: it ends when Stop() is called, or at once with `end_now`.
struct Runner {
  std::mutex mu;
  std::condition_variable cv;
  bool stopped = false;
  Status Run(bool end_now) {
    if (end_now) return Error("ended on its own");
    // A SIGTERM to the process, as `kill PID` sends it: every thread blocks it, so the waiting
    // thread takes it with sigwait.
    kill(getpid(), SIGTERM);
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return stopped; });
    return Status::Ok();
  }
  void Stop() {
    std::lock_guard<std::mutex> lock(mu);
    stopped = true;
    cv.notify_all();
  }
};

TEST_F(SignalsTest, RunnerStopsWhatItRunsOnSigterm) {
  const sigset_t set = BlockStopSignals();
  Runner r;
  std::atomic<int> stop_signal{0}, stops{0};
  Status st = RunUntilSignal(
      set, [&] { return r.Run(false); },
      [&](int sig) {
        stop_signal = sig;
        ++stops;
        r.Stop();
      });
  EXPECT_TRUE(st.ok()) << st.message();
  EXPECT_EQ(stop_signal.load(), SIGTERM);
  EXPECT_EQ(stops.load(), 1);
}

TEST_F(SignalsTest, RunnerEndingOnItsOwnIsNotStoppedAndKeepsItsStatus) {
  const sigset_t set = BlockStopSignals();
  Runner r;
  std::atomic<int> stops{0};
  Status st = RunUntilSignal(
      set, [&] { return r.Run(true); }, [&](int) { ++stops; });
  EXPECT_EQ(st.message(), "ended on its own");
  EXPECT_EQ(stops.load(), 0);
}

}  // namespace
}  // namespace kvasir::node
