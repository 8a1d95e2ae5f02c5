// How `kvasir serve` reaches its ring: a pool of authenticated client links to the head (each runs
// one request at a time, since the ring tells a link's sessions apart only by their order, and is
// kept for the next request), and a watcher thread that asks the ring for its statistics every
// interval. The ring is up while they come back: the head answers them only on a closed ring, so
// "up" means a request would reach every stage. The statistics (each stage's window, name,
// backend, open sessions, time per token) feed /health and /metrics.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "base/status.h"
#include "ring/client.h"

namespace kvasir::serve {

struct RingAccessOptions {
  std::string head;            // HOST:PORT of the head stage
  ring::ClientOptions client;  // how the head is authenticated; its timeouts
  int max_idle = 64;           // links kept for later requests
  int watch_interval_ms = 1000;
  int connect_timeout_ms = 5000;  // a request's wait for a new link to the head
};

class RingAccess {
 public:
  // Starts the watcher; the ring is down until its first statistics come back.
  static std::unique_ptr<RingAccess> Start(RingAccessOptions options);
  ~RingAccess();
  RingAccess(const RingAccess&) = delete;
  RingAccess& operator=(const RingAccess&) = delete;

  // A link to the head for one request: an idle one, or a new one. Thread-safe.
  Result<std::unique_ptr<ring::RingClient>> Take();
  // Returns a link after its request: kept when it still works. Thread-safe.
  void Give(std::unique_ptr<ring::RingClient> client);

  bool up() const { return up_.load(); }
  // Why the ring is down ("" while it is up).
  std::string why_down() const;
  // The last statistics, one record per stage in ring order (empty before the first).
  std::vector<wire::StageStats> stages() const;
  // Asks the watcher to look again now (a request found the ring broken).
  void Refresh();
  // Blocks until the ring is up or `timeout_ms` passes; returns whether it is up.
  bool WaitUp(int timeout_ms) const;
  // Closes every link, in use or idle (requests in progress fail), and stops the watcher.
  void Stop();

 private:
  explicit RingAccess(RingAccessOptions options) : o_(std::move(options)) {}
  void Watch();
  void SetState(bool up, std::string why, std::vector<wire::StageStats> stages);

  const RingAccessOptions o_;
  std::thread watcher_;
  std::atomic<bool> up_{false};
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool stopping_ = false;
  bool refresh_ = false;
  std::string why_down_ = "the ring has not answered yet";
  std::vector<wire::StageStats> stages_;
  std::vector<std::unique_ptr<ring::RingClient>> idle_;
  std::set<ring::RingClient*> in_use_;
  ring::RingClient* watching_ = nullptr;  // the watcher's link, aborted by Stop
  int connecting_ = 0;                    // links in their handshake now
  static constexpr int kMaxConnecting = 4;
};

}  // namespace kvasir::serve
