#include "serve/session_queue.h"

#include <algorithm>

namespace kvasir::serve {

SessionQueue::SessionQueue(int max_running, int max_waiting)
    : max_running_(std::max(1, max_running)), max_waiting_(std::max(0, max_waiting)) {
  for (int i = 0; i < max_running_; ++i) workers_.emplace_back([this] { Work(); });
}

SessionQueue::~SessionQueue() { Stop(); }

bool SessionQueue::Submit(std::function<void()> run, std::function<void()> dropped) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return false;
    // A free worker takes it at once; otherwise it waits, if there is room.
    const int free = max_running_ - running_;
    if (static_cast<int>(tasks_.size()) + 1 > free + max_waiting_) return false;
    tasks_.push_back({std::move(run), std::move(dropped)});
  }
  cv_.notify_one();
  return true;
}

int SessionQueue::running() const {
  std::lock_guard<std::mutex> lock(mu_);
  return running_;
}

int SessionQueue::waiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return std::max(0, static_cast<int>(tasks_.size()) - (max_running_ - running_));
}

void SessionQueue::Work() {
  while (true) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      if (stopping_) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
    }
    task.run();
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
  }
}

void SessionQueue::Stop() {
  std::deque<Task> left;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
    left.swap(tasks_);
  }
  cv_.notify_all();
  for (Task& t : left) {
    if (t.dropped) t.dropped();
  }
  for (std::thread& w : workers_) {
    if (w.joinable()) w.join();
  }
  workers_.clear();
}

}  // namespace kvasir::serve
