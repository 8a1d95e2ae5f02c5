// The tail's sampling decision.
#include "ring/tail_sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "base/check.h"
#include "ring/sampling_wire.h"

namespace kvasir::ring {

wire::FinishReason FinishReasonFor(bool is_eog, const wire::SamplingWire& sampling,
                                   int n_generated, int pos, int n_ctx) {
  if (is_eog && (sampling.flags & wire::kSamplingIgnoreEog) == 0) return wire::FinishReason::kEog;
  if (n_generated >= static_cast<int64_t>(sampling.max_tokens)) {
    return wire::FinishReason::kMaxTokens;
  }
  if (pos >= n_ctx) return wire::FinishReason::kContextFull;
  return wire::FinishReason::kNone;
}

namespace {

bool Adjusts(const wire::SamplingWire& w) {
  return (w.flags & (wire::kSamplingExtra | wire::kSamplingGrammar)) != 0;
}

// With extra sampling or a grammar the repeat penalty is applied with the others, in Adjust.
SamplingParams SamplerParams(const wire::SamplingWire& w) {
  SamplingParams p = SamplingFromWire(w);
  if (Adjusts(w)) p.repeat_penalty = 1.0f;
  return p;
}

}  // namespace

grammar::GrammarLimits TailGrammarLimits() {
  grammar::GrammarLimits l;
  l.max_text_bytes = wire::kMaxGrammarBytes;
  l.max_elements = 1 << 18;  // about 20 MB and 0.1 s to parse at most
  return l;
}

grammar::MatcherLimits TailMatcherLimits() {
  grammar::MatcherLimits l;
  l.max_frames = 1 << 18;
  l.max_states = 1 << 16;
  l.max_state_stacks = 1 << 20;
  l.max_table_bytes = 4 << 20;
  return l;
}

Result<std::unique_ptr<TailSampler>> TailSampler::Create(const wire::SamplingWire& sampling,
                                                         std::vector<int32_t> prompt, int n_ctx,
                                                         int n_vocab, const SamplingExtra& extra,
                                                         VocabTrie* vocab) {
  KV_RETURN_IF_ERROR(CheckSessionRequest(sampling, prompt, n_ctx, n_vocab, extra));
  std::unique_ptr<TailSampler> t(new TailSampler(sampling, std::move(prompt), extra));
  if ((sampling.flags & wire::kSamplingGrammar) != 0) {
    if (vocab == nullptr) return Error("grammar: this stage holds no vocabulary to apply it with");
    KV_ASSIGN_OR_RETURN(t->trie_, vocab->Get());
    if (t->trie_->n_vocab() != n_vocab) {
      return Error("grammar: the vocabulary has {} tokens but the output head {}",
                   t->trie_->n_vocab(), n_vocab);
    }
    auto g = grammar::Grammar::Parse(extra.grammar, TailGrammarLimits());
    if (!g.ok()) return g.status();
    t->recognizer_ = std::make_unique<grammar::Recognizer>(*g, TailMatcherLimits());
    KV_RETURN_IF_ERROR(t->recognizer_->status());
    t->matcher_ = grammar::Matcher(t->recognizer_.get());
  }
  return t;
}

TailSampler::TailSampler(const wire::SamplingWire& sampling, std::vector<int32_t> prompt,
                         const SamplingExtra& extra)
    : sampling_(sampling),
      adjust_(Adjusts(sampling)),
      extra_(extra),
      sampler_(SamplerParams(sampling)),
      history_(std::move(prompt)) {
  extra_.grammar.clear();  // parsed once, in Create
  extra_.grammar.shrink_to_fit();
}

std::span<const float> TailSampler::Adjust(std::span<const float> logits) {
  scratch_.assign(logits.begin(), logits.end());
  for (const LogitBias& b : extra_.logit_bias) {
    if (b.id >= 0 && static_cast<size_t>(b.id) < scratch_.size()) scratch_[b.id] += b.bias;
  }
  const size_t window = std::min(history_.size(), static_cast<size_t>(sampling_.repeat_last_n));
  if (window == 0) return scratch_;
  std::unordered_map<int32_t, int> counts;
  for (size_t i = history_.size() - window; i < history_.size(); ++i) ++counts[history_[i]];
  const float repeat = sampling_.repeat_penalty;
  for (const auto& [id, count] : counts) {
    if (id < 0 || static_cast<size_t>(id) >= scratch_.size()) continue;
    float& l = scratch_[id];
    if (repeat != 1.0f) l = l > 0 ? l / repeat : l * repeat;
    l -= static_cast<float>(count) * extra_.frequency_penalty + extra_.presence_penalty;
  }
  return scratch_;
}

Result<int32_t> TailSampler::SampleAllowed(std::span<const float> logits) {
  sampler_.Weigh(logits, history_, &weighted_);
  const int32_t first = sampler_.Draw(weighted_);
  if (trie_->Allows(matcher_, first)) return first;
  KV_RETURN_IF_ERROR(matcher_.status());
  // Refused: the exact restriction needs the whole allowed set (token_mask.h).
  KV_RETURN_IF_ERROR(trie_->FillMask(matcher_, &mask_));
  std::erase_if(weighted_, [&](const Sampler::Weighted& w) { return !mask_.Test(w.id); });
  if (!weighted_.empty()) return sampler_.Draw(weighted_);
  // The sampler's cuts left no allowed token: the allowed ones by their own weights.
  double best = -INFINITY;
  for (int32_t id = 0; id < mask_.size(); ++id) {
    if (mask_.Test(id)) best = std::max<double>(best, logits[id]);
  }
  if (best == -INFINITY) return Error("grammar: no token of the vocabulary can continue it here");
  const float temperature = sampler_.params().temperature;
  for (int32_t id = 0; id < mask_.size(); ++id) {
    if (!mask_.Test(id)) continue;
    if (sampler_.greedy()) {
      if (logits[id] == best) return id;  // the first of the best
      continue;
    }
    weighted_.push_back({std::exp((logits[id] - best) / temperature), id});
  }
  return sampler_.Draw(weighted_);
}

void TailSampler::FillLogprobs(std::span<const float> logits, int32_t id,
                               std::vector<TokenLogprob>* out) {
  double max = -INFINITY;
  for (float l : logits) max = std::max<double>(max, l);
  double sum = 0;
  for (float l : logits) sum += std::exp(l - max);
  const double log_z = max + std::log(sum);
  auto logprob = [&](int32_t i) {
    return static_cast<float>(std::min(0.0, static_cast<double>(logits[i]) - log_z));
  };
  out->clear();
  out->push_back({id, logprob(id), {}});
  // The top alternatives, most likely first (ties: lower id first).
  const size_t top = std::min<size_t>(extra_.top_logprobs, logits.size());
  if (top == 0) return;
  auto better = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  std::vector<int32_t> best;  // a min-heap under `better` of the best so far
  best.reserve(top + 1);
  for (int32_t i = 0; i < static_cast<int32_t>(logits.size()); ++i) {
    if (best.size() < top) {
      best.push_back(i);
      std::push_heap(best.begin(), best.end(), better);
    } else if (better(i, best.front())) {
      std::pop_heap(best.begin(), best.end(), better);
      best.back() = i;
      std::push_heap(best.begin(), best.end(), better);
    }
  }
  std::sort(best.begin(), best.end(), better);
  for (int32_t i : best) out->push_back({i, logprob(i), {}});
}

Status TailSampler::Resume(std::span<const int32_t> generated, int n_vocab) {
  if (recognizer_ != nullptr && !sampler_.greedy()) {
    return Error(
        "replay: a session with a grammar and a temperature above 0 cannot be resumed exactly "
        "(its draws depend on the logits)");
  }
  for (int32_t id : generated) {
    if (id < 0 || id >= n_vocab) {
      return Error("replay: token {} is outside the vocabulary of {}", id, n_vocab);
    }
    if (recognizer_ != nullptr && trie_->kind(id) == grammar::TokenKind::kText &&
        !trie_->Accept(&matcher_, id)) {
      return Error("replay: the grammar does not allow token {} here", id);
    }
    sampler_.SkipDraw();
    history_.push_back(id);
    ++n_generated_;
  }
  return Status::Ok();
}

Result<TokenMsg> TailSampler::Sample(uint32_t session, std::span<const float> logits, int pos,
                                     int n_ctx, const std::function<bool(int32_t)>& is_eog) {
  const std::span<const float> adjusted = adjust_ ? Adjust(logits) : logits;
  int32_t id;
  bool grammar_done = false;
  if (recognizer_ != nullptr) {
    KV_ASSIGN_OR_RETURN(id, SampleAllowed(adjusted));
    if (trie_->kind(id) == grammar::TokenKind::kText) {
      KV_CHECK(trie_->Accept(&matcher_, id), "an allowed token was refused");
      grammar_done = matcher_.MustEnd();
    }
  } else {
    id = sampler_.Sample(adjusted, history_);
  }
  return Decided(session, logits, adjusted, id, grammar_done, pos, n_ctx, is_eog);
}

Result<TokenMsg> TailSampler::Verify(uint32_t session, std::span<const float> logits,
                                     int32_t draft, int pos, int n_ctx,
                                     const std::function<bool(int32_t)>& is_eog, bool* accepted) {
  if (recognizer_ != nullptr) return Error("a session with a grammar does not verify drafts");
  if (draft < 0 || static_cast<size_t>(draft) >= logits.size()) {
    return Error("draft {} is outside the vocabulary of {}", draft, logits.size());
  }
  const std::span<const float> adjusted = adjust_ ? Adjust(logits) : logits;
  const Sampler::Verdict v = sampler_.Verify(adjusted, history_, draft);
  *accepted = v.accepted;
  return Decided(session, logits, adjusted, v.token, false, pos, n_ctx, is_eog);
}

TokenMsg TailSampler::Decided(uint32_t session, std::span<const float> logits,
                              std::span<const float> adjusted, int32_t id, bool grammar_done,
                              int pos, int n_ctx, const std::function<bool(int32_t)>& is_eog) {
  TokenMsg t;
  if ((sampling_.flags & wire::kSamplingLogprobs) != 0) FillLogprobs(adjusted, id, &t.logprobs);
  history_.push_back(id);
  ++n_generated_;
  wire::FinishReason reason = FinishReasonFor(is_eog(id), sampling_, n_generated_, pos, n_ctx);
  // A complete grammar ends the answer: nothing may follow it but an end-of-generation token.
  if (reason == wire::FinishReason::kNone && grammar_done) reason = wire::FinishReason::kEog;
  t.token.session = session;
  t.token.pos = static_cast<uint32_t>(pos);
  t.token.id = id;
  t.token.finished = reason != wire::FinishReason::kNone ? 1 : 0;
  t.token.reason = static_cast<uint8_t>(reason);
  t.token.logit = logits[static_cast<size_t>(id)];
  return t;
}

}  // namespace kvasir::ring
