// The tail's sampling decision.
#include "ring/tail_sampler.h"

#include <unordered_map>

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

// With extra sampling the repeat penalty is applied with the others, in Adjust.
SamplingParams SamplerParams(const wire::SamplingWire& w) {
  SamplingParams p = SamplingFromWire(w);
  if ((w.flags & wire::kSamplingExtra) != 0) p.repeat_penalty = 1.0f;
  return p;
}

}  // namespace

Result<std::unique_ptr<TailSampler>> TailSampler::Create(const wire::SamplingWire& sampling,
                                                         std::vector<int32_t> prompt, int n_ctx,
                                                         int n_vocab, const SamplingExtra& extra) {
  KV_RETURN_IF_ERROR(CheckSessionRequest(sampling, prompt, n_ctx, n_vocab, extra));
  return std::unique_ptr<TailSampler>(new TailSampler(sampling, std::move(prompt), extra));
}

TailSampler::TailSampler(const wire::SamplingWire& sampling, std::vector<int32_t> prompt,
                         const SamplingExtra& extra)
    : sampling_(sampling),
      has_extra_((sampling.flags & wire::kSamplingExtra) != 0),
      extra_(extra),
      sampler_(SamplerParams(sampling)),
      history_(std::move(prompt)) {}

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

wire::TokenBody TailSampler::Sample(uint32_t session, std::span<const float> logits, int pos,
                                    int n_ctx, const std::function<bool(int32_t)>& is_eog) {
  const int32_t id = sampler_.Sample(has_extra_ ? Adjust(logits) : logits, history_);
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
