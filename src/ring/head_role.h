// The head's part of the stage runtime (docs/PROTOCOL.md): what only the stage holding the
// embeddings does. It serves clients (GENERATE, CLOSE_SESSION, STATS, PING), opens their sessions
// (the prompt's checks and encoding, the prompt cache's choice, prompt chunks), probes the ring
// until it is closed, and takes what comes back around: tokens (stop strings, what the client
// sees), the CLOSE of its sessions, errors (a stage that could not fork a kept session: opened
// afresh), the probe, statistics and receipts. It acts on the stage's sessions and links through
// its StageImpl; a stage that is not the head has none. Compute thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>

#include "ring/byte_budget.h"
#include "ring/messages.h"
#include "ring/scheduler.h"

namespace kvasir::ring {

class StageImpl;

// A client's GENERATE that waits for the ring to close, with the bytes it holds.
struct WaitingGenerate {
  uint64_t client = 0;
  GenerateMsg request;
  ByteCharge charge;
};

class HeadRole {
 public:
  // `stage` outlives the role (it owns it).
  explicit HeadRole(StageImpl& stage);

  // A message from client `client` (`charge`: its bytes, held while it waits).
  void OnClientMessage(uint64_t client, Message& m, ByteCharge charge);
  // A message from the predecessor: something this head sent, back around the ring.
  void OnReturned(Message& m);
  void OnClientGone(uint64_t client);
  // The successor link came up: the ring must be probed again before sessions start.
  void OnSuccUp();
  // Every session was dropped for `why`: clients waiting for statistics are told.
  void OnRingDown(const std::string& why);
  // Sends the probe around (at most every 300 ms, 50 ms while sessions are held for a repair)
  // while the ring is not known to be closed.
  void MaybeProbe();
  bool ring_closed() const { return ring_closed_; }

  // A token the last stage sampled (from the predecessor, or this stage on a one-stage ring).
  void HandleToken(const TokenMsg& t);

 private:
  void HandleGenerate(uint64_t client, GenerateMsg& g, ByteCharge charge);
  void StartSession(uint64_t client, GenerateMsg& g, bool use_cache = true);
  void HandleError(const ErrorMsg& e);
  // A forked session that a stage could not fork is opened afresh; true when it was.
  bool RetryWithoutCache(uint32_t session);
  // The chunk a TOKEN tells the head to feed: the token, then its drafts (a verify chunk).
  static Work VerifyChunk(uint32_t session, const TokenMsg& t);

  StageImpl& st_;
  std::deque<WaitingGenerate> waiting_generates_;
  std::deque<uint64_t> stats_waiters_;  // clients whose STATS went around, in order
  uint32_t next_session_ = 1;
  uint64_t probe_nonce_ = 0;
  std::chrono::steady_clock::time_point last_probe_{};
  bool ring_closed_ = false;
};

}  // namespace kvasir::ring
