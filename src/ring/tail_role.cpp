// TailRole: the last stage's samplers and the tokens it draws (tail_role.h).
#include "ring/tail_role.h"

#include "base/log.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {

TailRole::TailRole(StageImpl& stage) : st_(stage), vocab_trie_(stage.tokenizer_.get()) {}

Result<std::unique_ptr<TailSampler>> TailRole::NewSampler(const wire::SamplingWire& sampling,
                                                          std::vector<int32_t> prompt,
                                                          const SamplingExtra& extra) {
  const LayerWindow& window = *st_.window_;
  return TailSampler::Create(sampling, std::move(prompt), window.n_ctx(), window.config().n_vocab,
                             extra, &vocab_trie_);
}

void TailRole::EmitTokens(std::span<const Work> batch, const ForwardOutput& out) {
  const int n_vocab = st_.window_->config().n_vocab;
  size_t logit_row = 0;
  for (const Work& w : batch) {
    if (!w.sample) {
      st_.CommitRows(w, nullptr, std::nullopt);
      continue;
    }
    auto it = st_.sessions_.find(w.session);
    if (it == st_.sessions_.end()) {
      ++logit_row;
      continue;
    }
    Session& s = it->second;
    std::span<const float> logits(out.logits.data() + logit_row * n_vocab, n_vocab);
    ++logit_row;
    auto sampled = s.tail->Sample(w.session, logits, w.pos0 + w.n_tokens, st_.window_->n_ctx(),
                                  [&](int32_t id) { return st_.tokenizer_->IsEog(id); });
    if (!sampled.ok()) {
      KV_LOG_WARN("{}: session {}: {}", st_.options_.name, w.session, sampled.status().message());
      st_.FailSession(w.session, wire::ErrorCode::kBadRequest, sampled.status().message());
      continue;
    }
    TokenMsg& t = *sampled;
    st_.CommitRows(w, nullptr, t.token.id);
    if (st_.head_) {
      st_.head_->HandleToken(t);  // a one-stage ring: the head samples for itself
    } else {
      st_.SendNext(t);
    }
  }
}

}  // namespace kvasir::ring
