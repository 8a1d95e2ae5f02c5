// The pre-tokenizer expressions on hand-picked text: where each variant cuts words, and that the
// cuts always give the text back.
#include "tokenizer/pre_tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir {
namespace {

using ::testing::HasSubstr;
using Words = std::vector<std::string>;

Words Split(std::string_view pre, std::string_view text) {
  auto p = PreTokenizer::Create(pre);
  EXPECT_TRUE(p.ok()) << p.status().message();
  if (!p.ok()) return {};
  Words out;
  for (std::string_view w : (*p)->Split(text)) out.emplace_back(w);
  return out;
}

TEST(PreTokenizerTest, Gpt2) {
  EXPECT_EQ(Split("gpt-2", "Hello world's 123  x\n\n"),
            (Words{"Hello", " world", "'s", " 123", " ", " x", "\n\n"}));
  // Upper-case contractions are not contractions for GPT-2.
  EXPECT_EQ(Split("gpt-2", "DON'T"), (Words{"DON", "'", "T"}));
  EXPECT_EQ(Split("gpt-2", "a+=b;"), (Words{"a", "+=", "b", ";"}));
  EXPECT_EQ(Split("gpt2", "1234567"), (Words{"1234567"}));
  EXPECT_TRUE(Split("gpt-2", "").empty());
}

TEST(PreTokenizerTest, Llama3) {
  // Digits in groups of three; a letter run takes one leading non-letter; newlines end a run.
  EXPECT_EQ(Split("llama-bpe", "12345 abc"), (Words{"123", "45", " abc"}));
  EXPECT_EQ(Split("llama-bpe", "DON'T\n\n  hi"), (Words{"DON", "'T", "\n\n", " ", " hi"}));
  EXPECT_EQ(Split("llama3", "(x)"), (Words{"(x", ")"}));
  EXPECT_EQ(Split("llama-v3", "!!\n\nok"), (Words{"!!\n\n", "ok"}));
}

TEST(PreTokenizerTest, Qwen2) {
  // Like Llama 3, but one digit per word.
  EXPECT_EQ(Split("qwen2", "123 abc"), (Words{"1", "2", "3", " abc"}));
  EXPECT_EQ(Split("qwen2", "I'm here"), (Words{"I", "'m", " here"}));
}

TEST(PreTokenizerTest, Qwen35KeepsCombiningMarksInWords) {
  // "é" written as e + U+0301 COMBINING ACUTE ACCENT, and Hindi "नमस्ते", whose vowel signs and
  // virama are marks (\p{M}): Qwen2 cuts the marks off as symbols, Qwen3.5 keeps each word whole.
  const std::string decomposed = "cafe\xCC\x81 ok";
  EXPECT_EQ(Split("qwen2", decomposed), (Words{"cafe", "\xCC\x81", " ok"}));
  EXPECT_EQ(Split("qwen35", decomposed), (Words{"cafe\xCC\x81", " ok"}));
  const std::string namaste =
      "\xE0\xA4\xA8\xE0\xA4\xAE\xE0\xA4\xB8\xE0\xA5\x8D\xE0\xA4\xA4\xE0\xA5\x87";
  EXPECT_GT(Split("qwen2", namaste).size(), 1u);
  EXPECT_EQ(Split("qwen35", namaste), (Words{namaste}));
  // Where no mark is involved the two agree.
  const std::string plain = "Hello, world! 42 times\n\n  done";
  EXPECT_EQ(Split("qwen2", plain), Split("qwen35", plain));
}

TEST(PreTokenizerTest, DefaultCascade) {
  // llama.cpp's "default": punctuation runs are cut out first, so "'t" is not a contraction;
  // then GPT-2 words; then digit runs in groups of three from the left.
  EXPECT_EQ(Split("default", "don't stop!!"), (Words{"don", "'", "t", " stop", "!!"}));
  EXPECT_EQ(Split("default", "x 12345"), (Words{"x", " ", "123", "45"}));
}

TEST(PreTokenizerTest, UnicodeWhitespace) {
  // NEL (U+0085) and NO-BREAK SPACE (U+00A0) are white space, as in the reference tokenizers.
  EXPECT_EQ(Split("gpt-2", "x \xC2\x85y"), (Words{"x", " ", "\xC2\x85", "y"}));
  EXPECT_EQ(Split("gpt-2", "x\xC2\xA0\xC2\xA0y"), (Words{"x", "\xC2\xA0", "\xC2\xA0", "y"}));
}

TEST(PreTokenizerTest, InvalidUtf8IsKeptAndActsAsASymbol) {
  // Each bad byte is matched as U+FFFD (a symbol) but the words keep the original bytes.
  EXPECT_EQ(Split("gpt-2", "ab\xFF\xFE cd"), (Words{"ab", "\xFF\xFE", " cd"}));
  EXPECT_EQ(Split("qwen2", "x\xE2\x82"), (Words{"x", "\xE2\x82"}));
  EXPECT_EQ(Split("llama-bpe", std::string("a\0b", 3)), (Words{"a", std::string("\0b", 2)}));
}

TEST(PreTokenizerTest, WordsCoverTheText) {
  std::mt19937 rng(99);
  for (const char* pre : {"default", "gpt-2", "llama-bpe", "qwen2", "qwen35"}) {
    auto p = PreTokenizer::Create(pre);
    ASSERT_TRUE(p.ok());
    for (int round = 0; round < 300; ++round) {
      std::string text(rng() % 48, '\0');
      for (char& c : text) {
        const uint32_t r = rng() % 8;
        c = static_cast<char>(r < 3 ? " \n\r\t'1aZ"[rng() % 8] : rng() % 256);
      }
      std::string joined;
      for (std::string_view w : (*p)->Split(text)) {
        EXPECT_FALSE(w.empty());
        joined += w;
      }
      EXPECT_EQ(joined, text) << pre;
    }
  }
}

TEST(PreTokenizerTest, LongRunsStayFast) {
  // A backtracking engine must not go quadratic on long runs of one class.
  for (const char* pre : {"default", "gpt-2", "llama-bpe", "qwen2", "qwen35"}) {
    auto p = PreTokenizer::Create(pre);
    ASSERT_TRUE(p.ok());
    for (char c : {' ', '\n', 'a', '!', '7'}) {
      const std::string run(200 * 1024, c);
      size_t total = 0;
      for (std::string_view w : (*p)->Split(run)) total += w.size();
      EXPECT_EQ(total, run.size()) << pre << " " << int{c};
    }
  }
}

TEST(PreTokenizerTest, UnknownNameListsTheSupportedOnes) {
  auto p = PreTokenizer::Create("falcon");
  ASSERT_FALSE(p.ok());
  EXPECT_THAT(p.status().message(), HasSubstr("'falcon' is not supported"));
  EXPECT_THAT(p.status().message(), HasSubstr("llama-bpe"));
  EXPECT_THAT(p.status().message(), HasSubstr("qwen35"));
  EXPECT_EQ(PreTokenizer::SupportedNames(),
            "default, gpt-2 (gpt2), llama-bpe (llama3, llama-v3), qwen2 (deepseek-r1-qwen), "
            "qwen35");
}

TEST(PreTokenizerTest, FamilyFlags) {
  auto llama = PreTokenizer::Create("llama3");
  ASSERT_TRUE(llama.ok());
  EXPECT_EQ((*llama)->name(), "llama-bpe");
  EXPECT_TRUE((*llama)->ignore_merges());
  EXPECT_TRUE((*llama)->default_add_bos());
  auto qwen = PreTokenizer::Create("qwen2");
  ASSERT_TRUE(qwen.ok());
  EXPECT_FALSE((*qwen)->ignore_merges());
  EXPECT_FALSE((*qwen)->default_add_bos());
}

}  // namespace
}  // namespace kvasir
