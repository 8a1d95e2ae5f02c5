#include "grammar/token_mask.h"

#include <algorithm>
#include <bit>
#include <numeric>

#include "grammar/char_classes.h"

namespace kvasir::grammar {

size_t TokenMask::Count() const {
  size_t n = 0;
  for (uint64_t w : words_) n += static_cast<size_t>(std::popcount(w));
  return n;
}

Result<TokenTrie> TokenTrie::Build(std::span<const std::string> pieces,
                                   std::span<const TokenKind> kinds) {
  if (pieces.size() != kinds.size()) {
    return Error("token trie: {} pieces but {} kinds", pieces.size(), kinds.size());
  }
  if (pieces.size() > static_cast<size_t>(INT32_MAX)) {
    return Error("token trie: {} tokens is too many", pieces.size());
  }
  TokenTrie t;
  t.pieces_.assign(pieces.begin(), pieces.end());
  t.kinds_.assign(kinds.begin(), kinds.end());
  std::vector<int32_t> order;
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (pieces[i].size() > kMaxPieceBytes) {
      return Error("token trie: token {} is {} bytes long, over the limit of {}", i,
                   pieces[i].size(), kMaxPieceBytes);
    }
    if (kinds[i] == TokenKind::kEndOfGeneration) t.eog_.push_back(static_cast<int32_t>(i));
    if (kinds[i] == TokenKind::kText && !pieces[i].empty()) {
      order.push_back(static_cast<int32_t>(i));
    }
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return pieces[a] < pieces[b]; });
  // Sorted pieces give the nodes in preorder: a node's subtree ends when a later piece no longer
  // shares its prefix.
  t.nodes_.push_back({0, 0, 0, 0, 0, 0, 0});
  std::vector<uint32_t> path{0};  // path[d]: the node at depth d on the current piece
  const std::string* prev = nullptr;
  for (int32_t id : order) {
    const std::string& p = pieces[id];
    size_t common = 0;
    if (prev != nullptr) {
      const size_t n = std::min(prev->size(), p.size());
      while (common < n && (*prev)[common] == p[common]) ++common;
    }
    while (path.size() > common + 1) {
      t.nodes_[path.back()].next = static_cast<uint32_t>(t.nodes_.size());
      path.pop_back();
    }
    for (size_t d = common; d < p.size(); ++d) {
      path.push_back(static_cast<uint32_t>(t.nodes_.size()));
      t.nodes_.push_back({0, 0, static_cast<uint32_t>(t.tokens_.size()), 0,
                          static_cast<uint16_t>(d + 1), static_cast<uint8_t>(p[d]), 0});
    }
    t.tokens_.push_back(id);
    t.max_depth_ = std::max(t.max_depth_, p.size());
    prev = &p;
  }
  while (!path.empty()) {
    t.nodes_[path.back()].next = static_cast<uint32_t>(t.nodes_.size());
    path.pop_back();
  }
  t.nodes_.push_back({0, 0, static_cast<uint32_t>(t.tokens_.size()), 0, 0, 0, 0});  // sentinel
  for (Node& n : t.nodes_) n.tok_end = t.nodes_[n.next].tok_begin;
  t.Summarize();
  t.text_tokens_.Resize(t.n_vocab());
  for (int32_t id : t.tokens_) t.text_tokens_.Set(id);
  return t;
}

void TokenTrie::Summarize() {
  const size_t n = nodes_.size() - 1;
  std::vector<uint64_t> classes(n, 0);
  // Top down: the UTF-8 decoder along each path (continuation bytes still expected, and the range
  // of the next one), whether each node starts a character, and whether its byte is invalid.
  std::vector<uint32_t> parent(n, 0);
  std::vector<uint8_t> pending(n, 0), lo(n, 0), hi(n, 0);
  std::vector<bool> starts(n, false), bad(n, false);
  std::vector<uint32_t> path{0};
  for (uint32_t i = 1; i < n; ++i) {
    path.resize(nodes_[i].depth);
    const uint32_t p = path.back();
    parent[i] = p;
    path.push_back(i);
    const uint8_t b = nodes_[i].byte;
    if (pending[p] == 0) {
      starts[i] = true;
      const Utf8Lead lead = Utf8LeadOf(b);
      bad[i] = CharClassOf(b) == kNoClass;
      pending[i] = bad[i] ? 0 : static_cast<uint8_t>(lead.continuation);
      lo[i] = lead.lo, hi[i] = lead.hi;
    } else {
      bad[i] = b < lo[p] || b > hi[p];
      pending[i] = bad[i] ? 0 : static_cast<uint8_t>(pending[p] - 1);
      lo[i] = 0x80, hi[i] = 0xBF;
    }
  }
  // Bottom up (children come after their parent in preorder).
  std::vector<uint8_t> depth_chars(n, 0);
  std::vector<bool> any_bad(n, false);
  for (uint32_t i = static_cast<uint32_t>(n) - 1; i >= 1; --i) {
    if (starts[i]) {
      // A byte that cannot start a character has no class (the subtree is never skipped).
      if (!bad[i]) classes[i] |= uint64_t{1} << CharClassOf(nodes_[i].byte);
      depth_chars[i] = static_cast<uint8_t>(std::min(255, depth_chars[i] + 1));
    }
    any_bad[i] = any_bad[i] || bad[i];
    if (starts[i] && !any_bad[i] && depth_chars[i] <= kMaxSkipChars) {
      nodes_[i].skip_chars = depth_chars[i];
      nodes_[i].classes = classes[i];
    }
    const uint32_t p = parent[i];
    classes[p] |= classes[i];
    depth_chars[p] = std::max(depth_chars[p], depth_chars[i]);
    any_bad[p] = any_bad[p] || any_bad[i];
  }
}

Status TokenTrie::FillMask(const Matcher& m, TokenMask* mask) const {
  Recognizer* r = m.recognizer();
  if (m.dead()) {
    mask->Resize(n_vocab());
    return r->status();
  }
  // The walk classifies tokens_ in order, as runs of allowed and refused tokens; the mask is then
  // written from whichever kind is fewer (inside free text nearly everything is allowed).
  struct Run {
    uint32_t end;  // tokens_[previous run's end, end)
    bool allowed;
  };
  std::vector<Run> runs;
  runs.reserve(4096);
  size_t allowed = 0;
  auto add = [&](uint32_t begin, uint32_t end, bool ok) {
    if (begin == end) return;
    if (ok) allowed += end - begin;
    if (!runs.empty() && runs.back().allowed == ok) {
      runs.back().end = end;
    } else {
      runs.push_back({end, ok});
    }
  };
  // states[d]: the state after the first d bytes of the current node's path.
  uint32_t states[kMaxPieceBytes + 1];
  states[0] = m.state();
  const Node* nodes = nodes_.data();
  const uint32_t end = static_cast<uint32_t>(nodes_.size() - 1);
  for (uint32_t i = 1; i < end;) {
    const Node& n = nodes[i];
    const Recognizer::State from = states[n.depth - 1];
    if (n.skip_chars != 0 && r->CharsAccepted(from, n.classes, n.skip_chars)) {
      add(n.tok_begin, n.tok_end, true);  // the whole subtree is accepted
      i = n.next;
      continue;
    }
    const uint32_t s = r->Next(from, n.byte);
    if (s == Recognizer::kDead) {
      add(n.tok_begin, n.tok_end, false);
      i = n.next;
      continue;
    }
    states[n.depth] = s;
    add(n.tok_begin, nodes[i + 1].tok_begin, true);
    ++i;
  }
  KV_RETURN_IF_ERROR(r->status());
  const bool from_all = allowed * 2 > tokens_.size();
  if (from_all) {
    *mask = text_tokens_;
  } else if (mask->size() != n_vocab()) {
    mask->Resize(n_vocab());
  } else {
    mask->Clear();
  }
  uint32_t begin = 0;
  for (const Run& run : runs) {
    if (run.allowed != from_all) {
      for (uint32_t k = begin; k < run.end; ++k) {
        if (from_all)
          mask->Reset(tokens_[k]);
        else
          mask->Set(tokens_[k]);
      }
    }
    begin = run.end;
  }
  if (m.CanEnd()) {
    for (int32_t id : eog_) mask->Set(id);
  }
  return Status::Ok();
}

bool TokenTrie::Allows(const Matcher& m, int32_t id) const {
  Matcher copy = m;
  return Accept(&copy, id);
}

bool TokenTrie::Accept(Matcher* m, int32_t id) const {
  if (id < 0 || id >= n_vocab() || m->dead()) return false;
  switch (kinds_[id]) {
    case TokenKind::kEndOfGeneration:
      return m->CanEnd();
    case TokenKind::kControl:
      return false;
    case TokenKind::kText:
      return !pieces_[id].empty() && m->AcceptBytes(pieces_[id]);
  }
  return false;
}

}  // namespace kvasir::grammar
