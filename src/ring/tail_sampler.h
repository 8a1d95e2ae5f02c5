// The last stage's decision for a sampled row: the token, its logit, and whether the session
// ends with it. Pure apart from the sampler's random state.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "grammar/grammar.h"
#include "grammar/recognizer.h"
#include "grammar/token_mask.h"
#include "model/sampler.h"
#include "ring/messages.h"
#include "ring/vocab_trie.h"
#include "ring/wire.h"

namespace kvasir::ring {

// Why a session ends with a token just sampled to take position `pos`, or kNone: an end-of-
// generation token (unless the request ignores them), then max_tokens (`n_generated` counts this
// token), then a full context (the token could not be fed back).
wire::FinishReason FinishReasonFor(bool is_eog, const wire::SamplingWire& sampling,
                                   int n_generated, int pos, int n_ctx);

// What a grammar a client sends may cost the last stage, per session: parsing it (the text is at
// most wire::kMaxGrammarBytes) and the recognizer's memo (a few MiB at most).
grammar::GrammarLimits TailGrammarLimits();
grammar::MatcherLimits TailMatcherLimits();

// What the tail keeps per session: its sampler, the prompt and generated ids for penalties, and
// the grammar's position when the session has one.
class TailSampler {
 public:
  // Refuses what it could not sample with (CheckSessionRequest): a NaN temperature, a negative
  // penalty window, a prompt id outside the vocabulary..., naming the field; and a grammar
  // (wire::kSamplingGrammar) that does not parse, or that `vocab` (the stage's vocabulary) cannot
  // serve.
  // `extra` applies when sampling.flags has wire::kSamplingExtra: logit biases, then the repeat,
  // frequency and presence penalties over the penalty window (as llama.cpp orders them), then the
  // sampler's cuts. Without it the sampler runs on the logits as they are.
  // With a grammar the sampler's distribution (after its cuts) is restricted to the tokens the
  // grammar allows and renormalised (docs/GRAMMAR.md); when the cuts leave none of them, the
  // distribution before the cuts is. Greedy picks the most likely allowed token.
  static Result<std::unique_ptr<TailSampler>> Create(const wire::SamplingWire& sampling,
                                                     std::vector<int32_t> prompt, int n_ctx,
                                                     int n_vocab, const SamplingExtra& extra = {},
                                                     VocabTrie* vocab = nullptr);

  // Samples the token that takes position `pos` from `logits` and returns the TOKEN the ring
  // carries to the head: with wire::kSamplingLogprobs, the log-probabilities of the token and of
  // the top alternatives (log-softmax of the logits after biases and penalties, before the
  // temperature, the cuts and the grammar). A session whose grammar is complete ends with
  // FinishReason::kEog. Errors (the session cannot go on): the grammar allows no token here, or
  // its recognizer ran out of its limits.
  Result<TokenMsg> Sample(uint32_t session, std::span<const float> logits, int pos, int n_ctx,
                          const std::function<bool(int32_t)>& is_eog);
  // Speculation: decides the token that takes position `pos` when the last stage drafted `draft`
  // for it, by Sampler::Verify on the logits as Sample adjusts them (greedy: the draft exactly when
  // it is the argmax; with temperature, speculative rejection sampling, the token Sample would
  // draw, one draw, so a seed gives the tokens it gives without drafts). *accepted tells whether
  // the token is the draft. The TOKEN is what Sample returns. Not for a session with a grammar (it
  // never drafts).
  Result<TokenMsg> Verify(uint32_t session, std::span<const float> logits, int32_t draft, int pos,
                          int n_ctx, const std::function<bool(int32_t)>& is_eog, bool* accepted);
  // The prompt, then every token decided so far (what a drafter continues).
  const std::vector<int32_t>& history() const { return history_; }
  // Resumes a session whose `generated` tokens were sampled before (a repair's replay): the
  // penalty window, the grammar's position, the count of tokens and the random state become what
  // they were after sampling them with the same request, so the next Sample draws exactly what an
  // undisturbed run would. Refuses ids outside `n_vocab`, a token the grammar does not allow, and
  // a grammar with a temperature above 0 (its draws depend on the logits, which are not here).
  Status Resume(std::span<const int32_t> generated, int n_vocab);
  int n_generated() const { return n_generated_; }
  bool has_grammar() const { return recognizer_ != nullptr; }

 private:
  TailSampler(const wire::SamplingWire& sampling, std::vector<int32_t> prompt,
              const SamplingExtra& extra);
  // `logits` with the biases and penalties of `extra_` applied, in scratch_.
  std::span<const float> Adjust(std::span<const float> logits);
  // The grammar's choice from `logits` (adjusted), as Create explains.
  Result<int32_t> SampleAllowed(std::span<const float> logits);
  // The TOKEN for `id`, decided from `logits` (`adjusted`: as Adjust left them) to take `pos`.
  TokenMsg Decided(uint32_t session, std::span<const float> logits,
                   std::span<const float> adjusted, int32_t id, bool grammar_done, int pos,
                   int n_ctx, const std::function<bool(int32_t)>& is_eog);
  // The log-probabilities of `id` and of the top alternatives under `logits`.
  void FillLogprobs(std::span<const float> logits, int32_t id, std::vector<TokenLogprob>* out);

  wire::SamplingWire sampling_;
  bool adjust_ = false;  // apply Adjust: extra sampling, or penalties under a grammar
  SamplingExtra extra_;
  Sampler sampler_;
  std::vector<float> scratch_;  // [n_vocab] adjusted logits
  std::vector<int32_t> history_;
  int n_generated_ = 0;

  // With a grammar.
  std::shared_ptr<const grammar::TokenTrie> trie_;
  std::unique_ptr<grammar::Recognizer> recognizer_;
  grammar::Matcher matcher_;
  grammar::TokenMask mask_;
  std::vector<Sampler::Weighted> weighted_;
};

}  // namespace kvasir::ring
