// Conversion between the sampler's parameters and their fixed-width wire form (GENERATE and
// OPEN_SESSION carry them to the stage that samples).
#pragma once

#include <cstdint>
#include <span>

#include "base/status.h"
#include "model/sampler.h"
#include "ring/messages.h"
#include "ring/wire.h"

namespace kvasir::ring {

wire::SamplingWire SamplingToWire(const SamplingParams& p, uint32_t max_tokens, bool ignore_eog);
SamplingParams SamplingFromWire(const wire::SamplingWire& w);
// The head's check of a client's sampling values, the same ranges the CLI enforces: finite
// temperature >= 0, top_k >= 0, top_p in (0, 1], min_p in [0, 1], repeat penalty finite > 0,
// repeat_last_n >= 0, max_tokens >= 1, known flags. Errors name the field.
Status CheckSamplingWire(const wire::SamplingWire& w);
// The extra sampling values (wire::kSamplingExtra): presence and frequency penalties finite and
// within [-2, 2], at most kMaxLogitBias biases, each finite within [-100, 100] on an id inside a
// vocabulary of `n_vocab`, no id twice. Errors name the field.
Status CheckSamplingExtra(const SamplingExtra& extra, int n_vocab);
// What every stage checks of an OPEN_SESSION before it opens anything: the sampling values as
// above (the last stage samples with them), a prompt that leaves room in a context of `n_ctx`,
// and prompt ids inside a vocabulary of `n_vocab` (the last stage penalises them). Errors name
// the field.
Status CheckSessionRequest(const wire::SamplingWire& w, std::span<const int32_t> prompt, int n_ctx,
                           int n_vocab, const SamplingExtra& extra = {});

}  // namespace kvasir::ring
