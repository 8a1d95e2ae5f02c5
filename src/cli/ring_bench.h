// `kvasir bench --ring`: throughput of a running ring with several concurrent streams.
#pragma once

#include <string>
#include <vector>

#include "ring/client.h"

namespace kvasir::cli {

struct RingBenchOptions {
  std::string head;  // HOST:PORT of the head stage
  std::vector<int> streams = {1, 4, 16};
  int n_prompt = 128;  // approximate prompt tokens per stream
  int n_gen = 64;      // tokens generated per stream
  int repetitions = 3;
  bool json = false;
  ring::ClientOptions client;  // how the head is reached and authenticated
  std::string links;           // what the ring's links are, for the header; empty: unsaid
};

// What is wrong with the options' counts (--streams, -n, -p, -r), or "" when nothing is.
std::string RingBenchUsageError(const RingBenchOptions& options);

// Runs every stream count `repetitions` times (after one warm-up) and prints a table (or JSON):
// aggregate tokens/s, per-stream decode tokens/s, time to first token, and bytes per hop.
int RunRingBench(const RingBenchOptions& options);

}  // namespace kvasir::cli
