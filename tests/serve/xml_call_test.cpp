// Qwen3.5's XML-style tool calls: the tools and earlier calls laid out as its template does, the
// model's calls read back whole and streamed (the name first, then the arguments as they are
// written, the markup never as content), and required/named calls enforced by a grammar whose
// every answer reads back as calls that validate against the tools' schemas.
#include <gtest/gtest.h>

#include <random>
#include <string>

#include "grammar/grammar_test_util.h"
#include "grammar/schema_validator.h"
#include "mangle.h"
#include "serve/tool_grammar.h"
#include "serve/tool_output.h"
#include "serve/tool_prompt.h"

namespace kvasir::serve {
namespace {

using OrderedJson = nlohmann::ordered_json;

ToolsRequest Tools(ToolChoice::Kind kind = ToolChoice::Kind::kAuto, bool parallel = false) {
  ToolsRequest t;
  ToolDef weather;
  weather.name = "get_weather";
  weather.description = "Weather of a city";
  weather.parameters = OrderedJson::parse(R"({"type": "object", "properties": {
      "city": {"type": "string", "maxLength": 30},
      "days": {"type": "integer", "minimum": 1, "maximum": 7},
      "unit": {"enum": ["c", "f"]},
      "where": {"type": "object", "properties": {"lat": {"type": "number"}},
                "required": ["lat"], "additionalProperties": false}},
      "required": ["city", "days"]})");
  ToolDef now;
  now.name = "now";
  now.parameters = OrderedJson::parse(R"({"type": "object", "properties": {}})");
  t.tools = {weather, now};
  t.choice.kind = kind;
  if (kind == ToolChoice::Kind::kNamed) t.choice.name = "now";
  t.parallel = parallel;
  return t;
}

const ToolSyntax kXml = ToolSyntaxFor(ChatFamily::kQwen35, /*forced=*/false);

struct Read {
  std::string content;
  std::vector<ToolCall> calls;
  std::vector<std::string> names_pieced;  // the calls' names, from their first pieces
  std::vector<std::string> args_pieced;   // their arguments, joined from their pieces
};

// Reads `text` in pieces of `size` bytes (0: whole), checking that each call's first piece names
// it before any of its arguments and that its pieces join into its arguments.
Read ReadBack(const std::string& text, size_t size = 0, bool forced = false) {
  ToolCallParser parser(ToolSyntaxFor(ChatFamily::kQwen35, forced), Tools().tools);
  Read r;
  auto add = [&](ToolCallParser::Output out) {
    for (const auto& p : out.pieces) {
      if (p.call < 0) {
        r.content += p.content;
        continue;
      }
      if (!p.name.empty()) {
        EXPECT_EQ(static_cast<size_t>(p.call), r.names_pieced.size());
        r.names_pieced.push_back(p.name);
        r.args_pieced.emplace_back();
      }
      ASSERT_LT(static_cast<size_t>(p.call), r.args_pieced.size()) << "arguments before a name";
      r.args_pieced[p.call] += p.arguments;
    }
    for (ToolCall& c : out.calls) r.calls.push_back(std::move(c));
  };
  const size_t step = size == 0 ? text.size() : size;
  for (size_t i = 0; i < text.size(); i += step) add(parser.Push(text.substr(i, step)));
  add(parser.Finish());
  return r;
}

const std::string kParisCall =
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis \"centre\"\nrive gauche\n"
    "</parameter>\n<parameter=days>\n3\n</parameter>\n<parameter=unit>\nc\n</parameter>\n"
    "<parameter=where>\n{\"lat\": 48.85}\n</parameter>\n</function>\n</tool_call>";
const std::string kParisArgs =
    R"({"city":"Paris \"centre\"\nrive gauche","days":3,"unit":"c","where":{"lat":48.85}})";

TEST(XmlCallTest, TheQwen35FamilyLaysToolsAndCallsOutAsItsTemplate) {
  std::vector<ChatTurn> turns(4);
  turns[0] = {"system", "Be brief."};
  turns[1] = {"user", "Weather?"};
  turns[2].role = "assistant";
  turns[2].content = "Looking.";
  turns[2].tool_calls = {{"call_1", "get_weather", R"({"city": "Oslo", "days": 2, "x": true})"}};
  turns[3].role = "tool";
  turns[3].content = "sunny";
  turns[3].tool_call_id = "call_1";
  ToolsRequest tools = Tools();
  tools.tools.resize(1);
  tools.tools[0].parameters = OrderedJson::parse(R"({"type": "object"})");
  const std::string text = FormatToolChat(ChatFamily::kQwen35, turns, tools);
  EXPECT_EQ(text,
            "<|im_start|>system\n# Tools\n\nYou have access to the following functions:\n\n"
            "<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", "
            "\"description\": \"Weather of a city\", \"parameters\": {\"type\": \"object\"}}}\n"
            "</tools>\n\nIf you choose to call a function ONLY reply in the following format with "
            "NO suffix:\n\n<tool_call>\n<function=example_function_name>\n"
            "<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
            "<parameter=example_parameter_2>\nThis is the value for the second parameter\n"
            "that can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
            "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
            "<function=...></function> block must be nested within <tool_call></tool_call> XML "
            "tags\n- Required parameters MUST be specified\n- You may provide optional reasoning "
            "for your function call in natural language BEFORE the function call, but NOT after\n"
            "- If there is no function call available, answer the question like normal with your "
            "current knowledge and do not tell the user about function calls\n</IMPORTANT>\n\n"
            "Be brief.<|im_end|>\n<|im_start|>user\nWeather?<|im_end|>\n<|im_start|>assistant\n"
            "Looking.\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n"
            "</parameter>\n<parameter=days>\n2\n</parameter>\n<parameter=x>\nTrue\n</parameter>\n"
            "</function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny\n"
            "</tool_response><|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(XmlParameterValue(OrderedJson::parse(R"({"a": [1, null]})")), R"({"a": [1, null]})");
  EXPECT_EQ(XmlParameterValue(nullptr), "None");
}

TEST(XmlCallTest, CallsAreReadBackWithTypedArgumentsAndTheTextBeforeThem) {
  const Read r = ReadBack("Let me check.\n" + kParisCall +
                          "\n<tool_call>\n<function=now>\n"
                          "</function>\n</tool_call>");
  EXPECT_EQ(r.content, "Let me check.\n");
  ASSERT_EQ(r.calls.size(), 2u);
  EXPECT_EQ(r.calls[0].name, "get_weather");
  EXPECT_EQ(r.calls[0].arguments, kParisArgs);
  EXPECT_EQ(r.calls[1].name, "now");
  EXPECT_EQ(r.calls[1].arguments, "{}");
  EXPECT_TRUE(r.calls[0].id.starts_with("call_"));
  EXPECT_EQ(OrderedJson::parse(r.calls[0].arguments)["where"]["lat"], 48.85);
}

TEST(XmlCallTest, AStreamSplitAnywhereGivesTheWholeAnswerAndNoMarkupAsContent) {
  const std::string text = "Sure <b>now</b>:\n" + kParisCall + "\nDone.";
  const Read whole = ReadBack(text);
  ASSERT_EQ(whole.calls.size(), 1u);
  EXPECT_EQ(whole.content, "Sure <b>now</b>:\nDone.");  // blanks between a call and text go
  for (size_t size = 1; size <= text.size(); ++size) {
    const Read s = ReadBack(text, size);
    EXPECT_EQ(s.content, whole.content) << "pieces of " << size;
    ASSERT_EQ(s.calls.size(), 1u) << "pieces of " << size;
    EXPECT_EQ(s.calls[0].arguments, kParisArgs) << "pieces of " << size;
    EXPECT_EQ(s.names_pieced, std::vector<std::string>{"get_weather"});
    EXPECT_EQ(s.args_pieced[0], kParisArgs) << "pieces of " << size;
  }
}

TEST(XmlCallTest, TheNameGoesOutFirstAndAStringArgumentAsItIsWritten) {
  ToolCallParser parser(kXml, Tools().tools);
  auto name = parser.Push("<tool_call>\n<function=get_weather>\n");
  ASSERT_EQ(name.pieces.size(), 1u);
  EXPECT_EQ(name.pieces[0].name, "get_weather");
  EXPECT_EQ(name.text(), "");
  auto begun = parser.Push("<parameter=city>\nPar");
  std::string args;
  for (const auto& p : begun.pieces) args += p.arguments;
  EXPECT_EQ(args, R"({"city":"Par)");  // before the value ends
  auto rest = parser.Push("is\n</parameter>\n<parameter=days>\n4\n</parameter>\n</function>");
  for (const auto& p : rest.pieces) args += p.arguments;
  EXPECT_EQ(args, R"({"city":"Paris","days":4})");
  EXPECT_TRUE(rest.calls.empty());  // complete at </tool_call> or the end
  auto end = parser.Finish();
  ASSERT_EQ(end.calls.size(), 1u);
  EXPECT_EQ(end.calls[0].arguments, args);
}

TEST(XmlCallTest, ACallOfNoToolOrBrokenBeforeItsNameIsContent) {
  const std::string other = "<tool_call>\n<function=rm_rf>\n</function>\n</tool_call>";
  EXPECT_EQ(ReadBack(other).content, other);
  EXPECT_TRUE(ReadBack(other).calls.empty());
  EXPECT_EQ(ReadBack("a <tool_call> b").content, "a <tool_call> b");
  // Broken after its name was shown: closed as far as it went; its markup is not content.
  const Read cut = ReadBack("<tool_call>\n<function=now>\n<oops>\n</tool_call>\nok");
  ASSERT_EQ(cut.calls.size(), 1u);
  EXPECT_EQ(cut.calls[0].arguments, "{}");
  EXPECT_EQ(cut.content, "\nok");
}

// Answers near calls (bytes changed, dropped or added) read the same whole and split anywhere,
// and every call's pieces join into arguments that parse as a JSON object.
TEST(XmlCallTest, MangledCallsReadTheSameWholeAndSplit) {
  const std::string alphabet = "<>/=\n _\"{}:,";
  std::mt19937_64 rng(5);
  for (int round = 0; round < 300; ++round) {
    std::string text =
        "ok " + kParisCall + "\n<tool_call>\n<function=now>\n</function>\n</tool_call>";
    testing::Mangle(&text, alphabet, rng);
    const Read whole = ReadBack(text);
    const Read split = ReadBack(text, 1 + rng() % 6);
    EXPECT_EQ(split.content, whole.content) << text;
    ASSERT_EQ(split.calls.size(), whole.calls.size()) << text;
    for (size_t k = 0; k < whole.calls.size(); ++k) {
      EXPECT_EQ(split.calls[k].name, whole.calls[k].name) << text;
      EXPECT_EQ(split.calls[k].arguments, whole.calls[k].arguments) << text;
      EXPECT_TRUE(OrderedJson::parse(whole.calls[k].arguments, nullptr, false).is_object())
          << whole.calls[k].arguments;
    }
  }
}

TEST(XmlCallTest, ACallLongerThanTheLimitIsClosedAndBlanksAreNoCall) {
  ToolCallParser parser(kXml, Tools().tools);
  auto out = parser.Push("<tool_call>\n<function=get_weather>\n<parameter=days>\n" +
                         std::string(kMaxCallBytes + 1, '1'));
  ASSERT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.calls[0].arguments, R"({"days":null})");
  EXPECT_EQ(parser.Push("\n</parameter>\n</function>\n</tool_call> ok").text(), " ok");
  ToolCallParser blanks(kXml, Tools().tools);
  EXPECT_TRUE(blanks.Push("\n" + std::string(kMaxCallBytes + 1, ' ')).calls.empty());
  EXPECT_TRUE(blanks.Finish().calls.empty());
}

TEST(XmlCallTest, TheGrammarAdmitsCallsThatMatchTheSchemasOnly) {
  auto text = ToolCallGrammarText(ChatFamily::kQwen35, Tools(ToolChoice::Kind::kRequired));
  ASSERT_TRUE(text.ok()) << text.status().message();
  const auto g = grammar::testing::MustParse(*text);
  EXPECT_TRUE(grammar::testing::FullMatch(g, kParisCall));
  EXPECT_TRUE(grammar::testing::FullMatch(
      g,
      "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
      "<parameter=days>\n7\n</parameter>\n</function>\n</tool_call>"));
  for (const std::string bad : {
           // days missing, days not an integer, unit outside its enum, an unknown tool
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
           "</function>\n</tool_call>",
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
           "<parameter=days>\n2.5\n</parameter>\n</function>\n</tool_call>",
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\n"
           "<parameter=days>\n2\n</parameter>\n<parameter=unit>\nk\n</parameter>\n</function>\n"
           "</tool_call>",
           "<tool_call>\n<function=rm>\n</function>\n</tool_call>",
           // a city over its maxLength
           "<tool_call>\n<function=get_weather>\n<parameter=city>\nLlanfairpwllgwyngyllgogerychwyrn"
           "\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
           "Sure: <tool_call>\n<function=now>\n</function>\n</tool_call>",
       }) {
    EXPECT_FALSE(grammar::testing::FullMatch(g, bad)) << bad;
  }
  auto named = ToolCallGrammarText(ChatFamily::kQwen35, Tools(ToolChoice::Kind::kNamed));
  ASSERT_TRUE(named.ok()) << named.status().message();
  const auto n = grammar::testing::MustParse(*named);
  EXPECT_TRUE(grammar::testing::FullMatch(n,
                                          "<tool_call>\n<function=now>\n</function>\n"
                                          "</tool_call>"));
  EXPECT_FALSE(grammar::testing::FullMatch(n, kParisCall));
}

TEST(XmlCallTest, AStringPatternCannotBeEnforcedOnRawTextAndIsRefused) {
  ToolsRequest tools = Tools(ToolChoice::Kind::kRequired);
  tools.tools[0].parameters["properties"]["city"]["pattern"] = "^[A-Z]";
  const auto text = ToolCallGrammarText(ChatFamily::kQwen35, tools);
  ASSERT_FALSE(text.ok());
  EXPECT_NE(text.status().message().find("'city': 'pattern'"), std::string::npos)
      << text.status().message();
}

TEST(XmlCallTest, WhatTheGrammarWritesIsReadBackAsValidCalls) {
  const ToolsRequest tools = Tools(ToolChoice::Kind::kRequired, /*parallel=*/true);
  auto text = ToolCallGrammarText(ChatFamily::kQwen35, tools);
  ASSERT_TRUE(text.ok()) << text.status().message();
  const auto g = grammar::testing::MustParse(*text);
  std::mt19937_64 rng(11);
  for (int i = 0; i < 60; ++i) {
    const std::string answer = grammar::testing::RandomString(*g, &rng);
    ASSERT_TRUE(grammar::testing::FullMatch(g, answer)) << answer;
    const Read r = ReadBack(answer, 1 + i % 7, /*forced=*/true);
    EXPECT_EQ(r.content, "") << answer;
    ASSERT_FALSE(r.calls.empty()) << answer;
    for (const ToolCall& c : r.calls) {
      const ToolDef& def = c.name == "now" ? tools.tools[1] : tools.tools[0];
      const auto args = OrderedJson::parse(c.arguments, nullptr, false);
      ASSERT_FALSE(args.is_discarded()) << c.arguments;
      EXPECT_EQ(grammar::testing::Validate(args, def.parameters, def.parameters), "") << answer;
    }
  }
}

}  // namespace
}  // namespace kvasir::serve
