// The answers' shapes as OpenAI's clients read them, and their framing as Server-Sent Events.
#include "serve/openai_json.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "serve/api_error.h"

namespace kvasir::serve {
namespace {

using nlohmann::json;

AnswerMeta Meta(Endpoint e) { return {e, "id-1", "stories", 1700000000}; }

// The JSON of one SSE event, after checking its framing.
json EventJson(const std::string& event) {
  EXPECT_EQ(event.rfind("data: ", 0), 0u) << event;
  EXPECT_EQ(event.substr(event.size() - 2), "\n\n") << event;
  const std::string payload = event.substr(6, event.size() - 8);
  EXPECT_EQ(payload.find('\n'), std::string::npos) << "one line per event";
  return json::parse(payload);
}

TEST(OpenAiJsonTest, ACompletionAnswer) {
  const json j =
      json::parse(AnswerBody(Meta(Endpoint::kCompletions), "Once", "length", {5, 16, 0}));
  EXPECT_EQ(j["id"], "id-1");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["created"], 1700000000);
  EXPECT_EQ(j["model"], "stories");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], "Once");
  EXPECT_EQ(j["choices"][0]["index"], 0);
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(j["usage"]["completion_tokens"], 16);
  EXPECT_EQ(j["usage"]["total_tokens"], 21);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
}

TEST(OpenAiJsonTest, LogprobsInEachEndpointsShape) {
  const std::vector<TokenLogprobs> entries = {
      {"Once", -0.5f, {{"Once", -0.5f}, {"One", -1.25f}}},
      {" upon", -0.25f, {{" upon", -0.25f}, {" Once", -2.0f}}},
  };
  const LogprobsPart part{entries, 4};
  const json c = json::parse(
      AnswerBody(Meta(Endpoint::kCompletions), "Once upon", "length", {1, 2, 0}, &part));
  const json& l = c["choices"][0]["logprobs"];
  EXPECT_EQ(l["tokens"], json({"Once", " upon"}));
  EXPECT_EQ(l["token_logprobs"], json({-0.5, -0.25}));
  EXPECT_EQ(l["top_logprobs"][1], json({{" upon", -0.25}, {" Once", -2.0}}));
  EXPECT_EQ(l["text_offset"], json({4, 8}));

  const json chat =
      EventJson(ChunkEvent(Meta(Endpoint::kChatCompletions), "Once upon", "", false, false, &part));
  const json& content = chat["choices"][0]["logprobs"]["content"];
  ASSERT_EQ(content.size(), 2u);
  EXPECT_EQ(content[0]["token"], "Once");
  EXPECT_EQ(content[0]["logprob"], -0.5);
  EXPECT_EQ(content[0]["bytes"], json({79, 110, 99, 101}));
  ASSERT_EQ(content[0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(content[0]["top_logprobs"][1]["token"], "One");
  EXPECT_EQ(content[0]["top_logprobs"][1]["logprob"], -1.25);
  EXPECT_TRUE(chat["choices"][0]["logprobs"]["refusal"].is_null());
}

TEST(OpenAiJsonTest, AChatAnswer) {
  const json j =
      json::parse(AnswerBody(Meta(Endpoint::kChatCompletions), "Hi!", "stop", {9, 2, 0}));
  EXPECT_EQ(j["object"], "chat.completion");
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hi!");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(j["choices"][0].contains("text"));
}

TEST(OpenAiJsonTest, AChatAnswerWithToolCalls) {
  const std::vector<ToolCall> calls = {{"call_a", "get_weather", R"({"city":"Paris"})"},
                                       {"call_b", "now", "{}"}};
  const json j = json::parse(
      AnswerBody(Meta(Endpoint::kChatCompletions), "\n", "tool_calls", {9, 2, 0}, nullptr, calls));
  const json& message = j["choices"][0]["message"];
  EXPECT_TRUE(message["content"].is_null());  // only whitespace before the calls
  ASSERT_EQ(message["tool_calls"].size(), 2u);
  EXPECT_EQ(message["tool_calls"][0],
            json({{"id", "call_a"},
                  {"type", "function"},
                  {"function", {{"name", "get_weather"}, {"arguments", R"({"city":"Paris"})"}}}}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  const json with_text = json::parse(AnswerBody(Meta(Endpoint::kChatCompletions), "Looking.",
                                                "tool_calls", {9, 2, 0}, nullptr, calls));
  EXPECT_EQ(with_text["choices"][0]["message"]["content"], "Looking.");
}

TEST(OpenAiJsonTest, AToolCallStreamsItsIdAndNameFirstThenArguments) {
  const AnswerMeta m = Meta(Endpoint::kChatCompletions);
  const json first = EventJson(ToolCallChunk(m, 1, "call_a", "now", "{\"tz", true));
  EXPECT_EQ(first["choices"][0]["delta"]["tool_calls"][0],
            json({{"index", 1},
                  {"id", "call_a"},
                  {"type", "function"},
                  {"function", {{"name", "now"}, {"arguments", "{\"tz"}}}}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_TRUE(first.contains("usage") && first["usage"].is_null());
  const json next = EventJson(ToolCallChunk(m, 1, "", "", "\":1}", false));
  EXPECT_EQ(next["choices"][0]["delta"]["tool_calls"][0],
            json({{"index", 1}, {"function", {{"arguments", "\":1}"}}}}));
  EXPECT_FALSE(next.contains("usage"));
}

TEST(OpenAiJsonTest, ChatChunksOpenWithTheRoleAndCloseWithTheReason) {
  const AnswerMeta m = Meta(Endpoint::kChatCompletions);
  const json first = EventJson(ChunkEvent(m, "", "", true, false));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(first["choices"][0]["delta"]["content"], "");
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));
  const json text = EventJson(ChunkEvent(m, "Hel", "", false, true));
  EXPECT_EQ(text["choices"][0]["delta"], json({{"content", "Hel"}}));
  EXPECT_TRUE(text.contains("usage") && text["usage"].is_null());
  const json last = EventJson(ChunkEvent(m, "", "length", false, false));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "length");
  const json usage = EventJson(UsageEvent(m, {3, 4, 0}));
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["total_tokens"], 7);
  EXPECT_EQ(DoneEvent(), "data: [DONE]\n\n");
}

TEST(OpenAiJsonTest, CompletionChunksCarryText) {
  const json j = EventJson(ChunkEvent(Meta(Endpoint::kCompletions), " upon", "", false, false));
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["choices"][0]["text"], " upon");
}

TEST(OpenAiJsonTest, TextThatIsNotUtf8NeverBreaksTheJson) {
  const json j =
      EventJson(ChunkEvent(Meta(Endpoint::kCompletions), "a\xff\n\"b", "", false, false));
  EXPECT_EQ(j["choices"][0]["text"], "a\xEF\xBF\xBD\n\"b");
}

TEST(OpenAiJsonTest, ErrorsAndModelsHaveOpenAisShape) {
  ApiError e = BadRequest("invalid_type", "temperature", "'temperature' must be a number");
  json j = json::parse(ErrorBody(e));
  EXPECT_EQ(j["error"]["message"], "'temperature' must be a number");
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["code"], "invalid_type");
  EXPECT_EQ(j["error"]["param"], "temperature");
  e.param.clear();
  e.code.clear();
  j = json::parse(ErrorBody(e));
  EXPECT_TRUE(j["error"]["param"].is_null());
  EXPECT_TRUE(j["error"]["code"].is_null());
  const json models = json::parse(ModelsBody("stories", 5));
  EXPECT_EQ(models["object"], "list");
  EXPECT_EQ(models["data"][0],
            json({{"id", "stories"}, {"object", "model"}, {"created", 5}, {"owned_by", "kvasir"}}));
}

TEST(OpenAiJsonTest, AnswerIdsAreFreshAndShaped) {
  const std::string a = NewAnswerId(Endpoint::kCompletions);
  const std::string b = NewAnswerId(Endpoint::kChatCompletions);
  EXPECT_THAT(a, ::testing::MatchesRegex("cmpl-[0-9a-f]{24}"));
  EXPECT_THAT(b, ::testing::MatchesRegex("chatcmpl-[0-9a-f]{24}"));
  EXPECT_NE(a.substr(5), NewAnswerId(Endpoint::kCompletions).substr(5));
}

}  // namespace
}  // namespace kvasir::serve
