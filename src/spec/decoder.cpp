#include "spec/decoder.h"

#include <algorithm>

#include "base/check.h"

namespace kvasir::spec {

int VerifyDrafts(Sampler& sampler, std::span<const float> logits, int n_vocab,
                 std::span<const int32_t> drafts, std::vector<int32_t>* history) {
  const int k = static_cast<int>(drafts.size());
  KV_CHECK(logits.size() == static_cast<size_t>(k + 1) * n_vocab);
  auto row = [&](int i) { return logits.subspan(static_cast<size_t>(i) * n_vocab, n_vocab); };
  for (int i = 0; i < k; ++i) {
    const Sampler::Verdict v = sampler.Verify(row(i), *history, drafts[i]);
    history->push_back(v.token);
    if (!v.accepted) return i;
  }
  // Every draft taken: the last row gives one more token for free. Without drafts this is plain
  // sampling, with the same RNG draws.
  history->push_back(sampler.Sample(row(k), *history));
  return k;
}

Decoder::Decoder(LayerWindow& window, int seq_id, Sampler& sampler, Drafter* drafter, int max_draft,
                 bool adapt_k)
    : window_(window),
      seq_id_(seq_id),
      sampler_(sampler),
      drafter_(drafter),
      budget_(max_draft, adapt_k) {
  KV_CHECK(window_.spec().has_embed && window_.spec().has_head);
}

Decoder::~Decoder() { window_.CloseSequence(seq_id_); }

Status Decoder::Start(std::span<const int32_t> prompt) {
  if (prompt.empty()) return Error("the prompt is empty (no tokens)");
  KV_RETURN_IF_ERROR(window_.OpenSequence(seq_id_));
  ForwardInput in;
  in.chunks = {SeqChunk{seq_id_, 0, static_cast<int>(prompt.size())}};
  in.tokens = prompt;
  in.want_hidden = wants_hidden();
  KV_RETURN_IF_ERROR(window_.Forward(in, &out_).WithContext("prefill"));
  if (in.want_hidden) drafter_->ObserveHidden(0, out_.hidden);
  history_.assign(prompt.begin(), prompt.end());
  prefilled_only_ = true;
  return Status::Ok();
}

bool Decoder::context_full() const {
  return !prefilled_only_ && window_.SequenceLength(seq_id_) >= window_.n_ctx();
}

Result<std::vector<int32_t>> Decoder::Step(int budget) {
  const int n_vocab = window_.config().n_vocab;
  if (prefilled_only_) {
    prefilled_only_ = false;
    history_.push_back(sampler_.Sample(out_.logits, history_));
    return std::vector<int32_t>{history_.back()};
  }
  const int pos = window_.SequenceLength(seq_id_);
  if (pos >= window_.n_ctx()) {
    return Error("sequence {}: {} positions fill the context of {}", seq_id_, pos, window_.n_ctx());
  }
  // Drafts beyond what is wanted, or beyond the context, would be wasted rows.
  const int room = drafter_ == nullptr
                       ? 0
                       : std::min({budget_.Next(), budget - 1, window_.n_ctx() - pos - 1,
                                   window_.max_checkpoints() - 1});
  std::vector<int32_t> rows = {history_.back()};
  if (room > 0) {
    KV_ASSIGN_OR_RETURN(std::vector<int32_t> drafts, drafter_->Propose(history_, room));
    if (static_cast<int>(drafts.size()) > room) drafts.resize(room);
    rows.insert(rows.end(), drafts.begin(), drafts.end());
  }
  const int k = static_cast<int>(rows.size()) - 1;
  ForwardInput in;
  SeqChunk ch{seq_id_, pos, k + 1};
  ch.n_checkpoints = k > 0 ? k + 1 : 0;
  in.chunks = {ch};
  in.tokens = rows;
  in.all_logits = k > 0;
  in.want_hidden = wants_hidden();
  KV_RETURN_IF_ERROR(window_.Forward(in, &out_).WithContext(fmt::format("decode at {}", pos)));
  if (out_.logits.size() != static_cast<size_t>(k + 1) * n_vocab) {
    return Error("model returned {} logits, expected {}", out_.logits.size(),
                 static_cast<size_t>(k + 1) * n_vocab);
  }
  const size_t before = history_.size();
  const int accepted = VerifyDrafts(sampler_, out_.logits, n_vocab,
                                    std::span<const int32_t>(rows).subspan(1), &history_);
  std::vector<int32_t> decided(history_.begin() + before, history_.end());
  if (k > 0) {
    stats_.steps++;
    stats_.drafted += k;
    stats_.accepted += accepted;
    budget_.Record(k, accepted);
    // The last decided token is not fed yet: keep the rows of the fed token and accepted drafts.
    KV_RETURN_IF_ERROR(window_.TruncateSequence(seq_id_, pos + 1 + accepted));
  }
  if (in.want_hidden) {
    // The rows kept: the fed token and the accepted drafts.
    const size_t e = static_cast<size_t>(window_.config().n_embd);
    drafter_->ObserveHidden(pos, std::span<const float>(out_.hidden).first((accepted + 1) * e));
  }
  return decided;
}

}  // namespace kvasir::spec
