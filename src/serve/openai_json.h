// The answers of the OpenAI-compatible API, as OpenAI shapes them: a completion and a chat
// completion whole, their stream chunks as Server-Sent Events (`data: {json}` each, then
// `data: [DONE]`), the usage block, and the model list. Pure: the same input gives the same bytes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "serve/request.h"

namespace kvasir::serve {

// What every chunk of one answer repeats.
struct AnswerMeta {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string id;       // "cmpl-..." or "chatcmpl-..."
  std::string model;    // the served model's name
  int64_t created = 0;  // Unix seconds
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;  // prompt tokens served from the ring's prompt cache
};

// One generated token's log-probability and its most likely alternatives, as an answer reports
// them (natural logs; texts are the tokens' bytes, not always whole UTF-8 characters).
struct TokenLogprobs {
  std::string token;
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};

// The log-probabilities of a run of an answer's tokens, whose text starts `text_offset` bytes
// into the answer. As choices[].logprobs: a chat answer's {"content": [{"token", "logprob",
// "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}; a completion's
// {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}.
struct LogprobsPart {
  std::span<const TokenLogprobs> entries;
  size_t text_offset = 0;
};

// "cmpl-" or "chatcmpl-" and 24 random hex digits.
std::string NewAnswerId(Endpoint endpoint);

// The whole answer: {"id", "object": "text_completion" | "chat.completion", "created", "model",
// "choices": [{"index": 0, "text" | "message", "logprobs": null, "finish_reason"}], "usage"}.
// `logprobs`: when the request asked for them (else "logprobs": null). `calls`: the tool calls of
// a chat answer, as message.tool_calls [{"id", "type": "function", "function": {"name",
// "arguments"}}]; with them, a content of only whitespace is null.
std::string AnswerBody(const AnswerMeta& meta, const std::string& text,
                       const std::string& finish_reason, const Usage& usage,
                       const LogprobsPart* logprobs = nullptr,
                       std::span<const ToolCall> calls = {});

// One stream chunk as an SSE event. `text` is the new text (the chat delta's content);
// `finish_reason` is "" until the last chunk; `first` opens a chat answer with the assistant's
// role; `usage_null` adds "usage": null (stream_options.include_usage asked for usage at the end).
std::string ChunkEvent(const AnswerMeta& meta, const std::string& text,
                       const std::string& finish_reason, bool first, bool usage_null,
                       const LogprobsPart* logprobs = nullptr);
// A piece of a tool call of a streamed chat answer: delta.tool_calls [{"index", "id", "type":
// "function", "function": {"name", "arguments"}}] for the call's first piece (`id` not empty),
// [{"index", "function": {"arguments"}}] for the next ones.
std::string ToolCallChunk(const AnswerMeta& meta, int index, const std::string& id,
                          const std::string& name, const std::string& arguments, bool usage_null);
// The chunk after the last one when include_usage: no choices, the usage.
std::string UsageEvent(const AnswerMeta& meta, const Usage& usage);
// "data: [DONE]\n\n".
std::string DoneEvent();
// "data: <json>\n\n" (the JSON is one line; bytes that are not UTF-8 are replaced).
std::string SseEvent(const std::string& json_text);

// GET /v1/models: {"object": "list", "data": [{"id", "object": "model", "created", "owned_by"}]}.
std::string ModelsBody(const std::string& model, int64_t created);

}  // namespace kvasir::serve
