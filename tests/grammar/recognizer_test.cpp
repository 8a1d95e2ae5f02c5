// Matching byte by byte: what is accepted and refused, UTF-8 at the byte level, checkpoints, and
// the bounds on ambiguity and memory.
#include "grammar/recognizer.h"

#include <gtest/gtest.h>

#include <string>

#include "grammar/char_classes.h"
#include "grammar/code_points.h"
#include "grammar_test_util.h"

namespace kvasir::grammar {
namespace {

using testing::FullMatch;
using testing::MustParse;
using testing::PrefixMatch;

std::string Utf8(uint32_t c) {
  std::string s;
  AppendUtf8(c, &s);
  return s;
}

TEST(Recognizer, AcceptsTheLanguageAndRefusesTheRest) {
  auto g = MustParse(R"(
root ::= "[" ws ( item ( "," ws item )* )? "]"
item ::= [0-9]+ | "\"" [a-z]* "\""
ws ::= " "?
)");
  for (const char* ok : {"[]", "[ ]", "[1]", "[12, \"ab\",3]", "[\"\"]", "[ 1,\"z\"]"}) {
    EXPECT_TRUE(FullMatch(g, ok)) << ok;
  }
  for (const char* bad : {"", "[", "[1,]", "[,1]", "[1 ]", "[\"A\"]", "[1]]", "x", "[  1]"}) {
    EXPECT_FALSE(FullMatch(g, bad)) << bad;
  }
  // Prefixes of the language are accepted without being complete.
  EXPECT_TRUE(PrefixMatch(g, "[12, \"a"));
  EXPECT_FALSE(PrefixMatch(g, "[12, \"a\"\""));
}

TEST(Recognizer, RefusedByteLeavesTheMatcherUnchanged) {
  auto g = MustParse("root ::= \"ab\" | \"ac\"");
  Recognizer r(g);
  Matcher m(&r);
  ASSERT_TRUE(m.Accept('a'));
  const Matcher checkpoint = m;
  EXPECT_FALSE(m.Accept('x'));
  EXPECT_EQ(m.state(), checkpoint.state());
  EXPECT_FALSE(m.AcceptBytes("bx"));  // all or nothing
  EXPECT_EQ(m.state(), checkpoint.state());
  EXPECT_FALSE(m.CanEnd());
  ASSERT_TRUE(m.Accept('c'));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_TRUE(m.MustEnd());
  // The checkpoint still continues on its own.
  Matcher other = checkpoint;
  EXPECT_TRUE(other.Accept('b'));
  EXPECT_TRUE(other.CanEnd());
}

TEST(Recognizer, CanEndWhileMoreMayFollow) {
  auto g = MustParse("root ::= [0-9]+");
  Recognizer r(g);
  Matcher m(&r);
  EXPECT_FALSE(m.CanEnd());
  ASSERT_TRUE(m.AcceptBytes("42"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.MustEnd());
}

TEST(Recognizer, NegatedClassMatchesEveryOtherCodePointAsStrictUtf8) {
  auto g = MustParse("root ::= [^a\\u00e9\\U0001F600-\\U0001F64F]");
  Recognizer r(g);
  const Matcher start(&r);
  for (uint32_t c = 0; c <= kMaxCodePoint; ++c) {
    if (c >= 0xD800 && c <= 0xDFFF) continue;
    const bool excluded = c == 'a' || c == 0xE9 || (c >= 0x1F600 && c <= 0x1F64F);
    Matcher m = start;
    const bool matched = m.AcceptBytes(Utf8(c)) && m.CanEnd();
    ASSERT_EQ(matched, !excluded) << "U+" << std::hex << c;
  }
  // Not UTF-8: overlong forms, surrogates, values over U+10FFFF, stray continuation bytes.
  for (const char* bad :
       {"\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80", "\xF0\x80\x80\x80",
        "\xF4\x90\x80\x80", "\xF5\x80\x80\x80", "\x80", "\xFF"}) {
    Matcher m = start;
    EXPECT_FALSE(m.AcceptBytes(bad) && m.CanEnd()) << ::testing::PrintToString(std::string(bad));
  }
}

TEST(Recognizer, DotMatchesOneCharacterSplitAcrossCalls) {
  auto g = MustParse("root ::= \"<\" . \">\"");
  Recognizer r(g);
  Matcher m(&r);
  ASSERT_TRUE(m.AcceptBytes("<\xF0\x9F"));  // a token may end inside a character
  EXPECT_FALSE(m.Accept('>'));
  ASSERT_TRUE(m.AcceptBytes("\x98\x80"));
  ASSERT_TRUE(m.Accept('>'));
  EXPECT_TRUE(m.CanEnd());
}

TEST(Recognizer, BoundedRepetitionCountsExactly) {
  auto g = MustParse("root ::= \"x\"{2,4} \"y\"{3} \"z\"{2,}");
  EXPECT_FALSE(FullMatch(g, "xyyyzz"));
  EXPECT_TRUE(FullMatch(g, "xxyyyzz"));
  EXPECT_TRUE(FullMatch(g, "xxxxyyyzzzzzz"));
  EXPECT_FALSE(FullMatch(g, "xxxxxyyyzz"));
  EXPECT_FALSE(FullMatch(g, "xxyyzz"));
  EXPECT_FALSE(FullMatch(g, "xxyyyz"));
}

TEST(Recognizer, RightRecursionKeepsTheStackFlat) {
  auto g = MustParse("root ::= \"a\" root | \"b\"");
  Recognizer r(g);
  Matcher m(&r);
  for (int i = 0; i < 100000; ++i) ASSERT_TRUE(m.Accept('a'));
  ASSERT_TRUE(m.Accept('b'));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_LT(r.frame_count(), 10u);
  EXPECT_LT(r.state_count(), 10u);
}

TEST(Recognizer, NestingGrowsFramesOnlyWithDepth) {
  auto g = MustParse("root ::= \"(\" root \")\" | \"x\"");
  Recognizer r(g);
  Matcher m(&r);
  const std::string text = std::string(500, '(') + "x" + std::string(500, ')');
  ASSERT_TRUE(m.AcceptBytes(text));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_LE(r.frame_count(), 5u * 500 + 10);  // a few frames per level, nothing more
}

TEST(Recognizer, AmbiguityIsDeduplicated) {
  // Two spellings of the same thing at every step: the stacks merge instead of doubling.
  auto g = MustParse("root ::= ( \"a\" | \"a\" | [a-b] )*");
  Recognizer r(g);
  Matcher m(&r);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(m.Accept('a'));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_LE(r.StackCount(m.state()), 4u);
  EXPECT_TRUE(m.status().ok());
}

TEST(Recognizer, TooManyStacksIsAnErrorNotARunaway) {
  // After n bytes 'a' every sequence of n closing letters b/c is still possible: 2^n stacks.
  const std::string text = "root ::= \"a\" root \"b\" | \"a\" root \"c\" | \"\"";
  GrammarLimits limits;
  limits.max_stacks = 64;
  auto g = Grammar::Parse(text, limits);
  ASSERT_TRUE(g.ok()) << g.status().message();
  Recognizer r(*g);
  Matcher m(&r);
  bool refused = false;
  for (int i = 0; i < 100 && !refused; ++i) refused = !m.Accept('a');
  ASSERT_TRUE(refused);
  EXPECT_EQ(m.status().code(), StatusCode::kTooLarge);
  EXPECT_NE(m.status().message().find("parse stacks alive at once, over the limit of 64"),
            std::string::npos)
      << m.status().message();
  // Sticky: the recognizer refuses from then on, even transitions it had computed.
  Matcher again(&r);
  EXPECT_FALSE(again.Accept('a'));
}

TEST(Recognizer, AGrammarTooAmbiguousToStartIsRefused) {
  std::string text = "root ::= a a a a a a a a a a\na ::= b*\nb ::= \"x\" | \"\"";
  GrammarLimits limits;
  limits.max_stacks = 4;
  auto g = Grammar::Parse(text, limits);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().code(), StatusCode::kTooLarge);
}

TEST(Recognizer, FrameAndStateLimitsAreErrors) {
  auto g = MustParse("root ::= \"(\" root \")\" | \"x\"");
  MatcherLimits limits;
  limits.max_frames = 100;
  Recognizer r(g, limits);
  Matcher m(&r);
  bool refused = false;
  for (int i = 0; i < 1000 && !refused; ++i) refused = !m.Accept('(');
  EXPECT_TRUE(refused);
  EXPECT_EQ(m.status().code(), StatusCode::kTooLarge);
  EXPECT_EQ(m.status().message(),
            "grammar: the match needs more than 100 stack frames (the limit)");

  MatcherLimits few_states;
  few_states.max_states = 50;
  Recognizer r2(g, few_states);
  Matcher m2(&r2);
  refused = false;
  for (int i = 0; i < 1000 && !refused; ++i) refused = !m2.Accept('(');
  EXPECT_TRUE(refused);
  EXPECT_EQ(m2.status().message(), "grammar: the match needs more than 50 states (the limit)");

  // States of many stacks each: after n bytes 'a', 2^n stacks (every sequence of n closings).
  auto ambiguous = MustParse("root ::= \"a\" root \"b\" | \"a\" root \"c\" | \"\"");
  MatcherLimits few_stacks;
  few_stacks.max_state_stacks = 100;
  Recognizer r3(ambiguous, few_stacks);
  Matcher m3(&r3);
  refused = false;
  for (int i = 0; i < 1000 && !refused; ++i) refused = !m3.Accept('a');
  EXPECT_TRUE(refused);
  EXPECT_EQ(m3.status().message(),
            "grammar: the match needs more than 100 stacks over all its states (the limit)");
}

TEST(Recognizer, DroppingTheTransitionMemoChangesNothing) {
  auto g = MustParse("root ::= ( [a-z] | \"\\u00e9\" )* \"!\"");
  MatcherLimits tiny;
  tiny.max_table_bytes = 2048;  // two tables: the memo is dropped over and over
  Recognizer r(g, tiny);
  Matcher m(&r);
  const std::string text = "abc\xC3\xA9xyz\xC3\xA9!";
  for (int round = 0; round < 3; ++round) {
    Matcher copy = m;
    ASSERT_TRUE(copy.AcceptBytes(text));
    EXPECT_TRUE(copy.CanEnd());
    EXPECT_FALSE(Matcher(m).AcceptBytes("abc!x"));
  }
  EXPECT_TRUE(r.status().ok());
  EXPECT_LE(r.MemoryBytes(), size_t{1} << 20);
}

TEST(Recognizer, CharacterRunsEndWhereTheGrammarSays) {
  auto g = MustParse("root ::= \"<\" [a-z\\u00e9]{0,3} \">\" | \"[\" [a-z]* \"]\"");
  Recognizer r(g);
  const uint64_t lower = uint64_t{1} << CharClassOf('a');
  const uint64_t two_bytes = uint64_t{1} << CharClassOf(0xC3);
  const uint64_t digits = uint64_t{1} << CharClassOf('0');
  Matcher m(&r);
  ASSERT_TRUE(m.Accept('<'));
  // Asked for one character first, then for more: the run is learnt further when needed.
  EXPECT_TRUE(r.CharsAccepted(m.state(), lower, 1));
  EXPECT_TRUE(r.CharsAccepted(m.state(), lower, 3));
  EXPECT_FALSE(r.CharsAccepted(m.state(), lower, 4));
  EXPECT_FALSE(r.CharsAccepted(m.state(), digits, 1));
  // [a-z\u00e9] holds only some two-byte characters: not every one of the class is accepted.
  EXPECT_FALSE(r.CharsAccepted(m.state(), two_bytes, 1));
  ASSERT_TRUE(m.AcceptBytes("ab"));
  EXPECT_TRUE(r.CharsAccepted(m.state(), lower, 1));
  EXPECT_FALSE(r.CharsAccepted(m.state(), lower, 2));
  Matcher open(&r);
  ASSERT_TRUE(open.Accept('['));
  EXPECT_TRUE(r.CharsAccepted(open.state(), lower, 200));  // a loop: any number
  EXPECT_FALSE(r.CharsAccepted(open.state(), lower | digits, 1));
}

}  // namespace
}  // namespace kvasir::grammar
