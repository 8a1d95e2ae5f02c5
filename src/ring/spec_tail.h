// Speculation at the last stage (docs/PROTOCOL.md, "Speculation"): the stage that samples also
// drafts. After a session's token is decided it guesses up to K more (prompt lookup, a draft
// model loaded by this stage only, or the model's own nextn block in this stage's window), which
// travel to the head with the token; the head feeds the token and the drafts as one verify chunk,
// every stage runs it with rollback checkpoints, and here the chunk's K + 1 logits rows decide the
// tokens: the longest prefix of the drafts the session's sampler agrees with, then the sampler's
// own next token. K follows the acceptance measured in each session (spec::DraftBudget). Compute
// thread only, except the statistics.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/layer_window.h"
#include "ring/batch_drafter.h"
#include "ring/messages.h"
#include "ring/stage.h"
#include "ring/tail_sampler.h"
#include "spec/draft_budget.h"
#include "spec/drafter.h"

namespace kvasir::ring {

// Verify windows of one session a last stage may keep in flight at once (--draft-windows).
inline constexpr int kMaxDraftWindows = 4;

// A session's drafting at the last stage.
struct SessionDraft {
  SessionDraft() = default;
  SessionDraft(const SessionDraft&) = delete;
  SessionDraft& operator=(const SessionDraft&) = delete;
  ~SessionDraft() {
    if (model) model->Close(seq);
  }
  std::unique_ptr<spec::Drafter> drafter;  // prompt lookup, or mtp on the stage's window
  std::shared_ptr<BatchDrafter> model;     // or the stage's draft model, on sequence `seq`
  int seq = 0;
  spec::DraftBudget budget{0};
  std::vector<int32_t> pending;  // the drafts sent with the last token
  int pending_pos = -1;          // the position of that token (the verify chunk's pos0)
  int kept_rows = 0;  // rows of the last verify chunk that stay: its token and accepted drafts
  // Drafted ahead while the verify chunk travels (a draft model only): the history the session
  // will have if every pending draft and the drafter's own next token are accepted, and the
  // drafts that follow it.
  bool looked_ahead = false;
  bool warmed = false;  // the draft model has run the prompt (in idle time, before the first token)
  std::vector<int32_t> expect;
  std::vector<int32_t> ahead;
  // Overlap (--draft-windows > 1): verify windows sent behind the pending one, each on the guess
  // that every window before it is accepted whole and followed by its first token.
  struct Window {
    int pos0 = 0;
    std::vector<int32_t> rows;  // the guessed token, then its drafts
  };
  std::deque<Window> further;  // in flight behind `pending`, in order
  std::deque<Window> stale;  // in flight, but a guess before them failed: their rows decide nothing
};

class SpecTail {
 public:
  // The drafting `options` ask for next to `target` (the last stage's window); null when they
  // ask for none. A draft model is loaded here, with target's context, one sequence per session.
  // mtp (and auto without a draft model, when target has a nextn block) drafts on target's own
  // nextn block, on each session's sequence; target must outlive this. K is at most
  // options.max_tokens, the window's rollback span less one, and wire::kMaxDraftTokens. Errors:
  // the draft model does not load or has another vocabulary; mtp on a window without the block.
  static Result<std::unique_ptr<SpecTail>> Create(const spec::DraftOptions& options,
                                                  LayerWindow& target);

  // A new session's drafting state; null when it cannot draft (a grammar constrains it).
  std::unique_ptr<SessionDraft> NewSession(uint32_t session, bool has_grammar);

  // The tokens one verify chunk decides: `logits` [pos0 rows n_tokens, n_vocab] of the rows
  // [token at pos0, the pending drafts], in order. Each accepted draft, then the sampler's own
  // token (a replacement for the first rejected draft, or the one after all of them), unless a
  // decided token ends the session first. All but the last carry `more`, and the last too when
  // it confirms the guess of the window in flight behind (d.further: that window becomes the
  // pending one; on any other outcome the windows behind become stale). A stale window's chunk
  // decides nothing: no tokens. Errors: the chunk is neither the one drafted nor a stale one
  // (its position or length), or the sampler fails.
  Result<std::vector<TokenMsg>> Verify(uint32_t session, TailSampler& sampler, SessionDraft& d,
                                       int pos0, int n_tokens, std::span<const float> logits,
                                       int n_vocab, int n_ctx,
                                       const std::function<bool(int32_t)>& is_eog);

  // With overlap: after the tokens a verify chunk decided were sent with their drafts (or the
  // chunk confirmed the guess of the window behind it), drafts the windows that follow the last
  // in flight, while fewer than options.windows are in flight, the session's acceptance is at
  // least options.overlap_min_acceptance, and their rows fit what every stage can roll back
  // (the last stage's window's max_checkpoints, as every stage's). Each is guessed from the history
  // as if every draft in flight were accepted and the drafter's own next token followed; it goes to
  // the head as a TOKEN with `ahead` (appended to *out). mtp, which drafts only from verified
  // hidden rows, makes none.
  void DraftFurther(uint32_t session, TailSampler& sampler, SessionDraft& d,
                    const wire::SamplingWire& sampling, int n_ctx, std::vector<TokenMsg>* out);
  // The same for several sessions at once: their draft model passes run batched (BatchDrafter),
  // one window more per session and batch.
  struct FurtherJob {
    uint32_t session;
    TailSampler* sampler;
    SessionDraft* d;
    const wire::SamplingWire* sampling;
    std::vector<TokenMsg>* out;
  };
  void DraftFurtherAll(std::span<const FurtherJob> jobs, int n_ctx);

  // Drafts after `last`, a decided token that does not end its session, into last->drafts (none
  // when the budget pauses, the context or max_tokens leaves no room, or the drafter has no
  // guess). A drafter that fails is logged and drafts nothing.
  void Draft(TailSampler& sampler, SessionDraft& d, const wire::SamplingWire& sampling, int n_ctx,
             TokenMsg* last);
  // The same for several sessions at once (the tokens of one forward batch): their draft model
  // passes run batched (BatchDrafter).
  struct DraftJob {
    TailSampler* sampler;
    SessionDraft* d;
    const wire::SamplingWire* sampling;
    TokenMsg* last;
  };
  void DraftAll(std::span<const DraftJob> jobs, int n_ctx);

  // Drafting ahead (a draft model's drafts cost a forward pass each, which would otherwise wait
  // on the verify chunk's way back): while a session's drafts travel, guess that all of them and
  // the drafter's own next token will be accepted and draft what follows. Draft() then takes those
  // drafts when the guess came true: the drafts are exactly those it would make, only earlier.
  // The draft model's prefill of the prompt runs the same way, while the prompt's chunks are on
  // their way to this stage.
  bool LookAheadDue(const SessionDraft& d) const {
    return d.model != nullptr && (!d.warmed || (!d.pending.empty() && !d.looked_ahead));
  }
  void LookAhead(TailSampler& sampler, SessionDraft& d);

  // The drafters read the stage's hidden rows (mtp): the stage asks Forward for them
  // (ForwardInput::want_hidden) and hands over the rows it keeps with ObserveHidden.
  bool wants_hidden() const { return options_.kind == spec::DraftKind::kMtp; }
  // Rows [n, n_embd] of the session's positions pos0 .. pos0 + n - 1, once decided: every row of
  // a prompt chunk or a plain decode row, and the first d.kept_rows of a verify chunk (after
  // Verify). Rejected rows are never given, so none reach the drafter.
  void ObserveHidden(SessionDraft& d, int pos0, std::span<const float> rows);

  DraftTotals counts() const;
  int max_tokens() const { return max_tokens_; }

 private:
  SpecTail(const spec::DraftOptions& options, int max_tokens, std::shared_ptr<BatchDrafter> model,
           LayerWindow* target);
  // Up to k drafts after `history` from d's drafter alone.
  Result<std::vector<int32_t>> ProposeOne(SessionDraft& d, std::span<const int32_t> history, int k);

  spec::DraftOptions options_;
  int max_tokens_;
  std::shared_ptr<BatchDrafter> model_;  // kModel only
  LayerWindow* target_;                  // kMtp: the window whose nextn block drafts
  std::string name_;
  std::atomic<uint64_t> steps_{0}, drafted_{0}, accepted_{0}, guessed_{0}, confirmed_{0};
};

}  // namespace kvasir::ring
