#include "node/signals.h"

#include <pthread.h>

#include <atomic>
#include <thread>

namespace kvasir::node {

sigset_t BlockStopSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int WaitForStopSignal(const sigset_t& set, const std::function<void()>& on_usr1) {
  while (true) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) return 0;
    if (sig == SIGUSR1) {
      if (on_usr1) on_usr1();
      continue;
    }
    return sig;
  }
}

Status RunUntilSignal(const sigset_t& set, const std::function<Status()>& run,
                      const std::function<void(int signal)>& stop,
                      const std::function<void()>& on_usr1) {
  std::atomic<bool> ran{false};
  std::thread signals([&] {
    const int sig = WaitForStopSignal(set, on_usr1);
    // The SIGTERM sent below to end this thread is no request to stop.
    if (!ran.load()) stop(sig);
  });
  Status st = run();
  ran.store(true);
  // Wakes the waiting thread (the signal is blocked there, so sigwait takes it) if `run` ended
  // on its own; after a real signal it has already returned and this is harmless.
  pthread_kill(signals.native_handle(), SIGTERM);
  signals.join();
  return st;
}

const char* StopSignalName(int signal) {
  if (signal == SIGINT) return "interrupt";
  if (signal == SIGTERM) return "terminate";
  return "signal";
}

}  // namespace kvasir::node
