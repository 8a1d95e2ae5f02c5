// Tokenizer::FromGguf on well-formed and hostile tokenizer metadata.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "test_assets.h"
#include "tokenizer/tokenizer.h"
#include "vocab_builder.h"

namespace kvasir {
namespace {

using ::kvasir::testing::ArrayValue;
using ::kvasir::testing::MakeVocabHeader;
using ::kvasir::testing::RemoveKv;
using ::kvasir::testing::SetKv;
using ::kvasir::testing::SpmBaseVocab;
using ::testing::HasSubstr;

GgufHeader SmallVocab() {
  auto v = SpmBaseVocab(/*with_bytes=*/true);
  v.push_back({"\xE2\x96\x81", -1.0f});
  v.push_back({"a", -2.0f});
  return MakeVocabHeader(v);
}

std::string LoadError(const GgufHeader& h) {
  auto tok = Tokenizer::FromGguf(h, "test.gguf");
  EXPECT_FALSE(tok.ok());
  return tok.ok() ? std::string() : tok.status().message();
}

TEST(VocabMetadataTest, SpmDefaults) {
  auto tok = Tokenizer::FromGguf(SmallVocab(), "test.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->n_vocab(), 3 + 256 + 2);
  EXPECT_EQ((*tok)->bos(), 1);
  EXPECT_EQ((*tok)->eos(), 2);
  EXPECT_EQ((*tok)->unk(), 0);
  EXPECT_EQ((*tok)->eot(), -1);
  EXPECT_TRUE((*tok)->add_bos());
  EXPECT_FALSE((*tok)->add_eos());
  EXPECT_TRUE((*tok)->add_space_prefix());
  EXPECT_EQ((*tok)->Attr(0), TokenAttr::kUnknown);
  EXPECT_EQ((*tok)->Attr(1), TokenAttr::kControl);
  EXPECT_EQ((*tok)->TokenText(3 + 256 + 1), "a");
  EXPECT_FLOAT_EQ((*tok)->Score(3 + 256 + 1), -2.0f);
  EXPECT_TRUE((*tok)->IsEog(2));
  EXPECT_FALSE((*tok)->IsEog(1));
  EXPECT_FALSE((*tok)->IsEog(-1));
  EXPECT_FALSE((*tok)->IsEog(100000));
}

TEST(VocabMetadataTest, ExplicitFlagsAndIds) {
  GgufHeader h = SmallVocab();
  SetKv(&h, "tokenizer.ggml.add_bos_token", GgufValue::Bool(false));
  SetKv(&h, "tokenizer.ggml.add_eos_token", GgufValue::Bool(true));
  SetKv(&h, "tokenizer.ggml.add_space_prefix", GgufValue::Bool(false));
  SetKv(&h, "tokenizer.ggml.bos_token_id", GgufValue::Uint32(2));
  SetKv(&h, "tokenizer.ggml.eos_token_id", GgufValue::Int32(1));
  SetKv(&h, "tokenizer.ggml.eot_token_id", GgufValue::Uint32(5));
  // Converters write 0xFFFFFFFF for "no such token".
  SetKv(&h, "tokenizer.ggml.unknown_token_id", GgufValue::Uint32(0xFFFFFFFFu));
  auto tok = Tokenizer::FromGguf(h, "test.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_FALSE((*tok)->add_bos());
  EXPECT_TRUE((*tok)->add_eos());
  EXPECT_FALSE((*tok)->add_space_prefix());
  EXPECT_EQ((*tok)->bos(), 2);
  EXPECT_EQ((*tok)->eos(), 1);
  EXPECT_EQ((*tok)->eot(), 5);
  EXPECT_EQ((*tok)->unk(), -1);
  EXPECT_TRUE((*tok)->IsEog(1));
  EXPECT_TRUE((*tok)->IsEog(5));
  EXPECT_FALSE((*tok)->IsEog(2));
  // add_eos and no add_bos.
  EXPECT_EQ((*tok)->Encode("a", /*add_special=*/true), (std::vector<int32_t>{3 + 256 + 1, 1}));
}

TEST(VocabMetadataTest, EndOfTurnTokenFoundByText) {
  auto v = SpmBaseVocab(/*with_bytes=*/false);
  v.push_back({"<|im_end|>", 0.0f, 3});
  auto tok = Tokenizer::FromGguf(MakeVocabHeader(v), "test.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->eot(), 3);
  EXPECT_TRUE((*tok)->IsEog(3));
}

TEST(VocabMetadataTest, DefaultIdsOutsideATinyVocabAreNone) {
  GgufHeader h = MakeVocabHeader({{"a", 0.0f, 1}});
  auto tok = Tokenizer::FromGguf(h, "test.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->bos(), -1);
  EXPECT_EQ((*tok)->eos(), -1);
  EXPECT_EQ((*tok)->unk(), 0);
  // No BOS to add, no byte tokens and the unk default points at "a": nothing crashes.
  EXPECT_EQ((*tok)->Encode("a", true), (std::vector<int32_t>{0, 0, 0, 0}));
}

TEST(VocabMetadataTest, OptionalArraysMayBeAbsent) {
  GgufHeader h = SmallVocab();
  RemoveKv(&h, "tokenizer.ggml.scores");
  RemoveKv(&h, "tokenizer.ggml.token_type");
  auto tok = Tokenizer::FromGguf(h, "test.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->Attr(1), TokenAttr::kNormal);
  EXPECT_FLOAT_EQ((*tok)->Score(5), 0.0f);
}

TEST(VocabMetadataTest, UnsupportedModels) {
  EXPECT_EQ(LoadError(MakeVocabHeader({{"a"}}, "rwkv")),
            "test.gguf: tokenizer.ggml.model 'rwkv' is not supported (supported: llama, gpt2)");
  EXPECT_EQ(LoadError(MakeVocabHeader({{"a"}}, "t5")),
            "test.gguf: tokenizer.ggml.model 't5' is not supported (supported: llama, gpt2)");
}

// The same checks on a vocabulary that went through a file.
TEST(VocabMetadataTest, WrittenVocabFiles) {
  ::kvasir::testing::TempDir dir;
  auto write_and_load = [&](const GgufHeader& h, const std::string& file_name) {
    GgufWriter writer;
    writer.CopyKvs(h);
    const std::string path = dir.File(file_name);
    EXPECT_TRUE(writer.Write(path).ok());
    auto file = GgufFile::Open(path);
    EXPECT_TRUE(file.ok()) << file.status().message();
    return Tokenizer::FromGguf(file->header(), path);
  };
  GgufHeader good = SmallVocab();
  auto tok = write_and_load(good, "good.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ((*tok)->Encode("a", true), (std::vector<int32_t>{1, 3 + 256, 3 + 256 + 1}));

  GgufHeader bad = SmallVocab();
  SetKv(&bad, "tokenizer.ggml.eos_token_id", GgufValue::Int32(70000));
  tok = write_and_load(bad, "bad.gguf");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(
      tok.status().message(),
      dir.File("bad.gguf") +
          ": tokenizer.ggml.eos_token_id = 70000 is out of range (vocabulary has 261 tokens)");
}

TEST(VocabMetadataTest, MissingOrMistypedModel) {
  GgufHeader h = SmallVocab();
  RemoveKv(&h, "tokenizer.ggml.model");
  EXPECT_THAT(LoadError(h), HasSubstr("test.gguf: tokenizer.ggml.model is missing"));
  SetKv(&h, "tokenizer.ggml.model", GgufValue::Uint32(7));
  EXPECT_THAT(LoadError(h), HasSubstr("tokenizer.ggml.model has type u32, expected string"));
}

TEST(VocabMetadataTest, BadTokensArray) {
  GgufHeader h = SmallVocab();
  RemoveKv(&h, "tokenizer.ggml.tokens");
  EXPECT_THAT(LoadError(h), HasSubstr("tokenizer.ggml.tokens is missing"));
  SetKv(&h, "tokenizer.ggml.tokens", GgufValue::String("abc"));
  EXPECT_THAT(LoadError(h), HasSubstr("tokenizer.ggml.tokens has type string, expected an array"));
  SetKv(&h, "tokenizer.ggml.tokens", ArrayValue(GgufType::kInt32, std::vector<int32_t>{1, 2}));
  EXPECT_THAT(LoadError(h),
              HasSubstr("tokenizer.ggml.tokens is an array of i32, expected strings"));
  SetKv(&h, "tokenizer.ggml.tokens", ArrayValue(GgufType::kString, std::vector<std::string>{}));
  EXPECT_THAT(LoadError(h), HasSubstr("tokenizer.ggml.tokens is empty"));
}

TEST(VocabMetadataTest, ArraysOfDifferentLengths) {
  GgufHeader h = SmallVocab();
  SetKv(&h, "tokenizer.ggml.scores", ArrayValue(GgufType::kFloat32, std::vector<float>(10)));
  EXPECT_EQ(LoadError(h),
            "test.gguf: tokenizer.ggml.scores has 10 entries but tokenizer.ggml.tokens has 261");
  h = SmallVocab();
  SetKv(&h, "tokenizer.ggml.token_type",
        ArrayValue(GgufType::kInt32, std::vector<int32_t>(300, 1)));
  EXPECT_EQ(
      LoadError(h),
      "test.gguf: tokenizer.ggml.token_type has 300 entries but tokenizer.ggml.tokens has 261");
}

TEST(VocabMetadataTest, BadScoresAndTypes) {
  GgufHeader h = SmallVocab();
  std::vector<float> scores(261, 0.0f);
  scores[7] = std::numeric_limits<float>::quiet_NaN();
  SetKv(&h, "tokenizer.ggml.scores", ArrayValue(GgufType::kFloat32, scores));
  EXPECT_THAT(LoadError(h), HasSubstr("tokenizer.ggml.scores[7] is NaN"));
  SetKv(&h, "tokenizer.ggml.scores",
        ArrayValue(GgufType::kString, std::vector<std::string>(261, "x")));
  EXPECT_THAT(LoadError(h), HasSubstr("tokenizer.ggml.scores is an array of string"));

  h = SmallVocab();
  std::vector<int32_t> types(261, 1);
  types[4] = 9;
  SetKv(&h, "tokenizer.ggml.token_type", ArrayValue(GgufType::kInt32, types));
  EXPECT_THAT(LoadError(h),
              HasSubstr("tokenizer.ggml.token_type[4] = 9 is not a known token type"));
  types[4] = -1;
  SetKv(&h, "tokenizer.ggml.token_type", ArrayValue(GgufType::kInt32, types));
  EXPECT_THAT(LoadError(h), HasSubstr("tokenizer.ggml.token_type[4] = -1"));
  SetKv(&h, "tokenizer.ggml.token_type", ArrayValue(GgufType::kFloat32, std::vector<float>(261)));
  EXPECT_THAT(LoadError(h), HasSubstr("tokenizer.ggml.token_type is an array of f32"));
}

TEST(VocabMetadataTest, SpecialIdsOutOfRange) {
  for (const char* key : {"tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
                          "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.eot_token_id"}) {
    GgufHeader h = SmallVocab();
    SetKv(&h, key, GgufValue::Uint32(261));
    EXPECT_EQ(LoadError(h), fmt::format("test.gguf: {} = 261 is out of range (vocabulary has 261 "
                                        "tokens)",
                                        key));
    SetKv(&h, key, GgufValue::Uint64(~uint64_t{0} - 1));
    EXPECT_THAT(LoadError(h), HasSubstr("is out of range"));
    SetKv(&h, key, GgufValue::String("1"));
    EXPECT_THAT(LoadError(h),
                HasSubstr(fmt::format("{} has type string, expected an integer", key)));
  }
}

TEST(VocabMetadataTest, MistypedFlags) {
  GgufHeader h = SmallVocab();
  SetKv(&h, "tokenizer.ggml.add_bos_token", GgufValue::Uint32(1));
  EXPECT_THAT(LoadError(h), HasSubstr("tokenizer.ggml.add_bos_token has type u32, expected bool"));
}

TEST(VocabMetadataTest, ByteTokenWithoutByteText) {
  auto v = SpmBaseVocab(/*with_bytes=*/false);
  v.push_back({"<0xZZ>", 0.0f, 6});
  EXPECT_THAT(LoadError(MakeVocabHeader(v)),
              HasSubstr("token 3 is a byte token (tokenizer.ggml.token_type 6) but its text "
                        "'<0xZZ>' is not of the form <0xXX>"));
}

TEST(VocabMetadataTest, OddButValidVocabularyDoesNotCrash) {
  // Empty texts, duplicate texts, unused/undefined tokens, infinite scores.
  auto v = SpmBaseVocab(/*with_bytes=*/false);
  v.push_back({"", 5.0f, 1});
  v.push_back({"", 0.0f, 3});
  v.push_back({"ab", 1.0f, 1});
  v.push_back({"ab", std::numeric_limits<float>::infinity(), 5});
  v.push_back({"a", -std::numeric_limits<float>::infinity(), 0});
  v.push_back({"b", 0.0f, 4});
  auto tok = Tokenizer::FromGguf(MakeVocabHeader(v), "test.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  // "b" is user-defined, so it is split out first; "▁" falls back to unk (no byte tokens) for
  // each of its three bytes, and "a" is the undefined token 7.
  std::vector<int32_t> ids = (*tok)->Encode("ab ab\xFF", true, true);
  EXPECT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ((*tok)->Encode("ab", false), (std::vector<int32_t>{0, 0, 0, 7, 8}));
  for (int32_t id = -3; id < (*tok)->n_vocab() + 3; ++id) (*tok)->TokenToPiece(id, true);
}

}  // namespace
}  // namespace kvasir
