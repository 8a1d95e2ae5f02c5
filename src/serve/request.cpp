#include "serve/request.h"

#include <fmt/format.h>

#include <charconv>
#include <nlohmann/json.hpp>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "ring/tail_sampler.h"
#include "ring/wire.h"
#include "serve/json_fields.h"
#include "serve/tool_request.h"

namespace kvasir::serve {
namespace {

using nlohmann::json;

constexpr size_t kMaxTextBytes = size_t{16} << 20;  // any one string; the body limit comes first
constexpr size_t kMaxUserBytes = 256;
constexpr size_t kMaxModelBytes = 256;

// "prompt": a string, or an array holding one string.
bool ReadPrompt(const json& v, std::string* out, ApiError* e) {
  if (v.is_array()) {
    if (v.size() != 1) {
      *e = Unsupported("prompt", fmt::format("a list of {} prompts (this server answers one "
                                             "prompt per request: send a string)",
                                             v.size()));
      return false;
    }
    if (!v[0].is_string()) {
      *e = Unsupported("prompt", "prompts as token ids (send the text)");
      return false;
    }
    return ReadString(v[0], "prompt[0]", kMaxTextBytes, out, e);
  }
  return ReadString(v, "prompt", kMaxTextBytes, out, e);
}

// "content": a string, an array of {"type": "text", "text": ...} parts (joined with newlines, as
// llama.cpp joins them), or null (an empty message).
bool ReadContent(const json& v, const std::string& param, std::string* out, ApiError* e) {
  if (v.is_null()) {
    out->clear();
    return true;
  }
  if (v.is_string()) return ReadString(v, param, kMaxTextBytes, out, e);
  if (!v.is_array()) {
    *e = BadRequest("invalid_type", param,
                    fmt::format("'{}' must be a string or an array of text parts", param));
    return false;
  }
  out->clear();
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string part = fmt::format("{}[{}]", param, i);
    if (!v[i].is_object()) {
      *e = BadRequest("invalid_type", part, fmt::format("'{}' must be an object", part));
      return false;
    }
    std::string type, text;
    auto t = v[i].find("type");
    if (t == v[i].end()) {
      *e = BadRequest("missing_required_parameter", part + ".type",
                      fmt::format("'{}.type' is required", part));
      return false;
    }
    if (!ReadString(*t, part + ".type", 64, &type, e)) return false;
    if (type != "text") {
      *e = Unsupported(part + ".type", fmt::format("content parts of type '{}' (only text)", type));
      return false;
    }
    for (const auto& [key, value] : v[i].items()) {
      if (key != "type" && key != "text") {
        *e = BadRequest("unknown_parameter", part + "." + key,
                        fmt::format("unrecognized field '{}.{}'", part, key));
        return false;
      }
    }
    auto x = v[i].find("text");
    if (x == v[i].end()) {
      *e = BadRequest("missing_required_parameter", part + ".text",
                      fmt::format("'{}.text' is required", part));
      return false;
    }
    if (!ReadString(*x, part + ".text", kMaxTextBytes, &text, e)) return false;
    if (i > 0) *out += "\n";
    *out += text;
  }
  return true;
}

bool ReadMessages(const json& v, std::vector<ChatTurn>* out, ApiError* e) {
  if (!v.is_array()) {
    *e = BadRequest("invalid_type", "messages", "'messages' must be an array of messages");
    return false;
  }
  if (v.empty() || v.size() > kMaxMessages) {
    *e = BadRequest(
        "invalid_value", "messages",
        fmt::format("'messages' must hold 1 to {} messages, not {}", kMaxMessages, v.size()));
    return false;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = fmt::format("messages[{}]", i);
    if (!v[i].is_object()) {
      *e = BadRequest("invalid_type", at, fmt::format("'{}' must be an object", at));
      return false;
    }
    ChatTurn turn;
    bool has_role = false;
    for (const auto& [key, value] : v[i].items()) {
      const std::string param = at + "." + key;
      if (key == "role") {
        if (!ReadString(value, param, 32, &turn.role, e)) return false;
        has_role = true;
      } else if (key == "content") {
        if (!ReadContent(value, param, &turn.content, e)) return false;
      } else if (key == "tool_calls") {
        if (!value.is_null() && !ReadToolCalls(value, param, &turn.tool_calls, e)) return false;
      } else if (key == "tool_call_id") {
        if (!value.is_null() && !ReadString(value, param, 256, &turn.tool_call_id, e)) {
          return false;
        }
      } else if ((key == "refusal" || key == "audio" || key == "annotations") &&
                 (value.is_null() || (value.is_array() && value.empty()))) {
        continue;  // what OpenAI's answers carry, sent back with a message: nothing to lay out
      } else if (key == "function_call" || key == "name") {
        if (value.is_null()) continue;
        *e = Unsupported(param, key == "name" ? "participant names (no chat template here has a "
                                                "place for them)"
                                              : "function_call (send tool_calls)");
        return false;
      } else {
        *e = BadRequest("unknown_parameter", param, fmt::format("unrecognized field '{}'", param));
        return false;
      }
    }
    if (!has_role) {
      *e = BadRequest("missing_required_parameter", at + ".role",
                      fmt::format("'{}.role' is required", at));
      return false;
    }
    if (turn.role == "developer") turn.role = "system";
    if (turn.role == "function") {
      *e = Unsupported(at + ".role", "messages of role 'function' (send role 'tool')");
      return false;
    }
    if (turn.role != "system" && turn.role != "user" && turn.role != "assistant" &&
        turn.role != "tool") {
      *e = BadRequest("invalid_value", at + ".role",
                      fmt::format("'{}.role' must be system, developer, user, assistant or tool, "
                                  "not '{}'",
                                  at, turn.role));
      return false;
    }
    if (!turn.tool_calls.empty() && turn.role != "assistant") {
      *e = BadRequest("invalid_value", at + ".tool_calls",
                      fmt::format("'{}.tool_calls' belongs to assistant messages", at));
      return false;
    }
    if (turn.role == "tool" && turn.tool_call_id.empty()) {
      *e = BadRequest("missing_required_parameter", at + ".tool_call_id",
                      fmt::format("'{}.tool_call_id' is required for a tool message", at));
      return false;
    }
    out->push_back(std::move(turn));
  }
  return true;
}

bool ReadStop(const json& v, std::vector<std::string>* out, ApiError* e) {
  std::vector<json> items;
  if (v.is_string()) {
    items.push_back(v);
  } else if (v.is_array()) {
    if (v.size() > kMaxStops) {
      *e = BadRequest("invalid_value", "stop",
                      fmt::format("'stop' holds {} strings, at most {}", v.size(), kMaxStops));
      return false;
    }
    items.assign(v.begin(), v.end());
  } else {
    *e = BadRequest("invalid_type", "stop", "'stop' must be a string or an array of strings");
    return false;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    std::string s;
    const std::string param = v.is_array() ? fmt::format("stop[{}]", i) : "stop";
    if (!ReadString(items[i], param, kMaxStopBytes, &s, e)) return false;
    if (!s.empty()) out->push_back(std::move(s));
  }
  return true;
}

bool ReadLogitBias(const json& v, std::vector<std::pair<int32_t, float>>* out, ApiError* e) {
  if (!v.is_object()) {
    *e = BadRequest("invalid_type", "logit_bias",
                    "'logit_bias' must be an object of token ids to biases");
    return false;
  }
  if (v.size() > kMaxLogitBias) {
    *e = BadRequest(
        "invalid_value", "logit_bias",
        fmt::format("'logit_bias' holds {} tokens, at most {}", v.size(), kMaxLogitBias));
    return false;
  }
  for (const auto& [key, value] : v.items()) {
    int32_t id = -1;
    const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || key.empty()) {
      *e = BadRequest("invalid_value", "logit_bias",
                      fmt::format("'logit_bias' key '{}' is not a token id", key.substr(0, 32)));
      return false;
    }
    float bias = 0;
    if (!ReadFloat(value, "logit_bias." + key, -100, 100, false, &bias, e)) return false;
    out->emplace_back(id, bias);
  }
  return true;
}

// stream_options: {"include_usage": bool}.
bool ReadStreamOptions(const json& v, bool* include_usage, ApiError* e) {
  if (!v.is_object()) {
    *e = BadRequest("invalid_type", "stream_options", "'stream_options' must be an object");
    return false;
  }
  for (const auto& [key, value] : v.items()) {
    if (key != "include_usage") {
      *e = BadRequest("unknown_parameter", "stream_options." + key,
                      fmt::format("unrecognized field 'stream_options.{}'", key));
      return false;
    }
    if (!value.is_null() && !ReadBool(value, "stream_options.include_usage", include_usage, e)) {
      return false;
    }
  }
  return true;
}

ApiError BothConstraints() {
  return BadRequest("invalid_value", "grammar",
                    "'grammar' and a JSON 'response_format' each constrain the output: send one "
                    "of them");
}

// response_format's type; the schema is compiled once the whole body is read (CompileOutput),
// from the body parsed again with its members in order (a schema's properties are generated in
// the order they are written).
bool ParseResponseFormat(const json& v, ResponseFormat* out, ApiError* e) {
  if (!v.is_object()) {
    *e = BadRequest("invalid_type", "response_format", "'response_format' must be an object");
    return false;
  }
  auto t = v.find("type");
  std::string type;
  if (t == v.end() || !ReadString(*t, "response_format.type", 64, &type, e)) {
    if (t == v.end()) {
      *e = BadRequest("missing_required_parameter", "response_format.type",
                      "'response_format.type' is required");
    }
    return false;
  }
  if (type == "text") return true;  // free text, or the "grammar" field's
  if (out->kind == ResponseFormat::Kind::kGrammar) {
    *e = BothConstraints();
    return false;
  }
  if (type == "json_object") {
    out->kind = ResponseFormat::Kind::kJsonObject;
  } else if (type == "json_schema") {
    out->kind = ResponseFormat::Kind::kJsonSchema;
  } else {
    *e = BadRequest("invalid_value", "response_format.type",
                    fmt::format("response_format.type '{}' is not one of 'text', 'json_object', "
                                "'json_schema'",
                                type.substr(0, 32)));
    return false;
  }
  return true;
}

// llama-server's "grammar": GBNF text, checked here so that a mistake is the client's 400.
bool ReadGrammar(const json& v, ResponseFormat* out, ApiError* e) {
  if (out->kind != ResponseFormat::Kind::kText) {
    *e = BothConstraints();
    return false;
  }
  std::string text;
  if (!ReadString(v, "grammar", wire::kMaxGrammarBytes, &text, e)) return false;
  if (text.empty()) return true;  // no grammar
  auto g = grammar::Grammar::Parse(text, ring::TailGrammarLimits());
  if (!g.ok()) {
    *e = BadRequest("invalid_value", "grammar", g.status().message());
    return false;
  }
  out->kind = ResponseFormat::Kind::kGrammar;
  out->grammar = std::move(text);
  return true;
}

// The grammar of a JSON response_format, from the body parsed with its members in order.
bool CompileOutput(const nlohmann::ordered_json& ordered, ResponseFormat* out, ApiError* e) {
  auto text = grammar::ResponseFormatGrammarText(ordered.at("response_format"));
  if (!text.ok()) {
    *e = BadRequest("invalid_value", "response_format", text.status().message());
    return false;
  }
  if (text->size() > wire::kMaxGrammarBytes) {
    *e = BadRequest("invalid_value", "response_format",
                    fmt::format("the schema compiles to a grammar of {} KiB, over the limit of {} "
                                "KiB",
                                text->size() >> 10, wire::kMaxGrammarBytes >> 10));
    return false;
  }
  auto g = grammar::Grammar::Parse(*text, ring::TailGrammarLimits());
  if (!g.ok()) {
    *e = BadRequest("invalid_value", "response_format", g.status().message());
    return false;
  }
  out->grammar = std::move(text).value();
  return true;
}

// logprobs: a boolean (chat: then top_logprobs says how many alternatives) or the number of
// alternatives (completions: 0 asks for nothing, as llama-server reads it).
bool ReadLogprobs(const json& v, Endpoint endpoint, LogprobsRequest* out, ApiError* e) {
  if (endpoint == Endpoint::kChatCompletions) return ReadBool(v, "logprobs", &out->enabled, e);
  int64_t n = 0;
  if (!ReadInt(v, "logprobs", 0, wire::kMaxTopLogprobs, &n, e)) return false;
  out->enabled = n > 0;
  out->top = static_cast<int>(n);
  return true;
}

// Fields only their neutral value of which is accepted today.
bool ReadNeutral(const std::string& key, const json& v, Endpoint endpoint, ApiError* e) {
  if (key == "n" || key == "best_of") {
    int64_t n = 0;
    if (!ReadInt(v, key, 1, 128, &n, e)) return false;
    if (n != 1) {
      *e = Unsupported(key, fmt::format("{} = {} (one choice per request: {} = 1)", key, n, key));
      return false;
    }
    return true;
  }
  if (key == "functions") {
    if (v.is_array() && v.empty()) return true;
    *e = Unsupported(key, "functions (send tools)");
    return false;
  }
  if (key == "tools") {  // chat completions read them
    if (v.is_array() && v.empty()) return true;
    *e = Unsupported(key, "tool calls");
    return false;
  }
  if (key == "tool_choice" || key == "function_call") {
    if (v.is_string() && v.get_ref<const std::string&>() == "none") return true;
    *e = Unsupported(key, "tool calls (only \"none\")");
    return false;
  }
  if (key == "parallel_tool_calls") {
    bool b = false;
    return ReadBool(v, key, &b, e);  // says nothing without tools
  }
  if (key == "echo" && endpoint == Endpoint::kCompletions) {
    bool b = false;
    if (!ReadBool(v, key, &b, e)) return false;
    if (b) *e = Unsupported(key, "echoing the prompt");
    return !b;
  }
  if (key == "suffix" && endpoint == Endpoint::kCompletions) {
    if (v.is_string() && v.get_ref<const std::string&>().empty()) return true;
    *e = Unsupported(key, "text after the completion (fill in the middle)");
    return false;
  }
  *e = BadRequest("unknown_parameter", key, fmt::format("unrecognized request field '{}'", key));
  return false;
}

bool ReadField(const std::string& key, const json& v, CompletionRequest* r, bool* has_input,
               ApiError* e) {
  SamplingFields& s = r->sampling;
  const bool chat = r->endpoint == Endpoint::kChatCompletions;
  int64_t i = 0;
  if (key == "model") return ReadString(v, key, kMaxModelBytes, &r->model, e);
  if (key == "prompt" && !chat) return *has_input = ReadPrompt(v, &r->prompt, e);
  if (key == "messages" && chat) return *has_input = ReadMessages(v, &r->messages, e);
  if (key == "max_tokens" || (key == "max_completion_tokens" && chat)) {
    if (!ReadInt(v, key, 1, kMaxTokensLimit, &i, e)) return false;
    if (key == "max_completion_tokens" || !r->max_tokens) r->max_tokens = i;
    return true;
  }
  if (key == "temperature") return ReadFloat(v, key, 0, 2, false, &s.temperature, e);
  if (key == "top_p") return ReadFloat(v, key, 0, 1, /*lo_open=*/true, &s.top_p, e);
  if (key == "min_p") return ReadFloat(v, key, 0, 1, false, &s.min_p, e);
  if (key == "repeat_penalty") return ReadFloat(v, key, 0, 10, true, &s.repeat_penalty, e);
  if (key == "presence_penalty") return ReadFloat(v, key, -2, 2, false, &s.presence_penalty, e);
  if (key == "frequency_penalty") return ReadFloat(v, key, -2, 2, false, &s.frequency_penalty, e);
  if (key == "top_k" || key == "repeat_last_n") {
    if (!ReadInt(v, key, 0, 1 << 20, &i, e)) return false;
    (key == "top_k" ? s.top_k : s.repeat_last_n) = static_cast<int32_t>(i);
    return true;
  }
  if (key == "seed") {
    if (!ReadInt(v, key, INT64_MIN, INT64_MAX, &i, e)) return false;
    s.seed = static_cast<uint64_t>(i);
    return true;
  }
  if (key == "stop") return ReadStop(v, &r->stop, e);
  if (key == "logit_bias") return ReadLogitBias(v, &s.logit_bias, e);
  if (key == "stream") return ReadBool(v, key, &r->stream, e);
  if (key == "stream_options") return ReadStreamOptions(v, &r->include_usage, e);
  if (key == "ignore_eos") return ReadBool(v, key, &r->ignore_eos, e);
  if (key == "user") return ReadString(v, key, kMaxUserBytes, &r->user, e);
  if (key == "response_format") return ParseResponseFormat(v, &r->response_format, e);
  if (key == "grammar") return ReadGrammar(v, &r->response_format, e);
  if (key == "logprobs") return ReadLogprobs(v, r->endpoint, &r->logprobs, e);
  if (key == "tools" && chat) return ReadTools(v, &r->tools.tools, e);
  if (key == "tool_choice" && chat) return ReadToolChoice(v, &r->tools.choice, e);
  if (key == "parallel_tool_calls" && chat) return ReadBool(v, key, &r->tools.parallel, e);
  if (key == "top_logprobs" && chat) {
    if (!ReadInt(v, key, 0, wire::kMaxTopLogprobs, &i, e)) return false;
    r->logprobs.top = static_cast<int>(i);
    return true;
  }
  return ReadNeutral(key, v, r->endpoint, e);
}

}  // namespace

std::optional<CompletionRequest> ParseCompletionRequest(std::string_view body, Endpoint endpoint,
                                                        ApiError* error) {
  auto j = ParseJsonObject(body, kJsonMaxDepth, error);
  if (!j) return std::nullopt;
  CompletionRequest r;
  r.endpoint = endpoint;
  bool has_input = false;
  for (const auto& [key, value] : j->items()) {
    if (value.is_null()) continue;  // OpenAI's clients send null for "not given"
    if (!ReadField(key, value, &r, &has_input, error)) return std::nullopt;
  }
  if (!has_input) {
    const char* field = endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
    *error =
        BadRequest("missing_required_parameter", field, fmt::format("'{}' is required", field));
    return std::nullopt;
  }
  if (endpoint == Endpoint::kChatCompletions && r.logprobs.top > 0 && !r.logprobs.enabled) {
    *error = BadRequest("invalid_value", "top_logprobs", "'top_logprobs' needs 'logprobs': true");
    return std::nullopt;
  }
  const bool json_output = r.response_format.kind == ResponseFormat::Kind::kJsonObject ||
                           r.response_format.kind == ResponseFormat::Kind::kJsonSchema;
  if (!json_output && r.tools.tools.empty()) {  // no schema to compile; tool_choice checked
    if (!CompleteTools(nlohmann::ordered_json::object(), &r.tools, error)) return std::nullopt;
    return r;
  }
  // Schemas are compiled from the body parsed again with its members in order (a schema's
  // properties are generated in the order they are written).
  auto ordered = grammar::ParseJsonText(body);
  if (!ordered.ok()) {  // parsed once already: only the depth limits differ
    *error = BadRequest("invalid_value", json_output ? "response_format" : "tools",
                        ordered.status().message());
    return std::nullopt;
  }
  if (json_output && !CompileOutput(*ordered, &r.response_format, error)) return std::nullopt;
  if (!CompleteTools(*ordered, &r.tools, error)) return std::nullopt;
  if (r.tools.forced() && r.response_format.kind != ResponseFormat::Kind::kText) {
    *error = BadRequest("invalid_value", "tool_choice",
                        "a required tool call and 'response_format' or 'grammar' each constrain "
                        "the output: send one of them");
    return std::nullopt;
  }
  return r;
}

std::optional<TokenizeRequest> ParseTokenizeRequest(std::string_view body, ApiError* error) {
  auto j = ParseJsonObject(body, kJsonMaxDepth, error);
  if (!j) return std::nullopt;
  TokenizeRequest r;
  bool has_content = false;
  for (const auto& [key, value] : j->items()) {
    bool ok = true;
    if (key == "content") {
      ok = has_content = ReadString(value, key, kMaxTextBytes, &r.content, error);
    } else if (key == "add_special") {
      ok = ReadBool(value, key, &r.add_special, error);
    } else if (key == "parse_special") {
      ok = ReadBool(value, key, &r.parse_special, error);
    } else if (key == "with_pieces") {
      ok = ReadBool(value, key, &r.with_pieces, error);
    } else {
      *error = BadRequest("unknown_parameter", key, fmt::format("unrecognized field '{}'", key));
      ok = false;
    }
    if (!ok) return std::nullopt;
  }
  if (!has_content) {
    *error = BadRequest("missing_required_parameter", "content", "'content' is required");
    return std::nullopt;
  }
  return r;
}

std::optional<std::vector<int32_t>> ParseDetokenizeRequest(std::string_view body, ApiError* error) {
  auto j = ParseJsonObject(body, kJsonMaxDepth, error);
  if (!j) return std::nullopt;
  std::optional<std::vector<int32_t>> ids;
  for (const auto& [key, value] : j->items()) {
    if (key != "tokens") {
      *error = BadRequest("unknown_parameter", key, fmt::format("unrecognized field '{}'", key));
      return std::nullopt;
    }
    if (!value.is_array() || value.size() > static_cast<size_t>(kMaxTokensLimit)) {
      *error = BadRequest(
          "invalid_type", "tokens",
          fmt::format("'tokens' must be an array of at most {} token ids", kMaxTokensLimit));
      return std::nullopt;
    }
    ids.emplace();
    for (size_t i = 0; i < value.size(); ++i) {
      int64_t id = 0;
      if (!ReadInt(value[i], fmt::format("tokens[{}]", i), 0, INT32_MAX, &id, error)) {
        return std::nullopt;
      }
      ids->push_back(static_cast<int32_t>(id));
    }
  }
  if (!ids) {
    *error = BadRequest("missing_required_parameter", "tokens", "'tokens' is required");
    return std::nullopt;
  }
  return ids;
}

}  // namespace kvasir::serve
