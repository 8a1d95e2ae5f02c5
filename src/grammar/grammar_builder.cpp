#include "grammar/grammar_builder.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <functional>

namespace kvasir::grammar {
namespace {

bool Empty(const ByteSet& s) { return (s[0] | s[1] | s[2] | s[3]) == 0; }

ByteSet Range(uint8_t lo, uint8_t hi) {
  ByteSet s{};
  for (unsigned b = lo; b <= hi; ++b) s[b >> 6] |= uint64_t{1} << (b & 63);
  return s;
}

}  // namespace

uint32_t GrammarBuilder::Named(const std::string& name, const std::string& where) {
  auto it = by_name_.find(name);
  if (it != by_name_.end()) return it->second;
  const auto id = static_cast<uint32_t>(rules_.size());
  rules_.push_back(Rule{name, id, false, where, {}});
  by_name_.emplace(name, id);
  return id;
}

Status GrammarBuilder::Define(uint32_t rule, std::vector<Sequence> alts, const std::string& where) {
  Rule& r = rules_[rule];
  if (r.defined) {
    return Error("grammar:{}: rule '{}' is defined twice (first at {})", where, r.name, r.where);
  }
  r.defined = true;
  r.where = where;
  r.alts = std::move(alts);
  return Status::Ok();
}

uint32_t GrammarBuilder::Synthetic(uint32_t origin, std::vector<Sequence> alts) {
  const auto id = static_cast<uint32_t>(rules_.size());
  const uint32_t n = ++synthetic_count_[origin];
  rules_.push_back(Rule{fmt::format("{}/{}", rules_[origin].name, n), origin, true, "", {}});
  rules_.back().alts = std::move(alts);
  return id;
}

uint32_t GrammarBuilder::SetIndex(const ByteSet& set) {
  auto [it, fresh] = set_index_.emplace(set, static_cast<uint32_t>(sets_.size()));
  if (fresh) sets_.push_back(set);
  return it->second;
}

Sequence GrammarBuilder::ClassItems(const CodePointSet& set, uint32_t origin) {
  if (set.IsAscii()) {
    ByteSet bits{};
    for (const auto& r : set.ranges()) {
      const ByteSet part = Range(static_cast<uint8_t>(r.lo), static_cast<uint8_t>(r.hi));
      for (int i = 0; i < 4; ++i) bits[i] |= part[i];
    }
    return {SetIndex(bits)};
  }
  std::vector<uint32_t> key;
  for (const auto& r : set.ranges()) key.insert(key.end(), {r.lo, r.hi});
  if (auto it = class_rules_.find(key); it != class_rules_.end()) {
    return {Grammar::kRuleBit | it->second};
  }
  std::vector<Sequence> alts;
  ByteSet ascii{};
  for (const Utf8Sequence& seq : Utf8Sequences(set)) {
    if (seq.length == 1) {
      const ByteSet part = Range(seq.ranges[0].lo, seq.ranges[0].hi);
      for (int i = 0; i < 4; ++i) ascii[i] |= part[i];
      continue;
    }
    // Trailing bytes that may be any continuation byte go through shared rules, so that every
    // class reaches the same frames once only plain continuation bytes are left: fewer distinct
    // matcher states inside multi-byte characters.
    int full = 0;
    while (full < seq.length - 1 && seq.ranges[seq.length - 1 - full].lo == 0x80 &&
           seq.ranges[seq.length - 1 - full].hi == 0xBF) {
      ++full;
    }
    Sequence items;
    for (int i = 0; i < seq.length - full; ++i) {
      items.push_back(SetIndex(Range(seq.ranges[i].lo, seq.ranges[i].hi)));
    }
    if (full > 0) items.push_back(Grammar::kRuleBit | Continuation(full, origin));
    alts.push_back(std::move(items));
  }
  if (!Empty(ascii)) alts.insert(alts.begin(), Sequence{SetIndex(ascii)});
  const uint32_t rule = Synthetic(origin, std::move(alts));
  class_rules_.emplace(std::move(key), rule);
  return {Grammar::kRuleBit | rule};
}

uint32_t GrammarBuilder::Continuation(int n, uint32_t origin) {
  if (continuation_[n] != 0) return continuation_[n];
  Sequence alt{SetIndex(Range(0x80, 0xBF))};
  if (n > 1) alt.push_back(Grammar::kRuleBit | Continuation(n - 1, origin));  // a tail call
  continuation_[n] = Synthetic(origin, {std::move(alt)});
  return continuation_[n];
}

Sequence GrammarBuilder::LiteralItems(std::string_view text) {
  Sequence items;
  for (unsigned char c : text) items.push_back(SetIndex(Range(c, c)));
  return items;
}

Status GrammarBuilder::Spend(size_t n) {
  elements_ += n;
  if (elements_ > limits_.max_elements) {
    return Error(StatusCode::kTooLarge,
                 "grammar: more than {} items once repetitions are expanded (the limit)",
                 limits_.max_elements);
  }
  return Status::Ok();
}

Status GrammarBuilder::AppendRepeat(const Sequence& unit, uint32_t min, std::optional<uint32_t> max,
                                    uint32_t origin, Sequence* out) {
  Sequence u = unit;
  if (u.size() != 1) {
    KV_RETURN_IF_ERROR(Spend(u.size() + 1));
    u = {Grammar::kRuleBit | Synthetic(origin, {unit})};
  }
  const uint64_t optional = max ? *max - min : 1;
  // Each copy costs an item; each optional level a rule of two alternatives (~4 items).
  KV_RETURN_IF_ERROR(Spend(min + 4 * optional));
  for (uint32_t i = 0; i < min; ++i) out->push_back(u[0]);
  if (!max) {
    const uint32_t star = Synthetic(origin, {});
    rules_[star].alts = {Sequence{u[0], Grammar::kRuleBit | star}, Sequence{}};
    out->push_back(Grammar::kRuleBit | star);
    return Status::Ok();
  }
  // x{0,k} as x (x (x)?)?: each level a rule whose recursive reference is in tail position, so
  // the matcher's stacks do not grow with k.
  std::optional<uint32_t> next;
  for (uint32_t i = min; i < *max; ++i) {
    Sequence more{u[0]};
    if (next) more.push_back(Grammar::kRuleBit | *next);
    next = Synthetic(origin, {std::move(more), Sequence{}});
  }
  if (next) out->push_back(Grammar::kRuleBit | *next);
  return Status::Ok();
}

}  // namespace kvasir::grammar
