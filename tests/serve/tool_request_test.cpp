// The tool-call fields of chat requests: tools with their schemas (member order kept, compiled so
// that an unsupported keyword is refused naming the tool), tool_choice, parallel_tool_calls, and
// the messages of a second turn (assistant tool_calls, tool results); every refusal names its
// field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "serve/request.h"

namespace kvasir::serve {
namespace {

using ::testing::HasSubstr;

constexpr char kWeather[] = R"({"type": "function", "function": {"name": "get_weather",
  "description": "The weather in a city", "strict": true,
  "parameters": {"type": "object", "properties": {"unit": {"enum": ["c", "f"]},
    "city": {"type": "string"}, "days": {"type": "integer", "minimum": 1, "maximum": 7}},
    "required": ["city", "days"]}}})";

std::string Body(const std::string& extra) {
  return R"({"messages": [{"role": "user", "content": "hi"}], "tools": [)" + std::string(kWeather) +
         "]" + extra + "}";
}

CompletionRequest Parse(const std::string& body) {
  ApiError error;
  auto r = ParseCompletionRequest(body, Endpoint::kChatCompletions, &error);
  EXPECT_TRUE(r.has_value()) << error.param << ": " << error.message;
  return r.value_or(CompletionRequest{});
}

ApiError Refusal(const std::string& body, Endpoint e = Endpoint::kChatCompletions) {
  ApiError error;
  auto r = ParseCompletionRequest(body, e, &error);
  EXPECT_FALSE(r.has_value()) << body;
  return error;
}

TEST(ToolRequestTest, ToolsAreReadWithTheirSchemaInTheRequestsOrder) {
  const CompletionRequest r = Parse(Body(""));
  ASSERT_EQ(r.tools.tools.size(), 1u);
  const ToolDef& t = r.tools.tools[0];
  EXPECT_EQ(t.name, "get_weather");
  EXPECT_EQ(t.description, "The weather in a city");
  EXPECT_TRUE(t.strict);
  std::vector<std::string> order;
  for (const auto& [key, value] : t.parameters["properties"].items()) order.push_back(key);
  EXPECT_EQ(order, (std::vector<std::string>{"unit", "city", "days"}));
  EXPECT_EQ(r.tools.choice.kind, ToolChoice::Kind::kAuto);
  EXPECT_TRUE(r.tools.parallel);
  EXPECT_TRUE(r.tools.active());
  EXPECT_FALSE(r.tools.forced());
}

TEST(ToolRequestTest, ToolChoiceTakesEachOfItsForms) {
  EXPECT_EQ(Parse(Body(R"(, "tool_choice": "none")")).tools.choice.kind, ToolChoice::Kind::kNone);
  EXPECT_FALSE(Parse(Body(R"(, "tool_choice": "none")")).tools.active());
  EXPECT_TRUE(Parse(Body(R"(, "tool_choice": "required")")).tools.forced());
  const CompletionRequest named =
      Parse(Body(R"(, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
              "parallel_tool_calls": false)"));
  EXPECT_EQ(named.tools.choice.kind, ToolChoice::Kind::kNamed);
  EXPECT_EQ(named.tools.choice.name, "get_weather");
  EXPECT_FALSE(named.tools.parallel);
  EXPECT_TRUE(named.tools.forced());
}

TEST(ToolRequestTest, AToolChoiceThatCannotBeHonouredIsRefusedNamingIt) {
  EXPECT_EQ(Refusal(Body(R"(, "tool_choice": "always")")).param, "tool_choice");
  EXPECT_EQ(Refusal(Body(R"(, "tool_choice": 3)")).param, "tool_choice");
  const ApiError unknown =
      Refusal(Body(R"(, "tool_choice": {"type": "function", "function": {"name": "other"}})"));
  EXPECT_EQ(unknown.param, "tool_choice.function.name");
  EXPECT_THAT(unknown.message, HasSubstr("other"));
  EXPECT_EQ(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "tool_choice":
                       "required"})")
                .param,
            "tool_choice");
  EXPECT_EQ(Refusal(Body(R"(, "parallel_tool_calls": "yes")")).param, "parallel_tool_calls");
}

TEST(ToolRequestTest, AMalformedToolIsRefusedNamingTheField) {
  auto with = [](const std::string& tool) {
    return R"({"messages": [{"role": "user", "content": "x"}], "tools": [)" + tool + "]}";
  };
  EXPECT_EQ(Refusal(with(R"({"type": "retrieval", "function": {"name": "f"}})")).param,
            "tools[0].type");
  EXPECT_EQ(Refusal(with(R"({"type": "function"})")).param, "tools[0].function");
  EXPECT_EQ(Refusal(with(R"({"type": "function", "function": {}})")).param,
            "tools[0].function.name");
  EXPECT_EQ(Refusal(with(R"({"type": "function", "function": {"name": "a b"}})")).param,
            "tools[0].function.name");
  EXPECT_EQ(Refusal(with(R"({"type": "function", "function": {"name": "f", "x": 1}})")).param,
            "tools[0].function.x");
  EXPECT_EQ(Refusal(with(R"({"type": "function", "function": {"name": "f"}},
                            {"type": "function", "function": {"name": "f"}})"))
                .param,
            "tools[1].function.name");
  EXPECT_EQ(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "tools": {}})").param,
            "tools");
}

TEST(ToolRequestTest, AnUnsupportedSchemaKeywordIsRefusedNamingTheToolAndTheKeyword) {
  const ApiError e = Refusal(
      R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
          "function": {"name": "f", "parameters": {"type": "object", "properties":
          {"n": {"type": "integer", "multipleOf": 3}}}}}]})");
  EXPECT_EQ(e.param, "tools[0].function.parameters");
  EXPECT_THAT(e.message, HasSubstr("multipleOf"));
}

TEST(ToolRequestTest, ParametersMustDescribeAnObject) {
  const ApiError e = Refusal(
      R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
          "function": {"name": "f", "parameters": {"type": "string"}}}]})");
  EXPECT_EQ(e.param, "tools[0].function.parameters");
  EXPECT_THAT(e.message, HasSubstr("object"));
}

TEST(ToolRequestTest, AToolWithoutParametersTakesNoArguments) {
  const CompletionRequest r = Parse(
      R"({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
          "function": {"name": "now"}}]})");
  ASSERT_EQ(r.tools.tools.size(), 1u);
  EXPECT_EQ(r.tools.tools[0].parameters["type"], "object");
}

TEST(ToolRequestTest, ASecondTurnCarriesTheCallsAndTheirResults) {
  const CompletionRequest r = Parse(R"({"messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
        "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 1}"}}]},
      {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
      {"role": "assistant", "content": "Sunny.", "refusal": null, "annotations": []}]})");
  ASSERT_EQ(r.messages.size(), 4u);
  ASSERT_EQ(r.messages[1].tool_calls.size(), 1u);
  EXPECT_EQ(r.messages[1].content, "");
  EXPECT_EQ(r.messages[1].tool_calls[0].id, "call_1");
  EXPECT_EQ(r.messages[1].tool_calls[0].name, "get_weather");
  EXPECT_EQ(r.messages[1].tool_calls[0].arguments, R"({"city": "Paris", "days": 1})");
  EXPECT_EQ(r.messages[2].role, "tool");
  EXPECT_EQ(r.messages[2].tool_call_id, "call_1");
  EXPECT_EQ(r.messages[2].content, "sunny");
}

TEST(ToolRequestTest, MalformedCallsAndResultsAreRefusedNamingTheField) {
  auto with = [](const std::string& message) {
    return R"({"messages": [{"role": "user", "content": "x"}, )" + message + "]}";
  };
  EXPECT_EQ(Refusal(with(R"({"role": "tool", "content": "r"})")).param, "messages[1].tool_call_id");
  EXPECT_EQ(Refusal(with(R"({"role": "assistant", "tool_calls": [{"type": "function",
                             "function": {"name": "f", "arguments": "not json"}}]})"))
                .param,
            "messages[1].tool_calls[0].function.arguments");
  EXPECT_EQ(Refusal(with(R"({"role": "assistant", "tool_calls": [{"type": "function",
                             "function": {"name": "f"}}]})"))
                .param,
            "messages[1].tool_calls[0].function.arguments");
  EXPECT_EQ(Refusal(with(R"({"role": "user", "content": "x", "tool_calls": [{"type":
                             "function", "function": {"name": "f", "arguments": "{}"}}]})"))
                .param,
            "messages[1].tool_calls");
  EXPECT_EQ(Refusal(with(R"({"role": "function", "content": "x"})")).param, "messages[1].role");
  EXPECT_EQ(Refusal(with(R"({"role": "assistant", "content": "x", "refusal": "no"})")).param,
            "messages[1].refusal");
}

TEST(ToolRequestTest, ARequiredCallAndAResponseFormatAreNotBothHonoured) {
  EXPECT_EQ(Refusal(Body(R"(, "tool_choice": "required",
                           "response_format": {"type": "json_object"})"))
                .param,
            "tool_choice");
}

TEST(ToolRequestTest, CompletionsStillTakeNoTools) {
  EXPECT_EQ(Refusal(R"({"prompt": "x", "tools": [{"type": "function", "function":
                       {"name": "f"}}]})",
                    Endpoint::kCompletions)
                .param,
            "tools");
}

}  // namespace
}  // namespace kvasir::serve
