// Which tokens of a vocabulary a grammar allows next, by walking a trie of the tokens' bytes with
// the matcher: a subtree is skipped at its first refused byte, so the cost is the number of trie
// nodes whose prefix the grammar still accepts, one memoised transition each. Inside free text
// (a JSON string) that would be nearly the whole trie, so each node that starts a character also
// records which classes of characters its subtree holds (char_classes.h) and how many characters
// deep it goes: when the recognizer accepts every string of that many characters of those
// classes, all the subtree's tokens are allowed at once without visiting it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "grammar/recognizer.h"

namespace kvasir::grammar {

enum class TokenKind : uint8_t {
  kText,             // its bytes are output text
  kEndOfGeneration,  // allowed only where the grammar may end
  kControl,          // never allowed under a grammar (no text of its own)
};

// A set of token ids, one bit each.
class TokenMask {
 public:
  TokenMask() = default;
  explicit TokenMask(int32_t n_vocab) { Resize(n_vocab); }
  void Resize(int32_t n_vocab) {
    n_ = n_vocab;
    words_.assign((static_cast<size_t>(n_vocab) + 63) / 64, 0);
  }
  void Clear() { std::fill(words_.begin(), words_.end(), 0); }
  void Set(int32_t id) { words_[id >> 6] |= uint64_t{1} << (id & 63); }
  void Reset(int32_t id) { words_[id >> 6] &= ~(uint64_t{1} << (id & 63)); }
  bool Test(int32_t id) const { return id >= 0 && id < n_ && ((words_[id >> 6] >> (id & 63)) & 1); }
  size_t Count() const;
  int32_t size() const { return n_; }
  // [ceil(size / 64)] words; bit i of word w is token 64 w + i.
  const std::vector<uint64_t>& words() const { return words_; }

 private:
  int32_t n_ = 0;
  std::vector<uint64_t> words_;
};

// The vocabulary's pieces as a trie, built once per vocabulary; immutable and thread-safe.
class TokenTrie {
 public:
  static constexpr size_t kMaxPieceBytes = 4096;

  // `pieces[i]` is the bytes token i stands for, `kinds[i]` its kind. A text token with an empty
  // piece is never allowed (it would let a generation run without progress). Errors: the two
  // spans differ in length, a piece is longer than kMaxPieceBytes.
  static Result<TokenTrie> Build(std::span<const std::string> pieces,
                                 std::span<const TokenKind> kinds);

  int32_t n_vocab() const { return static_cast<int32_t>(kinds_.size()); }
  size_t node_count() const { return nodes_.size() - 1; }

  // Sets in `mask` (resized and cleared first) exactly the tokens allowed after `m`: text tokens
  // whose bytes the grammar accepts from here, end-of-generation tokens when it may end here.
  // Fails only when the recognizer does (a limit; its status).
  Status FillMask(const Matcher& m, TokenMask* mask) const;
  // The fast path: whether token `id` alone is allowed after `m` (false for ids out of range).
  // A recognizer failure reads as false; m.status() tells.
  bool Allows(const Matcher& m, int32_t id) const;
  // Advances `m` over token `id` when allowed; an end-of-generation token leaves it unchanged.
  bool Accept(Matcher* m, int32_t id) const;

  const std::string& piece(int32_t id) const { return pieces_[id]; }
  TokenKind kind(int32_t id) const { return kinds_[id]; }

 private:
  // Fills the nodes' classes and skip_chars.
  void Summarize();
  // Nodes in depth-first preorder; node 0 is the root, and a sentinel closes the array.
  struct Node {
    // Classes of the characters starting in the subtree (this node's byte on), for the test
    // above; filled where skip_chars is.
    uint64_t classes;
    uint32_t next;       // first node after this one's subtree
    uint32_t tok_begin;  // tokens_[tok_begin, next node's tok_begin) end at this node
    uint32_t tok_end;    // tokens_[tok_begin, tok_end) are the subtree's (next's tok_begin)
    uint16_t depth;      // bytes from the root
    uint8_t byte;        // the edge into this node
    // The characters on the subtree's longest path, when the subtree is valid UTF-8 starting at
    // this node (a token may end inside a character) and at most kMaxSkipChars deep; else 0
    // (never tested).
    uint8_t skip_chars;
  };
  static constexpr int kMaxSkipChars = 254;

  std::vector<Node> nodes_;
  std::vector<int32_t> tokens_;  // token ids in trie order: a subtree's tokens are contiguous
  TokenMask text_tokens_;        // every token the trie holds
  std::vector<int32_t> eog_;
  std::vector<std::string> pieces_;
  std::vector<TokenKind> kinds_;
  size_t max_depth_ = 0;
};

}  // namespace kvasir::grammar
