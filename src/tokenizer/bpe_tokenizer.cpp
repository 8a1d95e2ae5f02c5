#include "tokenizer/bpe_tokenizer.h"

#include <fmt/format.h>

#include <limits>
#include <queue>
#include <variant>

#include "tokenizer/byte_level.h"

namespace kvasir {
namespace {

constexpr std::string_view kKeyPre = "tokenizer.ggml.pre";
constexpr std::string_view kKeyMerges = "tokenizer.ggml.merges";
constexpr std::string_view kKeyAddBos = "tokenizer.ggml.add_bos_token";

// At most this many bytes of a token or merge are quoted in an error.
constexpr size_t kQuoteBytes = 48;

// One symbol of the word being merged, in a linked list: raw bytes [offset, offset + n).
struct Symbol {
  int32_t id;  // its token, or -1 when the vocabulary has none (then it never merges)
  size_t offset;
  size_t n;  // 0 once merged into its left neighbour
  int64_t prev;
  int64_t next;
};

// A candidate merge of two adjacent symbols, valid while both still hold these tokens.
struct Bigram {
  int64_t left;
  int64_t right;
  int32_t left_id;
  int32_t right_id;
  int32_t rank;
  int32_t result;
};

// Lowest rank first; on equal ranks, the leftmost pair first.
struct BigramAfter {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

uint64_t PairKey(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> BpeTokenizer::Create(const GgufHeader& header,
                                                        const std::string& name) {
  std::unique_ptr<BpeTokenizer> tok(new BpeTokenizer());
  // A vocabulary from an unknown converter (no tokenizer.ggml.pre) gets llama.cpp's "default".
  std::string pre_name = "default";
  if (const GgufValue* v = header.Find(kKeyPre); v != nullptr) {
    const std::string* s = v->AsString();
    if (s == nullptr) {
      return Error("{}: {} has type {}, expected string", name, kKeyPre,
                   GgufTypeName(static_cast<GgufType>(v->value.index())));
    }
    pre_name = *s;
  }
  auto pre = PreTokenizer::Create(pre_name);
  if (!pre.ok()) return Error("{}: {} {}", name, kKeyPre, pre.status().message());
  tok->pre_ = std::move(pre).value();

  // BPE defaults; the file's keys override them.
  tok->bos_ = -1;
  tok->eos_ = -1;
  tok->unk_ = -1;
  tok->add_bos_ = tok->pre_->default_add_bos();
  tok->add_eos_ = false;
  tok->add_space_prefix_ = false;
  KV_RETURN_IF_ERROR(tok->LoadCommon(header, name));
  tok->add_space_prefix_ = false;  // byte-level BPE encodes spaces itself
  if (tok->add_bos_ && tok->bos_ < 0) {
    return Error("{}: {} is true (or implied by {} '{}') but the vocabulary has no BOS token", name,
                 kKeyAddBos, kKeyPre, pre_name);
  }
  if (tok->add_eos_ && tok->eos_ < 0) {
    return Error("{}: tokenizer.ggml.add_eos_token is true but the vocabulary has no EOS token",
                 name);
  }

  const int32_t n = tok->n_vocab();
  tok->token_to_id_.reserve(static_cast<size_t>(n));
  // Later ids win on duplicate texts, as in llama.cpp.
  for (int32_t id = 0; id < n; ++id) tok->token_to_id_.insert_or_assign(tok->tokens_[id], id);
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    AppendByteLevel(std::string(1, static_cast<char>(b)), &ch);
    tok->byte_token_[b] = tok->Find(ch);
  }
  KV_RETURN_IF_ERROR(tok->LoadMerges(header, name));
  tok->BuildPieces();
  tok->CollectSpecialTokens();
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

Status BpeTokenizer::LoadMerges(const GgufHeader& header, const std::string& name) {
  const GgufValue* v = header.Find(kKeyMerges);
  if (v == nullptr) return Error("{}: {} is missing (a BPE vocabulary needs it)", name, kKeyMerges);
  const GgufArray* a = v->AsArray();
  if (a == nullptr) {
    return Error("{}: {} has type {}, expected an array of strings", name, kKeyMerges,
                 GgufTypeName(static_cast<GgufType>(v->value.index())));
  }
  const auto* merges = std::get_if<std::vector<std::string>>(&a->items);
  if (merges == nullptr) {
    return Error("{}: {} is an array of {}, expected strings", name, kKeyMerges,
                 GgufTypeName(static_cast<GgufType>(a->items.index())));
  }
  if (merges->size() > static_cast<size_t>(std::numeric_limits<int32_t>::max())) {
    return Error("{}: {} has {} entries, more than ranks can address", name, kKeyMerges,
                 merges->size());
  }
  merges_.clear();
  merges_.reserve(merges->size());
  std::string joined;
  for (size_t i = 0; i < merges->size(); ++i) {
    const std::string& m = (*merges)[i];
    // "A B": the first space after the first byte separates the two token texts (a token text
    // never holds a plain space: byte-level BPE writes it as U+0120).
    const size_t space = m.size() > 1 ? m.find(' ', 1) : std::string::npos;
    if (space == std::string::npos || space + 1 >= m.size()) {
      return Error("{}: {}[{}] = '{}' is not two tokens separated by a space", name, kKeyMerges, i,
                   m.substr(0, kQuoteBytes));
    }
    const std::string_view left(m.data(), space);
    const std::string_view right(m.data() + space + 1, m.size() - space - 1);
    const int32_t left_id = Find(left);
    const int32_t right_id = Find(right);
    if (left_id < 0 || right_id < 0) {
      return Error("{}: {}[{}] = '{}' names '{}', which is not in tokenizer.ggml.tokens", name,
                   kKeyMerges, i, m.substr(0, kQuoteBytes),
                   (left_id < 0 ? left : right).substr(0, kQuoteBytes));
    }
    joined.assign(left);
    joined.append(right);
    // A pair listed twice keeps its first (lowest) rank.
    merges_.try_emplace(PairKey(left_id, right_id), Merge{static_cast<int32_t>(i), Find(joined)});
  }
  return Status::Ok();
}

void BpeTokenizer::BuildPieces() {
  pieces_.assign(tokens_.size(), std::string());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    switch (attrs_[id]) {
      case TokenAttr::kNormal:
      case TokenAttr::kByte:
        // Characters outside the byte-level alphabet are kept as their UTF-8 (llama.cpp would
        // print a placeholder); the vocabularies seen so far have none.
        pieces_[id] = DecodeByteLevel(tokens_[id]);
        break;
      case TokenAttr::kControl:
      case TokenAttr::kUnknown:
      case TokenAttr::kUserDefined:
        pieces_[id] = tokens_[id];
        break;
      case TokenAttr::kUndefined:
      case TokenAttr::kUnused:
        break;
    }
  }
}

int32_t BpeTokenizer::Find(std::string_view text) const {
  auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

const BpeTokenizer::Merge* BpeTokenizer::FindMerge(int32_t left, int32_t right) const {
  if (left < 0 || right < 0) return nullptr;
  auto it = merges_.find(PairKey(left, right));
  return it == merges_.end() ? nullptr : &it->second;
}

std::vector<int32_t> BpeTokenizer::Encode(std::string_view text, bool add_special,
                                          bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special && add_bos_) out.push_back(bos_);
  for (const Fragment& f : Partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      continue;
    }
    for (std::string_view word : pre_->Split(text.substr(f.offset, f.length))) {
      EncodeWord(word, &out);
    }
  }
  if (add_special && add_eos_) out.push_back(eos_);
  return out;
}

void BpeTokenizer::EncodeWord(std::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (pre_->ignore_merges()) {
    std::string encoded;
    AppendByteLevel(word, &encoded);
    const int32_t id = Find(encoded);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  // One symbol per byte: each byte is one byte-level character.
  std::vector<Symbol> symbols(word.size());
  for (size_t i = 0; i < word.size(); ++i) {
    const int64_t index = static_cast<int64_t>(i);
    symbols[i] = {byte_token_[static_cast<uint8_t>(word[i])], i, 1, index - 1,
                  i + 1 == word.size() ? -1 : index + 1};
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramAfter> queue;
  auto try_add = [&](int64_t left, int64_t right) {
    if (left < 0 || right < 0) return;
    const int32_t left_id = symbols[left].id;
    const int32_t right_id = symbols[right].id;
    const Merge* merge = FindMerge(left_id, right_id);
    if (merge == nullptr) return;
    queue.push({left, right, left_id, right_id, merge->rank, merge->result});
  };
  for (int64_t i = 1; i < static_cast<int64_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // Stale entry: one side was merged away or changed since this pair was queued.
    if (left.n == 0 || right.n == 0 || left.id != bigram.left_id || right.id != bigram.right_id) {
      continue;
    }
    left.n += right.n;
    left.id = bigram.result;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  for (int64_t i = 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    if (s.id >= 0) {
      out->push_back(s.id);
      continue;
    }
    // A merge whose joined text is not a token (or a byte the vocabulary lacks): fall back to
    // the bytes' own tokens.
    for (size_t k = 0; k < s.n; ++k) {
      const int32_t id = byte_token_[static_cast<uint8_t>(word[s.offset + k])];
      if (id >= 0) out->push_back(id);
    }
  }
}

}  // namespace kvasir
