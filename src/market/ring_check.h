// The market's check of a claim's holder (docs/MARKET.md, "Ready rings are checked"): before a
// ring counts as ready, the market dials every holder that gave an address and runs a ring client
// handshake (ring/handshake.h) that demands the holder's node key; the head must also answer a
// client's HELLO with the model and the window it holds. So a holder that lies about serving, or
// names an address it does not listen on, keeps its ring from being handed to clients.
// Checks run on a few worker threads behind a bounded queue: the market's event loop only queues
// them and never waits for the network.
#pragma once

#include <array>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "base/status.h"

namespace kvasir::market {

struct CheckJob {
  int64_t claim = 0;
  int64_t epoch = 0;     // the ring epoch the check is for
  std::string node;      // 64 hex digits: the key the holder must prove
  std::string address;   // HOST:PORT the holder gave
  bool head = false;     // window 0: also exchange HELLO as a client
  std::string model_id;  // 32 hex digits (head: what its HELLO must name)
  int last = 0;          // the head's window is [0, last)
  // A standby behind NAT is dialed through the relay instead of `address` (empty): `via` is
  // "wss://RELAY/edge/ID" of the edge from its window's predecessor, dialed as that side with
  // `token` (docs/MARKET.md, "Standbys").
  std::string via;
  std::array<uint8_t, 32> token{};
};

// Runs one check within about `timeout_ms` (dial, handshake and HELLO together; resolving a host
// name takes what the system resolver takes). Blocking; any thread. Errors say what failed
// ("10.0.0.5:7001: the head: is node 3fa91c07, expected node 9e0a44b2"). `relay_ca_file`: PEM
// certificates to trust for a wss:// `via` instead of the system's.
Status CheckHolder(const CheckJob& job, int timeout_ms, const std::string& relay_ca_file = "");

// Where the market's API sends the checks it wants done.
class CheckQueue {
 public:
  virtual ~CheckQueue() = default;
  // Never blocks. May drop the request (queue full, already queued, done or failed recently);
  // the API asks again with the next heartbeat.
  virtual void Request(const CheckJob& job) = 0;
};

struct CheckerOptions {
  int threads = 2;
  size_t max_queued = 64;
  int timeout_ms = 3000;
  double retry_after_s = 2;   // a failed (claim, epoch) is not checked again for this long
  std::string relay_ca_file;  // for jobs with a `via` (CheckHolder)
};

struct CheckerStats {
  uint64_t requested = 0, dropped = 0, passed = 0, failed = 0;
};

class RingChecker final : public CheckQueue {
 public:
  // `sink` receives every outcome, on a worker thread (calls may overlap).
  using Sink = std::function<void(const CheckJob&, const Status&)>;
  RingChecker(CheckerOptions options, Sink sink);
  ~RingChecker() override;
  RingChecker(const RingChecker&) = delete;
  RingChecker& operator=(const RingChecker&) = delete;

  void Request(const CheckJob& job) override;
  // Waits for the running checks (at most about timeout_ms) and stops the threads. Idempotent.
  void Stop();
  CheckerStats stats() const;

 private:
  using Key = std::pair<int64_t, int64_t>;  // claim, epoch
  struct Outcome {
    bool ok = false;
    std::chrono::steady_clock::time_point at;
  };
  void Work();
  CheckerOptions o_;
  Sink sink_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<CheckJob> queue_;
  std::map<Key, bool> busy_;       // queued or running
  std::map<Key, Outcome> recent_;  // bounded: the oldest are forgotten
  CheckerStats stats_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

// A checker whose outcomes go to the market database at `db_path` (Store::RecordCheck, on a
// connection of its own).
Result<std::unique_ptr<RingChecker>> StartStoreChecker(const std::string& db_path,
                                                       CheckerOptions options = {});

}  // namespace kvasir::market
