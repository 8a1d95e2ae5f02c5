// A model's answer read back into tool calls: text before a call is content, a call's markup never
// is, calls that break before their name (or name no tool) are given back as content, calls that
// break after it are closed, and a stream split anywhere gives what the whole answer gives,
// without ever showing part of a marker.
#include "serve/tool_output.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "mangle.h"

namespace kvasir::serve {
namespace {

struct Parsed;
void Add(ToolCallParser::Output out, Parsed* p);

struct Parsed {
  std::string content;
  std::vector<std::pair<std::string, std::string>> calls;  // name, arguments
  std::vector<std::string> ids;
  std::vector<std::pair<std::string, std::string>> pieced;  // the calls as their pieces tell
  std::vector<std::string> pieced_ids;
};

// Adds the output's text and calls, and checks that its pieces tell the same calls: a call's
// first piece has its id and name, the next ones only arguments, in order.
void Add(ToolCallParser::Output out, Parsed* p) {
  p->content += out.text();
  for (const ToolCallParser::Piece& piece : out.pieces) {
    if (piece.call < 0) continue;
    if (!piece.id.empty()) {
      EXPECT_EQ(static_cast<size_t>(piece.call), p->pieced.size());
      p->pieced.emplace_back(piece.name, "");
      p->pieced_ids.push_back(piece.id);
    }
    ASSERT_LT(static_cast<size_t>(piece.call), p->pieced.size());
    p->pieced[piece.call].second += piece.arguments;
  }
  for (const ToolCall& c : out.calls) {
    p->calls.emplace_back(c.name, c.arguments);
    p->ids.push_back(c.id);
  }
  EXPECT_EQ(std::vector(p->pieced.begin(), p->pieced.begin() + p->calls.size()), p->calls);
  EXPECT_EQ(std::vector(p->pieced_ids.begin(), p->pieced_ids.begin() + p->ids.size()), p->ids);
}

const std::vector<std::string> kNames = {"get_weather", "now"};

Parsed Whole(const ToolSyntax& syntax, const std::string& text) {
  ToolCallParser parser(syntax, kNames);
  Parsed p;
  Add(parser.Push(text), &p);
  Add(parser.Finish(), &p);
  return p;
}

// Splits `text` into pieces of `size` bytes; checks that no piece of content shows a call marker
// before the parser has decided it is text.
Parsed Streamed(const ToolSyntax& syntax, const std::string& text, size_t size) {
  ToolCallParser parser(syntax, kNames);
  Parsed p;
  for (size_t i = 0; i < text.size(); i += size) Add(parser.Push(text.substr(i, size)), &p);
  Add(parser.Finish(), &p);
  return p;
}

void ExpectSameAtEverySplit(const ToolSyntax& syntax, const std::string& text) {
  const Parsed whole = Whole(syntax, text);
  for (size_t size = 1; size <= text.size(); ++size) {
    const Parsed s = Streamed(syntax, text, size);
    EXPECT_EQ(s.content, whole.content) << "pieces of " << size;
    EXPECT_EQ(s.calls, whole.calls) << "pieces of " << size;
  }
  // Every split point of two pieces, too.
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    ToolCallParser parser(syntax, kNames);
    Parsed p;
    Add(parser.Push(text.substr(0, cut)), &p);
    Add(parser.Push(text.substr(cut)), &p);
    Add(parser.Finish(), &p);
    EXPECT_EQ(p.content, whole.content) << "cut at " << cut;
    EXPECT_EQ(p.calls, whole.calls) << "cut at " << cut;
  }
}

const ToolSyntax kHermes = ToolSyntaxFor(ChatFamily::kChatMl, false);

TEST(ToolOutputTest, HermesCallsAreReadWithTheTextBeforeThem) {
  const std::string text =
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": 2}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": "
      "{}}\n</tool_call>";
  const Parsed p = Whole(kHermes, text);
  EXPECT_EQ(p.content, "Let me look.\n");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0],
            (std::pair<std::string, std::string>{"get_weather", R"({"city":"Paris","days":2})"}));
  EXPECT_EQ(p.calls[1], (std::pair<std::string, std::string>{"now", "{}"}));
  EXPECT_TRUE(p.ids[0].starts_with("call_"));
  EXPECT_EQ(p.ids[0].size(), 29u);
  EXPECT_NE(p.ids[0], p.ids[1]);
  ExpectSameAtEverySplit(kHermes, text);
}

TEST(ToolOutputTest, AStreamNeverShowsPartOfAMarker) {
  const std::string text = "Sure <tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>";
  for (size_t size = 1; size <= text.size(); ++size) {
    ToolCallParser parser(kHermes, kNames);
    for (size_t i = 0; i < text.size(); i += size) {
      const auto out = parser.Push(text.substr(i, size));
      EXPECT_EQ(out.text().find('<'), std::string::npos) << "pieces of " << size;
    }
  }
}

TEST(ToolOutputTest, TextThatOnlyLooksLikeAMarkerIsShownOnceItIsNot) {
  ToolCallParser parser(kHermes, kNames);
  EXPECT_EQ(parser.Push("a <tool").text(), "a ");
  EXPECT_EQ(parser.Push("box> b").text(), "<toolbox> b");
  EXPECT_EQ(parser.Finish().text(), "");
  EXPECT_EQ(parser.calls_made(), 0u);
  ExpectSameAtEverySplit(kHermes, "a <toolbox> b <tool");
}

TEST(ToolOutputTest, ACallThatDoesNotParseBeforeItsNameIsGivenBackAsContent) {
  for (const std::string text : {
           "<tool_call>{\"name\": \"unknown\", \"arguments\": {}}</tool_call>",
           "<tool_call>not json</tool_call>", "<tool_call>{\"nam\": \"now\"}</tool_call>",
           "<tool_call>{\"name\": \"no",  // cut short
       }) {
    const Parsed p = Whole(kHermes, "x " + text);
    EXPECT_EQ(p.content, "x " + text);
    EXPECT_TRUE(p.calls.empty()) << text;
    ExpectSameAtEverySplit(kHermes, "x " + text);
  }
}

// Once its name is a tool's, a call is shown (auto streams it): if it then breaks, it is closed
// after its last complete argument, and the rest of its markup is dropped, never content.
TEST(ToolOutputTest, ACallThatBreaksAfterItsNameIsClosedWhereItWasWhole) {
  struct Case {
    std::string text, args;
  };
  for (const Case& c : std::vector<Case>{
           {"<tool_call>{\"name\": \"now\", \"arguments\": [1]}</tool_call>", "{}"},
           {"<tool_call>{\"name\": \"now\", \"arguments\": {\"a\": 1}}</tool_box> y", "{\"a\":1}"},
           {"<tool_call>{\"name\": \"now\", \"arguments\": {", "{}"},  // cut short
           {"<tool_call>{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\", \"days\": "
            "3 x"
            "}}</tool_call> after",
            "{\"city\":\"Oslo\"}"},
       }) {
    const Parsed p = Whole(kHermes, "x " + c.text);
    EXPECT_EQ(p.content, c.text.ends_with(" after") ? "x  after" : "x ") << c.text;
    ASSERT_EQ(p.calls.size(), 1u) << c.text;
    EXPECT_EQ(p.calls[0].second, c.args) << c.text;
    ExpectSameAtEverySplit(kHermes, "x " + c.text);
  }
}

TEST(ToolOutputTest, AnAutoCallIsStreamedAsItIsWrittenMemberByMember) {
  ToolCallParser parser(kHermes, kNames);
  EXPECT_TRUE(parser.Push("Sure. <tool_call>\n{\"name\": \"get_wea").text() == "Sure. ");
  auto named = parser.Push("ther\", \"arguments\": {\"city\": \"New");
  ASSERT_EQ(named.pieces.size(), 1u);
  EXPECT_EQ(named.pieces[0].name, "get_weather");
  EXPECT_EQ(named.pieces[0].arguments, "{");
  auto member = parser.Push(" York\", \"da");
  ASSERT_EQ(member.pieces.size(), 1u);
  EXPECT_EQ(member.pieces[0].arguments, "\"city\":\"New York\"");
  auto end = parser.Push("ys\": 2}}\n</tool_call>");
  ASSERT_EQ(end.calls.size(), 1u);
  EXPECT_EQ(end.calls[0].id, named.pieces[0].id);
  std::string args = "{\"city\":\"New York\"";
  for (const auto& p : end.pieces) args += p.arguments;
  EXPECT_EQ(args, R"({"city":"New York","days":2})");
  EXPECT_EQ(end.calls[0].arguments, args);
  // A call of a name that is no tool's is not shown: it is text.
  ToolCallParser other(kHermes, kNames);
  EXPECT_TRUE(other.Push("<tool_call>{\"name\": \"rm\", \"arguments\": {\"a\": 1,").pieces.empty());
  EXPECT_EQ(other.Finish().text(), "<tool_call>{\"name\": \"rm\", \"arguments\": {\"a\": 1,");
}

TEST(ToolOutputTest, ACallCutShortByTheTokenLimitIsDropped) {
  ToolCallParser parser(kHermes, kNames);
  auto out = parser.Push("<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call>\n<tool_c");
  EXPECT_EQ(out.calls.size(), 1u);
  EXPECT_EQ(out.text(), "");
  EXPECT_EQ(parser.Finish(/*cut=*/true).text(), "");
  ToolCallParser text(kHermes, kNames);
  EXPECT_EQ(text.Push("just text").text(), "just text");
  EXPECT_EQ(text.Finish(/*cut=*/true).text(), "");
}

TEST(ToolOutputTest, ACallLongerThanTheLimitIsClosedOrContent) {
  ToolCallParser parser(kHermes, kNames);
  const std::string head = "<tool_call>{\"name\": \"now\", \"arguments\": {\"a\": \"";
  EXPECT_EQ(parser.Push(head).text(), "");
  const std::string filler(kMaxCallBytes, 'x');
  const auto over = parser.Push(filler);
  EXPECT_EQ(over.text(), "");
  ASSERT_EQ(over.calls.size(), 1u);  // shown by its name, closed empty
  EXPECT_EQ(over.calls[0].arguments, "{}");
  EXPECT_EQ(parser.Push("\"}}</tool_call> ok").text(), " ok");
  // One whose name is no tool's is content.
  ToolCallParser other(kHermes, kNames);
  const std::string rm = "<tool_call>{\"name\": \"rm\", \"arguments\": {\"a\": \"";
  EXPECT_EQ(other.Push(rm).text(), "");
  EXPECT_EQ(other.Push(filler).text(), rm + filler);
  EXPECT_EQ(other.calls_made(), 0u);
}

TEST(ToolOutputTest, ArgumentsWrittenAsAStringAreRead) {
  const Parsed p = Whole(
      kHermes, "<tool_call>{\"name\": \"now\", \"arguments\": \"{\\\"tz\\\": \\\"UTC\\\"}\"}");
  ASSERT_EQ(p.calls.size(), 1u);  // the answer ended before </tool_call>: the call stands
  EXPECT_EQ(p.calls[0].second, R"({"tz":"UTC"})");
  EXPECT_EQ(p.content, "");
}

TEST(ToolOutputTest, Llama3CallsAreBareJsonWithParameters) {
  const ToolSyntax llama = ToolSyntaxFor(ChatFamily::kLlama3, false);
  const std::string text =
      " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}; {\"name\": \"now\", "
      "\"parameters\": {}}";
  const Parsed p = Whole(llama, text);
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].second, R"({"city":"Oslo"})");
  ExpectSameAtEverySplit(llama, text);
  // JSON later in a text answer is text.
  EXPECT_EQ(Whole(llama, "It is {\"a\": 1}").content, "It is {\"a\": 1}");
  ExpectSameAtEverySplit(llama, "<|python_tag|>{\"name\": \"now\", \"parameters\": {}}");
}

TEST(ToolOutputTest, MistralCallsAreAnArrayAfterTheMarker) {
  const ToolSyntax mistral = ToolSyntaxFor(ChatFamily::kMistralV7, false);
  const std::string text =
      "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Rome\"}}, "
      "{\"name\": \"now\", \"arguments\": {}}]";
  const Parsed p = Whole(mistral, text);
  EXPECT_EQ(p.content, "");
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[1].first, "now");
  ExpectSameAtEverySplit(mistral, text);
  // A bare array is a call only where the grammar writes it so.
  const std::string bare = "[{\"name\": \"now\", \"arguments\": {}}]";
  EXPECT_EQ(Whole(mistral, bare).calls.size(), 0u);
  EXPECT_EQ(Whole(ToolSyntaxFor(ChatFamily::kMistralV7, true), bare).calls.size(), 1u);
}

TEST(ToolOutputTest, AForcedCallIsStreamedAsItIsWritten) {
  const ToolSyntax forced = ToolSyntaxFor(ChatFamily::kChatMl, /*forced=*/true);
  ToolCallParser parser(forced, kNames);
  EXPECT_TRUE(parser.Push("<tool_call>\n{ \"name\" : \"get_wea").pieces.empty());
  auto named = parser.Push("ther\", \"arguments\": { \"city");
  ASSERT_EQ(named.pieces.size(), 1u);
  EXPECT_EQ(named.pieces[0].call, 0);
  EXPECT_EQ(named.pieces[0].name, "get_weather");
  EXPECT_TRUE(named.pieces[0].id.starts_with("call_"));
  EXPECT_EQ(named.pieces[0].arguments, "{\"city");
  auto more = parser.Push("\": \"New York\", ");
  ASSERT_EQ(more.pieces.size(), 1u);
  EXPECT_TRUE(more.pieces[0].id.empty());
  EXPECT_EQ(more.pieces[0].arguments, "\":\"New York\",");
  auto end = parser.Push("\"days\": 2}}\n</tool_call>");
  ASSERT_EQ(end.calls.size(), 1u);
  EXPECT_EQ(end.calls[0].id, named.pieces[0].id);
  EXPECT_EQ(end.calls[0].arguments, R"({"city":"New York","days":2})");
  const std::string text =
      "<tool_call>\n{\"name\": \"now\", \"arguments\": {\"tz\": \"a \\\" }\"}}\n</tool_call>\n"
      "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n</tool_call>";
  ExpectSameAtEverySplit(forced, text);
  EXPECT_EQ(Whole(forced, text).calls[0].second, R"({"tz":"a \" }"})");
  const std::string array =
      "[{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"get_weather\", \"arguments\": "
      "{\"city\": \"Rome\"}}]";
  ExpectSameAtEverySplit(ToolSyntaxFor(ChatFamily::kMistralV7, true), array);
  EXPECT_EQ(Whole(ToolSyntaxFor(ChatFamily::kMistralV7, true), array).calls.size(), 2u);
}

// Answers near calls (calls with bytes changed, dropped or added) give, split anywhere, what they
// give whole: the same text and the same calls, for every family, free or forced.
TEST(ToolOutputTest, MangledCallsReadTheSameWholeAndSplit) {
  const std::vector<std::string> seeds = {
      "Hi <tool_call>\n{\"name\": \"now\", \"arguments\": {\"a\": [1, \"}\"]}}\n</tool_call>",
      "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"x\"}}; {\"name\": \"now\"}",
      "[TOOL_CALLS] [{\"name\": \"now\", \"arguments\": {}}, {\"name\": \"now\", "
      "\"arguments\": \"{}\"}]",
  };
  const std::string alphabet = "{}[]\"\\:, \n<>/_;TOOLCALS";
  std::mt19937_64 rng(11);
  for (int round = 0; round < 400; ++round) {
    std::string text = seeds[round % seeds.size()];
    testing::Mangle(&text, alphabet, rng);
    for (ChatFamily f : {ChatFamily::kChatMl, ChatFamily::kLlama3, ChatFamily::kMistralV3}) {
      for (bool forced : {false, true}) {
        const ToolSyntax syntax = ToolSyntaxFor(f, forced);
        const Parsed whole = Whole(syntax, text);
        const Parsed split = Streamed(syntax, text, 1 + rng() % 6);
        EXPECT_EQ(split.content, whole.content) << text;
        EXPECT_EQ(split.calls, whole.calls) << text;
      }
    }
  }
}

TEST(ToolOutputTest, TextAfterTheCallsIsContent) {
  const std::string text = "<tool_call>{\"name\": \"now\", \"arguments\": {}}</tool_call> done";
  const Parsed p = Whole(kHermes, text);
  EXPECT_EQ(p.calls.size(), 1u);
  EXPECT_EQ(p.content, "done");
  ExpectSameAtEverySplit(kHermes, text);
}

}  // namespace
}  // namespace kvasir::serve
