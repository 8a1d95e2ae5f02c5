// Tokenizer built from GGUF metadata (tokenizer.ggml.*). Two vocabulary types are supported: the
// SentencePiece-style vocabulary (`tokenizer.ggml.model = llama`: scores, byte fallback; see
// spm_tokenizer.h) and byte-level BPE (`tokenizer.ggml.model = gpt2`: merges and a pre-tokenizer
// chosen by tokenizer.ggml.pre; see bpe_tokenizer.h). Both share the token types, special tokens,
// BOS/EOS rules and the end-of-generation set built here.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace kvasir {

// Token types as stored in tokenizer.ggml.token_type (frozen by llama.cpp's vocab format).
enum class TokenAttr : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Builds the tokenizer named by `tokenizer.ggml.model`. Errors name the file and the key
  // ("vocab.gguf: tokenizer.ggml.model 'bert' is not supported (supported: llama, gpt2)"), and
  // refuse inconsistent metadata: arrays of different lengths, special ids out of range, unknown
  // token types, NaN scores, byte tokens whose text is not "<0xXX>".
  static Result<std::unique_ptr<Tokenizer>> FromGguf(const GgufHeader& header,
                                                     const std::string& name);

  // Text to ids. `add_special` adds BOS (and EOS) as the vocabulary asks
  // (tokenizer.ggml.add_bos_token; when absent, true for SPM and Llama 3 BPE, false for other BPE).
  // `parse_special`: control-token text such as "<s>" in `text` becomes that token instead of being
  // split as plain text (user-defined tokens are always matched, as in llama.cpp). Any bytes are
  // accepted, including invalid UTF-8. Thread-safe (const).
  virtual std::vector<int32_t> Encode(std::string_view text, bool add_special,
                                      bool parse_special = false) const = 0;

  // The bytes one token stands for (byte tokens <0x0A> give the raw byte; control and unknown
  // tokens give "" unless `special`). Like llama_token_to_piece with lstrip 0; an SPM
  // word-boundary marker becomes a space, and BPE's byte-level characters become their bytes. An
  // id outside [0, n_vocab) gives "".
  std::string TokenToPiece(int32_t id, bool special = false) const;
  // Concatenated pieces. `skip_leading_space`: drop one space at the start of the first non-empty
  // piece (the space SPM puts before the first word). Bytes need not form valid UTF-8 (see
  // Utf8Stream).
  std::string Decode(std::span<const int32_t> ids, bool special = false,
                     bool skip_leading_space = false) const;

  int32_t n_vocab() const { return static_cast<int32_t>(tokens_.size()); }
  // Special ids; -1 when the vocabulary has none.
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }
  int32_t unk() const { return unk_; }
  bool add_bos() const { return add_bos_; }
  bool add_eos() const { return add_eos_; }
  // SPM: a space is put before text that starts the input or follows a special token.
  bool add_space_prefix() const { return add_space_prefix_; }
  // End-of-generation: EOS, EOT, EOM, and every control or user-defined token whose text is a
  // known end-of-turn marker ("<|eot_id|>", "<|im_end|>", "<|endoftext|>", ...), as llama.cpp
  // decides. Generation stops at any of these.
  bool IsEog(int32_t id) const;
  // The end-of-generation ids, ascending.
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
  const std::string& TokenText(int32_t id) const { return tokens_.at(id); }
  TokenAttr Attr(int32_t id) const { return attrs_.at(id); }
  float Score(int32_t id) const { return scores_.at(id); }

 protected:
  // Reads and validates the metadata every vocabulary type shares (tokens, scores, token types,
  // special ids, add_bos/add_eos/add_space_prefix) into the members below. Defaults that are out
  // of range for a small vocabulary become -1; explicit ids out of range are errors.
  Status LoadCommon(const GgufHeader& header, const std::string& name);

  // A piece of the input: raw text [offset, offset + length), or a special token (token >= 0).
  struct Fragment {
    int32_t token;
    size_t offset;
    size_t length;
  };
  // Fills special_ids_: control, unknown and user-defined tokens with non-empty text, longest text
  // first.
  void CollectSpecialTokens();
  // Splits `text` on special-token texts, longest token first (as llama.cpp does). User-defined
  // tokens are always split out; control and unknown ones only with `parse_special`.
  std::vector<Fragment> Partition(std::string_view text, bool parse_special) const;

  std::vector<std::string> tokens_;
  std::vector<float> scores_;
  std::vector<TokenAttr> attrs_;
  // [n_vocab] piece per token as printed with special = true, filled by each vocabulary type.
  std::vector<std::string> pieces_;
  std::vector<int32_t> eog_ids_;
  std::vector<int32_t> special_ids_;
  int32_t bos_ = -1;
  int32_t eos_ = -1;
  int32_t eot_ = -1;
  int32_t eom_ = -1;
  int32_t unk_ = -1;
  bool add_bos_ = true;
  bool add_eos_ = false;
  bool add_space_prefix_ = true;
};

// Incremental detokenizer for streaming: feeds token pieces and returns only complete UTF-8,
// holding back the bytes of a character split across byte tokens until it completes (at most 3
// bytes are held). Invalid bytes become U+FFFD, one per maximal ill-formed subpart (as Python's
// `errors="replace"` and the Unicode standard recommend), as soon as they are known to be invalid.
class Utf8Stream {
 public:
  // Appends bytes; returns the longest prefix of pending bytes that is complete UTF-8.
  std::string Push(std::string_view bytes);
  // Returns whatever is left (an incomplete sequence becomes U+FFFD) and resets the stream.
  std::string Flush();

 private:
  std::string pending_;
};

}  // namespace kvasir
