// TailRole: the last stage's samplers and the tokens it draws (tail_role.h).
#include "ring/tail_role.h"

#include <fmt/format.h>

#include "base/log.h"
#include "base/timing_trace.h"
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

Result<std::unique_ptr<TailSampler>> TailRole::CheckOpen(const OpenSessionMsg& o) {
  if (!o.replay) return NewSampler(o.sampling, o.prompt, o.extra);
  // Drafts or not, the sampler took one draw per token (Sampler::Verify): Resume restores it.
  const size_t n_prompt = o.prompt.size() - o.n_generated;
  KV_ASSIGN_OR_RETURN(
      std::unique_ptr<TailSampler> t,
      NewSampler(o.sampling, std::vector<int32_t>(o.prompt.begin(), o.prompt.begin() + n_prompt),
                 o.extra));
  KV_RETURN_IF_ERROR(t->Resume(std::span<const int32_t>(o.prompt).subspan(n_prompt),
                               st_.window_->config().n_vocab));
  return t;
}

int TailRole::ReplayKeepLimit(const Session& /*s*/, int n) const { return n - 1; }

bool TailRole::PassKept(Session& s, const HiddenMsg& h, const Work& w, uint32_t upto) {
  const uint32_t end = h.pos0 + h.n_tokens;
  if (upto == end && (h.flags & wire::kHiddenSample) != 0) {
    st_.FailSession(s.id, wire::ErrorCode::kBadRequest,
                    fmt::format("replay: HIDDEN asks for the token after position {}, which this "
                                "stage kept from before the replay (it draws only after position "
                                "{} or later)",
                                end - 1, s.replay_skip));
    return false;
  }
  st_.CommitRows(w, nullptr, std::nullopt);
  return true;
}

void TailRole::EmitOutputs(std::span<const Work> batch, const ForwardOutput& out) {
  const int n_vocab = st_.window_->config().n_vocab;
  const int n_ctx = st_.window_->n_ctx();
  auto is_eog = [&](int32_t id) { return st_.tokenizer_->IsEog(id); };
  size_t logit_row = 0;
  size_t hidden_row = 0;
  for (const Work& w : batch) {
    const size_t first = hidden_row;
    hidden_row += static_cast<size_t>(w.n_tokens);
    if (!w.sample) {
      ObserveHidden(w, out, first, w.n_tokens);
      st_.CommitRows(w, nullptr, std::nullopt);
      continue;
    }
    // A verify chunk has logits for every row, others for their last.
    const size_t n_rows = w.verify ? static_cast<size_t>(w.n_tokens) : 1;
    std::span<const float> logits(out.logits.data() + logit_row * n_vocab, n_rows * n_vocab);
    logit_row += n_rows;
    auto it = st_.sessions_.find(w.session);
    if (it == st_.sessions_.end()) continue;
    Session& s = it->second;
    Result<std::vector<TokenMsg>> decided = std::vector<TokenMsg>();
    if (w.verify) {
      if (s.draft == nullptr || st_.spec_ == nullptr) {
        decided = Error("a verify chunk for a session this stage drafted nothing for");
      } else {
        decided = st_.spec_->Verify(w.session, *s.tail, *s.draft, w.pos0, w.n_tokens, logits,
                                    n_vocab, n_ctx, is_eog);
      }
    } else {
      auto sampled = s.tail->Sample(w.session, logits, w.pos0 + w.n_tokens, n_ctx, is_eog);
      if (sampled.ok()) {
        decided->push_back(std::move(sampled).value());
      } else {
        decided = sampled.status();
      }
    }
    if (!decided.ok()) {
      KV_LOG_WARN("{}: session {}: {}", st_.options_.name, w.session, decided.status().message());
      st_.FailSession(w.session, wire::ErrorCode::kBadRequest, decided.status().message());
      continue;
    }
    if (decided->empty()) {  // a stale window (overlap): its rows ran, and decide nothing
      st_.CommitRows(w, nullptr, std::nullopt);
      continue;
    }
    ObserveHidden(w, out, first, w.verify && s.draft ? s.draft->kept_rows : w.n_tokens);
    decided_.push_back({&w, std::move(decided).value()});
  }
  // Drafts after the batch's last tokens, all at once (a draft model runs them batched).
  std::vector<SpecTail::DraftJob> jobs;
  for (auto& [w, tokens] : decided_) {
    Session& s = st_.sessions_.at(w->session);
    // A last token with `more` confirmed the guessed window behind: it is fed already.
    if (s.draft != nullptr && tokens.back().token.finished == 0 && !tokens.back().more) {
      jobs.push_back({s.tail.get(), s.draft.get(), &s.sampling, &tokens.back()});
    }
  }
  if (!jobs.empty()) st_.spec_->DraftAll(jobs, n_ctx);
  // On a one-stage ring, the head takes them; elsewhere they go on (EntryRole::TakeToken).
  auto send = [&](const TokenMsg& t) { st_.entry_->TakeToken(t); };
  for (auto& [w, tokens] : decided_) {
    st_.CommitRows(*w, nullptr, tokens.back().token.id);
    for (const TokenMsg& t : tokens) send(t);
  }
  // Overlap: the windows guessed to follow go behind, drafted while those tokens travel.
  std::vector<std::vector<TokenMsg>> further(decided_.size());
  std::vector<SpecTail::FurtherJob> ahead;
  for (size_t i = 0; i < decided_.size() && st_.spec_ != nullptr; ++i) {
    const auto& [w, tokens] = decided_[i];
    auto it = st_.sessions_.find(w->session);
    if (tokens.back().token.finished != 0 || it == st_.sessions_.end() ||
        it->second.draft == nullptr || it->second.closing) {
      continue;
    }
    Session& s = it->second;
    ahead.push_back({w->session, s.tail.get(), s.draft.get(), &s.sampling, &further[i]});
  }
  if (!ahead.empty()) st_.spec_->DraftFurtherAll(ahead, n_ctx);
  for (const std::vector<TokenMsg>& windows : further) {
    for (const TokenMsg& t : windows) send(t);
  }
  decided_.clear();
}

void TailRole::ObserveHidden(const Work& w, const ForwardOutput& out, size_t first, int n_rows) {
  if (st_.spec_ == nullptr || !st_.spec_->wants_hidden()) return;
  auto it = st_.sessions_.find(w.session);
  if (it == st_.sessions_.end() || it->second.draft == nullptr) return;
  const size_t e = static_cast<size_t>(st_.window_->config().n_embd);
  if (out.hidden.size() < (first + static_cast<size_t>(n_rows)) * e) return;
  st_.spec_->ObserveHidden(*it->second.draft, w.pos0,
                           std::span<const float>(out.hidden).subspan(first * e, n_rows * e));
}

}  // namespace kvasir::ring
