// The head's part of the stage runtime (docs/PROTOCOL.md): what only the stage holding the
// embeddings does. It serves clients (GENERATE, CLOSE_SESSION, STATS, PING), opens their sessions
// (the prompt's checks and encoding, the prompt cache's choice, prompt chunks), probes the ring
// until it is closed, and takes what comes back around: tokens (stop strings, what the client
// sees), the CLOSE of its sessions, errors (a stage that could not fork a kept session: opened
// afresh), the probe, statistics and receipts. It acts on the stage's sessions and links through
// its StageImpl; it is the head's entry role (stage_roles.h), where other stages have a
// MemberEntry. Compute thread only.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <string>

#include "ring/byte_budget.h"
#include "ring/messages.h"
#include "ring/scheduler.h"
#include "ring/stage_roles.h"

namespace kvasir::ring {

class StageImpl;

// A client's GENERATE that waits for the ring to close, with the bytes it holds.
struct WaitingGenerate {
  uint64_t client = 0;
  GenerateMsg request;
  ByteCharge charge;
};

class HeadRole final : public EntryRole {
 public:
  // `stage` outlives the role (it owns it).
  explicit HeadRole(StageImpl& stage);

  uint32_t hello_flag() const override { return wire::kHelloHasEmbed; }
  std::string_view part() const override { return "embeddings"; }
  bool accepts_clients() const override { return true; }
  // From the context and the vocabulary: the longest prompt a client may send.
  uint32_t client_max_payload() const override;

  void OnClientMessage(uint64_t client, Message& m, ByteCharge charge) override;
  // Something this head sent, back around the ring.
  void OnPredMessage(Message& m) override;
  void OnClientGone(uint64_t client) override;
  // The ring must be probed again before sessions start.
  void OnSuccUp() override;
  // Clients waiting for statistics are told (nothing goes on: the head is where news ends).
  void OnRingDown(const std::string& why, bool forward) override;
  // head_replay.cpp: a held session is not run (its rows would die at the break); one whose
  // CLOSE went out before the break is dropped.
  bool Holds(Session& s) override;
  // Ends the session (EndSession) with `why` as its client's error.
  void FailSession(uint32_t session, wire::ErrorCode code, const std::string& why) override;
  // head_replay.cpp: the client is told, unless its session was closing already.
  void OnDropped(const Session& s, const std::string& why) override;
  // head_replay.cpp: the client is told, and CLOSE goes around for the stages before the break.
  void OnHeldEnded(const Session& s, const std::string& why) override;
  // Sends the overdue receipts, and the probe around (at most every 300 ms, 50 ms while
  // sessions are held for a repair) while the ring is not known to be closed.
  void OnTurn() override;
  // Sleeps up to 1 s once the ring is closed and nothing is held, else 100 ms (to probe).
  std::chrono::milliseconds IdleWait() const override;
  // A token of a one-stage ring, which the head draws for itself.
  void TakeToken(const TokenMsg& t) override { HandleToken(t); }
  // The token id fed at that position.
  RowSide InputRow(const Work& w, int i) const override;
  // The session's ids, for a later prompt to find its longest prefix.
  void OnKept(Session& s, PromptCache::Entry& e) override;

 private:
  // Ends a session of this head: kept or freed, its client told `error` (if any), and its CLOSE
  // sent around with its receipt behind it (dropped when the CLOSE comes back).
  void EndSession(uint32_t session, wire::FinishReason reason, const std::string& error);
  // A token the last stage sampled (from the predecessor, or this stage on a one-stage ring).
  void HandleToken(const TokenMsg& t);
  void HandleGenerate(uint64_t client, GenerateMsg& g, ByteCharge charge);
  void StartSession(uint64_t client, GenerateMsg& g, bool use_cache = true);
  void HandleError(const ErrorMsg& e);
  // A forked session that a stage could not fork is opened afresh; true when it was.
  bool RetryWithoutCache(uint32_t session);

  // head_replay.cpp: repair (docs/PROTOCOL.md, "Repair").
  // Once the probe came around the repaired ring: replays every held session.
  void ReplayHeld();
  // Sends the kept rows [0, skip) of a replayed session of `n` positions on.
  bool SendKeptRows(uint32_t session, int skip, int n);
  // Whether a TOKEN for `s` is the one it waits for (not held, not from before a replay); the
  // first after a replay ends the client's pause.
  bool AcceptsToken(Session& s, const TokenMsg& t);
  // Whether TOKENs of `s` arriving now were drawn before its replay (it is held, or the
  // replay's OPEN_SESSION has not come back around): none of them is streamed or fed.
  bool DrawnBeforeReplay(const Session& s) const;
  // A replay's OPEN_SESSION of `session` came back around; the TOKENs behind it are the
  // replay's own.
  void ReplayCameBack(uint32_t session);

  // head_receipts.cpp: contribution receipts (docs/PROTOCOL.md, "RECEIPT").
  // Once the session's CLOSE went out: starts its receipt around the ring.
  void SendReceipt(Session& s);
  // The client's count for `session` came with its CLOSE; receipts whose client did not vouch
  // in time go without (docs/PROTOCOL.md, "Client counts").
  void ClientVouched(uint32_t session, uint64_t client, const wire::ClientCount& count);
  void SendReceiptsOverdue();
  // Checks a receipt that came back and hands it to StageOptions::on_receipt.
  void ReceiptCameBack(ReceiptMsg& m);
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
