#include "ring/sampling_wire.h"

#include <cmath>
#include <unordered_set>

namespace kvasir::ring {

wire::SamplingWire SamplingToWire(const SamplingParams& p, uint32_t max_tokens, bool ignore_eog) {
  wire::SamplingWire w{};
  w.temperature = p.temperature;
  w.top_p = p.top_p;
  w.min_p = p.min_p;
  w.repeat_penalty = p.repeat_penalty;
  w.top_k = p.top_k;
  w.repeat_last_n = p.repeat_last_n;
  w.seed = p.seed;
  w.max_tokens = max_tokens;
  w.flags = ignore_eog ? wire::kSamplingIgnoreEog : 0;
  return w;
}

SamplingParams SamplingFromWire(const wire::SamplingWire& w) {
  SamplingParams p;
  p.temperature = w.temperature;
  p.top_k = w.top_k;
  p.top_p = w.top_p;
  p.min_p = w.min_p;
  p.repeat_penalty = w.repeat_penalty;
  p.repeat_last_n = w.repeat_last_n;
  p.seed = w.seed;
  return p;
}

Status CheckSamplingWire(const wire::SamplingWire& w) {
  if (!std::isfinite(w.temperature) || w.temperature < 0) {
    return Error("temperature must be finite and >= 0 (got {})", w.temperature);
  }
  if (w.top_k < 0) return Error("top_k must be >= 0 (got {})", w.top_k);
  if (!(w.top_p > 0.0f && w.top_p <= 1.0f)) return Error("top_p must be in (0, 1] (got {})", w.top_p);
  if (!(w.min_p >= 0.0f && w.min_p <= 1.0f)) return Error("min_p must be in [0, 1] (got {})", w.min_p);
  if (!std::isfinite(w.repeat_penalty) || w.repeat_penalty <= 0) {
    return Error("repeat_penalty must be finite and > 0 (got {})", w.repeat_penalty);
  }
  if (w.repeat_last_n < 0) return Error("repeat_last_n must be >= 0 (got {})", w.repeat_last_n);
  if (w.max_tokens < 1) return Error("max_tokens must be at least 1 (got {})", w.max_tokens);
  if ((w.flags & ~wire::kSamplingKnownFlags) != 0) {
    return Error("sampling flags 0x{:x} has unknown bits", w.flags);
  }
  return Status::Ok();
}

Status CheckSamplingExtra(const SamplingExtra& e, int n_vocab) {
  for (auto [name, v] : {std::pair{"presence_penalty", e.presence_penalty},
                         {"frequency_penalty", e.frequency_penalty}}) {
    if (!(v >= -2.0f && v <= 2.0f)) return Error("{} must be in [-2, 2] (got {})", name, v);
  }
  if (e.logit_bias.size() > wire::kMaxLogitBias) {
    return Error("logit_bias has {} entries, at most {}", e.logit_bias.size(), wire::kMaxLogitBias);
  }
  std::unordered_set<int32_t> seen;
  for (const LogitBias& b : e.logit_bias) {
    if (b.id < 0 || b.id >= n_vocab) {
      return Error("logit_bias: token {} is outside the vocabulary (0..{})", b.id, n_vocab - 1);
    }
    if (!(b.bias >= -100.0f && b.bias <= 100.0f)) {
      return Error("logit_bias: the bias of token {} must be in [-100, 100] (got {})", b.id,
                   b.bias);
    }
    if (!seen.insert(b.id).second) return Error("logit_bias: token {} appears twice", b.id);
  }
  return Status::Ok();
}

Status CheckSessionRequest(const wire::SamplingWire& w, std::span<const int32_t> prompt, int n_ctx,
                           int n_vocab, const SamplingExtra& extra) {
  KV_RETURN_IF_ERROR(CheckSamplingWire(w));
  KV_RETURN_IF_ERROR(CheckSamplingExtra(extra, n_vocab));
  if (prompt.empty()) return Error("n_prompt is 0");
  if (static_cast<int64_t>(prompt.size()) >= n_ctx) {
    return Error("n_prompt {} leaves no room in the context of {}", prompt.size(), n_ctx);
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= n_vocab) {
      return Error("prompt token {} is {}, outside the vocabulary (0..{})", i, prompt[i],
                   n_vocab - 1);
    }
  }
  return Status::Ok();
}

}  // namespace kvasir::ring
