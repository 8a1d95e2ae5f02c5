#include "spec/mtp_drafter.h"

#include <algorithm>

#include "base/check.h"
#include "model/sampler.h"

namespace kvasir::spec {

MtpDrafter::MtpDrafter(LayerWindow& window, int seq_id)
    : window_(window), seq_id_(seq_id), n_embd_(window.config().n_embd) {
  KV_CHECK(window_.has_nextn());
}

void MtpDrafter::ObserveHidden(int pos0, std::span<const float> rows) {
  const size_t e = static_cast<size_t>(n_embd_);
  KV_CHECK(rows.size() % e == 0 && pos0 >= 0);
  const int held_end = hidden_pos0_ + static_cast<int>(hidden_.size() / e);
  if (hidden_.empty() || pos0 < hidden_pos0_ || pos0 > held_end) {
    // A fresh run of rows (a new session, or a gap the block cannot bridge).
    hidden_.clear();
    hidden_pos0_ = pos0;
  } else {
    hidden_.resize(static_cast<size_t>(pos0 - hidden_pos0_) * e);  // replaces from pos0 on
  }
  hidden_.insert(hidden_.end(), rows.begin(), rows.end());
  // Rows the block built on positions now being replaced are no longer verified.
  committed_ = std::min(committed_, pos0);
}

Result<std::vector<int32_t>> MtpDrafter::Propose(std::span<const int32_t> history, int max_tokens) {
  std::vector<int32_t> drafts;
  const int n = static_cast<int>(history.size());
  const size_t e = static_cast<size_t>(n_embd_);
  if (window_.NextnLength(seq_id_) < 0 || n < 2) return drafts;
  // The sequence may have been reopened since (its block cache empty).
  committed_ = std::min(committed_, window_.NextnLength(seq_id_));
  // Chained drafts take the positions n - 1 onwards.
  max_tokens = std::min(max_tokens, window_.n_ctx() - (n - 1));
  if (max_tokens <= 0) return drafts;
  // The block's rows 0 .. n - 2 must stand on verified hidden rows. Rows from `keep` on are
  // (re)run now: at least row n - 2, whose logits give the first draft.
  const int keep = std::max(0, std::min(committed_, n - 2));
  const int held_end = hidden_pos0_ + static_cast<int>(hidden_.size() / e);
  if (keep < hidden_pos0_ || held_end < n - 1) {
    // Hidden rows missing (never given, or a gap): nothing to draft from.
    const int length = window_.NextnLength(seq_id_);
    if (length > committed_) KV_RETURN_IF_ERROR(window_.TruncateNextn(seq_id_, committed_));
    return drafts;
  }
  KV_RETURN_IF_ERROR(window_.TruncateNextn(seq_id_, keep));
  NextnOutput out;
  NextnInput in;
  in.seq_id = seq_id_;
  in.pos0 = keep;
  in.tokens = history.subspan(keep + 1, n - 1 - keep);
  in.hidden =
      std::span<const float>(hidden_).subspan((keep - hidden_pos0_) * e, in.tokens.size() * e);
  KV_RETURN_IF_ERROR(window_.ForwardNextn(in, &out).WithContext("mtp drafter"));
  rows_run_ += static_cast<int64_t>(in.tokens.size());
  committed_ = n - 1;
  // The block holds the rows before n - 1 now; the last one stays for a repeated call.
  hidden_.erase(hidden_.begin(), hidden_.begin() + (n - 2 - hidden_pos0_) * e);
  hidden_pos0_ = n - 2;
  drafts.push_back(ArgMax(out.logits));
  std::vector<float> chain;
  while (static_cast<int>(drafts.size()) < max_tokens) {
    chain.assign(out.hidden.end() - static_cast<std::ptrdiff_t>(e), out.hidden.end());
    NextnInput step;
    step.seq_id = seq_id_;
    step.pos0 = window_.NextnLength(seq_id_);
    step.tokens = std::span<const int32_t>(&drafts.back(), 1);
    step.hidden = chain;
    KV_RETURN_IF_ERROR(window_.ForwardNextn(step, &out).WithContext("mtp drafter"));
    ++rows_run_;
    drafts.push_back(ArgMax(out.logits));
  }
  return drafts;
}

}  // namespace kvasir::spec
