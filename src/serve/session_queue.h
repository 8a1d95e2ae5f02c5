// Where the API's requests wait for the ring: at most `max_running` run at once, each on its own
// worker thread (a request holds a link to the head and blocks on it), and at most `max_waiting`
// more wait in order for a place (deferred). Beyond that a request is refused at once (the API
// answers 429 with Retry-After), so neither threads nor memory grow with the number of clients.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvasir::serve {

class SessionQueue {
 public:
  SessionQueue(int max_running, int max_waiting);
  ~SessionQueue();
  SessionQueue(const SessionQueue&) = delete;
  SessionQueue& operator=(const SessionQueue&) = delete;

  // Queues `run`; false (and nothing queued) when `max_waiting` already wait. `dropped` runs
  // instead of `run` when the queue stops before a worker took it. Thread-safe.
  bool Submit(std::function<void()> run, std::function<void()> dropped);
  int running() const;
  int waiting() const;
  int max_running() const { return max_running_; }
  // Drops what waits (their `dropped` run), lets the running ones finish, joins the workers.
  void Stop();

 private:
  void Work();
  struct Task {
    std::function<void()> run, dropped;
  };
  const int max_running_, max_waiting_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Task> tasks_;
  int running_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace kvasir::serve
