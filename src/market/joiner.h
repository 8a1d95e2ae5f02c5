// `kvasir join` as a library (docs/MARKET.md, "kvasir join"): a node that claims a window from the
// market, fetches it, runs it as a ring stage with the neighbours the market names, re-links when
// they change, heartbeats its lease, submits the receipts its ring signs, and releases its claim
// when it stops.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "base/status.h"
#include "ring/node_key.h"
#include "ring/stage.h"
#include "shard/fetch.h"

namespace kvasir::market {

struct JoinOptions {
  std::string market_url;  // http[s]://HOST[:PORT]
  std::shared_ptr<const ring::NodeKey> key;
  uint64_t memory_bytes = 0;  // what a window (weights + KV + runtime) may take
  bool behind_nat = false;    // accepts no inbound connections: both links through the relay
  std::string cache_dir;      // where fetched slices are kept
  std::string listen = "0.0.0.0:0";  // where the predecessor (and clients, on the head) connect
  // HOST:PORT the market tells others; default ":<bound port>" (the market fills in the address
  // this node's requests come from).
  std::string advertise;
  std::string model;  // claim only windows of this model (empty: any)
  int n_threads = 1;
  std::string backend = "cpu";  // where claimed windows run (--backend)
  std::string ca_file;  // for https:// markets, models and wss:// relays
  double poll_s = 2;    // map polls while waiting, and the longest gap between heartbeats
  // The budget of the rows kept to reveal (docs/PROTOCOL.md, "Row commitments"): one store for
  // the node's life, so a stage restarted with new neighbours still reveals earlier sessions.
  ring::RowStoreOptions reveal;
  // Stand by (docs/MARKET.md, "Standbys"): take a standby claim for the held window that most
  // needs one (none yet, then the fewest), run its stage as a hot standby, and serve the window
  // when a predecessor adopts it (the market then promotes the claim).
  bool standby = false;
  // The stages' StageOptions::link_timeout_ms and repair_timeout_ms.
  int link_timeout_ms = 10000;
  int repair_timeout_ms = 30000;
  // Test builds only: the stage's StageOptions::test_fault_noise.
  double test_fault_noise = 0;
  // Last changes to each stage's options before it starts (tests: timeouts, names).
  std::function<void(ring::StageOptions*)> configure_stage;
};

// What the node is doing, for logs and tests.
struct JoinState {
  int64_t claim = 0;  // 0: none
  std::string model;
  int ring = -1, window = -1, first = 0, last = 0;
  int64_t serving_epoch = -1;
  bool standby = false;  // the claim is a standby (not yet promoted)
  uint64_t stages_started = 0;  // times a stage was (re)started with new neighbours
  uint64_t receipts_submitted = 0, receipts_refused = 0;
  uint64_t maps_read = 0;  // maps read while looking for a window
  std::string waiting;     // while it holds no claim: what it waits for, as logged
};

class Joiner {
 public:
  // Checks the options and binds the listen address (kept for the node's whole life, so a stage
  // restarted with new neighbours is reached at the same port).
  static Result<std::unique_ptr<Joiner>> Create(JoinOptions options);
  ~Joiner();

  // Works until Stop(): claims, serves, claims again when a claim is lost. Returns an error only
  // when it cannot go on (a bad market URL, a node key the market refuses).
  Status Run();
  // Asks Run() to release its claim and return. Thread-safe, idempotent.
  void Stop();
  uint16_t port() const;
  JoinState state() const;

  struct Impl;

 private:
  explicit Joiner(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvasir::market
