// The tail's sampling decision.
#include "ring/tail_sampler.h"

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

Result<std::unique_ptr<TailSampler>> TailSampler::Create(const wire::SamplingWire& sampling,
                                                         std::vector<int32_t> prompt, int n_ctx,
                                                         int n_vocab) {
  KV_RETURN_IF_ERROR(CheckSessionRequest(sampling, prompt, n_ctx, n_vocab));
  return std::unique_ptr<TailSampler>(new TailSampler(sampling, std::move(prompt)));
}

TailSampler::TailSampler(const wire::SamplingWire& sampling, std::vector<int32_t> prompt)
    : sampling_(sampling), sampler_(SamplingFromWire(sampling)), history_(std::move(prompt)) {}

wire::TokenBody TailSampler::Sample(uint32_t session, std::span<const float> logits, int pos,
                                    int n_ctx, const std::function<bool(int32_t)>& is_eog) {
  const int32_t id = sampler_.Sample(logits, history_);
  history_.push_back(id);
  ++n_generated_;
  const wire::FinishReason reason = FinishReasonFor(is_eog(id), sampling_, n_generated_, pos, n_ctx);
  wire::TokenBody t{};
  t.session = session;
  t.pos = static_cast<uint32_t>(pos);
  t.id = id;
  t.finished = reason != wire::FinishReason::kNone ? 1 : 0;
  t.reason = static_cast<uint8_t>(reason);
  t.logit = logits[static_cast<size_t>(id)];
  return t;
}

}  // namespace kvasir::ring
