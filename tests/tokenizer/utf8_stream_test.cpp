#include <gtest/gtest.h>

#include <string>

#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace kvasir {
namespace {

const std::string kFffd = "\xEF\xBF\xBD";

TEST(Utf8StreamTest, AsciiPassesThrough) {
  Utf8Stream s;
  EXPECT_EQ(s.Push("Hello"), "Hello");
  EXPECT_EQ(s.Push(" world"), " world");
  EXPECT_EQ(s.Flush(), "");
}

TEST(Utf8StreamTest, EmojiSplitOverFourByteTokens) {
  // U+1F999 🦙 arrives as byte tokens <0xF0> <0x9F> <0xA6> <0x99>.
  Utf8Stream s;
  EXPECT_EQ(s.Push("a\xF0"), "a");
  EXPECT_EQ(s.Push("\x9F"), "");
  EXPECT_EQ(s.Push("\xA6"), "");
  EXPECT_EQ(s.Push("\x99"), "\xF0\x9F\xA6\x99");
  EXPECT_EQ(s.Push("b"), "b");
  EXPECT_EQ(s.Flush(), "");
}

TEST(Utf8StreamTest, ConcatenatedOutputEqualsInputForValidText) {
  const std::string text = "Ä \xE2\x82\xAC \xF0\x9F\x98\x81 x\xE6\x88\x91";
  for (size_t chunk = 1; chunk <= 4; ++chunk) {
    Utf8Stream s;
    std::string out;
    for (size_t i = 0; i < text.size(); i += chunk) {
      std::string part = s.Push(text.substr(i, chunk));
      // Every returned part is complete on its own.
      for (size_t j = 0; j < part.size();) {
        const Utf8ScanResult r = ScanUtf8(std::string_view(part).substr(j));
        ASSERT_EQ(r.kind, Utf8Scan::kComplete) << "chunk " << chunk;
        j += r.length;
      }
      out += part;
    }
    out += s.Flush();
    EXPECT_EQ(out, text) << "chunk " << chunk;
  }
}

TEST(Utf8StreamTest, InvalidBytesBecomeReplacementAsSoonAsKnown) {
  Utf8Stream s;
  EXPECT_EQ(s.Push("\x80"), kFffd);  // stray continuation byte
  EXPECT_EQ(s.Push("\xFF"
                   "a"),
            kFffd + "a");                        // never valid in UTF-8
  EXPECT_EQ(s.Push("\xE2\x82"), "");             // could still complete
  EXPECT_EQ(s.Push("z"), kFffd + "z");           // ... but did not: one U+FFFD for the subpart
  EXPECT_EQ(s.Push("\xC0\xAF"), kFffd + kFffd);  // overlong lead byte
  EXPECT_EQ(s.Push("\xED\xA0\x80"), kFffd + kFffd + kFffd);  // surrogate
  EXPECT_EQ(s.Flush(), "");
}

TEST(Utf8StreamTest, FlushReplacesIncompleteTail) {
  Utf8Stream s;
  EXPECT_EQ(s.Push("ok\xF0\x9F\x98"), "ok");
  EXPECT_EQ(s.Flush(), kFffd);
  // The stream is reusable after a flush.
  EXPECT_EQ(s.Push("\xC3\xA9"), "\xC3\xA9");
  EXPECT_EQ(s.Flush(), "");
}

TEST(Utf8ScanTest, LeadByteLengths) {
  EXPECT_EQ(Utf8LenFromLead('a'), 1u);
  EXPECT_EQ(Utf8LenFromLead(0x80), 1u);
  EXPECT_EQ(Utf8LenFromLead(0xC3), 2u);
  EXPECT_EQ(Utf8LenFromLead(0xE2), 3u);
  EXPECT_EQ(Utf8LenFromLead(0xF0), 4u);
  EXPECT_EQ(Utf8LenFromLead(0xFF), 4u);
}

TEST(Utf8ScanTest, SpmCharacterLengths) {
  EXPECT_EQ(SpmCharLen("ab"), 1u);
  EXPECT_EQ(SpmCharLen("\xC3\xA9x"), 2u);
  EXPECT_EQ(SpmCharLen("\xF0\x9F\xA6\x99"), 4u);
  // Structurally complete sequences count as one character, even when not valid UTF-8 (as
  // llama.cpp splits them) ...
  EXPECT_EQ(SpmCharLen("\xC0\x80"), 2u);
  EXPECT_EQ(SpmCharLen("\xED\xA0\x80"), 3u);
  // ... but a lead byte never swallows a byte that is not a continuation byte, or runs past the
  // end.
  EXPECT_EQ(SpmCharLen("\xC3"
                       "A"),
            1u);
  EXPECT_EQ(SpmCharLen("\xE0\xE2\x96\x81"), 1u);
  EXPECT_EQ(SpmCharLen("\xF0\x9F\xA6"), 1u);
  EXPECT_EQ(SpmCharLen("\x80\x80"), 1u);
}

}  // namespace
}  // namespace kvasir
