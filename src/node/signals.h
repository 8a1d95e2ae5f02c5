// Running until SIGINT or SIGTERM, for every long-running command (stage, join, serve, relay,
// market, audit). Signals are taken by one thread with sigwait(), so no handler ever runs inside
// the code it stops.
#pragma once

#include <signal.h>

#include <functional>

#include "base/status.h"

namespace kvasir::node {

// Blocks SIGINT, SIGTERM and SIGUSR1 in the calling thread (and the threads it starts later) and
// returns that set. Call it before starting any thread, so that no thread takes these signals
// with their default action.
sigset_t BlockStopSignals();

// Waits on `set` (from BlockStopSignals) until SIGINT or SIGTERM arrives and returns it; each
// SIGUSR1 meanwhile calls `on_usr1` (when given) on this thread. Returns 0 if sigwait fails.
int WaitForStopSignal(const sigset_t& set, const std::function<void()>& on_usr1 = {});

// Runs `run` on the calling thread while another thread waits on `set`: SIGUSR1 calls `on_usr1`,
// SIGINT or SIGTERM calls `stop(signal)` once, which must make `run` return. When `run` returns
// on its own, the waiting thread ends without calling `stop`. Returns what `run` returned, after
// the waiting thread has ended.
Status RunUntilSignal(const sigset_t& set, const std::function<Status()>& run,
                      const std::function<void(int signal)>& stop,
                      const std::function<void()>& on_usr1 = {});

// "interrupt" for SIGINT, "terminate" for SIGTERM, else "signal": for the line a command logs
// as it stops.
const char* StopSignalName(int signal);

}  // namespace kvasir::node
