// Token-by-token decoding of one sequence of a whole-model window, with speculation: each step
// feeds the last decided token plus up to K drafted ones as one batch of K + 1 rows, accepts the
// longest prefix of the drafts the sampler agrees with (Sampler::Verify: exact for greedy,
// speculative rejection sampling with temperature), adds the sampler's own next token, and rolls
// the window back past the rejected rows. Without a drafter it is plain decoding, one row a step,
// with the same RNG draws as Sampler::Sample in a loop.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/layer_window.h"
#include "model/sampler.h"
#include "spec/draft_budget.h"
#include "spec/drafter.h"

namespace kvasir::spec {

// Per-drafter counts of one session.
struct DraftStats {
  int64_t steps = 0;     // verify batches that carried drafts
  int64_t drafted = 0;   // tokens proposed
  int64_t accepted = 0;  // of them, accepted
  double acceptance() const { return drafted > 0 ? static_cast<double>(accepted) / drafted : 0; }
};

// The verdict on one verify batch: logits [k + 1, n_vocab] of the rows [last, drafts...], where
// row i predicts the token after drafts[0, i). Appends the decided tokens to *history (the accepted
// drafts, then the sampler's own next token) and returns how many drafts were accepted. This is
// the whole acceptance rule; the ring's tail runs the same on the rows it gets back.
int VerifyDrafts(Sampler& sampler, std::span<const float> logits, int n_vocab,
                 std::span<const int32_t> drafts, std::vector<int32_t>* history);

class Decoder {
 public:
  // Decodes sequence `seq_id` of `window` (embeddings and head, the sequence not open yet) with
  // `sampler`; `drafter` may be null (no speculation) and must outlive the decoder; at most
  // max_draft drafted tokens a step (and fewer than the window's max_checkpoints), fewer while the
  // measured acceptance is low (DraftBudget), unless adapt_k is false.
  Decoder(LayerWindow& window, int seq_id, Sampler& sampler, Drafter* drafter, int max_draft,
          bool adapt_k = true);
  ~Decoder();

  // Opens the sequence and prefills `prompt` (not empty) in one batch.
  Status Start(std::span<const int32_t> prompt);
  // Decides the next tokens: one or more, at most max(1, budget), appended to history(). Fails
  // (naming the sizes) when the context is full (context_full() says so first).
  Result<std::vector<int32_t>> Step(int budget);
  bool context_full() const;

  // The prompt and every token decided so far; the last one is not yet fed to the window.
  const std::vector<int32_t>& history() const { return history_; }
  const DraftStats& stats() const { return stats_; }

 private:
  LayerWindow& window_;
  int seq_id_;
  Sampler& sampler_;
  Drafter* drafter_;
  DraftBudget budget_;
  std::vector<int32_t> history_;
  ForwardOutput out_;
  bool prefilled_only_ = false;  // out_ holds the prompt's last logits, nothing sampled yet
  DraftStats stats_;

  bool wants_hidden() const { return drafter_ != nullptr && drafter_->wants_hidden(); }
};

}  // namespace kvasir::spec
