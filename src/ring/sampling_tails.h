// The tails GENERATE and OPEN_SESSION carry after their prompt, under their sampling flags: a
// SamplingExtraWire and its logit biases (wire::kSamplingExtra), then a SamplingOutputWire and the
// grammar's text (wire::kSamplingGrammar, wire::kSamplingLogprobs). Used by the message codec;
// `what` names the message in errors.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/status.h"
#include "ring/messages.h"
#include "ring/wire.h"

namespace kvasir::ring {

bool HasExtra(const wire::SamplingWire& w);
bool HasOutput(const wire::SamplingWire& w);
inline bool HasSamplingTails(const wire::SamplingWire& w) { return HasExtra(w) || HasOutput(w); }

// Bytes the tails of `e` take under the flags of `w`.
uint64_t SamplingTailBytes(const wire::SamplingWire& w, const SamplingExtra& e);

// The tails at `p` (`left` bytes from there to the end of the payload), which must hold exactly
// what the flags of `w` announce; counts and sizes are checked before anything is read.
Status DecodeSamplingTails(const char* what, const wire::SamplingWire& w, const uint8_t* p,
                           size_t left, SamplingExtra* out);

// Appends the tails of `e` that the flags of `w` announce to `out` (the codec's frame builder:
// Put(trivially copyable value), PutBytes(pointer, size)).
template <typename Builder>
void PutSamplingTails(Builder& out, const wire::SamplingWire& w, const SamplingExtra& e) {
  if (HasExtra(w)) {
    wire::SamplingExtraWire x{};
    x.presence_penalty = e.presence_penalty;
    x.frequency_penalty = e.frequency_penalty;
    x.n_logit_bias = static_cast<uint32_t>(e.logit_bias.size());
    out.Put(x);
    for (const LogitBias& b : e.logit_bias) out.Put(wire::LogitBiasWire{b.id, b.bias});
  }
  if (HasOutput(w)) {
    out.Put(wire::SamplingOutputWire{static_cast<uint32_t>(e.grammar.size()), e.top_logprobs});
    out.PutBytes(e.grammar.data(), e.grammar.size());
  }
}

// Whether `e` may travel under the flags of `w`: each part only under its flag, within its counts.
Status CheckSamplingTailsEncodable(const char* what, const wire::SamplingWire& w,
                                   const SamplingExtra& e);

}  // namespace kvasir::ring
