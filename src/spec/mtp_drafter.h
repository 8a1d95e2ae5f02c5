// The model's own multi-token-prediction block as a drafter. Position i of the block's cache pairs
// the target's final hidden state at i with the token at i + 1 and predicts the token at i + 2, so
// with the history t_0 .. t_{n-1} (t_{n-1} not yet fed to the target) and the target's hidden rows
// up to n - 2, the block's row n - 2 predicts t_n, the first draft. Further drafts chain: the
// block's own output row stands in for the hidden state it has not seen, paired with the previous
// draft. The block's cache keeps the rows built on decided tokens and verified hidden rows; the
// chained rows are dropped (TruncateNextn) at the next call. Drafts are the block's argmax.
#pragma once

#include <vector>

#include "spec/drafter.h"

namespace kvasir::spec {

class MtpDrafter final : public Drafter {
 public:
  // Drafts on `window`'s nextn block (has_nextn()), for its sequence `seq_id`, which the decoder
  // opens and closes. `window` must outlive the drafter.
  MtpDrafter(LayerWindow& window, int seq_id);

  const char* name() const override { return "mtp"; }
  Result<std::vector<int32_t>> Propose(std::span<const int32_t> history, int max_tokens) override;
  bool wants_hidden() const override { return true; }
  void ObserveHidden(int pos0, std::span<const float> rows) override;

  // Rows the block has run (history rows and chained drafts), for tests and statistics.
  int64_t rows_run() const { return rows_run_; }

 private:
  LayerWindow& window_;
  int seq_id_;
  int n_embd_;
  // The block's cache rows [0, committed_) pair verified hidden rows with decided tokens.
  int committed_ = 0;
  // Verified hidden rows not yet fed, of positions [hidden_pos0_, hidden_pos0_ + n): the rows
  // given since the last Propose (plus the last row fed), so at most the session's length.
  int hidden_pos0_ = 0;
  std::vector<float> hidden_;  // [n, n_embd]
  int64_t rows_run_ = 0;
};

}  // namespace kvasir::spec
