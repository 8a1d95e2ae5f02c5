// The tails GENERATE and OPEN_SESSION carry after their prompt under their sampling flags: the
// extra sampling (kSamplingExtra) and the output part (kSamplingGrammar, kSamplingLogprobs).
#include "ring/sampling_tails.h"

#include <cstring>

namespace kvasir::ring {

bool HasExtra(const wire::SamplingWire& w) { return (w.flags & wire::kSamplingExtra) != 0; }

bool HasOutput(const wire::SamplingWire& w) {
  return (w.flags & (wire::kSamplingGrammar | wire::kSamplingLogprobs)) != 0;
}

uint64_t SamplingTailBytes(const wire::SamplingWire& w, const SamplingExtra& e) {
  uint64_t bytes = 0;
  if (HasExtra(w)) {
    bytes += sizeof(wire::SamplingExtraWire) +
             uint64_t{e.logit_bias.size()} * sizeof(wire::LogitBiasWire);
  }
  if (HasOutput(w)) bytes += sizeof(wire::SamplingOutputWire) + e.grammar.size();
  return bytes;
}

// The sampling tails at `p` (`left` bytes from there to the end of the payload), which must hold
// exactly what the flags of `w` announce: the SamplingExtraWire and its logit biases, then the
// SamplingOutputWire and the grammar text.
Status DecodeSamplingTails(const char* what, const wire::SamplingWire& w, const uint8_t* p,
                           size_t left, SamplingExtra* out) {
  if (HasExtra(w)) {
    wire::SamplingExtraWire e{};
    if (left < sizeof(e)) {
      return Error("{}: the sampling flags announce extra sampling, but {} bytes remain of its {}",
                   what, left, sizeof(e));
    }
    std::memcpy(&e, p, sizeof(e));
    if (e.n_logit_bias > wire::kMaxLogitBias) {
      return Error("{}: n_logit_bias {} exceeds the limit of {}", what, e.n_logit_bias,
                   wire::kMaxLogitBias);
    }
    if (e.reserved != 0) return Error("{}: extra sampling's reserved field is not zero", what);
    const uint64_t biases = uint64_t{e.n_logit_bias} * sizeof(wire::LogitBiasWire);
    if (left - sizeof(e) < biases) {
      return Error("{}: {} bytes follow the extra sampling, but n_logit_bias {} needs {}", what,
                   left - sizeof(e), e.n_logit_bias, biases);
    }
    out->presence_penalty = e.presence_penalty;
    out->frequency_penalty = e.frequency_penalty;
    out->logit_bias.resize(e.n_logit_bias);
    for (uint32_t i = 0; i < e.n_logit_bias; ++i) {
      wire::LogitBiasWire b{};
      std::memcpy(&b, p + sizeof(e) + i * sizeof(b), sizeof(b));
      out->logit_bias[i] = {b.id, b.bias};
    }
    p += sizeof(e) + biases;
    left -= sizeof(e) + biases;
  }
  if (HasOutput(w)) {
    wire::SamplingOutputWire o{};
    if (left < sizeof(o)) {
      return Error(
          "{}: the sampling flags announce a grammar or logprobs, but {} bytes remain of "
          "their {}",
          what, left, sizeof(o));
    }
    std::memcpy(&o, p, sizeof(o));
    const bool grammar = (w.flags & wire::kSamplingGrammar) != 0;
    if (grammar != (o.grammar_bytes != 0)) {
      return Error("{}: grammar_bytes {} {} the kSamplingGrammar flag", what, o.grammar_bytes,
                   grammar ? "is zero under" : "is set without");
    }
    if (o.grammar_bytes > wire::kMaxGrammarBytes) {
      return Error("{}: grammar_bytes {} exceeds the {} KiB limit", what, o.grammar_bytes,
                   wire::kMaxGrammarBytes >> 10);
    }
    const bool logprobs = (w.flags & wire::kSamplingLogprobs) != 0;
    if (!logprobs && o.top_logprobs != 0) {
      return Error("{}: top_logprobs {} without the kSamplingLogprobs flag", what, o.top_logprobs);
    }
    if (o.top_logprobs > wire::kMaxTopLogprobs) {
      return Error("{}: top_logprobs {} exceeds the limit of {}", what, o.top_logprobs,
                   wire::kMaxTopLogprobs);
    }
    if (left - sizeof(o) < o.grammar_bytes) {
      return Error("{}: grammar_bytes {} but {} bytes remain", what, o.grammar_bytes,
                   left - sizeof(o));
    }
    out->top_logprobs = o.top_logprobs;
    out->grammar.assign(reinterpret_cast<const char*>(p + sizeof(o)), o.grammar_bytes);
    p += sizeof(o) + o.grammar_bytes;
    left -= sizeof(o) + o.grammar_bytes;
  }
  if (left != 0) {
    return Error("{}: {} bytes follow the last field the sampling flags announce", what, left);
  }
  return Status::Ok();
}

Status CheckSamplingTailsEncodable(const char* what, const wire::SamplingWire& w,
                                   const SamplingExtra& e) {
  if (!HasExtra(w) &&
      (e.presence_penalty != 0 || e.frequency_penalty != 0 || !e.logit_bias.empty())) {
    return Error("{}: extra sampling without the kSamplingExtra flag", what);
  }
  if (((w.flags & wire::kSamplingGrammar) != 0) != !e.grammar.empty()) {
    return Error("{}: a grammar {} the kSamplingGrammar flag", what,
                 e.grammar.empty() ? "is missing under" : "without");
  }
  if (e.grammar.size() > wire::kMaxGrammarBytes) {
    return Error("{}: grammar of {} bytes exceeds the {} KiB limit", what, e.grammar.size(),
                 wire::kMaxGrammarBytes >> 10);
  }
  if ((w.flags & wire::kSamplingLogprobs) == 0 && e.top_logprobs != 0) {
    return Error("{}: top_logprobs without the kSamplingLogprobs flag", what);
  }
  if (e.top_logprobs > wire::kMaxTopLogprobs) {
    return Error("{}: top_logprobs {} exceeds the limit of {}", what, e.top_logprobs,
                 wire::kMaxTopLogprobs);
  }
  if (e.logit_bias.size() > wire::kMaxLogitBias) {
    return Error("{}: {} logit biases exceed the limit of {}", what, e.logit_bias.size(),
                 wire::kMaxLogitBias);
  }
  return Status::Ok();
}

}  // namespace kvasir::ring
