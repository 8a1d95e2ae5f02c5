// A persistent pool of worker threads for data-parallel kernels. Workers spin for 50 us between
// jobs (decode issues many small jobs per token) and then sleep on a condition variable, so an idle
// pool (a ring stage waiting for its predecessor) leaves the cores to others.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <cstdint>
#include <thread>
#include <vector>

namespace kvasir {

class ThreadPool {
 public:
  // `n_threads` counts the calling thread: ThreadPool(1) runs everything inline.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(thread_index, n_threads) once on every thread (the caller is index 0) and returns when
  // all calls have returned. Not reentrant: call from one thread at a time.
  template <typename Fn>
  void Run(Fn&& fn) {
    RunImpl(
        [](void* ctx, int i, int n) { (*static_cast<std::remove_reference_t<Fn>*>(ctx))(i, n); },
        &fn);
  }

  // Splits [0, n) into contiguous chunks of at least `grain` items, one per thread, and calls
  // fn(begin, end) for each non-empty chunk.
  template <typename Fn>
  void ParallelFor(int64_t n, int64_t grain, Fn&& fn) {
    if (n <= 0) return;
    int64_t chunks = grain > 0 ? (n + grain - 1) / grain : n;
    if (n_threads_ == 1 || chunks <= 1) {
      fn(int64_t{0}, n);
      return;
    }
    Run([&](int i, int nt) {
      int64_t per = (n + nt - 1) / nt;
      if (grain > 1) per = (per + grain - 1) / grain * grain;
      int64_t b = per * i, e = b + per < n ? b + per : n;
      if (b < e) fn(b, e);
    });
  }

 private:
  using JobFn = void (*)(void*, int, int);
  void RunImpl(JobFn fn, void* ctx);
  void WorkerLoop(int index);

  int n_threads_;
  std::vector<std::thread> workers_;
  JobFn job_fn_ = nullptr;
  void* job_ctx_ = nullptr;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  std::atomic<int> sleepers_{0};
  std::mutex mu_;
  std::condition_variable cv_;
};

}  // namespace kvasir
