#include "grammar_test_util.h"

#include <algorithm>
#include <limits>
#include <unordered_map>

#include "gguf/gguf_file.h"
#include "tokenizer/tokenizer.h"

namespace kvasir::grammar::testing {

Vocab LoadVocab(const std::string& path) {
  Vocab v;
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().message();
  if (!file.ok()) return v;
  auto tok = Tokenizer::FromGguf(file->header(), path);
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  if (!tok.ok()) return v;
  const Tokenizer& t = **tok;
  for (int32_t id = 0; id < t.n_vocab(); ++id) {
    const TokenAttr a = t.Attr(id);
    if (t.IsEog(id)) {
      v.kinds.push_back(TokenKind::kEndOfGeneration);
    } else if (a == TokenAttr::kControl || a == TokenAttr::kUnknown || a == TokenAttr::kUnused) {
      v.kinds.push_back(TokenKind::kControl);
    } else {
      v.kinds.push_back(TokenKind::kText);
    }
    v.pieces.push_back(t.TokenToPiece(id, false));
  }
  return v;
}

namespace {

// Shortest derivation length of every rule (bytes), a least fixpoint.
std::vector<uint64_t> MinLengths(const Grammar& g) {
  const uint64_t kInf = std::numeric_limits<uint64_t>::max() / 4;
  std::vector<uint64_t> len(g.rule_count(), kInf);
  const auto el = g.elements();
  for (bool changed = true; changed;) {
    changed = false;
    for (uint32_t r = 0; r < g.rule_count(); ++r) {
      for (uint32_t alt : g.alternatives(r)) {
        uint64_t sum = 0;
        for (uint32_t p = alt; el[p] != Grammar::kEnd; ++p) {
          sum += Grammar::IsRule(el[p]) ? len[el[p] & ~Grammar::kRuleBit] : 1;
          sum = std::min(sum, kInf);
        }
        if (sum < len[r]) {
          len[r] = sum;
          changed = true;
        }
      }
    }
  }
  return len;
}

void Expand(const Grammar& g, const std::vector<uint64_t>& min_len, uint32_t rule, int depth,
            int max_depth, std::mt19937_64* rng, std::string* out) {
  const auto alts = g.alternatives(rule);
  const auto el = g.elements();
  // (shortest length, rule references): fewer references first, so that a chain of rules that
  // only call each other is left for one that reads bytes.
  auto alt_len = [&](uint32_t alt) {
    uint64_t sum = 0, refs = 0;
    for (uint32_t p = alt; el[p] != Grammar::kEnd; ++p) {
      sum += Grammar::IsRule(el[p]) ? min_len[el[p] & ~Grammar::kRuleBit] : 1;
      refs += Grammar::IsRule(el[p]) ? 1 : 0;
    }
    return std::make_pair(sum, refs);
  };
  uint32_t chosen = alts[(*rng)() % alts.size()];
  if (depth > max_depth) {
    for (uint32_t alt : alts) {
      if (alt_len(alt) < alt_len(chosen)) chosen = alt;
    }
  }
  for (uint32_t p = chosen; el[p] != Grammar::kEnd; ++p) {
    if (Grammar::IsRule(el[p])) {
      Expand(g, min_len, el[p] & ~Grammar::kRuleBit, depth + 1, max_depth, rng, out);
    } else {
      std::vector<uint8_t> bytes;
      for (int b = 0; b < 256; ++b) {
        if (g.SetHas(el[p], static_cast<uint8_t>(b))) bytes.push_back(static_cast<uint8_t>(b));
      }
      out->push_back(static_cast<char>(bytes[(*rng)() % bytes.size()]));
    }
  }
}

}  // namespace

std::string RandomString(const Grammar& g, std::mt19937_64* rng, int depth) {
  std::string out;
  Expand(g, MinLengths(g), g.root(), 0, depth, rng, &out);
  return out;
}

std::optional<std::string> ShortestCompletion(Matcher m, size_t max_states) {
  Recognizer* r = m.recognizer();
  std::unordered_map<Recognizer::State, std::pair<Recognizer::State, uint8_t>> from;
  std::deque<Recognizer::State> queue{m.state()};
  from[m.state()] = {m.state(), 0};
  while (!queue.empty() && from.size() < max_states) {
    const Recognizer::State s = queue.front();
    queue.pop_front();
    if (r->CanEnd(s)) {
      std::string bytes;
      for (Recognizer::State v = s; v != m.state(); v = from[v].first) {
        bytes.push_back(static_cast<char>(from[v].second));
      }
      std::reverse(bytes.begin(), bytes.end());
      return bytes;
    }
    for (int b = 0; b < 256; ++b) {
      const Recognizer::State t = r->Next(s, static_cast<uint8_t>(b));
      if (t == Recognizer::kDead || from.count(t)) continue;
      from[t] = {s, static_cast<uint8_t>(b)};
      queue.push_back(t);
    }
  }
  return std::nullopt;
}

}  // namespace kvasir::grammar::testing
