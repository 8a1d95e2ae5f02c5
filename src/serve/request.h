// The requests of the OpenAI-compatible API as pure functions of their bodies: JSON in, a checked
// request or an ApiError naming the field out. Nothing here touches a socket or a ring, so the
// unit tests and the fuzzer (tests/fuzz/serve_request_fuzz.cpp) call them directly.
//
// Every field is checked for its type and range; a field this server does not know is refused
// (as OpenAI does), and one it knows but cannot honour yet (n > 1) is refused
// naming it, rather than silently ignored.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "serve/api_error.h"

namespace kvasir::serve {

enum class Endpoint { kCompletions, kChatCompletions };

// Limits on what one request may hold (the HTTP body limit comes first).
inline constexpr size_t kMaxMessages = 1024;
inline constexpr size_t kMaxStops = 16;
inline constexpr size_t kMaxStopBytes = 256;
inline constexpr size_t kMaxLogitBias = 1024;  // ring/wire.h kMaxLogitBias
inline constexpr int64_t kMaxTokensLimit = 1 << 20;
inline constexpr int kJsonMaxDepth = 32;

// One call of a tool: one the model made (parsed from its output), or one of an earlier
// assistant turn that the client sends back.
struct ToolCall {
  std::string id;         // "call_..." (ours), or whatever the client sent
  std::string name;       // the function's name
  std::string arguments;  // a JSON object's text
};

struct ChatTurn {
  std::string role;  // "system", "user", "assistant" or "tool" ("developer" arrives as "system")
  std::string content;
  std::vector<ToolCall> tool_calls{};  // assistant: the calls it made (content may then be empty)
  std::string tool_call_id{};          // tool: the call this message answers
};

// A function the model may call (tools[i] with type "function").
struct ToolDef {
  std::string name;  // 1 to 64 of [a-zA-Z0-9_-]
  std::string description;
  nlohmann::ordered_json parameters;  // a JSON schema, members in the request's order
  bool strict = false;                // accepted; every call is held to the schema when enforced
};

// tool_choice: "auto" lets the model answer or call; "none" lays no tools into the prompt;
// "required" and a named function make the ring's last stage enforce a call by grammar.
struct ToolChoice {
  enum class Kind { kAuto, kNone, kRequired, kNamed };
  Kind kind = Kind::kAuto;
  std::string name;  // kNamed
};

struct ToolsRequest {
  std::vector<ToolDef> tools;
  ToolChoice choice;     // absent: "auto" with tools, "none" without
  bool parallel = true;  // parallel_tool_calls: more than one call per answer
  // True when tools are laid into the prompt and the answer is parsed for calls.
  bool active() const { return !tools.empty() && choice.kind != ToolChoice::Kind::kNone; }
  // True when the answer must be calls (a grammar enforces them).
  bool forced() const {
    return active() &&
           (choice.kind == ToolChoice::Kind::kRequired || choice.kind == ToolChoice::Kind::kNamed);
  }
};

// Sampling as the request asks for it. Absent fields keep these defaults, which are those of
// `kvasir generate` (and llama-server), so a request that names only a seed samples as
// `kvasir generate --seed` does.
struct SamplingFields {
  float temperature = 0.8f;
  float top_p = 0.95f;
  int32_t top_k = 40;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int32_t repeat_last_n = 64;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  std::vector<std::pair<int32_t, float>> logit_bias;  // token id, bias; ids not yet checked
  std::optional<uint64_t> seed;                       // absent: a random one per request
};

// How the answer must be shaped: free text, or text a grammar admits (response_format
// {"type": "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}} compiled by
// grammar/json_schema.h, or llama-server's "grammar" field in GBNF). The ring's last stage draws
// only tokens the grammar allows.
struct ResponseFormat {
  enum class Kind { kText, kJsonObject, kJsonSchema, kGrammar };
  Kind kind = Kind::kText;
  std::string grammar;  // GBNF text (docs/GRAMMAR.md), parsed once here; empty for kText
};

// Log-probabilities of the answer's tokens, computed at the ring's last stage from the logits it
// samples from: the sampled token's and `top` alternatives' (at most wire::kMaxTopLogprobs).
struct LogprobsRequest {
  bool enabled = false;
  int top = 0;
};

struct CompletionRequest {
  Endpoint endpoint = Endpoint::kCompletions;
  std::string model;               // "" when absent: the served model
  std::string prompt;              // kCompletions
  std::vector<ChatTurn> messages;  // kChatCompletions, at least one
  // max_tokens (or max_completion_tokens, which wins); absent: the endpoint's default.
  std::optional<int64_t> max_tokens;
  SamplingFields sampling;
  std::vector<std::string> stop;  // non-empty strings; the text before the first one is returned
  bool ignore_eos = false;        // llama-server's: generate past end-of-generation tokens
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string user;
  ResponseFormat response_format;
  LogprobsRequest logprobs;
  ToolsRequest tools;  // chat only
};

// The request of `endpoint` in `body`; nullopt and `*error` set when it is refused.
std::optional<CompletionRequest> ParseCompletionRequest(std::string_view body, Endpoint endpoint,
                                                        ApiError* error);

// llama-server's POST /tokenize: {"content": "text", "add_special": false, "with_pieces": false}.
struct TokenizeRequest {
  std::string content;
  bool add_special = false;
  bool parse_special = true;  // llama-server parses special-token text in /tokenize
  bool with_pieces = false;
};
std::optional<TokenizeRequest> ParseTokenizeRequest(std::string_view body, ApiError* error);

// llama-server's POST /detokenize: {"tokens": [1, 2, 3]} (at most kMaxTokensLimit ids).
std::optional<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body, ApiError* error);

}  // namespace kvasir::serve
