// Stop strings over streamed text: nothing of a stop string is ever shown, the text that could
// still begin one is held back until the next piece tells, and what was held comes out when it
// turns out not to be one. Whole UTF-8 characters only.
#include "serve/stop_filter.h"

#include <gtest/gtest.h>

#include <random>

namespace kvasir::serve {
namespace {

// Feeds `pieces` one by one and returns what was shown, '|' between the outputs of each push.
std::string Shown(StopFilter& f, const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) out += f.Push(p) + "|";
  return out;
}

TEST(StopFilterTest, WithoutStopStringsTextPassesAtOnce) {
  StopFilter f;
  EXPECT_EQ(Shown(f, {"Once", " upon"}), "Once| upon|");
  EXPECT_EQ(f.Flush(), "");
  EXPECT_FALSE(f.stopped());
}

TEST(StopFilterTest, APossibleStartIsHeldBackUntilTheNextPieceTells) {
  StopFilter f({"The end"});
  EXPECT_EQ(f.Push("and so The"), "and so ");  // "The" may begin "The end"
  EXPECT_EQ(f.Push(" cat"), "The cat");        // it did not
  EXPECT_EQ(f.Push(" The e"), " ");
  EXPECT_EQ(f.Push("nd. More"), "");
  EXPECT_TRUE(f.stopped());
  EXPECT_EQ(f.Push("after"), "");
  EXPECT_EQ(f.Flush(), "");
}

TEST(StopFilterTest, AStopStringSplitOverManyPiecesIsCutWhole) {
  StopFilter f({"<|end|>"});
  EXPECT_EQ(Shown(f, {"Hi", "<", "|", "en", "d", "|>", "tail"}), "Hi|||||||");
  EXPECT_TRUE(f.stopped());
}

TEST(StopFilterTest, TheEarliestOfSeveralStopStringsWins) {
  StopFilter f({"bc", "ab"});
  EXPECT_EQ(f.Push("xabc"), "x");
  StopFilter g({"abcd", "bc"});
  EXPECT_EQ(g.Push("a"), "");    // may begin "abcd"
  EXPECT_EQ(g.Push("bc"), "a");  // "bc" occurs first, at 1
  EXPECT_TRUE(g.stopped());
}

TEST(StopFilterTest, TextHeldAtTheEndIsFlushed) {
  StopFilter f({"\n\n"});
  EXPECT_EQ(f.Push("line\n"), "line");
  EXPECT_EQ(f.Flush(), "\n");
}

// Whatever the split into pieces, the text shown is the text before the first stop string.
TEST(StopFilterTest, AnySplitShowsTheTextBeforeTheFirstStop) {
  const std::string text = "One day, Tim saw a cat. The cat said: THE END? No. The end. And more";
  const std::vector<std::string> stops = {"The end", "xyz", "cat said:"};
  const std::string expected = "One day, Tim saw a cat. The ";
  std::mt19937 rng(3);
  for (int trial = 0; trial < 500; ++trial) {
    StopFilter f(stops);
    std::string shown;
    size_t at = 0;
    while (at < text.size()) {
      const size_t n = 1 + rng() % 6;
      shown += f.Push(text.substr(at, n));
      at += n;
    }
    shown += f.Flush();
    ASSERT_EQ(shown, expected) << "trial " << trial;
    ASSERT_TRUE(f.stopped());
  }
}

TEST(StopFilterTest, HeldTextStaysBoundedByTheLongestStop) {
  StopFilter f({"STOP"});
  size_t shown = 0;
  for (int i = 0; i < 100000; ++i) shown += f.Push("words ST").size();
  EXPECT_EQ(shown + 2, 100000u * 8) << "all but the last \"ST\" went out";
}

TEST(GeneratedTextTest, CharactersSplitOverByteTokensComeOutWhole) {
  GeneratedText t({"é!"});
  EXPECT_EQ(t.Push("caf"), "caf");
  EXPECT_EQ(t.Push("\xC3"), "");  // half of é
  EXPECT_EQ(t.Push("\xA9"), "");  // é may begin "é!"
  EXPECT_EQ(t.Push("?"), "\xC3\xA9?");
  EXPECT_EQ(t.Push("\xC3\xA9!"), "");
  EXPECT_TRUE(t.stopped());
  GeneratedText u;
  EXPECT_EQ(u.Push("ab\xE2\x82"), "ab");
  EXPECT_EQ(u.Finish(), "\xEF\xBF\xBD") << "an unfinished character becomes U+FFFD";
}

}  // namespace
}  // namespace kvasir::serve
