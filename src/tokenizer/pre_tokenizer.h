// Pre-tokenizers of byte-level BPE vocabularies: the regular expressions that cut text into words
// before BPE merges run inside each word, chosen by `tokenizer.ggml.pre`. The table of supported
// names and their expressions lives in pre_tokenizer.cpp; matching is PCRE2 with Unicode
// properties (\p{L}, \p{N}, \p{M}, \p{P}), and \s means the Unicode White_Space set (as in the
// Rust and Python regex engines that the reference tokenizers use).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvasir {

class PreTokenizer {
 public:
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // The pre-tokenizer that `tokenizer.ggml.pre` = `name` names. An unknown name is an error that
  // reads "'NAME' is not supported (supported: ...)"; callers prefix the file and key.
  static Result<std::unique_ptr<PreTokenizer>> Create(std::string_view name);
  // "default, gpt-2 (gpt2), llama-bpe (llama3, llama-v3), qwen2 (deepseek-r1-qwen), qwen35".
  static std::string SupportedNames();

  // Cuts `text` into words that cover it in order, none empty. Each expression of the variant
  // splits every word of the previous one into its matches and the text between them (as llama.cpp
  // does), and an expression never looks past the word it splits. Any bytes are accepted: a byte
  // that is not part of valid UTF-8 is matched as U+FFFD would be, but the words keep the original
  // bytes, so joining them gives `text` back. Thread-safe (const).
  std::vector<std::string_view> Split(std::string_view text) const;

  // The canonical name ("llama-bpe" for "llama3").
  const std::string& name() const { return name_; }
  // A word that is itself a vocabulary token becomes that token without merges (Llama 3).
  bool ignore_merges() const { return ignore_merges_; }
  // Whether this family adds BOS when the file has no tokenizer.ggml.add_bos_token.
  bool default_add_bos() const { return default_add_bos_; }

 private:
  class Regex;
  PreTokenizer() = default;

  std::string name_;
  bool ignore_merges_ = false;
  bool default_add_bos_ = false;
  std::vector<std::unique_ptr<Regex>> regexes_;
};

}  // namespace kvasir
