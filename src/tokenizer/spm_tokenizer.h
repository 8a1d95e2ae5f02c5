// SentencePiece-style tokenizer for `tokenizer.ggml.model = llama`, matching llama.cpp's SPM vocab:
// spaces become U+2581, a space is put before text that starts the input or follows a special
// token, characters are merged pairwise by best vocabulary score, and leftovers fall back to
// "<0xXX>" byte tokens.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "tokenizer/tokenizer.h"

namespace kvasir {

class SpmTokenizer final : public Tokenizer {
 public:
  // Reads and validates the vocabulary; errors name `name` and the offending key.
  static Result<std::unique_ptr<Tokenizer>> Create(const GgufHeader& header,
                                                   const std::string& name);

  std::vector<int32_t> Encode(std::string_view text, bool add_special,
                              bool parse_special = false) const override;

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  SpmTokenizer() = default;
  // Builds the lookup tables from the loaded vocabulary.
  Status BuildTables(const std::string& name);
  // Tokenizes one fragment that already has U+2581 for spaces; appends ids to *out.
  void EncodeEscaped(std::string_view text, std::vector<int32_t>* out) const;
  // The id whose text is exactly `text` (the highest such id), or -1.
  int32_t Find(std::string_view text) const;

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id_;
  // Byte fallback: "<0xXX>", else the one-byte token, else unk; -1 when none of these exist.
  std::array<int32_t, 256> byte_to_token_{};
};

}  // namespace kvasir
