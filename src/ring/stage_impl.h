// Private to the stage runtime: the StageImpl class shared by stage.cpp (creation, stop,
// statistics), stage_links.cpp (what its two link parts need, sending), stage_compute.cpp (the
// compute loop, a ring member's sessions), stage_cache.cpp, stage_rows.cpp, stage_repair.cpp and
// stage_replay.cpp; and by its two roles (stage_roles.h), which it calls instead of asking where
// it is in the ring: an entry role, HeadRole (head_role.h) on the head or MemberEntry elsewhere,
// and an exit role, TailRole (tail_role.h) on the last stage or MemberExit elsewhere. Its links are
// two parts that tell it events: PredecessorSide (predecessor_side.h: the predecessor and clients)
// and SuccessorLink (successor_link.h). Receipts are kept by a ReceiptBook (receipt_book.h): the
// head's role starts and checks them, a member's signs them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "model/model_id.h"
#include "net/stream.h"
#include "ring/byte_budget.h"
#include "ring/front_end.h"
#include "ring/link.h"
#include "ring/link_set.h"
#include "ring/messages.h"
#include "ring/predecessor_side.h"
#include "ring/prompt_cache.h"
#include "ring/receipt_book.h"
#include "ring/repair.h"
#include "ring/replay_rows.h"
#include "ring/row_store.h"
#include "ring/scheduler.h"
#include "ring/spec_tail.h"
#include "ring/stage.h"
#include "ring/stage_roles.h"
#include "ring/successor_link.h"
#include "ring/tail_sampler.h"
#include "ring/verify_rows.h"
#include "tokenizer/tokenizer.h"

namespace kvasir::ring {

using Clock = std::chrono::steady_clock;

// Something for the compute loop to handle.
struct Event {
  enum class Kind { kMessage, kPredDown, kSuccUp, kSuccDown, kClientGone, kWake };
  Kind kind = Kind::kWake;
  bool from_pred = false;  // kMessage: from the predecessor link (else from a client)
  uint64_t client = 0;     // kMessage/kClientGone: client connection id
  std::optional<Message> msg;
  std::string reason;
  ByteCharge charge;  // a client's message: its bytes, held until the event is handled
};

struct Session {
  uint32_t id = 0;
  wire::SamplingWire sampling{};
  int n_prompt = 0;
  int n_generated = 0;  // head: tokens sent to the client
  // Token rows this window ran for the session (for its receipt). The head runs nothing once it
  // has sent CLOSE_SESSION, and every other stage runs the rows it was sent before the CLOSE
  // before it closes, so every stage runs exactly the head's rows.
  uint64_t rows = 0;
  // Those rows, in and out, for the receipt line's commitment (stage_rows.cpp).
  SessionRows commit;
  std::unique_ptr<TailSampler> tail;  // on the last stage
  // Speculation (stage_spec.cpp): the last verify chunk this stage ran for the session, and on a
  // last stage that drafts, the session's drafting.
  VerifySpan verify;
  std::unique_ptr<SessionDraft> draft;
  // Head only (every session of a head is one it opened, HeadRole::StartSession):
  bool closing = false;  // CLOSE sent around, waiting for it to come back
  uint64_t client = 0;
  StopMatcher stops;
  bool report_cached = false;  // the client asked for the cached count with the first token
  std::optional<std::array<uint8_t, 16>> client_receipt;  // the client will vouch for its count
  // Prompt cache.
  bool keep = false;                   // kept when it ends (every stage)
  uint32_t n_cached = 0;               // prompt positions taken over from a kept session
  std::vector<int32_t> history;        // head: the ids of its positions (prompt, then tokens fed)
  std::unique_ptr<GenerateMsg> retry;  // head, forked: the request, to open afresh on a miss
  // Repair (stage_repair.cpp), head only: the request's extra sampling, sent again by a replay;
  // and when the session was replayed, since when its client has waited for a token.
  SamplingExtra extra;
  std::optional<Clock::time_point> paused_since;
  // Head: the replay's OPEN_SESSION is on its way around; every TOKEN before it comes back was
  // drawn before the replay.
  bool replay_out = false;
  // A replay that kept this stage's state (stage_replay.cpp): positions below this are not run
  // again; their rows are sent on from the kept ones.
  uint32_t replay_skip = 0;
};

// A row of a session's receipt line (stage_rows.cpp): a token id, or [n_embd] f32 values.
RowSide TokenRowSide(int32_t id);
RowSide F32RowSide(std::span<const float> row);

// The options of a link to a neighbour (stage_links.cpp), accepting frames up to `max_payload`.
LinkOptions StageLinkOptions(const StageOptions& o, uint32_t max_payload);

class StageImpl final : public Stage {
 public:
  StageImpl(StageOptions options, std::shared_ptr<const GgufFile> file,
            std::unique_ptr<LayerWindow> window, std::unique_ptr<Tokenizer> tokenizer,
            ModelId model_id, net::Listener listener);
  ~StageImpl() override;

  uint16_t port() const override { return pred_side_->port(); }
  Status Run() override;
  void Stop() override;
  void LogStats() override;
  DraftTotals draft_totals() const override { return spec_ ? spec_->counts() : DraftTotals{}; }
  void SetStandbys(std::vector<StandbyPeer> next, std::vector<StandbyPeer> pred) override;
  void StopCheckEdge() override { pred_side_->StopCheckEdge(); }
  // Drafting on the last stage (--draft), set once before Run().
  void AttachDrafting(std::unique_ptr<SpecTail> spec) { spec_ = std::move(spec); }
  bool linked() const override {
    std::lock_guard<std::mutex> lock(links_mu_);
    return pred_side_->pred_up() && succ_link_->up();
  }

 private:
  friend class HeadRole;
  friend class TailRole;
  friend class MemberEntry;
  friend class MemberExit;

  // stage.cpp: creation, stop, statistics, the event queue.
  wire::Hello MyHello() const;
  Status CheckStageHello(const wire::Hello& h, bool peer_is_pred) const;
  void Push(Event e);
  wire::StageStats StatsRecord() const;
  // Appends this stage's record to `m`, and its drafts' counts when it drafts or `m` has some.
  void AddStatsRecord(StatsMsg& m) const;
  // stage_replay.cpp: this stage's repair counts, and appending them to `m` when any is nonzero
  // or `m` has some (zeros for the stages before).
  wire::RepairStatsWire RepairRecord() const;
  void AddRepairRecord(StatsMsg& m) const;

  // stage_links.cpp: what the link parts need of this stage, sending.
  // The successor link's dial, proofs, HELLO and events.
  SuccessorLinkOptions SuccessorOptions();
  // The predecessor side's limits, proofs, HELLO checks and events.
  PredecessorSideOptions PredecessorOptions();
  // Registers a successor link so Stop() can close it (weakly: a link that ends is freed at once).
  bool TrackLink(const std::shared_ptr<Link>& link);
  // Sends to the successor. A message the protocol cannot carry fails its session instead.
  bool SendNext(const Message& m);

  // stage_compute.cpp: the compute loop, and a stage's part as a ring member (not the head).
  void HandleEvent(Event& e);
  void HandleMessage(Event& e);
  void HandleOpen(OpenSessionMsg& o);
  void HandleHidden(HiddenMsg& h);
  void HandleClose(const CloseMsg& c);
  void HandleError(const ErrorMsg& e);
  // Drops every session for `why`; `forward`: an ERROR for session 0 goes on (not the head).
  void FailAll(const std::string& why, bool forward);
  void SendToClient(uint64_t client, const Message& m);
  // Ends a session this stage cannot carry on, as its entry role does (EntryRole::FailSession).
  void FailSession(uint32_t session, wire::ErrorCode code, const std::string& why);
  bool RunBatch();
  // Runs `batch` (one forward pass, or item by item when refused) and sends its outputs on.
  void RunWork(std::span<const Work> batch);
  // --trace-timing: one `event` line per item of a batch (base/timing_trace.h).
  void TraceWork(std::span<const Work> items, std::string_view event) const;

  // stage_cache.cpp: the prompt cache.
  // Opens a sequence, first freeing kept sessions when the window has no room for another.
  Status OpenSequence(uint32_t session);
  // Takes kept session `from` over as `to` with its first `n_keep` positions; false (and nothing
  // kept of it) when it is not kept here or cannot be cut there.
  bool ForkSequence(uint32_t from, uint32_t to, int n_keep);
  // Keeps an ending session's state for later ones (when it asked and ended normally), or frees it.
  void KeepOrClose(Session& s, wire::FinishReason reason);
  void ExpireCache();
  // stage_spec.cpp: speculation.
  // Before queueing a chunk of session `s` that starts at `pos0`: drops the rejected rows of its
  // last verify chunk (KeepBeforeChunk). An error names why the chunk cannot run.
  Status RollBackBefore(Session& s, int pos0);
  // RollBackBefore for each item of `batch`, as it is about to run: true when every item may run;
  // otherwise the sessions refused are failed and *kept holds the items that may.
  bool RollBackBeforeRows(std::span<const Work> batch, std::vector<Work>* kept);
  // Drafting ahead while idle (SpecTail::LookAhead): whether a session waits for it, and doing
  // it for one session (false when none waits).
  bool LookAheadDue() const;
  bool LookAhead();
  // After `w` ran: remembers whether it was a verify chunk.
  void NoteRan(const Work& w);
  // A session that ends right after a verify chunk keeps only that chunk's first row, which every
  // stage knows was decided (the others may have been rejected), before the prompt cache keeps it.
  void DropUnverifiedRows(Session& s);
  // stage_repair.cpp: holding sessions while the ring is broken, and replaying them.
  // A link of the ring went down (`forward`: tell the stages downstream, toward the head):
  // holds every session for the repair timeout, or without one fails them all (FailAll).
  void RingBroken(const std::string& why, bool forward);
  // Ends the held sessions whose repair timeout passed (the head tells their clients).
  void ExpireHolds();
  // Ends the session held longest, to give its sequence to a new session; false when none is.
  bool EndOldestHeld();
  // Ends held session `id` (already released from the hold book) with `why`.
  void EndHeld(uint32_t id, const std::string& why);
  // Not the head: a replay that cannot keep what this stage holds (ResumeReplay) starts the
  // session again from position 0.
  void ResetForReplay(uint32_t session);
  // stage_replay.cpp: a replay computes only what a stage lacks.
  // Keeps `s`'s state for a replay of `n` positions: how many of them this stage need not run
  // again (its state truncated to that many); 0: it starts the session again from position 0.
  int KeepForReplay(Session& s, int n);
  // Not the head: a replay's OPEN_SESSION for a session this stage holds; true when it kept its
  // state (and sent the OPEN on), false when the session opens afresh as a new one.
  bool ResumeReplay(OpenSessionMsg& o);
  // Not the head: the part of `h` below the session's replay_skip is not run again (its kept
  // rows go on instead); false when nothing of `h` is left to run (or the session failed).
  bool SkipReplayed(Session& s, HiddenMsg& h);
  // A standby that a predecessor adopted starts dialing its successor (compute thread).
  void MaybeStartDialing();
  // The compute loop's previous turn began at `last_turn`: a process stopped for longer than the
  // link timeout stops dialing the standby peers (compute thread).
  void CheckStalled(Clock::time_point last_turn);

  // stage_rows.cpp: row commitments.
  // A new session's commitment, keeping its rows when the store keeps rows.
  SessionRows NewCommit() const { return SessionRows(row_store_); }
  // Adds the positions of `w`, which ran, to its session's commitment: their inputs (w's tokens
  // on the head, else its rows: the entry role's InputRow) and outputs: `out`'s rows (the HIDDEN
  // sent on), else on the last stage the token `sampled` from the last row, else nothing.
  void CommitRows(const Work& w, const HiddenMsg* out, std::optional<int32_t> sampled);
  // A session that closed here: its row count and commitment wait for the receipt (not the
  // head), its rows go to the store.
  void KeepClosedRows(Session& s);

  StageOptions options_;
  std::shared_ptr<const GgufFile> file_;
  std::unique_ptr<LayerWindow> window_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ModelId model_id_;
  std::string succ_host_;
  uint16_t succ_port_ = 0;
  std::string succ_desc_;  // the successor in messages: `next`, or `next_via` when relayed

  std::atomic<bool> running_{true};
  std::mutex stop_mu_;
  std::thread dial_thread_;
  LinkSet succ_links_;  // the successor links Stop() closes
  LinkAuth stage_auth_;
  std::atomic<uint64_t> links_refused_{0};
  // What links may make this stage hold (docs/PROTOCOL.md, "Limits").
  uint32_t client_max_payload_ = 0;  // from the context and the vocabulary
  uint32_t stage_max_payload_ = 0;   // from the context and the width

  // The two link parts. The predecessor side is made at creation, never null after.
  std::unique_ptr<PredecessorSide> pred_side_;
  mutable std::mutex links_mu_;               // guards succ_link_, which MaybeStartDialing remakes
  std::unique_ptr<SuccessorLink> succ_link_;  // made at creation, never null after
  // The successor's addresses: `next`, then the standby peers; the dial thread tries them in
  // turn from succ_next_ (its own).
  std::vector<std::pair<std::string, uint16_t>> succ_addrs_;
  size_t succ_next_ = 0;
  // stage_standby.cpp: the successor's window's standbys the market lists (SetStandbys; the
  // predecessor's go to pred_side_), and the successor's dial over every address and standby.
  std::mutex standby_mu_;
  std::vector<StandbyPeer> next_standbys_;  // guarded by standby_mu_
  size_t n_pred_standbys_ = 0;              // guarded by standby_mu_, for the log
  bool AcceptsSuccessorStandby(const PublicKey& key);
  Result<std::unique_ptr<net::Stream>> DialSuccessor(const std::function<bool()>& cancelled);
  bool MayCallStandbys(const std::function<bool()>& cancelled);  // the successor's, or `next` only
  std::atomic<bool> succ_linked_once_{false};
  // Repair: this process's place in the ring (HELLO's generation) and the newest neighbours.
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> adopted_{false};  // a standby: a predecessor linked to it
  GenerationGate succ_gate_;          // the predecessor's is pred_side_'s

  // Event queue.
  std::mutex events_mu_;
  std::condition_variable events_cv_;
  std::deque<Event> events_;

  // Compute-thread state (no lock: only the compute loop touches it).
  std::map<uint32_t, Session> sessions_;
  BatchScheduler scheduler_;
  PromptCache cache_;
  bool recurrent_ = false;  // the model has layers with recurrent state: forks at exact ends only
  std::unique_ptr<EntryRole> entry_;     // never null: HeadRole on the head, else MemberEntry
  std::unique_ptr<ExitRole> exit_;       // never null: TailRole on the last stage, else MemberExit
  std::unique_ptr<SpecTail> spec_;       // on a last stage that drafts
  std::shared_ptr<RowStore> row_store_;  // never null
  ReceiptBook receipts_;                 // after row_store_, which it shares
  HoldBook holds_;                       // sessions held while the ring is broken
  std::string hold_reason_;              // the link that went down, for clients' errors

  // Statistics.
  std::atomic<uint64_t> rows_{0}, decode_rows_{0}, busy_ns_{0}, decode_busy_ns_{0};
  std::atomic<uint64_t> bytes_out_{0};                     // bytes in: pred_side_->pred_bytes_in()
  std::atomic<uint64_t> repairs_{0}, replayed_tokens_{0};  // head: sessions replayed, their ids
  ReplayRows replay_rows_;      // the rows sent on for live sessions, for a replay
  ReplayCounts replay_counts_;  // guarded by replay_mu_
  mutable std::mutex replay_mu_;
};

}  // namespace kvasir::ring
