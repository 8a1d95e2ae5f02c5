#include "serve/openai_json.h"

#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <random>

namespace kvasir::serve {
namespace {

using json = nlohmann::ordered_json;

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

bool IsChat(const AnswerMeta& m) { return m.endpoint == Endpoint::kChatCompletions; }

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json Head(const AnswerMeta& m, const char* object) {
  return {{"id", m.id}, {"object", object}, {"created", m.created}, {"model", m.model}};
}

json Finish(const std::string& reason) { return reason.empty() ? json(nullptr) : json(reason); }

json Bytes(const std::string& text) {
  json b = json::array();
  for (unsigned char c : text) b.push_back(c);
  return b;
}

json LogprobsJson(const AnswerMeta& m, const LogprobsPart* part) {
  if (part == nullptr) return nullptr;
  if (IsChat(m)) {
    json content = json::array();
    for (const TokenLogprobs& e : part->entries) {
      json top = json::array();
      for (const auto& [token, logprob] : e.top) {
        top.push_back({{"token", token}, {"logprob", logprob}, {"bytes", Bytes(token)}});
      }
      content.push_back({{"token", e.token},
                         {"logprob", e.logprob},
                         {"bytes", Bytes(e.token)},
                         {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), logprobs = json::array(), tops = json::array(),
       offsets = json::array();
  size_t offset = part->text_offset;
  for (const TokenLogprobs& e : part->entries) {
    tokens.push_back(e.token);
    logprobs.push_back(e.logprob);
    json top = json::object();
    for (const auto& [token, logprob] : e.top) {
      if (!top.contains(token)) top[token] = logprob;  // two ids with one text: the likelier
    }
    tops.push_back(top);
    offsets.push_back(offset);
    offset += e.token.size();
  }
  return {{"tokens", tokens},
          {"token_logprobs", logprobs},
          {"top_logprobs", tops},
          {"text_offset", offsets}};
}

}  // namespace

std::string NewAnswerId(Endpoint endpoint) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return fmt::format("{}-{:016x}{:08x}",
                     endpoint == Endpoint::kChatCompletions ? "chatcmpl" : "cmpl", rng(),
                     static_cast<uint32_t>(rng()));
}

std::string AnswerBody(const AnswerMeta& m, const std::string& text,
                       const std::string& finish_reason, const Usage& usage,
                       const LogprobsPart* logprobs, std::span<const ToolCall> calls) {
  json j = Head(m, IsChat(m) ? "chat.completion" : "text_completion");
  json choice = {{"index", 0},
                 {"logprobs", LogprobsJson(m, logprobs)},
                 {"finish_reason", Finish(finish_reason)}};
  if (IsChat(m)) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
    if (!calls.empty()) {
      // OpenAI's content beside calls: the text before them, or null when there is none.
      const bool blank = text.find_first_not_of(" \t\r\n") == std::string::npos;
      if (blank) choice["message"]["content"] = nullptr;
      json list = json::array();
      for (const ToolCall& c : calls) {
        list.push_back({{"id", c.id},
                        {"type", "function"},
                        {"function", {{"name", c.name}, {"arguments", c.arguments}}}});
      }
      choice["message"]["tool_calls"] = std::move(list);
    }
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string ChunkEvent(const AnswerMeta& m, const std::string& text,
                       const std::string& finish_reason, bool first, bool usage_null,
                       const LogprobsPart* logprobs) {
  json j = Head(m, IsChat(m) ? "chat.completion.chunk" : "text_completion");
  json choice = {{"index", 0},
                 {"logprobs", LogprobsJson(m, logprobs)},
                 {"finish_reason", Finish(finish_reason)}};
  if (IsChat(m)) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (first || !text.empty()) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  j["choices"] = json::array({choice});
  if (usage_null) j["usage"] = nullptr;
  return SseEvent(Dump(j));
}

std::string ToolCallChunk(const AnswerMeta& m, int index, const std::string& id,
                          const std::string& name, const std::string& arguments, bool usage_null) {
  json call = {{"index", index}};
  if (!id.empty()) {
    call["id"] = id;
    call["type"] = "function";
    call["function"] = {{"name", name}, {"arguments", arguments}};
  } else {
    call["function"] = {{"arguments", arguments}};
  }
  json j = Head(m, "chat.completion.chunk");
  j["choices"] = json::array({{{"index", 0},
                               {"logprobs", nullptr},
                               {"finish_reason", nullptr},
                               {"delta", {{"tool_calls", json::array({call})}}}}});
  if (usage_null) j["usage"] = nullptr;
  return SseEvent(Dump(j));
}

std::string UsageEvent(const AnswerMeta& m, const Usage& usage) {
  json j = Head(m, IsChat(m) ? "chat.completion.chunk" : "text_completion");
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return SseEvent(Dump(j));
}

std::string DoneEvent() { return "data: [DONE]\n\n"; }

std::string SseEvent(const std::string& json_text) { return "data: " + json_text + "\n\n"; }

std::string ModelsBody(const std::string& model, int64_t created) {
  json j = {
      {"object", "list"},
      {"data",
       json::array(
           {{{"id", model}, {"object", "model"}, {"created", created}, {"owned_by", "kvasir"}}})}};
  return Dump(j);
}

}  // namespace kvasir::serve
