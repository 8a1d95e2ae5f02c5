// The last stage's part of the stage runtime: what only the stage holding the output head does.
// It makes each session's sampler from the request (refusing what it could not sample with), and
// turns the logits of the rows that sample into tokens: each drawn by its session's sampler,
// committed to the session's rows, and sent on (or, on a one-stage ring, handed to the head's
// role). It is the last stage's exit role (stage_roles.h); other stages have a MemberExit, which
// sends hidden rows on instead. It acts on the stage's sessions and links through its StageImpl.
// Compute thread only.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "ring/messages.h"
#include "ring/scheduler.h"
#include "ring/stage_roles.h"
#include "ring/tail_sampler.h"
#include "ring/vocab_trie.h"

namespace kvasir::ring {

class StageImpl;

class TailRole final : public ExitRole {
 public:
  // `stage` outlives the role (it owns it).
  explicit TailRole(StageImpl& stage);

  uint32_t hello_flag() const override { return wire::kHelloHasHead; }
  std::string_view part() const override { return "head"; }

  // The sampler of a session opening with `prompt`, as TailSampler::Create checks it.
  Result<std::unique_ptr<TailSampler>> NewSampler(const wire::SamplingWire& sampling,
                                                  std::vector<int32_t> prompt,
                                                  const SamplingExtra& extra) override;
  // NewSampler's; a replay's resumed after the tokens sampled before.
  Result<std::unique_ptr<TailSampler>> CheckOpen(const OpenSessionMsg& o) override;

  // The outputs of `batch`, which ran: a token for each item that samples, from its row of
  // `out.logits` ([items that sample, n_vocab], in batch order); the other rows are committed.
  // When the drafting reads hidden rows (mtp), out.hidden holds every row and the kept ones go
  // to the session's drafter.
  void EmitOutputs(std::span<const Work> batch, const ForwardOutput& out) override;

  // n - 1: the last position's logits draw the next token.
  int ReplayKeepLimit(const Session& s, int n) const override;
  // Refuses a kept range whose last row would draw a token; commits the rest (no rows go on).
  bool PassKept(Session& s, const HiddenMsg& h, const Work& w, uint32_t upto) override;

 private:
  // Hands `w`'s first n_rows rows of out.hidden (w's rows start at row `first`) to its session's
  // drafter, when it reads them.
  void ObserveHidden(const Work& w, const ForwardOutput& out, size_t first, int n_rows);

  StageImpl& st_;
  VocabTrie vocab_trie_;  // for grammars: built by the first session that needs it
  // EmitOutputs: the tokens each item of the batch decided, before they are drafted after and sent.
  std::vector<std::pair<const Work*, std::vector<TokenMsg>>> decided_;
};

}  // namespace kvasir::ring
