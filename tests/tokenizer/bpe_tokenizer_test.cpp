// Byte-level BPE rules on small hand-made vocabularies (ids 0..255 are the byte characters), and
// BPE metadata that must be refused with a message rather than crash.
#include "tokenizer/bpe_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "test_assets.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/tokenizer.h"
#include "vocab_builder.h"

namespace kvasir {
namespace {

using ::kvasir::testing::ArrayValue;
using ::kvasir::testing::BpeByteVocab;
using ::kvasir::testing::ByteLevel;
using ::kvasir::testing::MakeBpeHeader;
using ::kvasir::testing::RemoveKv;
using ::kvasir::testing::SetKv;
using ::kvasir::testing::VocabEntry;
using ::testing::HasSubstr;
using Ids = std::vector<int32_t>;

constexpr int32_t kControl = 3;
constexpr int32_t kUserDefined = 4;
constexpr int32_t kUnused = 5;

std::unique_ptr<Tokenizer> Load(const GgufHeader& h) {
  auto tok = Tokenizer::FromGguf(h, "test.gguf");
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  return tok.ok() ? std::move(tok).value() : nullptr;
}

std::string LoadError(const GgufHeader& h) {
  auto tok = Tokenizer::FromGguf(h, "test.gguf");
  EXPECT_FALSE(tok.ok());
  return tok.ok() ? std::string() : tok.status().message();
}

Ids Bytes(const std::string& s) {
  Ids ids;
  for (unsigned char c : s) ids.push_back(c);
  return ids;
}

TEST(ByteLevelTest, Alphabet) {
  EXPECT_EQ(ByteToCodepoint(' '), 0x120u);   // 'Ġ'
  EXPECT_EQ(ByteToCodepoint('\n'), 0x10Au);  // 'Ċ'
  EXPECT_EQ(ByteToCodepoint(0), 0x100u);
  EXPECT_EQ(ByteToCodepoint('a'), static_cast<uint32_t>('a'));
  EXPECT_EQ(ByteToCodepoint(0x7F), 0x121u);
  EXPECT_EQ(ByteToCodepoint(0xAD), 0x143u);
  EXPECT_EQ(ByteToCodepoint(0xE9), 0xE9u);
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(CodepointToByte(ByteToCodepoint(static_cast<uint8_t>(b))), b);
    std::string s;
    AppendByteLevel(std::string(1, static_cast<char>(b)), &s);
    EXPECT_EQ(s, ::kvasir::testing::ByteLevelChar(static_cast<uint8_t>(b))) << b;
  }
  EXPECT_EQ(CodepointToByte(0x20), -1);  // a plain space is not in the alphabet
  EXPECT_EQ(CodepointToByte(0x144), -1);
  EXPECT_EQ(DecodeByteLevel("\xC4\xA0hello\xC4\x8A"), " hello\n");
  bool ok = true;
  EXPECT_EQ(DecodeByteLevel("a\xE2\x82\xAC\xFF", &ok), "a\xE2\x82\xAC\xFF");  // '€' and a bad byte
  EXPECT_FALSE(ok);
}

TEST(BpeTokenizerTest, MergesApplyByRank) {
  const auto vocab = BpeByteVocab({{"ab"}, {"bc"}, {"abc"}});  // 256, 257, 258
  auto first = Load(MakeBpeHeader(vocab, {"a b", "b c", "ab c"}));
  ASSERT_NE(first, nullptr);
  EXPECT_EQ(first->Encode("abc", false), (Ids{258}));
  EXPECT_EQ(first->Encode("abcabc", false), (Ids{258, 258}));
  // "b c" ranks first now; nothing merges "a" with "bc".
  auto second = Load(MakeBpeHeader(vocab, {"b c", "a b", "ab c"}));
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->Encode("abc", false), (Ids{'a', 257}));
}

TEST(BpeTokenizerTest, EqualRanksMergeLeftmostFirst) {
  auto tok = Load(MakeBpeHeader(BpeByteVocab({{"aa"}}), {"a a"}));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("aaa", false), (Ids{256, 'a'}));
  EXPECT_EQ(tok->Encode("aaaa", false), (Ids{256, 256}));
}

TEST(BpeTokenizerTest, MergesStayInsideWords) {
  // "a Ġ" ranks first, but the pre-tokenizer cuts "a a" into "a" and " a".
  auto tok = Load(MakeBpeHeader(
      BpeByteVocab({{ByteLevel("a ")}, {ByteLevel(" a")}}),
      {ByteLevel("a") + " " + ByteLevel(" "), ByteLevel(" ") + " " + ByteLevel("a")}));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("a a", false), (Ids{'a', 257}));
  EXPECT_EQ(tok->Decode(Ids{'a', 257}), "a a");
}

TEST(BpeTokenizerTest, BytesAndPieces) {
  const auto vocab = BpeByteVocab({{ByteLevel(" h")}, {ByteLevel(" hi")}});  // 256, 257
  auto tok = Load(MakeBpeHeader(vocab, {ByteLevel(" ") + " h", ByteLevel(" h") + " i", "x y"}));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->TokenText(' '), "\xC4\xA0");
  EXPECT_EQ(tok->TokenToPiece(' '), " ");
  EXPECT_EQ(tok->TokenToPiece(0xFF), "\xFF");
  EXPECT_EQ(tok->TokenToPiece(257), " hi");
  EXPECT_EQ(tok->Encode(" hi\n", false), (Ids{257, '\n'}));
  // "x y" is a listed merge but "xy" is no token: the bytes come back as byte tokens.
  EXPECT_EQ(tok->Encode("xy", false), (Ids{'x', 'y'}));
  EXPECT_EQ(tok->TokenToPiece(-1), "");
  EXPECT_EQ(tok->TokenToPiece(258), "");
  EXPECT_FALSE(tok->add_space_prefix());
}

TEST(BpeTokenizerTest, AnyBytesRoundTrip) {
  auto tok = Load(
      MakeBpeHeader(BpeByteVocab({{"ab"}, {ByteLevel(" a")}}), {"a b", ByteLevel(" ") + " a"}));
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(7);
  for (int round = 0; round < 300; ++round) {
    std::string text(rng() % 40, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 3 == 0 ? " ab"[rng() % 3] : rng() % 256);
    const Ids ids = tok->Encode(text, true, true);
    EXPECT_EQ(tok->Decode(ids), text);
  }
}

TEST(BpeTokenizerTest, SpecialTokens) {
  auto vocab = BpeByteVocab(
      {{"<|im_end|>", 0, kControl}, {"<tool>", 0, kUserDefined}, {"[PAD0]", 0, kUnused}});
  GgufHeader h = MakeBpeHeader(vocab, {});
  SetKv(&h, "tokenizer.ggml.eos_token_id", GgufValue::Uint32(256));
  auto tok = Load(h);
  ASSERT_NE(tok, nullptr);
  // User-defined tokens are always matched; control tokens only with parse_special.
  EXPECT_EQ(tok->Encode("hi<tool>x", false), (Ids{'h', 'i', 257, 'x'}));
  EXPECT_EQ(tok->Encode("a<|im_end|>", false, /*parse_special=*/false), Bytes("a<|im_end|>"));
  EXPECT_EQ(tok->Encode("a<|im_end|>", false, /*parse_special=*/true), (Ids{'a', 256}));
  EXPECT_EQ(tok->Encode("[PAD0]", false, true), Bytes("[PAD0]"));
  EXPECT_EQ(tok->TokenToPiece(256), "");
  EXPECT_EQ(tok->TokenToPiece(256, /*special=*/true), "<|im_end|>");
  EXPECT_EQ(tok->TokenToPiece(257), "<tool>");
  EXPECT_EQ(tok->TokenToPiece(258, true), "");
  EXPECT_TRUE(tok->IsEog(256));
  EXPECT_FALSE(tok->IsEog(257));
}

TEST(BpeTokenizerTest, EndOfGenerationSet) {
  auto vocab = BpeByteVocab({{"<|endoftext|>", 0, kControl},
                             {"<|eot_id|>", 0, kControl},
                             {"<|eom_id|>", 0, kControl},
                             {"<|im_end|>", 0, 1}});  // normal: its text alone does not count
  GgufHeader h = MakeBpeHeader(vocab, {});
  SetKv(&h, "tokenizer.ggml.eos_token_id", GgufValue::Uint32(256));
  auto tok = Load(h);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->eos(), 256);
  EXPECT_EQ(tok->eog_ids(), (Ids{256, 257, 258}));
  EXPECT_FALSE(tok->IsEog(259));
  EXPECT_FALSE(tok->IsEog('a'));
}

TEST(BpeTokenizerTest, BosAndEosRules) {
  const auto vocab = BpeByteVocab({{"<|begin_of_text|>", 0, kControl}, {"</s>", 0, kControl}});
  // GPT-2 style: no BOS unless the file asks.
  GgufHeader h = MakeBpeHeader(vocab, {});
  SetKv(&h, "tokenizer.ggml.bos_token_id", GgufValue::Uint32(256));
  auto gpt2 = Load(h);
  ASSERT_NE(gpt2, nullptr);
  EXPECT_FALSE(gpt2->add_bos());
  EXPECT_EQ(gpt2->Encode("a", true), (Ids{'a'}));
  SetKv(&h, "tokenizer.ggml.add_bos_token", GgufValue::Bool(true));
  SetKv(&h, "tokenizer.ggml.add_eos_token", GgufValue::Bool(true));
  SetKv(&h, "tokenizer.ggml.eos_token_id", GgufValue::Uint32(257));
  auto both = Load(h);
  ASSERT_NE(both, nullptr);
  EXPECT_EQ(both->Encode("a", true), (Ids{256, 'a', 257}));
  EXPECT_EQ(both->Encode("a", false), (Ids{'a'}));

  // Llama 3 style: BOS by default, unless the file says otherwise.
  GgufHeader l = MakeBpeHeader(vocab, {}, "llama-bpe");
  SetKv(&l, "tokenizer.ggml.bos_token_id", GgufValue::Uint32(256));
  auto llama = Load(l);
  ASSERT_NE(llama, nullptr);
  EXPECT_TRUE(llama->add_bos());
  EXPECT_EQ(llama->Encode("a", true), (Ids{256, 'a'}));
  SetKv(&l, "tokenizer.ggml.add_bos_token", GgufValue::Bool(false));
  auto no_bos = Load(l);
  ASSERT_NE(no_bos, nullptr);
  EXPECT_EQ(no_bos->Encode("a", true), (Ids{'a'}));
}

TEST(BpeTokenizerTest, Llama3TakesWholeWordTokens) {
  // "abc" is a token that the merges would not build: Llama 3 takes the word whole, Qwen2 merges.
  const auto vocab = BpeByteVocab({{"ab"}, {"abc"}, {"<s>", 0, kControl}});
  GgufHeader h = MakeBpeHeader(vocab, {"a b"}, "llama-bpe");
  SetKv(&h, "tokenizer.ggml.bos_token_id", GgufValue::Uint32(258));
  auto llama = Load(h);
  ASSERT_NE(llama, nullptr);
  EXPECT_EQ(llama->Encode("abc", true), (Ids{258, 257}));
  auto qwen = Load(MakeBpeHeader(vocab, {"a b"}, "qwen2"));
  ASSERT_NE(qwen, nullptr);
  EXPECT_EQ(qwen->Encode("abc", false), (Ids{256, 'c'}));
}

TEST(BpeTokenizerTest, MissingPreMeansDefault) {
  auto tok = Tokenizer::FromGguf(MakeBpeHeader(BpeByteVocab(), {}, /*pre=*/""), "test.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(tok->get());
  ASSERT_NE(bpe, nullptr);
  EXPECT_EQ(bpe->pre_tokenizer().name(), "default");
  EXPECT_EQ(bpe->n_merges(), 0u);
}

TEST(BpeTokenizerTest, VocabularyWithoutByteCharacters) {
  // Bytes whose character is not a token are dropped (as in llama.cpp); nothing crashes.
  auto tok = Load(MakeBpeHeader({{"a"}, {"\xE2\x82\xAC"}}, {}));
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->Encode("abc", false), (Ids{0}));
  EXPECT_EQ(tok->TokenToPiece(1), "\xE2\x82\xAC");  // not in the alphabet: kept as it is
}

TEST(BpeTokenizerTest, WrittenVocabFile) {
  ::kvasir::testing::TempDir dir;
  GgufWriter writer;
  writer.CopyKvs(MakeBpeHeader(BpeByteVocab({{"ab"}}), {"a b"}, "qwen2"));
  const std::string path = dir.File("bpe.gguf");
  ASSERT_TRUE(writer.Write(path).ok());
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto tok = Tokenizer::FromGguf(file->header(), path);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->Encode("xab", false), (Ids{'x', 256}));
}

TEST(BpeMetadataTest, UnknownPreTokenizer) {
  EXPECT_EQ(LoadError(MakeBpeHeader(BpeByteVocab(), {}, "falcon")),
            "test.gguf: tokenizer.ggml.pre 'falcon' is not supported (supported: default, gpt-2 "
            "(gpt2), llama-bpe (llama3, llama-v3), qwen2 (deepseek-r1-qwen), qwen35)");
  GgufHeader h = MakeBpeHeader(BpeByteVocab(), {});
  SetKv(&h, "tokenizer.ggml.pre", GgufValue::Uint32(2));
  EXPECT_THAT(LoadError(h), HasSubstr("test.gguf: tokenizer.ggml.pre has type"));
}

TEST(BpeMetadataTest, BadMergesArray) {
  GgufHeader h = MakeBpeHeader(BpeByteVocab(), {});
  RemoveKv(&h, "tokenizer.ggml.merges");
  EXPECT_EQ(LoadError(h),
            "test.gguf: tokenizer.ggml.merges is missing (a BPE vocabulary needs it)");
  SetKv(&h, "tokenizer.ggml.merges", GgufValue::String("a b"));
  EXPECT_THAT(LoadError(h), HasSubstr("test.gguf: tokenizer.ggml.merges has type"));
  SetKv(&h, "tokenizer.ggml.merges", ArrayValue(GgufType::kInt32, std::vector<int32_t>{1, 2}));
  EXPECT_THAT(LoadError(h), HasSubstr("test.gguf: tokenizer.ggml.merges is an array of"));
}

TEST(BpeMetadataTest, MalformedMerges) {
  const auto vocab = BpeByteVocab({{"ab"}});
  for (const std::string& bad : {std::string("ab"), std::string("a "), std::string(" a"),
                                 std::string(""), std::string(" ")}) {
    EXPECT_EQ(LoadError(MakeBpeHeader(vocab, {"a b", bad})),
              "test.gguf: tokenizer.ggml.merges[1] = '" + bad +
                  "' is not two tokens separated by a space")
        << bad;
  }
  EXPECT_EQ(LoadError(MakeBpeHeader(vocab, {"a zz"})),
            "test.gguf: tokenizer.ggml.merges[0] = 'a zz' names 'zz', which is not in "
            "tokenizer.ggml.tokens");
  EXPECT_EQ(LoadError(MakeBpeHeader(vocab, {"q\xFF b"})),
            "test.gguf: tokenizer.ggml.merges[0] = 'q\xFF b' names 'q\xFF', which is not in "
            "tokenizer.ggml.tokens");
  // A long entry is quoted in part.
  const std::string long_merge = std::string(1000, 'x') + " y";
  const std::string message = LoadError(MakeBpeHeader(vocab, {long_merge}));
  EXPECT_LT(message.size(), 300u);
  EXPECT_THAT(message, HasSubstr("tokenizer.ggml.merges[0]"));
}

TEST(BpeMetadataTest, BosOrEosAskedForButAbsent) {
  GgufHeader h = MakeBpeHeader(BpeByteVocab(), {}, "llama-bpe");
  EXPECT_THAT(LoadError(h), HasSubstr("the vocabulary has no BOS token"));
  GgufHeader g = MakeBpeHeader(BpeByteVocab(), {});
  SetKv(&g, "tokenizer.ggml.add_eos_token", GgufValue::Bool(true));
  EXPECT_THAT(LoadError(g), HasSubstr("add_eos_token is true but the vocabulary has no EOS"));
}

TEST(BpeMetadataTest, CommonChecksApply) {
  // The checks every vocabulary type shares (types, special ids) run for BPE too.
  GgufHeader h = MakeBpeHeader(BpeByteVocab(), {});
  SetKv(&h, "tokenizer.ggml.eos_token_id", GgufValue::Uint32(256));
  EXPECT_THAT(LoadError(h), HasSubstr("tokenizer.ggml.eos_token_id = 256 is out of range"));
  GgufHeader t = MakeBpeHeader(BpeByteVocab(), {});
  SetKv(&t, "tokenizer.ggml.token_type", ArrayValue(GgufType::kInt32, std::vector<int32_t>{1}));
  EXPECT_THAT(LoadError(t), HasSubstr("tokenizer.ggml.token_type has 1 entries"));
}

}  // namespace
}  // namespace kvasir
