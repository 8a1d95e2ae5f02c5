// A stage's place in the ring as two role objects, so the runtime calls a role instead of asking
// whether it is the head or the last stage. The entry role is where its rows come from: the head
// (HeadRole, head_role.h) takes clients and feeds token ids; every other stage (MemberEntry) takes
// hidden rows from its predecessor. The exit role is where they go: the last stage (TailRole,
// tail_role.h) draws tokens from the logits; every other stage (MemberExit) sends hidden rows on.
// A one-stage ring is a HeadRole and a TailRole. Roles act on the stage's sessions and links
// through its StageImpl, which owns them and outlives them. Compute thread only, except the
// constant answers (hello_flag, accepts_clients, client_max_payload, part), read at creation.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "ring/byte_budget.h"
#include "ring/messages.h"
#include "ring/prompt_cache.h"
#include "ring/row_commit.h"
#include "ring/scheduler.h"
#include "ring/tail_sampler.h"

namespace kvasir::ring {

class StageImpl;
struct Session;

// Where a stage's rows come from: the head, or a ring member after it.
class EntryRole {
 public:
  virtual ~EntryRole() = default;

  // HELLO's flag for this end of the window (kHelloHasEmbed on the head), and the window's end
  // in the log ("embeddings" on the head, else empty).
  virtual uint32_t hello_flag() const = 0;
  virtual std::string_view part() const = 0;
  // Whether clients may connect, and the largest frame one may send (docs/PROTOCOL.md, "Limits").
  virtual bool accepts_clients() const = 0;
  virtual uint32_t client_max_payload() const = 0;

  // A message from client `client` (`charge`: its bytes, held while it waits). Clients reach the
  // head only (PredecessorSide refuses them elsewhere).
  virtual void OnClientMessage(uint64_t /*client*/, Message& /*m*/, ByteCharge /*charge*/) {}
  virtual void OnClientGone(uint64_t /*client*/) {}
  // A message from the predecessor.
  virtual void OnPredMessage(Message& m) = 0;
  // The successor link came up.
  virtual void OnSuccUp() {}
  // Every session was dropped or held for `why`; `forward`: the stages toward the head are told.
  virtual void OnRingDown(const std::string& why, bool forward) = 0;
  // The ring broke: whether session `s` is held until it is repaired (false: it is dropped).
  virtual bool Holds(Session& /*s*/) { return true; }
  // Ends session `session`, which this stage cannot carry on, for `why`: the head tells its
  // client and sends CLOSE around; a member frees it and sends ERROR (`code`) on.
  virtual void FailSession(uint32_t session, wire::ErrorCode code, const std::string& why) = 0;
  // Session `s` is dropped with every other for `why` (StageImpl::FailAll).
  virtual void OnDropped(const Session& /*s*/, const std::string& /*why*/) {}
  // Held session `s` ends for `why` before it was replayed (its window's sequence is freed).
  virtual void OnHeldEnded(const Session& /*s*/, const std::string& /*why*/) {}
  // Once per turn of the compute loop, after the events.
  virtual void OnTurn() {}
  // How long the compute loop may sleep with nothing to do.
  virtual std::chrono::milliseconds IdleWait() const { return std::chrono::milliseconds(100); }
  // A token the last stage of this process drew (TailRole): taken by the head on a one-stage
  // ring, else sent on.
  virtual void TakeToken(const TokenMsg& t) = 0;

  // Row i of `w`'s input, as the session's receipt line commits to it (stage_rows.cpp).
  virtual RowSide InputRow(const Work& w, int i) const = 0;
  // An ending session `s` kept by the prompt cache as `e`: what only the head keeps (its ids).
  virtual void OnKept(Session& /*s*/, PromptCache::Entry& /*e*/) {}
};

// Where a stage's rows go: to the last stage's samplers, or on to the successor.
class ExitRole {
 public:
  virtual ~ExitRole() = default;

  // HELLO's flag for this end of the window (kHelloHasHead on the last stage), and its end in
  // the log ("head" on the last stage, else empty).
  virtual uint32_t hello_flag() const = 0;
  virtual std::string_view part() const = 0;

  // The sampler of a session opening with `prompt` (TailSampler::Create's checks): null where
  // this stage draws nothing.
  virtual Result<std::unique_ptr<TailSampler>> NewSampler(const wire::SamplingWire& sampling,
                                                          std::vector<int32_t> prompt,
                                                          const SamplingExtra& extra) = 0;
  // An OPEN_SESSION's check before a ring member opens it: the session's sampler on the last
  // stage (a replay's resumed after the tokens drawn before), null elsewhere; or why it cannot
  // open.
  virtual Result<std::unique_ptr<TailSampler>> CheckOpen(const OpenSessionMsg& o) = 0;
  // Sends `batch`'s outputs on, `batch` having run: tokens, or hidden rows.
  virtual void EmitOutputs(std::span<const Work> batch, const ForwardOutput& out) = 0;

  // Replay (stage_replay.cpp): at most how many of `n` replayed positions of `s` this stage may
  // keep rather than run again.
  virtual int ReplayKeepLimit(const Session& s, int n) const = 0;
  // Replay: `w` holds the input rows of `h`'s positions [h.pos0, upto), which `s` kept from before
  // it; commits to them and passes them on as run before. False when the session failed.
  virtual bool PassKept(Session& s, const HiddenMsg& h, const Work& w, uint32_t upto) = 0;
};

// The entry of every stage but the head: hidden rows from the predecessor, and every message
// that concerns its window handled and passed on (stage_compute.cpp).
class MemberEntry final : public EntryRole {
 public:
  explicit MemberEntry(StageImpl& stage) : st_(stage) {}

  uint32_t hello_flag() const override { return 0; }
  std::string_view part() const override { return ""; }
  bool accepts_clients() const override { return false; }
  uint32_t client_max_payload() const override;
  void OnPredMessage(Message& m) override;
  void OnRingDown(const std::string& why, bool forward) override;
  void FailSession(uint32_t session, wire::ErrorCode code, const std::string& why) override;
  void TakeToken(const TokenMsg& t) override;
  RowSide InputRow(const Work& w, int i) const override;

 private:
  // Signs a receipt on its way to the head and forwards it (docs/PROTOCOL.md, "RECEIPT").
  void SignReceipt(ReceiptMsg& m);

  StageImpl& st_;
};

// The exit of every stage but the last: hidden rows sent on in the boundary dtype.
class MemberExit final : public ExitRole {
 public:
  explicit MemberExit(StageImpl& stage) : st_(stage) {}

  uint32_t hello_flag() const override { return 0; }
  std::string_view part() const override { return ""; }
  Result<std::unique_ptr<TailSampler>> NewSampler(const wire::SamplingWire& sampling,
                                                  std::vector<int32_t> prompt,
                                                  const SamplingExtra& extra) override;
  Result<std::unique_ptr<TailSampler>> CheckOpen(const OpenSessionMsg& o) override;
  void EmitOutputs(std::span<const Work> batch, const ForwardOutput& out) override;
  int ReplayKeepLimit(const Session& s, int n) const override;
  bool PassKept(Session& s, const HiddenMsg& h, const Work& w, uint32_t upto) override;

 private:
  StageImpl& st_;
};

// The roles of a stage whose window has the embeddings (`has_embed`) and the output head
// (`has_head`): the only place that chooses them.
std::unique_ptr<EntryRole> MakeEntryRole(StageImpl& stage, bool has_embed);
std::unique_ptr<ExitRole> MakeExitRole(StageImpl& stage, bool has_head);

}  // namespace kvasir::ring
