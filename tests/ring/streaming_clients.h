// Clients that stream from a ring's head at once while the test disturbs the ring (kills or
// freezes a stage), and the check that none of them noticed: shared by the healing ring tests
// (tests/ring/heal_process_test.cpp) and the market's standby test.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "model/sampler.h"
#include "ring/client.h"

namespace kvasir::testing {

// Client i's prompt: one of four, in turn.
std::string StreamPrompt(int i);
// Client i's sampling: greedy for even i, temperature 0.9 with top-k 20 and seed `seed_base` + i
// for odd i.
SamplingParams StreamSampling(int i, uint64_t seed_base);

// What one streaming client saw.
struct ClientRun {
  std::vector<int32_t> ids;
  std::string error;         // empty when the session ended normally
  double pause_ms = 0;       // the longest wait between two tokens
  int seen_at_disturb = -1;  // tokens received when `disturb` ran
};

// `n` clients connect to `head` with `options` and stream `tokens` tokens each at once (prompt
// StreamPrompt(i), sampling `sampling(i)`, end-of-generation ignored). Once each has `before`
// tokens (or after 60 s), `disturb` runs on the calling thread; returns when every client is done.
std::vector<ClientRun> StreamWhile(const std::string& head, const ring::ClientOptions& options,
                                   int n, int tokens, int before,
                                   const std::function<void()>& disturb,
                                   const std::function<SamplingParams(int)>& sampling);

// Every client ended without error, was mid-stream when the ring was disturbed, and got
// `reference(i)`; prints each client's pause. `what` names the disturbance in failures.
void ExpectUndisturbed(const std::vector<ClientRun>& runs, const std::string& what, int tokens,
                       const std::function<std::vector<int32_t>(int)>& reference);

}  // namespace kvasir::testing
