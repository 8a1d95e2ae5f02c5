#include "ring/sampling_wire.h"

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

}  // namespace kvasir::ring
