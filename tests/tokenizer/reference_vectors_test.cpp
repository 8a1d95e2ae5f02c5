// The llama-spm vocabulary against llama.cpp's own tokenizer vectors, and every reference prompt of
// the shared models (as llama.cpp tokenized and detokenized them).
#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "test_assets.h"
#include "tokenizer/tokenizer.h"

namespace kvasir {
namespace {

using ::kvasir::testing::AssetPath;
using ::kvasir::testing::ReadFileToString;
using Ids = std::vector<int32_t>;

constexpr char kSpmVocab[] = "vocab/ggml-vocab-llama-spm.gguf";

std::unique_ptr<Tokenizer> LoadTokenizer(const std::string& path) {
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().message();
  if (!file.ok()) return nullptr;
  auto tok = Tokenizer::FromGguf(file->header(), path);
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  if (!tok.ok()) return nullptr;
  return std::move(tok).value();
}

std::string Escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

std::string HexToBytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

TEST(SpmReferenceTest, LlamaCppVectors) {
  KV_REQUIRE_ASSET(kSpmVocab);
  const std::string base = AssetPath(kSpmVocab);
  std::unique_ptr<Tokenizer> tok = LoadTokenizer(base);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->n_vocab(), 32000);

  // Every string is followed by "\n__ggml_vocab_test__\n"; .out has one line per string.
  const std::string inp = ReadFileToString(base + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t end = inp.find(sep, pos);
    ASSERT_NE(end, std::string::npos) << "unterminated test string at byte " << pos;
    texts.push_back(inp.substr(pos, end - pos));
    pos = end + sep.size();
  }
  std::vector<Ids> expected;
  std::istringstream out(ReadFileToString(base + ".out"));
  for (std::string line; std::getline(out, line);) {
    std::istringstream ids(line);
    Ids row;
    for (int32_t id; ids >> id;) row.push_back(id);
    expected.push_back(row);
  }
  ASSERT_EQ(texts.size(), expected.size());
  ASSERT_GE(texts.size(), 40u);
  for (size_t i = 0; i < texts.size(); ++i) {
    EXPECT_EQ(tok->Encode(texts[i], /*add_special=*/false, /*parse_special=*/false), expected[i])
        << "vector " << i << ": \"" << Escaped(texts[i]) << "\"";
    // Decoding gives the text back, with the prefix space SPM adds.
    EXPECT_EQ(tok->Decode(expected[i]), texts[i].empty() ? "" : " " + texts[i]) << "vector " << i;
  }
}

TEST(SpmReferenceTest, ModelPrompts) {
  const std::filesystem::path dir = AssetPath("reference");
  if (!std::filesystem::exists(dir)) KV_REQUIRE_ASSET("reference");
  int n_cases = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".json") continue;
    const std::string case_name = entry.path().filename().string();
    const nlohmann::json ref = nlohmann::json::parse(ReadFileToString(entry.path().string()));
    const std::string model_path = AssetPath("models/" + ref.at("model").get<std::string>());
    auto file = GgufFile::Open(model_path);
    ASSERT_TRUE(file.ok()) << file.status().message();
    const GgufValue* model = file->Find("tokenizer.ggml.model");
    ASSERT_NE(model, nullptr) << case_name;
    ASSERT_NE(model->AsString(), nullptr) << case_name;
    if (*model->AsString() != "llama") continue;  // only SPM vocabularies are supported so far
    auto tok = Tokenizer::FromGguf(file->header(), model_path);
    ASSERT_TRUE(tok.ok()) << tok.status().message();
    ++n_cases;

    // llama.cpp tokenized the prompts with add_special and parse_special.
    const std::string prompt = ref.at("prompt").get<std::string>();
    EXPECT_EQ((*tok)->Encode(prompt, /*add_special=*/true, /*parse_special=*/true),
              ref.at("prompt_ids").get<Ids>())
        << case_name;
    EXPECT_EQ((*tok)->Encode(prompt, true, false), ref.at("prompt_ids").get<Ids>()) << case_name;

    // `text` joins llama_token_to_piece(special = true) of the generated tokens; when those
    // bytes are not valid UTF-8 the exact bytes are in text_bytes_hex and `text` has U+FFFD.
    const Ids generated = ref.at("generated_ids").get<Ids>();
    const std::string text = ref.at("text").get<std::string>();
    const bool valid = ref.value("text_utf8_valid", true);
    const std::string bytes =
        valid ? text : HexToBytes(ref.at("text_bytes_hex").get<std::string>());
    EXPECT_EQ((*tok)->Decode(generated, /*special=*/true), bytes) << case_name;
    Utf8Stream stream;
    std::string streamed;
    for (int32_t id : generated) streamed += stream.Push((*tok)->TokenToPiece(id, true));
    streamed += stream.Flush();
    EXPECT_EQ(streamed, text) << case_name;
  }
  EXPECT_GE(n_cases, 14);
}

TEST(SpmReferenceTest, AsciiRoundTrip) {
  KV_REQUIRE_ASSET(kSpmVocab);
  std::unique_ptr<Tokenizer> tok = LoadTokenizer(AssetPath(kSpmVocab));
  ASSERT_NE(tok, nullptr);
  const std::vector<std::string> texts = {
      "Once upon a time, there was a little girl named Lily.",
      "  leading spaces and trailing  ",
      "tabs\tand\nnewlines\r\n",
      "symbols: ~!@#$%^&*()_+{}|:\"<>?`-=[]\\;',./",
      "<s> and </s> are plain text here",
      "x",
  };
  for (const std::string& text : texts) {
    const Ids ids = tok->Encode(text, /*add_special=*/true);
    ASSERT_FALSE(ids.empty());
    EXPECT_EQ(ids[0], tok->bos());
    EXPECT_EQ(tok->Decode(ids), " " + text);
    EXPECT_EQ(tok->Decode(ids, false, /*skip_leading_space=*/true), text);
  }
}

TEST(SpmReferenceTest, ArbitraryBytesRoundTrip) {
  KV_REQUIRE_ASSET(kSpmVocab);
  std::unique_ptr<Tokenizer> tok = LoadTokenizer(AssetPath(kSpmVocab));
  ASSERT_NE(tok, nullptr);
  std::mt19937 rng(1234);
  for (int round = 0; round < 200; ++round) {
    std::string text(1 + rng() % 64, '\0');
    for (char& c : text) {
      // Mostly printable text with some multi-byte and broken sequences mixed in.
      const uint32_t r = rng() % 10;
      c = static_cast<char>(r < 6 ? 0x20 + rng() % 0x5f : rng() % 256);
    }
    const Ids ids = tok->Encode(text, /*add_special=*/false);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->n_vocab());
    EXPECT_EQ(tok->Decode(ids), " " + text) << Escaped(text);
  }
}

TEST(SpmReferenceTest, ParseSpecialOnTheRealVocab) {
  KV_REQUIRE_ASSET(kSpmVocab);
  std::unique_ptr<Tokenizer> tok = LoadTokenizer(AssetPath(kSpmVocab));
  ASSERT_NE(tok, nullptr);
  // "Hello" after a special token gets the space prefix: "▁Hello" is 15043.
  EXPECT_EQ(tok->Encode("<s>Hello</s>", false, /*parse_special=*/true), (Ids{1, 15043, 2}));
  EXPECT_EQ(tok->Encode("Hello world", true), (Ids{1, 15043, 3186}));
}

TEST(SpmReferenceTest, LargeInput) {
  KV_REQUIRE_ASSET(kSpmVocab);
  std::unique_ptr<Tokenizer> tok = LoadTokenizer(AssetPath(kSpmVocab));
  ASSERT_NE(tok, nullptr);
  // 100 KB of prose, and 100 KB without any space (one long word): both stay O(n log n).
  std::string prose;
  while (prose.size() < 100 * 1024) prose += "The quick brown fox jumps over the lazy dog. ";
  const Ids ids = tok->Encode(prose, false);
  EXPECT_GT(ids.size(), 10000u);
  EXPECT_EQ(tok->Decode(ids), " " + prose);
  const std::string word(100 * 1024, 'a');
  EXPECT_EQ(tok->Decode(tok->Encode(word, false)), " " + word);
}

}  // namespace
}  // namespace kvasir
