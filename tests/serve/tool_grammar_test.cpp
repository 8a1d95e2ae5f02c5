// The grammar of a required or named tool call: it admits calls that name a tool and whose
// arguments follow that tool's schema, in the family's format, and nothing else; what it admits,
// the call parser reads back as calls whose arguments validate against the schema.
#include "serve/tool_grammar.h"

#include <gtest/gtest.h>

#include <random>
#include <string>

#include "grammar/grammar_test_util.h"
#include "grammar/schema_validator.h"
#include "serve/tool_output.h"

namespace kvasir::serve {
namespace {

using grammar::testing::FullMatch;
using grammar::testing::MustParse;
using OrderedJson = nlohmann::ordered_json;

ToolsRequest Tools(ToolChoice::Kind kind = ToolChoice::Kind::kRequired, bool parallel = false) {
  ToolsRequest t;
  ToolDef weather;
  weather.name = "get_weather";
  weather.parameters = OrderedJson::parse(R"({"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 12},
      "days": {"type": "integer", "minimum": 1, "maximum": 7},
      "unit": {"enum": ["c", "f"]}}, "required": ["city", "days"]})");
  ToolDef now;
  now.name = "now";
  now.parameters = OrderedJson::parse(R"({"type": "object", "$defs": {"zone": {"enum":
      ["UTC", "CET"]}}, "properties": {"tz": {"$ref": "#/$defs/zone"}}})");
  t.tools = {weather, now};
  t.choice.kind = kind;
  if (kind == ToolChoice::Kind::kNamed) t.choice.name = "now";
  t.parallel = parallel;
  return t;
}

std::shared_ptr<const grammar::Grammar> Compile(ChatFamily family, const ToolsRequest& tools) {
  auto text = ToolCallGrammarText(family, tools);
  EXPECT_TRUE(text.ok()) << text.status().message();
  return text.ok() ? MustParse(*text) : nullptr;
}

std::string Hermes(const std::string& call) { return "<tool_call>\n" + call + "\n</tool_call>"; }

const std::string kParis = R"({"name": "get_weather", "arguments": {"city": "Paris", "days": 3}})";
const std::string kNowUtc = R"({"name": "now", "arguments": {"tz": "UTC"}})";

TEST(ToolGrammarTest, ARequiredCallAdmitsAnyToolWithValidArguments) {
  const auto g = Compile(ChatFamily::kChatMl, Tools());
  EXPECT_TRUE(FullMatch(g, Hermes(kParis)));
  EXPECT_TRUE(FullMatch(g, Hermes(kNowUtc)));
  EXPECT_TRUE(FullMatch(g, Hermes(R"({"name": "now", "arguments": {}})")));
  EXPECT_TRUE(FullMatch(
      g,
      Hermes(R"({"name": "get_weather", "arguments": {"city": "Oslo", "days": 7, "unit": "f"}})")));
}

TEST(ToolGrammarTest, ARequiredCallRefusesWhatTheSchemasRefuse) {
  const auto g = Compile(ChatFamily::kChatMl, Tools());
  for (const std::string bad : {
           R"({"name": "other", "arguments": {}})",                       // no such tool
           R"({"name": "get_weather", "arguments": {"city": "Paris"}})",  // days missing
           R"({"name": "get_weather", "arguments": {"city": "Paris", "days": "3"}})",  // a string
           R"({"name": "get_weather", "arguments": {"city": "Paris", "days": 1.5}})",  // not
                                                                                       // integer
           R"({"name": "get_weather", "arguments": {"city": "Paris", "days": 3, "unit": "k"}})",
           R"({"name": "now", "arguments": {"tz": "PST"}})",  // not in the $ref'd enum
           R"({"name": "now"})",                              // no arguments
       }) {
    EXPECT_FALSE(FullMatch(g, Hermes(bad))) << bad;
  }
  EXPECT_FALSE(FullMatch(g, "Sure! " + Hermes(kParis)));                // nothing but the call
  EXPECT_FALSE(FullMatch(g, kParis));                                   // in its markers
  EXPECT_FALSE(FullMatch(g, Hermes(kParis) + "\n" + Hermes(kNowUtc)));  // one call
}

TEST(ToolGrammarTest, ANamedChoiceAdmitsOnlyThatTool) {
  const auto g = Compile(ChatFamily::kChatMl, Tools(ToolChoice::Kind::kNamed));
  EXPECT_TRUE(FullMatch(g, Hermes(kNowUtc)));
  EXPECT_FALSE(FullMatch(g, Hermes(kParis)));
}

TEST(ToolGrammarTest, ParallelCallsAdmitSeveralUpToTheLimit) {
  const auto g = Compile(ChatFamily::kChatMl, Tools(ToolChoice::Kind::kRequired, true));
  std::string calls = Hermes(kParis);
  for (int n = 2; n <= kMaxParallelCalls; ++n) {
    calls += "\n" + Hermes(kNowUtc);
    EXPECT_TRUE(FullMatch(g, calls)) << n << " calls";
  }
  EXPECT_FALSE(FullMatch(g, calls + "\n" + Hermes(kNowUtc)));
}

TEST(ToolGrammarTest, EachFamilyWritesItsOwnFormat) {
  const auto llama = Compile(ChatFamily::kLlama3, Tools(ToolChoice::Kind::kRequired, true));
  EXPECT_TRUE(FullMatch(llama, R"({"name": "now", "parameters": {"tz": "CET"}})"));
  EXPECT_TRUE(
      FullMatch(llama, R"({"name": "now", "parameters": {}}; {"name": "now", "parameters": {}})"));
  EXPECT_FALSE(FullMatch(llama, kNowUtc));  // Llama 3 names them parameters
  const auto mistral = Compile(ChatFamily::kMistralV3, Tools(ToolChoice::Kind::kRequired, true));
  EXPECT_TRUE(FullMatch(mistral, "[" + kParis + ", " + kNowUtc + "]"));
  EXPECT_FALSE(FullMatch(mistral, kParis));
}

TEST(ToolGrammarTest, WhatTheGrammarWritesIsReadBackAsValidCalls) {
  const ToolsRequest tools = Tools(ToolChoice::Kind::kRequired, true);
  for (ChatFamily family :
       {ChatFamily::kChatMl, ChatFamily::kLlama3, ChatFamily::kMistralV7, ChatFamily::kGemma}) {
    const auto g = Compile(family, tools);
    ASSERT_NE(g, nullptr);
    std::mt19937_64 rng(7);
    for (int i = 0; i < 40; ++i) {
      const std::string text = grammar::testing::RandomString(*g, &rng);
      ASSERT_TRUE(FullMatch(g, text)) << text;
      ToolCallParser parser(ToolSyntaxFor(family, /*forced=*/true), {"get_weather", "now"});
      auto out = parser.Push(text);
      auto end = parser.Finish();
      out.calls.insert(out.calls.end(), end.calls.begin(), end.calls.end());
      EXPECT_EQ(out.text() + end.text(), "") << text;
      ASSERT_FALSE(out.calls.empty()) << text;
      for (const ToolCall& c : out.calls) {
        const ToolDef& def = c.name == "now" ? tools.tools[1] : tools.tools[0];
        const auto args = OrderedJson::parse(c.arguments);
        EXPECT_EQ(grammar::testing::Validate(args, def.parameters, def.parameters), "") << text;
      }
    }
  }
}

TEST(ToolGrammarTest, ApplyingItConstrainsTheRequest) {
  CompletionRequest r;
  r.endpoint = Endpoint::kChatCompletions;
  r.tools = Tools();
  ApiError e;
  ASSERT_TRUE(ApplyToolGrammar(ChatFamily::kChatMl, &r, &e)) << e.message;
  EXPECT_EQ(r.response_format.kind, ResponseFormat::Kind::kGrammar);
  EXPECT_TRUE(r.response_format.grammar.starts_with("root ::= \"<tool_call>\\n\""));
  CompletionRequest free;
  free.tools = Tools(ToolChoice::Kind::kAuto);
  ASSERT_TRUE(ApplyToolGrammar(ChatFamily::kChatMl, &free, &e));
  EXPECT_TRUE(free.response_format.grammar.empty());
}

}  // namespace
}  // namespace kvasir::serve
