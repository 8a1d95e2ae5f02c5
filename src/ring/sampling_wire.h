// Conversion between the sampler's parameters and their fixed-width wire form (GENERATE and
// OPEN_SESSION carry them to the stage that samples).
#pragma once

#include <cstdint>

#include "model/sampler.h"
#include "ring/wire.h"

namespace kvasir::ring {

wire::SamplingWire SamplingToWire(const SamplingParams& p, uint32_t max_tokens, bool ignore_eog);
SamplingParams SamplingFromWire(const wire::SamplingWire& w);

}  // namespace kvasir::ring
