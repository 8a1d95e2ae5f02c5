// The largest frame a stage accepts on each kind of link, derived from its context so that nothing
// larger than a message it could use is ever buffered (docs/PROTOCOL.md, "Limits"). A record over
// the limit ends the link before any buffer is sized for it.
#pragma once

#include <cstdint>

#include "tokenizer/tokenizer.h"

namespace kvasir::ring {

// Stop strings of one GENERATE a head takes, in bytes together (each with its u16 length).
inline constexpr uint32_t kMaxClientStopBytes = 4096;
// OPEN_SESSION prompts a stage takes from its predecessor, in tokens: the head's context may be
// larger than this stage's, so this does not depend on it.
inline constexpr uint32_t kMaxOpenPromptTokens = 1u << 18;

// The prompt text a head takes: `n_ctx` tokens of the vocabulary's longest token text (at least 4
// bytes each, the longest UTF-8 character), at most wire::kMaxPromptBytes. A prompt longer than
// this cannot fit the context.
uint32_t MaxPromptBytes(const Tokenizer& tokenizer, int n_ctx);

// The largest payload a head takes from a client: GENERATE with a prompt of `max_prompt_bytes`,
// kMaxClientStopBytes of stop strings, the most extra sampling and the largest grammar (every other
// client message is smaller).
uint32_t MaxClientPayload(uint32_t max_prompt_bytes);

// The largest payload a stage takes from a neighbour: HIDDEN of `n_ctx` rows of `n_embd` f32,
// OPEN_SESSION of kMaxOpenPromptTokens (with the most extra sampling and the largest grammar),
// STATS of 1024 records or a full RECEIPT, whichever is largest, at most wire::kMaxPayload.
uint32_t MaxStagePayload(int n_ctx, int n_embd);

}  // namespace kvasir::ring
