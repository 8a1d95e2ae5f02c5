// At most max_running requests run and max_waiting wait; beyond that a request is refused at once;
// stopping drops the waiting ones through their `dropped` and lets the running ones finish.
#include "serve/session_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <future>

namespace kvasir::serve {
namespace {

constexpr auto kDeadline = std::chrono::seconds(10);

// A task that runs until released.
struct Gate {
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  std::atomic<int> started{0}, finished{0}, dropped{0};
  std::function<void()> Run() {
    return [this] {
      ++started;
      opened.wait();
      ++finished;
    };
  }
  std::function<void()> Drop() {
    return [this] { ++dropped; };
  }
};

// Waits (with a deadline) until `done` holds, yielding in between.
template <typename F>
bool Eventually(F done) {
  const auto end = std::chrono::steady_clock::now() + kDeadline;
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::yield();
  }
  return true;
}

TEST(SessionQueueTest, RunsAtMostMaxRunningAndQueuesAtMostMaxWaiting) {
  SessionQueue q(2, 1);
  Gate gate;
  EXPECT_TRUE(q.Submit(gate.Run(), gate.Drop()));
  EXPECT_TRUE(q.Submit(gate.Run(), gate.Drop()));
  ASSERT_TRUE(Eventually([&] { return gate.started == 2; }));
  EXPECT_EQ(q.running(), 2);
  EXPECT_TRUE(q.Submit(gate.Run(), gate.Drop()));  // waits
  EXPECT_EQ(q.waiting(), 1);
  EXPECT_FALSE(q.Submit(gate.Run(), gate.Drop())) << "no room left: refused at once";
  gate.open.set_value();
  ASSERT_TRUE(Eventually([&] { return gate.finished == 3; }));
  ASSERT_TRUE(Eventually([&] { return q.running() == 0; }));
  EXPECT_EQ(q.waiting(), 0);
  EXPECT_EQ(gate.dropped, 0);
}

TEST(SessionQueueTest, StopDropsTheWaitingAndFinishesTheRunning) {
  SessionQueue q(1, 4);
  Gate gate;
  ASSERT_TRUE(q.Submit(gate.Run(), gate.Drop()));
  ASSERT_TRUE(Eventually([&] { return gate.started == 1; }));
  ASSERT_TRUE(q.Submit(gate.Run(), gate.Drop()));
  ASSERT_TRUE(q.Submit(gate.Run(), gate.Drop()));
  std::thread opener([&] {
    EXPECT_TRUE(Eventually([&] { return gate.dropped == 2; }));
    gate.open.set_value();
  });
  q.Stop();
  opener.join();
  EXPECT_EQ(gate.finished, 1);
  EXPECT_EQ(gate.dropped, 2);
  EXPECT_FALSE(q.Submit(gate.Run(), gate.Drop())) << "a stopped queue takes nothing";
}

}  // namespace
}  // namespace kvasir::serve
