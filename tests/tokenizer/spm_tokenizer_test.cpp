// SPM encoding rules on small hand-made vocabularies.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "tokenizer/tokenizer.h"
#include "vocab_builder.h"

namespace kvasir {
namespace {

using ::kvasir::testing::MakeVocabHeader;
using ::kvasir::testing::SetKv;
using ::kvasir::testing::SpmBaseVocab;
using ::kvasir::testing::VocabEntry;
using Ids = std::vector<int32_t>;

const std::string kMarker = "\xE2\x96\x81";  // U+2581

// A tokenizer over <unk> <s> </s>, the 256 byte tokens and `extra`; Id() finds a token by text.
class SpmVocab {
 public:
  explicit SpmVocab(std::vector<VocabEntry> extra, bool space_prefix = true,
                    bool with_bytes = true) {
    entries_ = SpmBaseVocab(with_bytes);
    for (VocabEntry& e : extra) entries_.push_back(std::move(e));
    GgufHeader h = MakeVocabHeader(entries_);
    SetKv(&h, "tokenizer.ggml.add_space_prefix", GgufValue::Bool(space_prefix));
    auto tok = Tokenizer::FromGguf(h, "test.gguf");
    EXPECT_TRUE(tok.ok()) << tok.status().message();
    if (tok.ok()) tok_ = std::move(tok).value();
  }
  const Tokenizer& tok() const { return *tok_; }
  int32_t Id(const std::string& text) const {
    for (size_t i = entries_.size(); i-- > 0;) {
      if (entries_[i].text == text) return static_cast<int32_t>(i);
    }
    ADD_FAILURE() << "no token " << text;
    return -1;
  }
  static int32_t Byte(uint8_t b) { return 3 + b; }
  Ids Encode(std::string_view text, bool parse_special = false) const {
    return tok_->Encode(text, /*add_special=*/false, parse_special);
  }

 private:
  std::vector<VocabEntry> entries_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST(SpmTokenizerTest, HighestScoringPairMergesFirst) {
  SpmVocab right({{"a", -1}, {"b", -1}, {"c", -1}, {"ab", -5}, {"bc", -2}}, false);
  EXPECT_EQ(right.Encode("abc"), (Ids{right.Id("a"), right.Id("bc")}));
  SpmVocab left({{"a", -1}, {"b", -1}, {"c", -1}, {"ab", -2}, {"bc", -5}}, false);
  EXPECT_EQ(left.Encode("abc"), (Ids{left.Id("ab"), left.Id("c")}));
}

TEST(SpmTokenizerTest, EqualScoresMergeLeftmostFirst) {
  SpmVocab v({{"a", -1}, {"b", -1}, {"c", -1}, {"ab", -3}, {"bc", -3}, {"aa", -3}}, false);
  EXPECT_EQ(v.Encode("abc"), (Ids{v.Id("ab"), v.Id("c")}));
  EXPECT_EQ(v.Encode("aaa"), (Ids{v.Id("aa"), v.Id("a")}));
  EXPECT_EQ(v.Encode("aaaaa"), (Ids{v.Id("aa"), v.Id("aa"), v.Id("a")}));
}

TEST(SpmTokenizerTest, MergesChainThroughIntermediateTokens) {
  // "abcd" needs "bc" (best), then "abc", then "abcd"; "cd" would win over "abc" but "c" is gone.
  SpmVocab v({{"a", -1},
              {"b", -1},
              {"c", -1},
              {"d", -1},
              {"bc", -1},
              {"cd", -2},
              {"abc", -3},
              {"abcd", -9}},
             false);
  EXPECT_EQ(v.Encode("abcd"), (Ids{v.Id("abcd")}));
  // Without "abcd" the chain stops at "abc" + "d".
  SpmVocab w({{"a", -1}, {"b", -1}, {"c", -1}, {"d", -1}, {"bc", -1}, {"cd", -2}, {"abc", -3}},
             false);
  EXPECT_EQ(w.Encode("abcd"), (Ids{w.Id("abc"), w.Id("d")}));
}

TEST(SpmTokenizerTest, SpacesBecomeMarkersWithPrefix) {
  SpmVocab v({{kMarker, -1}, {"a", -1}, {"b", -1}, {kMarker + "a", -2}});
  EXPECT_EQ(v.Encode("a b"), (Ids{v.Id(kMarker + "a"), v.Id(kMarker), v.Id("b")}));
  EXPECT_EQ(v.Encode(" a"), (Ids{v.Id(kMarker), v.Id(kMarker + "a")}));
  EXPECT_EQ(v.Encode(""), Ids{});
  EXPECT_EQ(v.tok().Encode("", /*add_special=*/true), Ids{1});
  EXPECT_EQ(v.tok().Encode("a", /*add_special=*/true), (Ids{1, v.Id(kMarker + "a")}));
  // Tabs and newlines are not spaces.
  EXPECT_EQ(v.Encode("\t"), (Ids{v.Id(kMarker), SpmVocab::Byte('\t')}));

  SpmVocab no_prefix({{kMarker, -1}, {"a", -1}, {"b", -1}, {kMarker + "a", -2}}, false);
  EXPECT_EQ(no_prefix.Encode("a b"),
            (Ids{no_prefix.Id("a"), no_prefix.Id(kMarker), no_prefix.Id("b")}));
}

TEST(SpmTokenizerTest, UnknownCharactersFallBackToBytes) {
  SpmVocab v({{"a", -1}}, false);
  EXPECT_EQ(v.Encode("a\xC3\xA9"), (Ids{v.Id("a"), SpmVocab::Byte(0xC3), SpmVocab::Byte(0xA9)}));
  EXPECT_EQ(v.Encode("\xF0\x9F\xA6\x99"), (Ids{SpmVocab::Byte(0xF0), SpmVocab::Byte(0x9F),
                                               SpmVocab::Byte(0xA6), SpmVocab::Byte(0x99)}));
}

TEST(SpmTokenizerTest, WithoutByteTokensUnknownCharactersBecomeUnk) {
  SpmVocab v({{"a", -1}}, false, /*with_bytes=*/false);
  EXPECT_EQ(v.Encode("a\xC3\xA9"), (Ids{v.Id("a"), 0, 0}));
}

TEST(SpmTokenizerTest, InvalidUtf8BytesStandAlone) {
  SpmVocab v({{"a", -1}, {"A", -1}, {kMarker + "a", -1}}, false);
  // A lead byte without its continuation bytes does not swallow the next character.
  EXPECT_EQ(v.Encode("\xC3"
                     "A"),
            (Ids{SpmVocab::Byte(0xC3), v.Id("A")}));
  EXPECT_EQ(v.Encode("\xE0 a"), (Ids{SpmVocab::Byte(0xE0), v.Id(kMarker + "a")}));
  // A stray continuation byte stands alone; a truncated sequence at the end is clamped.
  EXPECT_EQ(v.Encode("\x80"
                     "a\xF0\x9F"),
            (Ids{SpmVocab::Byte(0x80), v.Id("a"), SpmVocab::Byte(0xF0), SpmVocab::Byte(0x9F)}));
  EXPECT_EQ(v.Encode("\xFF"), (Ids{SpmVocab::Byte(0xFF)}));
}

TEST(SpmTokenizerTest, ParseSpecialSplitsControlTokens) {
  SpmVocab v({{kMarker, -1}, {"a", -1}, {kMarker + "a", -2}});
  EXPECT_EQ(v.Encode("<s>a</s>", /*parse_special=*/true), (Ids{1, v.Id(kMarker + "a"), 2}));
  EXPECT_EQ(v.Encode("a<unk>", /*parse_special=*/true), (Ids{v.Id(kMarker + "a"), 0}));
  // Without parse_special the text is ordinary characters.
  Ids plain = v.Encode("<s>", /*parse_special=*/false);
  EXPECT_EQ(plain,
            (Ids{v.Id(kMarker), SpmVocab::Byte('<'), SpmVocab::Byte('s'), SpmVocab::Byte('>')}));
}

TEST(SpmTokenizerTest, UserDefinedTokensAreAlwaysSplitOut) {
  SpmVocab v({{kMarker, -1}, {"a", -1}, {"b", -1}, {kMarker + "a", -2}, {"<tag>", 0, 4}});
  const int32_t tag = v.Id("<tag>");
  // The text after a special token gets the space prefix again.
  EXPECT_EQ(v.Encode("a<tag>b"), (Ids{v.Id(kMarker + "a"), tag, v.Id(kMarker), v.Id("b")}));
  EXPECT_EQ(v.Encode("<tag><tag>"), (Ids{tag, tag}));
}

TEST(SpmTokenizerTest, LongerSpecialTokensAreMatchedFirst) {
  SpmVocab v({{"x", -1}, {"xy", 0, 4}, {"yzw", 0, 4}}, false);
  // "yzw" is split out first over the whole text, although "xy" starts earlier.
  EXPECT_EQ(v.Encode("xyzw"), (Ids{v.Id("x"), v.Id("yzw")}));
}

TEST(SpmTokenizerTest, TokenToPiece) {
  SpmVocab v({{kMarker + "a", -1}, {"<tag>", 0, 4}, {"gone", 0, 5}, {"odd" + kMarker, 0, 0}});
  const Tokenizer& t = v.tok();
  EXPECT_EQ(t.TokenToPiece(v.Id(kMarker + "a")), " a");
  EXPECT_EQ(t.TokenToPiece(SpmVocab::Byte('\n')), "\n");
  EXPECT_EQ(t.TokenToPiece(SpmVocab::Byte(0xF0)), "\xF0");
  EXPECT_EQ(t.TokenToPiece(1), "");
  EXPECT_EQ(t.TokenToPiece(1, /*special=*/true), "<s>");
  EXPECT_EQ(t.TokenToPiece(0), "");
  EXPECT_EQ(t.TokenToPiece(0, /*special=*/true), "<unk>");
  EXPECT_EQ(t.TokenToPiece(v.Id("<tag>")), "<tag>");
  EXPECT_EQ(t.TokenToPiece(v.Id("gone"), true), "");
  EXPECT_EQ(t.TokenToPiece(v.Id("odd" + kMarker), true), "");
  EXPECT_EQ(t.TokenToPiece(-1), "");
  EXPECT_EQ(t.TokenToPiece(t.n_vocab()), "");
}

TEST(SpmTokenizerTest, DecodeConcatenatesPieces) {
  SpmVocab v({{kMarker + "a", -1}, {"b", -1}});
  const Ids ids = {1, v.Id(kMarker + "a"), v.Id("b"), SpmVocab::Byte(0xC3), SpmVocab::Byte(0xA9),
                   2};
  EXPECT_EQ(v.tok().Decode(ids), " ab\xC3\xA9");
  EXPECT_EQ(v.tok().Decode(ids, /*special=*/true), "<s> ab\xC3\xA9</s>");
  const Ids no_bos(ids.begin() + 1, ids.end());
  EXPECT_EQ(v.tok().Decode(no_bos, false, /*skip_leading_space=*/true), "ab\xC3\xA9");
}

}  // namespace
}  // namespace kvasir
