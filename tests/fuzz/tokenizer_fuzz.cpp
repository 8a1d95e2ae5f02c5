// libFuzzer target: arbitrary bytes through SPM Encode on the llama-spm vocabulary, then Decode and
// Utf8Stream. The vocabulary is read from $KVASIR_ASSETS/vocab, else ../shared/vocab relative to
// the working directory, else the shared folder next to this source tree.
// Input layout: byte 0 holds flags (bit 0 add_special, bit 1 parse_special, bit 2 special pieces),
// the rest is the text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "gguf/gguf_file.h"
#include "tokenizer/tokenizer.h"

namespace {

std::string FindVocab() {
  const std::string rel = "vocab/ggml-vocab-llama-spm.gguf";
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
  return candidates.front();
}

const kvasir::Tokenizer& GetTokenizer() {
  static const std::unique_ptr<kvasir::Tokenizer> tok = [] {
    const std::string path = FindVocab();
    auto file = kvasir::GgufFile::Open(path);
    if (!file.ok()) {
      std::fprintf(stderr, "tokenizer_fuzz: %s (set KVASIR_ASSETS)\n",
                   file.status().message().c_str());
      std::abort();
    }
    auto t = kvasir::Tokenizer::FromGguf(file->header(), path);
    if (!t.ok()) {
      std::fprintf(stderr, "tokenizer_fuzz: %s\n", t.status().message().c_str());
      std::abort();
    }
    return std::move(t).value();
  }();
  return *tok;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const kvasir::Tokenizer& tok = GetTokenizer();
  const bool add_special = (data[0] & 1) != 0;
  const bool parse_special = (data[0] & 2) != 0;
  const bool special_pieces = (data[0] & 4) != 0;
  const std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);

  const std::vector<int32_t> ids = tok.Encode(text, add_special, parse_special);
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.n_vocab()) __builtin_trap();
  }
  const std::string decoded = tok.Decode(ids, special_pieces);
  // Without special-token parsing every input byte survives (byte fallback), behind the prefix
  // space, except that a literal U+2581 decodes as a space; the llama-spm vocabulary cannot merge
  // plain text into a control token.
  if (!parse_special && !special_pieces && tok.add_space_prefix()) {
    std::string want = text.empty() ? std::string() : " ";
    for (size_t i = 0; i < text.size(); ++i) {
      if (text.substr(i, 3) == "\xE2\x96\x81") {
        want.push_back(' ');
        i += 2;
      } else {
        want.push_back(text[i]);
      }
    }
    if (decoded != want) __builtin_trap();
  }

  kvasir::Utf8Stream stream;
  size_t streamed = 0;
  for (int32_t id : ids) streamed += stream.Push(tok.TokenToPiece(id, special_pieces)).size();
  streamed += stream.Flush().size();
  // Each input byte yields at most one U+FFFD (3 bytes).
  if (streamed > 3 * decoded.size()) __builtin_trap();
  return 0;
}
