// The grammar that makes a model's answer be tool calls: for tool_choice "required" (any of the
// tools) or a named function (that one), in the family's call format (tool_prompt.h), each call
// {"name": <one of the tools' names>, "arguments": <that tool's parameters schema>} ("parameters"
// for Llama 3), one call or, with parallel_tool_calls, up to kMaxParallelCalls. The ring's last
// stage applies it to every draw, so even a weak model returns calls that parse and match the
// schemas (unless max_tokens cuts them).
#pragma once

#include <string>

#include "base/status.h"
#include "serve/api_error.h"
#include "serve/request.h"
#include "tokenizer/chat_template.h"

namespace kvasir::serve {

inline constexpr int kMaxParallelCalls = 8;

// The grammar text (root rule "root") for `tools` (tools.forced() must hold) in `family`'s
// format. Mistral's [TOOL_CALLS] and Llama's <|python_tag|> are control tokens that no grammar
// may draw, so their calls are enforced bare (the JSON array, the JSON object).
Result<std::string> ToolCallGrammarText(ChatFamily family, const ToolsRequest& tools);

// When `request` forces a call: its grammar set as the request's output constraint (checked to
// parse, as the ring's last stage will parse it). An error is the client's 400 naming `tools`.
bool ApplyToolGrammar(ChatFamily family, CompletionRequest* request, ApiError* error);

}  // namespace kvasir::serve
