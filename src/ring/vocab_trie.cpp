#include "ring/vocab_trie.h"

#include <string>
#include <vector>

namespace kvasir::ring {

Result<grammar::TokenTrie> BuildVocabTrie(const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.n_vocab();
  std::vector<std::string> pieces(n);
  std::vector<grammar::TokenKind> kinds(n);
  for (int32_t id = 0; id < n; ++id) {
    const TokenAttr a = tokenizer.Attr(id);
    if (tokenizer.IsEog(id)) {
      kinds[id] = grammar::TokenKind::kEndOfGeneration;
    } else if (a == TokenAttr::kControl || a == TokenAttr::kUnknown || a == TokenAttr::kUnused) {
      kinds[id] = grammar::TokenKind::kControl;
    } else {
      kinds[id] = grammar::TokenKind::kText;
      pieces[id] = tokenizer.TokenToPiece(id, false);
    }
  }
  return grammar::TokenTrie::Build(pieces, kinds);
}

Result<std::shared_ptr<const grammar::TokenTrie>> VocabTrie::Get() {
  if (trie_) return trie_;
  if (tokenizer_ == nullptr) return Error("this stage holds no vocabulary to apply a grammar with");
  KV_ASSIGN_OR_RETURN(grammar::TokenTrie trie, BuildVocabTrie(*tokenizer_));
  trie_ = std::make_shared<const grammar::TokenTrie>(std::move(trie));
  return trie_;
}

}  // namespace kvasir::ring
