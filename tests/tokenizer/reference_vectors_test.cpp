// The shared vocabularies against llama.cpp's own tokenizer vectors (llama-spm, gpt-2, qwen2, and
// llama-bpe when its GGUF is present), and every reference prompt of the shared models (as
// llama.cpp tokenized and detokenized them).
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

// A vocabulary's test strings and the ids llama.cpp gives them.
struct Vectors {
  std::vector<std::string> texts;
  std::vector<Ids> expected;
};

// Reads `base`.inp / `base`.out: every string is followed by "\n__ggml_vocab_test__\n"; .out has
// one line of ids per string.
Vectors ReadVectors(const std::string& base) {
  Vectors v;
  const std::string inp = ReadFileToString(base + ".inp");
  const std::string sep = "\n__ggml_vocab_test__\n";
  for (size_t pos = 0; pos < inp.size();) {
    const size_t end = inp.find(sep, pos);
    EXPECT_NE(end, std::string::npos) << base << ".inp: unterminated test string at byte " << pos;
    if (end == std::string::npos) break;
    v.texts.push_back(inp.substr(pos, end - pos));
    pos = end + sep.size();
  }
  std::istringstream out(ReadFileToString(base + ".out"));
  for (std::string line; std::getline(out, line);) {
    std::istringstream ids(line);
    Ids row;
    for (int32_t id; ids >> id;) row.push_back(id);
    v.expected.push_back(row);
  }
  EXPECT_EQ(v.texts.size(), v.expected.size()) << base;
  return v;
}

// Encodes every vector (add_special = false, parse_special = false, as llama.cpp's test does) and
// decodes the expected ids; `decode_prefix` is what decoding puts before the text. Returns how
// many vectors encode exactly.
size_t CheckVectors(const Tokenizer& tok, const Vectors& v, const std::string& decode_prefix) {
  size_t n_pass = 0;
  for (size_t i = 0; i < v.texts.size() && i < v.expected.size(); ++i) {
    const Ids ids = tok.Encode(v.texts[i], /*add_special=*/false, /*parse_special=*/false);
    EXPECT_EQ(ids, v.expected[i]) << "vector " << i << ": \"" << Escaped(v.texts[i]) << "\"";
    n_pass += ids == v.expected[i];
    EXPECT_EQ(tok.Decode(v.expected[i]), v.texts[i].empty() ? "" : decode_prefix + v.texts[i])
        << "vector " << i;
  }
  return n_pass;
}

TEST(SpmReferenceTest, LlamaCppVectors) {
  KV_REQUIRE_ASSET(kSpmVocab);
  const std::string base = AssetPath(kSpmVocab);
  std::unique_ptr<Tokenizer> tok = LoadTokenizer(base);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->n_vocab(), 32000);
  const Vectors v = ReadVectors(base);
  ASSERT_GE(v.texts.size(), 40u);
  // Decoding gives the text back, with the prefix space SPM adds.
  EXPECT_EQ(CheckVectors(*tok, v, " "), v.texts.size());
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

constexpr char kGpt2Vocab[] = "vocab/ggml-vocab-gpt-2.gguf";
constexpr char kQwen2Vocab[] = "vocab/ggml-vocab-qwen2.gguf";
constexpr char kLlamaBpeVocab[] = "vocab/ggml-vocab-llama-bpe.gguf";

// Every vector of `base` (the vocab GGUF, with .inp/.out beside it) encodes to its ids.
void ExpectEveryVector(const std::string& base, int32_t n_vocab) {
  std::unique_ptr<Tokenizer> tok = LoadTokenizer(base);
  ASSERT_NE(tok, nullptr);
  EXPECT_EQ(tok->n_vocab(), n_vocab);
  const Vectors v = ReadVectors(base);
  ASSERT_GE(v.texts.size(), 40u);
  EXPECT_EQ(CheckVectors(*tok, v, ""), v.texts.size());
}

TEST(BpeReferenceTest, Gpt2Vectors) {
  KV_REQUIRE_ASSET(kGpt2Vocab);
  ExpectEveryVector(AssetPath(kGpt2Vocab), 50257);
}

TEST(BpeReferenceTest, Qwen2Vectors) {
  KV_REQUIRE_ASSET(kQwen2Vocab);
  ExpectEveryVector(AssetPath(kQwen2Vocab), 151936);
}

// The shared set has llama.cpp's llama-bpe vectors but not their vocabulary (a Llama 3 GGUF that
// was too large to include). Put ggml-vocab-llama-bpe.gguf next to them to run this test; until
// then it skips, even under KVASIR_REQUIRE_ASSETS=1.
TEST(BpeReferenceTest, LlamaBpeVectors) {
  const std::string base = AssetPath(kLlamaBpeVocab);
  if (!std::filesystem::exists(base)) {
    GTEST_SKIP() << base << " is not in the shared set (only its .inp/.out are): add a Llama 3 "
                 << "vocabulary GGUF there to run the llama-bpe vectors";
  }
  ExpectEveryVector(base, 128256);
}

TEST(BpeReferenceTest, Qwen2SpecialTokens) {
  KV_REQUIRE_ASSET(kQwen2Vocab);
  std::unique_ptr<Tokenizer> tok = LoadTokenizer(AssetPath(kQwen2Vocab));
  ASSERT_NE(tok, nullptr);
  // <|endoftext|> 151643, <|im_start|> 151644, <|im_end|> 151645 are control tokens.
  EXPECT_EQ(tok->bos(), 151643);
  EXPECT_EQ(tok->eos(), 151643);
  EXPECT_FALSE(tok->add_bos());
  EXPECT_TRUE(tok->IsEog(151643));
  EXPECT_TRUE(tok->IsEog(151645));  // by its text: "<|im_end|>" ends a chat turn
  EXPECT_FALSE(tok->IsEog(151644));
  EXPECT_FALSE(tok->IsEog(9707));
  EXPECT_EQ(tok->eog_ids(), (Ids{151643, 151645}));

  const std::string chat = "<|im_start|>user\nHello<|im_end|>";
  const Ids parsed = tok->Encode(chat, /*add_special=*/true, /*parse_special=*/true);
  ASSERT_GE(parsed.size(), 4u);
  EXPECT_EQ(parsed.front(), 151644);
  EXPECT_EQ(parsed.back(), 151645);
  EXPECT_EQ(tok->Decode(parsed, /*special=*/true), chat);
  EXPECT_EQ(tok->Decode(parsed), "user\nHello");
  // Without parse_special the markers are plain text, and nothing maps to a control token.
  const Ids plain = tok->Encode(chat, true, false);
  for (int32_t id : plain) EXPECT_LT(id, 151643);
  EXPECT_EQ(tok->Decode(plain), chat);
}

TEST(BpeReferenceTest, ArbitraryBytesRoundTrip) {
  for (const char* rel : {kGpt2Vocab, kQwen2Vocab}) {
    KV_REQUIRE_ASSET(rel);
    std::unique_ptr<Tokenizer> tok = LoadTokenizer(AssetPath(rel));
    ASSERT_NE(tok, nullptr);
    std::mt19937 rng(4321);
    for (int round = 0; round < 200; ++round) {
      std::string text(1 + rng() % 64, '\0');
      for (char& c : text) {
        const uint32_t r = rng() % 10;
        c = static_cast<char>(r < 6 ? 0x20 + rng() % 0x5f : rng() % 256);
      }
      const Ids ids = tok->Encode(text, /*add_special=*/false);
      for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok->n_vocab());
      EXPECT_EQ(tok->Decode(ids), text) << rel << ": " << Escaped(text);
    }
  }
}

TEST(BpeReferenceTest, LargeInput) {
  KV_REQUIRE_ASSET(kQwen2Vocab);
  std::unique_ptr<Tokenizer> tok = LoadTokenizer(AssetPath(kQwen2Vocab));
  ASSERT_NE(tok, nullptr);
  // 100 KB of prose, one 100 KB word, and 100 KB of spaces: all stay fast and round-trip.
  std::string prose;
  while (prose.size() < 100 * 1024) prose += "The quick brown fox jumps over the lazy dog. ";
  const Ids ids = tok->Encode(prose, false);
  EXPECT_GT(ids.size(), 10000u);
  EXPECT_EQ(tok->Decode(ids), prose);
  for (char c : {'a', ' ', '\n', '7'}) {
    const std::string run(100 * 1024, c);
    EXPECT_EQ(tok->Decode(tok->Encode(run, false)), run) << int{c};
  }
}

}  // namespace
}  // namespace kvasir
