#include "base/thread_pool.h"

#include <chrono>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KV_PAUSE() _mm_pause()
#else
#define KV_PAUSE() std::this_thread::yield()
#endif

namespace kvasir {
namespace {
// How long a worker spins for the next job before it sleeps. Decode issues jobs microseconds
// apart, so a short spin saves the wake-up; but a ring stage then waits milliseconds for its
// predecessor, and a spin counted in `pause` instructions lasts ~1 ms where `pause` takes ~140
// cycles (recent Intel), burning a core other stages on the host need. So the spin is timed.
constexpr auto kSpinTime = std::chrono::microseconds(50);
constexpr int kSpinCheckEvery = 64;  // pause iterations between clock reads
// The caller waiting for workers to finish a job spins this many iterations before yielding.
constexpr int kSpinIterations = 20000;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(n_threads < 1 ? 1 : n_threads) {
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunImpl(JobFn fn, void* ctx) {
  if (n_threads_ == 1) {
    fn(ctx, 0, 1);
    return;
  }
  job_fn_ = fn;
  job_ctx_ = ctx;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  fn(ctx, 0, n_threads_);
  int spins = 0;
  while (pending_.load(std::memory_order_acquire) != 0) {
    if (++spins < kSpinIterations) {
      KV_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint32_t seen = 0;  // the generation before any Run(); a late-starting worker must not skip job 1
  while (true) {
    int spins = 0;
    const auto spin_until = std::chrono::steady_clock::now() + kSpinTime;
    bool spinning = true;
    uint32_t g;
    while ((g = generation_.load(std::memory_order_acquire)) == seen) {
      if (spinning && (++spins % kSpinCheckEvery != 0 ||
                       std::chrono::steady_clock::now() < spin_until)) {
        KV_PAUSE();
      } else {
        spinning = false;
        std::unique_lock<std::mutex> lock(mu_);
        sleepers_.fetch_add(1, std::memory_order_seq_cst);
        cv_.wait(lock, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
        sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      }
    }
    seen = g;
    if (stop_.load()) return;
    job_fn_(job_ctx_, index, n_threads_);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace kvasir
