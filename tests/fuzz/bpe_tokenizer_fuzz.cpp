// libFuzzer target: arbitrary bytes through byte-level BPE Encode and back through Decode, on the
// gpt-2 and qwen2 vocabularies ($KVASIR_ASSETS/vocab, else ../shared/vocab relative to the working
// directory, else the shared folder next to this source tree), or on a small built-in vocabulary
// when those files are absent. Every id must be in range and decoding must give the input back.
// Input layout: byte 0 holds flags (bit 0 add_special, bit 1 parse_special, bit 2 second
// vocabulary), the rest is the text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "../tokenizer/vocab_builder.h"
#include "gguf/gguf_file.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string FindVocab(const std::string& file_name) {
  const std::string rel = "vocab/" + file_name;
  std::vector<std::string> candidates;
  if (const char* env = std::getenv("KVASIR_ASSETS"); env != nullptr && *env != '\0') {
    candidates.push_back(std::string(env) + "/" + rel);
  }
  candidates.push_back("../shared/" + rel);
  candidates.push_back(
      (std::filesystem::path(__FILE__).parent_path() / "../../../shared" / rel).string());
  for (const std::string& c : candidates) {
    if (std::filesystem::exists(c)) return c;
  }
  return "";
}

// 256 byte characters, a few merges (" t", " th", " the", "in", "ing"), a control and a
// user-defined token.
kvasir::GgufHeader BuiltInVocab(const std::string& pre) {
  using kvasir::testing::ByteLevel;
  auto vocab = kvasir::testing::BpeByteVocab({{ByteLevel(" t")},
                                              {ByteLevel(" th")},
                                              {ByteLevel(" the")},
                                              {"in"},
                                              {"ing"},
                                              {"<|endoftext|>", 0.0f, 3},
                                              {"<tool>", 0.0f, 4}});
  std::vector<std::string> merges = {ByteLevel(" ") + " t", ByteLevel(" t") + " h",
                                     ByteLevel(" th") + " e", "i n", "in g"};
  return kvasir::testing::MakeBpeHeader(vocab, merges, pre);
}

std::unique_ptr<kvasir::Tokenizer> Load(const std::string& file_name, const std::string& pre) {
  const std::string path = FindVocab(file_name);
  kvasir::Result<std::unique_ptr<kvasir::Tokenizer>> tok = kvasir::Error("unset");
  if (path.empty()) {
    std::fprintf(stderr, "bpe_tokenizer_fuzz: %s not found; using a built-in %s vocabulary\n",
                 file_name.c_str(), pre.c_str());
    tok = kvasir::Tokenizer::FromGguf(BuiltInVocab(pre), "built-in");
  } else {
    auto file = kvasir::GgufFile::Open(path);
    if (!file.ok()) {
      std::fprintf(stderr, "bpe_tokenizer_fuzz: %s\n", file.status().message().c_str());
      std::abort();
    }
    tok = kvasir::Tokenizer::FromGguf(file->header(), path);
  }
  if (!tok.ok()) {
    std::fprintf(stderr, "bpe_tokenizer_fuzz: %s\n", tok.status().message().c_str());
    std::abort();
  }
  return std::move(tok).value();
}

const kvasir::Tokenizer& GetTokenizer(bool second) {
  static const std::unique_ptr<kvasir::Tokenizer> gpt2 = Load("ggml-vocab-gpt-2.gguf", "gpt-2");
  static const std::unique_ptr<kvasir::Tokenizer> qwen2 = Load("ggml-vocab-qwen2.gguf", "qwen2");
  return second ? *qwen2 : *gpt2;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const bool add_special = (data[0] & 1) != 0;
  const bool parse_special = (data[0] & 2) != 0;
  const kvasir::Tokenizer& tok = GetTokenizer((data[0] & 4) != 0);
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);

  const std::vector<int32_t> ids = tok.Encode(text, add_special, parse_special);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
    (void)tok.IsEog(id);
  }
  // Every byte has a token, so nothing is lost: plain text decodes back as it was, and special
  // tokens matched in the text give their own text back when printed with special = true.
  if (!add_special) {
    if (tok.Decode(ids, /*special=*/true) != text) __builtin_trap();
    if (!parse_special && tok.Decode(ids) != text) __builtin_trap();
  }
  return 0;
}
