#include "tokenizer/spm_tokenizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <queue>

#include "tokenizer/utf8.h"

namespace kvasir {
namespace {

// U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's word-boundary marker.
constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";

std::string UnescapeWhitespace(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t hit = text.find(kSpaceMarker, pos);
    if (hit == std::string_view::npos) {
      out.append(text.substr(pos));
      break;
    }
    out.append(text.substr(pos, hit - pos));
    out.push_back(' ');
    pos = hit + kSpaceMarker.size();
  }
  return out;
}

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// The byte a "<0xXX>" token stands for, or -1 when `text` has another form.
int ParseByteToken(std::string_view text) {
  if (text.size() != 6 || text.substr(0, 3) != "<0x" || text[5] != '>') return -1;
  const int hi = HexDigit(text[3]);
  const int lo = HexDigit(text[4]);
  if (hi < 0 || lo < 0) return -1;
  return hi * 16 + lo;
}

// One character (or merged run of characters) of the text being tokenized, in a linked list.
struct Symbol {
  size_t offset;
  size_t n;  // bytes; 0 once merged into its left neighbour
  int64_t prev;
  int64_t next;
};

// A candidate merge of two adjacent symbols whose concatenation is a vocabulary token.
struct Bigram {
  int64_t left;
  int64_t right;
  float score;
  size_t size;  // bytes of the concatenation, to detect symbols changed since the push
};

// Highest score first; on equal scores, the leftmost pair first.
struct BigramLess {
  bool operator()(const Bigram& a, const Bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

}  // namespace

Result<std::unique_ptr<Tokenizer>> SpmTokenizer::Create(const GgufHeader& header,
                                                        const std::string& name) {
  std::unique_ptr<SpmTokenizer> tok(new SpmTokenizer());
  // SPM defaults (used when the file names no ids / flags).
  tok->bos_ = 1;
  tok->eos_ = 2;
  tok->unk_ = 0;
  tok->add_bos_ = true;
  tok->add_eos_ = false;
  tok->add_space_prefix_ = true;
  KV_RETURN_IF_ERROR(tok->LoadCommon(header, name));
  KV_RETURN_IF_ERROR(tok->BuildTables(name));
  return std::unique_ptr<Tokenizer>(std::move(tok));
}

Status SpmTokenizer::BuildTables(const std::string& name) {
  const int32_t n = n_vocab();
  token_to_id_.clear();
  token_to_id_.reserve(static_cast<size_t>(n));
  // Later ids win on duplicate texts, as in llama.cpp.
  for (int32_t id = 0; id < n; ++id) token_to_id_.insert_or_assign(tokens_[id], id);

  pieces_.assign(static_cast<size_t>(n), std::string());
  for (int32_t id = 0; id < n; ++id) {
    const std::string& text = tokens_[id];
    switch (attrs_[id]) {
      case TokenAttr::kNormal:
        pieces_[id] = UnescapeWhitespace(text);
        break;
      case TokenAttr::kControl:
      case TokenAttr::kUnknown:
      case TokenAttr::kUserDefined:
        pieces_[id] = text;
        break;
      case TokenAttr::kByte: {
        const int byte = ParseByteToken(text);
        if (byte < 0) {
          return Error(
              "{}: token {} is a byte token (tokenizer.ggml.token_type 6) but its text "
              "'{}' is not of the form <0xXX>",
              name, id, text.substr(0, 32));
        }
        pieces_[id] = std::string(1, static_cast<char>(byte));
        break;
      }
      case TokenAttr::kUndefined:
      case TokenAttr::kUnused:
        break;
    }
  }
  CollectSpecialTokens();

  for (int b = 0; b < 256; ++b) {
    int32_t id = Find(fmt::format("<0x{:02X}>", b));
    if (id < 0) id = Find(std::string(1, static_cast<char>(b)));
    if (id < 0) id = unk_;
    byte_to_token_[b] = id;
  }
  return Status::Ok();
}

int32_t SpmTokenizer::Find(std::string_view text) const {
  auto it = token_to_id_.find(text);
  return it == token_to_id_.end() ? -1 : it->second;
}

std::vector<int32_t> SpmTokenizer::Encode(std::string_view text, bool add_special,
                                          bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special && add_bos_ && bos_ >= 0) out.push_back(bos_);
  // The start of the input counts as "after a special token": both get the space prefix.
  bool prev_special = true;
  std::string escaped;
  for (const Fragment& f : Partition(text, parse_special)) {
    if (f.token >= 0) {
      out.push_back(f.token);
      prev_special = true;
      continue;
    }
    escaped.clear();
    if (add_space_prefix_ && prev_special) escaped.append(kSpaceMarker);
    for (char c : text.substr(f.offset, f.length)) {
      if (c == ' ') {
        escaped.append(kSpaceMarker);
      } else {
        escaped.push_back(c);
      }
    }
    EncodeEscaped(escaped, &out);
    prev_special = false;
  }
  if (add_special && add_eos_ && eos_ >= 0) out.push_back(eos_);
  return out;
}

void SpmTokenizer::EncodeEscaped(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  // Split into characters. Bytes that do not form a character by their lead byte stand alone
  // (llama.cpp would let a bad lead byte swallow the next character, even an escaped space).
  std::vector<Symbol> symbols;
  symbols.reserve(text.size());
  for (size_t offset = 0; offset < text.size();) {
    const size_t len = SpmCharLen(text.substr(offset));
    const int64_t index = static_cast<int64_t>(symbols.size());
    offset += len;
    symbols.push_back({offset - len, len, index - 1, offset == text.size() ? -1 : index + 1});
  }

  std::priority_queue<Bigram, std::vector<Bigram>, BigramLess> queue;
  auto try_add = [&](int64_t left, int64_t right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    const std::string_view joined = text.substr(l.offset, l.n + r.n);
    const int32_t id = Find(joined);
    if (id < 0) return;
    queue.push({left, right, scores_[id], joined.size()});
  };
  for (int64_t i = 1; i < static_cast<int64_t>(symbols.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    // Stale entry: one side was merged away or grew since this pair was queued.
    if (left.n == 0 || right.n == 0 || left.n + right.n != bigram.size) continue;
    left.n += right.n;
    right.n = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add(left.prev, bigram.left);
    try_add(bigram.left, left.next);
  }

  for (int64_t i = 0; i >= 0; i = symbols[i].next) {
    const Symbol& s = symbols[i];
    const std::string_view piece = text.substr(s.offset, s.n);
    const int32_t id = Find(piece);
    if (id >= 0) {
      out->push_back(id);
      continue;
    }
    // Only single characters can miss the vocabulary (every merge result is a token).
    for (char c : piece) {
      const int32_t byte_id = byte_to_token_[static_cast<uint8_t>(c)];
      if (byte_id >= 0) out->push_back(byte_id);
    }
  }
}

}  // namespace kvasir
