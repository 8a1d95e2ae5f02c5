// The vocabulary as the grammar engine sees it: each token's bytes and kind (text, end of
// generation, control) in a grammar::TokenTrie, built once per stage on first use.
#pragma once

#include <memory>

#include "base/status.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace kvasir::ring {

// Text tokens are their pieces as the detokenizer writes them (TokenToPiece without special
// text); end-of-generation tokens (Tokenizer::IsEog) end a grammar; control, unknown and unused
// tokens are never allowed under one.
Result<grammar::TokenTrie> BuildVocabTrie(const Tokenizer& tokenizer);

// BuildVocabTrie on first Get, then the same trie. Not thread-safe; the tokenizer must outlive it.
class VocabTrie {
 public:
  explicit VocabTrie(const Tokenizer* tokenizer) : tokenizer_(tokenizer) {}
  // Errors: no tokenizer (a stage without the vocabulary), or the trie cannot be built.
  Result<std::shared_ptr<const grammar::TokenTrie>> Get();

 private:
  const Tokenizer* tokenizer_;
  std::shared_ptr<const grammar::TokenTrie> trie_;
};

}  // namespace kvasir::ring
