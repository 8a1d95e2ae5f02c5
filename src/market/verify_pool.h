// A few threads that check the Ed25519 signatures of the market's signed requests before each
// takes the lock around the store (market_server.h): the signature check, a fifth of a heartbeat's
// work, then runs beside another request's store work instead of on the one thread that answers.
// Bounded: at most `max_waiting` requests wait for a thread; past that, Submit refuses.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvasir::market {

class VerifyPool {
 public:
  // Starts `threads` threads (at least 1).
  VerifyPool(int threads, size_t max_waiting);
  ~VerifyPool() { Stop(); }
  VerifyPool(const VerifyPool&) = delete;
  VerifyPool& operator=(const VerifyPool&) = delete;

  // Queues `job` for a thread; false (and `job` dropped) when max_waiting jobs wait already or
  // the pool stopped. Thread-safe.
  bool Submit(std::function<void()> job);
  // Runs the jobs that wait, then joins the threads. Idempotent.
  void Stop();

 private:
  void Run();
  const size_t max_waiting_;
  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> jobs_;  // guarded by mu_
  bool stopping_ = false;                   // guarded by mu_
  std::vector<std::thread> threads_;
};

}  // namespace kvasir::market
