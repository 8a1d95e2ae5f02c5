// Grammar text: what parses, what is refused and with which message.
#include <gtest/gtest.h>

#include <string>

#include "grammar/grammar.h"
#include "grammar/recognizer.h"

namespace kvasir::grammar {
namespace {

std::string ParseError(std::string_view text, const GrammarLimits& limits = {}) {
  auto g = Grammar::Parse(text, limits);
  if (g.ok()) return "(parsed)";
  return g.status().message();
}

bool Matches(std::string_view grammar, std::string_view input) {
  auto g = Grammar::Parse(grammar);
  EXPECT_TRUE(g.ok()) << g.status().message();
  if (!g.ok()) return false;
  Recognizer r(*g);
  Matcher m(&r);
  return m.AcceptBytes(input) && m.CanEnd();
}

TEST(GrammarParse, AcceptsEveryConstruct) {
  const char* text = R"(
# a comment line
root ::= greeting ws ( name | "you" )+ tail? end  # trailing comment
greeting ::= "h\x65llo" | "hi\n" | "\u00e9t\U0001F600"
ws ::= [ \t]{1,3}
name ::= [A-Z] [a-z\-]* [^\]"]{0}
tail ::= .{2} [0-9]{2,} x{0,2}
x ::= "x"
end ::= ()
)";
  auto g = Grammar::Parse(text);
  ASSERT_TRUE(g.ok()) << g.status().message();
  EXPECT_TRUE(Matches(text, "hello  Bob"));
  EXPECT_TRUE(Matches(text, "hi\n\tyouAnn-e"));
  EXPECT_TRUE(Matches(text, "hello Bob\xC3\xA9z12345xx"));
  EXPECT_FALSE(Matches(text, "hello Bob\xC3\xA9z12345xxx"));
  EXPECT_FALSE(Matches(text, "hellobob"));
}

TEST(GrammarParse, ErrorsNameLineColumnAndWhat) {
  EXPECT_EQ(ParseError(""), "grammar:1:1: empty grammar: expected a rule 'name ::= ...'");
  EXPECT_EQ(ParseError("root ::= \"a\"\nvalue = \"b\""),
            "grammar:2:7: expected '::=' after rule name 'value'");
  EXPECT_EQ(ParseError("root ::= \"abc"), "grammar:1:10: unterminated literal");
  EXPECT_EQ(ParseError("root ::= [z-a]"), "grammar:1:11: range 'z'-'a' is reversed");
  EXPECT_EQ(ParseError("root ::= []"), "grammar:1:10: empty character class");
  EXPECT_EQ(ParseError("root ::= \"\\q\""), "grammar:1:11: unknown escape '\\q'");
  EXPECT_EQ(ParseError("root ::= (\"a\""), "grammar:1:10: '(' without a matching ')'");
  EXPECT_EQ(ParseError("root ::= \"a\")"), "grammar:1:13: ')' without a matching '('");
  EXPECT_EQ(ParseError("root ::= \"a\"{3,1}"),
            "grammar:1:13: repetition {3,1}: the maximum is below the minimum");
  EXPECT_EQ(ParseError("root ::= \"a\"{1000001}"),
            "grammar:1:14: repetition count 1000001 is over the limit 100000");
  EXPECT_EQ(ParseError("root ::= \"a\" @"), "grammar:1:14: unexpected '@'");
  EXPECT_EQ(ParseError("root ::= \"\\uD800\""),
            "grammar:1:11: escape U+D800 is not a Unicode scalar value");
  EXPECT_EQ(ParseError("root ::= \"a\"**"),
            "grammar:1:14: a repetition of a repetition: use a group");
}

TEST(GrammarParse, RefusesUndefinedAndDuplicateRulesByName) {
  EXPECT_EQ(ParseError("root ::= value\nvalue ::= vaule"),
            "grammar:2:11: rule 'vaule' is not defined");
  EXPECT_EQ(ParseError("root ::= \"a\"\nroot ::= \"b\""),
            "grammar:2:1: rule 'root' is defined twice (first at 1:1)");
  EXPECT_EQ(ParseError("start ::= \"a\""), "grammar: no rule named 'root' (the start rule)");
}

TEST(GrammarParse, RefusesLeftRecursionNamingTheCycle) {
  EXPECT_EQ(ParseError("root ::= root \"a\" | \"b\""),
            "grammar: rule 'root' is left-recursive: root -> root");
  EXPECT_EQ(ParseError("root ::= expr\nexpr ::= term \"+\" | \"1\"\nterm ::= expr \"*\""),
            "grammar: rule 'expr' is left-recursive: expr -> term -> expr");
  // Through a nullable prefix and through a group.
  EXPECT_EQ(ParseError("root ::= opt root \"x\" | \"y\"\nopt ::= \"o\"?"),
            "grammar: rule 'root' is left-recursive: root -> root");
  EXPECT_EQ(ParseError("root ::= (root | \"a\") \"b\" | \"c\""),
            "grammar: rule 'root' is left-recursive: root -> root");
  // Right recursion and tail calls through nullable prefixes are fine.
  EXPECT_EQ(ParseError("root ::= \"a\" root | \"\""), "(parsed)");
  EXPECT_EQ(ParseError("root ::= (\"a\"?)*"), "(parsed)");
}

TEST(GrammarParse, RefusesRulesThatCanNeverEnd) {
  EXPECT_EQ(ParseError("root ::= \"a\" | loop\nloop ::= \"b\" loop"),
            "grammar: rule 'loop' can never end: every alternative needs itself or another rule "
            "that cannot end, or an empty character class");
  EXPECT_EQ(ParseError("root ::= [^\\x00-\\U0010FFFF]"),
            "grammar: rule 'root' can never end: every alternative needs itself or another rule "
            "that cannot end, or an empty character class");
}

TEST(GrammarParse, LimitsAreEnforced) {
  auto code = [](std::string_view text, const GrammarLimits& limits) {
    auto g = Grammar::Parse(text, limits);
    return g.ok() ? StatusCode::kOk : g.status().code();
  };
  EXPECT_EQ(ParseError("root ::= \"a\"{" + std::string(100, '9') + "}"),
            "grammar:1:14: repetition count 99999999999999999999... is over the limit 100000");
  EXPECT_EQ(code("root ::= \"a\"{100001}", {}), StatusCode::kTooLarge);
  GrammarLimits small;
  small.max_elements = 100;
  EXPECT_EQ(ParseError("root ::= \"a\"{200}", small),
            "grammar: more than 100 items once repetitions are expanded (the limit)");
  EXPECT_EQ(code("root ::= \"a\"{200}", small), StatusCode::kTooLarge);
  small = {};
  small.max_text_bytes = 10;
  EXPECT_EQ(ParseError("root ::= \"abcdef\"", small),
            "grammar: 17 bytes of text, over the limit of 10");
  small = {};
  small.max_nesting = 2;
  EXPECT_EQ(ParseError("root ::= (((\"a\")))", small),
            "grammar:1:12: parentheses nested deeper than 2");
  EXPECT_EQ(code("root ::= (((\"a\")))", small), StatusCode::kTooLarge);
}

}  // namespace
}  // namespace kvasir::grammar
