// Tools and earlier calls laid into the prompt: the exact text per template family (Hermes for
// ChatML and the families without a format of their own, Llama 3.1's JSON, Mistral's markers), as
// these models' own templates write them.
#include "serve/tool_prompt.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace kvasir::serve {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr char kTool[] =
    R"({"type": "function", "function": {"name": "get_weather", "description": "Weather", )"
    R"("parameters": {"type": "object", "properties": {"city": {"type": "string"}}, )"
    R"("required": ["city"]}}})";

ToolsRequest Tools() {
  ToolsRequest t;
  ToolDef d;
  d.name = "get_weather";
  d.description = "Weather";
  d.parameters = OrderedJson::parse(
      R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})");
  t.tools.push_back(d);
  return t;
}

std::vector<ChatTurn> Conversation() {
  std::vector<ChatTurn> turns(4);
  turns[0].role = "system";
  turns[0].content = "Be brief.";
  turns[1].role = "user";
  turns[1].content = "Weather in Paris?";
  turns[2].role = "assistant";
  turns[2].tool_calls.push_back({"call_1", "get_weather", R"({"city":"Paris"})"});
  turns[3].role = "tool";
  turns[3].tool_call_id = "call_1";
  turns[3].content = "sunny";
  return turns;
}

const std::string kHermesSystem =
    std::string(
        "Be brief.\n\n# Tools\n\nYou may call one or more functions to assist with the user "
        "query.\n\nYou are provided with function signatures within <tools></tools> XML "
        "tags:\n<tools>\n") +
    kTool +
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
const std::string kHermesCall =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

TEST(ToolPromptTest, ChatMlListsTheToolsInTheSystemTurnAndAnswersInAUserTurn) {
  EXPECT_EQ(FormatToolChat(ChatFamily::kChatMl, Conversation(), Tools()),
            "<|im_start|>system\n" + kHermesSystem +
                "<|im_end|>\n<|im_start|>user\nWeather in Paris?<|im_end|>\n"
                "<|im_start|>assistant\n" +
                kHermesCall +
                "<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>"
                "<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ToolPromptTest, AFamilyWithoutAToolFormatTakesHermesInItsOwnTurns) {
  // Gemma has no system turn: the tools' system text opens the first user turn.
  EXPECT_EQ(FormatToolChat(ChatFamily::kGemma, Conversation(), Tools()),
            "<start_of_turn>user\n" + kHermesSystem +
                "\n\nWeather in Paris?<end_of_turn>\n<start_of_turn>model\n" + kHermesCall +
                "<end_of_turn>\n<start_of_turn>user\n<tool_response>\nsunny\n</tool_response>"
                "<end_of_turn>\n<start_of_turn>model\n");
}

TEST(ToolPromptTest, Llama3PutsTheToolsInTheFirstUserTurnAndResultsInIpython) {
  const std::string tool_indented =
      "{\n    \"type\": \"function\",\n    \"function\": {\n        \"name\": \"get_weather\",\n"
      "        \"description\": \"Weather\",\n        \"parameters\": {\n            \"type\": "
      "\"object\",\n            \"properties\": {\n                \"city\": {\n              "
      "      \"type\": \"string\"\n                }\n            },\n            \"required\": "
      "[\n                \"city\"\n            ]\n        }\n    }\n}";
  EXPECT_EQ(FormatToolChat(ChatFamily::kLlama3, Conversation(), Tools()),
            "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nGiven the following functions, please "
            "respond with a JSON for a function call with its proper arguments that best answers "
            "the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
            "dictionary of argument name and its value}.Do not use variables.\n\n" +
                tool_indented +
                "\n\nWeather in Paris?<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n{\"name\": \"get_weather\", "
                "\"parameters\": {\"city\": \"Paris\"}}<|eot_id|>"
                "<|start_header_id|>ipython<|end_header_id|>\n\nsunny<|eot_id|>"
                "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ToolPromptTest, MistralV3ListsTheToolsBeforeTheLastInstruction) {
  EXPECT_EQ(FormatToolChat(ChatFamily::kMistralV3, Conversation(), Tools()),
            std::string("[AVAILABLE_TOOLS] [") + kTool +
                "][/AVAILABLE_TOOLS][INST] Be brief.\n\nWeather in Paris?[/INST]"
                "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
                "\"id\": \"call_1\"}]</s>[TOOL_RESULTS] {\"content\": \"sunny\", \"call_id\": "
                "\"call_1\"}[/TOOL_RESULTS]");
}

TEST(ToolPromptTest, MistralV7TekkenWritesItsMarkersWithoutSpaces) {
  EXPECT_EQ(FormatToolChat(ChatFamily::kMistralV7Tekken, Conversation(), Tools()),
            std::string("[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][AVAILABLE_TOOLS][") + kTool +
                "][/AVAILABLE_TOOLS][INST]Weather in Paris?[/INST]"
                "[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, "
                "\"id\": \"call_1\"}]</s>[TOOL_RESULTS]{\"content\": \"sunny\", \"call_id\": "
                "\"call_1\"}[/TOOL_RESULTS]");
}

TEST(ToolPromptTest, ToolChoiceNoneShowsNoToolsButKeepsTheHistory) {
  ToolsRequest none = Tools();
  none.choice.kind = ToolChoice::Kind::kNone;
  const std::string text = FormatToolChat(ChatFamily::kChatMl, Conversation(), none);
  EXPECT_EQ(text.find("<tools>"), std::string::npos);
  EXPECT_EQ(text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWeather in "
            "Paris?<|im_end|>\n<|im_start|>assistant\n" +
                kHermesCall +
                "<|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n</tool_response>"
                "<|im_end|>\n<|im_start|>assistant\n");
}

TEST(ToolPromptTest, ConsecutiveResultsShareOneUserTurnAndTextPrecedesCalls) {
  std::vector<ChatTurn> turns(4);
  turns[0].role = "user";
  turns[0].content = "Two cities";
  turns[1].role = "assistant";
  turns[1].content = "Looking.";
  turns[1].tool_calls = {{"a", "get_weather", R"({"city":"A"})"},
                         {"b", "get_weather", R"({"city":"B"})"}};
  turns[2].role = "tool";
  turns[2].content = "rain";
  turns[3].role = "tool";
  turns[3].content = "snow";
  ToolsRequest none;
  EXPECT_EQ(FormatToolChat(ChatFamily::kChatMl, turns, none),
            "<|im_start|>user\nTwo cities<|im_end|>\n<|im_start|>assistant\nLooking.\n"
            "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"A\"}}\n"
            "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
            "\"B\"}}\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nrain\n"
            "</tool_response>\n<tool_response>\nsnow\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ToolPromptTest, APlainConversationKeepsThePlainLayout) {
  CompletionRequest r;
  r.endpoint = Endpoint::kChatCompletions;
  r.messages.push_back({"user", "hi", {}, ""});
  EXPECT_FALSE(NeedsToolLayout(r));
  r.tools = Tools();
  EXPECT_TRUE(NeedsToolLayout(r));
  r.tools.choice.kind = ToolChoice::Kind::kNone;
  EXPECT_FALSE(NeedsToolLayout(r));
}

TEST(ToolPromptTest, TemplateJsonWritesAsPythonsJsonDumps) {
  const auto v = OrderedJson::parse(R"({"b": [1, "x\"y", {}], "a": {"c": null}, "é": []})");
  EXPECT_EQ(TemplateJson(v), R"({"b": [1, "x\"y", {}], "a": {"c": null}, "é": []})");
  EXPECT_EQ(TemplateJson(OrderedJson::parse(R"({"a": [1]})"), 2), "{\n  \"a\": [\n    1\n  ]\n}");
}

}  // namespace
}  // namespace kvasir::serve
