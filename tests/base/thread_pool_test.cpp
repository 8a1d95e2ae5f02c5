#include "base/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
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

// The threads of this process, by id, with the state letter and the CPU time (ns) the kernel
// reports for each (/proc/self/task/TID/stat and schedstat).
struct ThreadState {
  char state = '?';
  uint64_t cpu_ns = 0;
  std::string wchan;  // what a sleeping thread waits in ("futex_wait_queue", ...; "0" if hidden)
};

std::map<int, ThreadState> Threads() {
  std::map<int, ThreadState> out;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/task")) {
    const int tid = std::stoi(e.path().filename().string());
    ThreadState t;
    std::ifstream stat(e.path() / "stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');  // the name may hold spaces and parentheses
    if (paren == std::string::npos || paren + 2 >= line.size()) continue;
    t.state = line[paren + 2];
    std::ifstream(e.path() / "schedstat") >> t.cpu_ns;
    std::ifstream(e.path() / "wchan") >> t.wchan;
    out[tid] = t;
  }
  return out;
}

}  // namespace

// An idle pool sleeps: a ring stage waits for its predecessor most of the time, and its workers
// must leave the cores to the other stages on the host. After a job every worker leaves its 50 us
// spin and blocks in the kernel (state S, not R) within the deadline, having used little CPU on
// the way; a worker that kept spinning would stay runnable and never block.
TEST(ThreadPoolTest, IdleWorkersSleepInsteadOfSpinning) {
  const std::map<int, ThreadState> before = Threads();
  ThreadPool pool(4);
  std::atomic<int> ran{0};
  pool.Run([&](int, int) { ++ran; });
  ASSERT_EQ(ran.load(), 4);
  std::vector<int> workers;
  for (const auto& [tid, t] : Threads()) {
    if (before.count(tid) == 0) workers.push_back(tid);
  }
  ASSERT_EQ(workers.size(), 3u) << "the caller is the pool's fourth thread";
  std::map<int, ThreadState> now;
  auto all_blocked = [&] {
    now = Threads();
    return std::all_of(workers.begin(), workers.end(), [&](int tid) {
      const auto it = now.find(tid);
      return it != now.end() && it->second.state == 'S';
    });
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  bool blocked = all_blocked();
  while (!blocked && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // a poll, not a wait for time
    blocked = all_blocked();
  }
  ASSERT_TRUE(blocked) << "a worker is still runnable after 10 s: it spins";
  uint64_t cpu_ns = 0;
  for (int tid : workers) {
    cpu_ns += now[tid].cpu_ns;
    // Where the kernel shows it: blocked on the pool's condition variable, not in a sleep call.
    if (now[tid].wchan != "0" && !now[tid].wchan.empty()) {
      EXPECT_NE(now[tid].wchan.find("futex"), std::string::npos) << now[tid].wchan;
    }
  }
  // Three workers, one tiny job and a 50 us spin each; a spinning pool would burn a core per
  // worker until the deadline. 100 ms in all leaves room for thread start-up on a loaded machine.
  EXPECT_LT(cpu_ns, 100'000'000u);
  // And it still wakes for the next job.
  pool.Run([&](int, int) { ++ran; });
  EXPECT_EQ(ran.load(), 8);
}

}  // namespace kvasir
