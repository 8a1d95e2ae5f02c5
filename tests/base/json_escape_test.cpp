#include "base/json_escape.h"

#include <gtest/gtest.h>

#include <string>

namespace kvasir {
namespace {

TEST(JsonEscape, PlainTextAndUtf8StayAsWritten) {
  EXPECT_EQ(JsonEscape(""), "");
  EXPECT_EQ(JsonEscape("get_weather(city)"), "get_weather(city)");
  EXPECT_EQ(JsonEscape("caf\xC3\xA9 \xF0\x9F\x98\x80"), "caf\xC3\xA9 \xF0\x9F\x98\x80");
  EXPECT_EQ(JsonEscape("\x7F"), "\x7F");
}

TEST(JsonEscape, QuoteBackslashAndNamedControlsAreEscaped) {
  EXPECT_EQ(JsonEscape("say \"hi\""), "say \\\"hi\\\"");
  EXPECT_EQ(JsonEscape("C:\\dir"), "C:\\\\dir");
  EXPECT_EQ(JsonEscape("a\nb\rc\td"), "a\\nb\\rc\\td");
}

TEST(JsonEscape, OtherControlCharactersAreUnicodeEscapes) {
  EXPECT_EQ(JsonEscape(std::string("\0", 1)), "\\u0000");
  EXPECT_EQ(JsonEscape("\x01\x08\x0C\x1F"), "\\u0001\\u0008\\u000c\\u001f");
}

TEST(JsonEscape, PiecesEscapedApartJoinIntoTheWhole) {
  const std::string text = "x\"\\\n\xC3\xA9\x01";
  for (size_t cut = 0; cut <= text.size(); ++cut) {
    EXPECT_EQ(JsonEscape(text.substr(0, cut)) + JsonEscape(text.substr(cut)), JsonEscape(text))
        << "cut at " << cut;
  }
}

TEST(JsonEscape, AppendKeepsWhatIsThere) {
  std::string out = "{\"k\":\"";
  AppendJsonEscaped("a\"b", &out);
  EXPECT_EQ(out, "{\"k\":\"a\\\"b");
}

}  // namespace
}  // namespace kvasir
