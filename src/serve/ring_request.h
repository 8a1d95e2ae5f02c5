// A checked API request turned into what the ring runs: the prompt text the head tokenizes (the
// chat messages laid out by the model's chat template) and the GENERATE message with every
// sampling field mapped onto the ring's sampling (ring/sampling_wire.h), extra sampling
// (penalties, logit biases) under its flag only when asked for, so that plain requests run on
// rings that predate it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "ring/messages.h"
#include "serve/api_error.h"
#include "serve/request.h"
#include "tokenizer/chat_template.h"

namespace kvasir::serve {

// max_tokens when a completion request names none (OpenAI's default).
inline constexpr uint32_t kDefaultCompletionTokens = 16;
// ... and a chat request: until the context is full or the model ends its turn.
inline constexpr uint32_t kUntilContextEnds = UINT32_MAX;

// The text to send: the prompt, or the messages in `family`'s layout with the assistant's turn
// opened. A chat request without a family is refused (the server names how to choose one).
std::optional<std::string> PromptText(const CompletionRequest& request,
                                      const std::optional<ChatFamily>& family, ApiError* error);

// The GENERATE message for `request` with `prompt_text`, sampling with `seed` when the request
// names none. Special tokens in the text are parsed and BOS added as the vocabulary asks, as
// `kvasir generate` does; stop strings stay with the caller (StopFilter), which ends the session.
ring::GenerateMsg ToGenerate(const CompletionRequest& request, std::string prompt_text,
                             uint64_t seed);

}  // namespace kvasir::serve
