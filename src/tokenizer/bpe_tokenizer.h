// Byte-level BPE tokenizer for `tokenizer.ggml.model = gpt2` (GPT-2, Llama 3, Qwen2, ...), matching
// llama.cpp's BPE vocab: special tokens are split out first, a pre-tokenizer (tokenizer.ggml.pre)
// cuts the rest into words, each word's bytes become GPT-2 byte-level characters, and adjacent
// symbols are merged by the lowest rank in tokenizer.ggml.merges (rank = index) until no listed
// pair is left.
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
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace kvasir {

class BpeTokenizer final : public Tokenizer {
 public:
  // Reads and validates the vocabulary, merges and pre-tokenizer; errors name `name` and the key
  // (an unknown tokenizer.ggml.pre, a merge that is not "A B" or names a token the vocabulary does
  // not have, add_bos_token without a BOS id).
  static Result<std::unique_ptr<Tokenizer>> Create(const GgufHeader& header,
                                                   const std::string& name);

  // No space prefix is added, and any bytes survive: a word's bytes that no merge covers become
  // their one-character tokens (only bytes whose character the vocabulary lacks are dropped, as
  // in llama.cpp).
  std::vector<int32_t> Encode(std::string_view text, bool add_special,
                              bool parse_special = false) const override;
  // Normal and byte tokens give their bytes; control, unknown and user-defined tokens their text
  // as stored (control and unknown only with `special`); unused tokens "".

  const PreTokenizer& pre_tokenizer() const { return *pre_; }
  size_t n_merges() const { return merges_.size(); }

 private:
  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // A listed merge of two tokens: its rank and the token of the joined text (-1 if none).
  struct Merge {
    int32_t rank;
    int32_t result;
  };

  BpeTokenizer() = default;
  Status LoadMerges(const GgufHeader& header, const std::string& name);
  void BuildPieces();
  // Tokenizes one pre-tokenized word (raw bytes); appends ids to *out.
  void EncodeWord(std::string_view word, std::vector<int32_t>* out) const;
  // The id whose text is exactly `text` (the highest such id), or -1.
  int32_t Find(std::string_view text) const;
  const Merge* FindMerge(int32_t left, int32_t right) const;

  std::unique_ptr<PreTokenizer> pre_;
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> token_to_id_;
  // Key: left id << 32 | right id.
  std::unordered_map<uint64_t, Merge> merges_;
  // [256] the token whose text is byte b's byte-level character, or -1.
  std::array<int32_t, 256> byte_token_{};
};

}  // namespace kvasir
