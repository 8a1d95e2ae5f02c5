// The last stage's decision for a sampled row: the token, its logit, and whether the session
// ends with it. Pure apart from the sampler's random state.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "base/status.h"
#include "model/sampler.h"
#include "ring/messages.h"
#include "ring/wire.h"

namespace kvasir::ring {

// Why a session ends with a token just sampled to take position `pos`, or kNone: an end-of-
// generation token (unless the request ignores them), then max_tokens (`n_generated` counts this
// token), then a full context (the token could not be fed back).
wire::FinishReason FinishReasonFor(bool is_eog, const wire::SamplingWire& sampling,
                                   int n_generated, int pos, int n_ctx);

// What the tail keeps per session: its sampler, and the prompt and generated ids for penalties.
class TailSampler {
 public:
  // Refuses what it could not sample with (CheckSessionRequest): a NaN temperature, a negative
  // penalty window, a prompt id outside the vocabulary..., naming the field.
  // `extra` applies when sampling.flags has wire::kSamplingExtra: logit biases, then the repeat,
  // frequency and presence penalties over the penalty window (as llama.cpp orders them), then the
  // sampler's cuts. Without it the sampler runs on the logits as they are.
  static Result<std::unique_ptr<TailSampler>> Create(const wire::SamplingWire& sampling,
                                                     std::vector<int32_t> prompt, int n_ctx,
                                                     int n_vocab, const SamplingExtra& extra = {});

  // Samples the token that takes position `pos` from `logits` and returns the TOKEN body the
  // ring carries to the head.
  wire::TokenBody Sample(uint32_t session, std::span<const float> logits, int pos, int n_ctx,
                         const std::function<bool(int32_t)>& is_eog);
  int n_generated() const { return n_generated_; }

 private:
  TailSampler(const wire::SamplingWire& sampling, std::vector<int32_t> prompt,
              const SamplingExtra& extra);
  // `logits` with the biases and penalties of `extra_` applied, in scratch_.
  std::span<const float> Adjust(std::span<const float> logits);

  wire::SamplingWire sampling_;
  bool has_extra_ = false;
  SamplingExtra extra_;
  Sampler sampler_;
  std::vector<float> scratch_;  // [n_vocab] adjusted logits
  std::vector<int32_t> history_;
  int n_generated_ = 0;
};

}  // namespace kvasir::ring
