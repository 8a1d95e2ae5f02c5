// The checks a grammar passes before use (every rule defined, every reachable rule able to end, no
// left recursion) and the flattening into Grammar's arrays.
#include <fmt/format.h>

#include <algorithm>
#include <deque>

#include "grammar/grammar_builder.h"

namespace kvasir::grammar {
namespace {

bool EmptySet(const ByteSet& s) { return (s[0] | s[1] | s[2] | s[3]) == 0; }
uint32_t RuleOf(uint32_t item) { return item & ~Grammar::kRuleBit; }

}  // namespace

// Linear time: each alternative waits on a count of items not yet known good.
std::vector<bool> GrammarBuilder::Solve(bool sets_good) const {
  const size_t n = rules_.size();
  std::vector<bool> good(n, false);
  std::vector<uint32_t> alt_rule;
  std::vector<size_t> waiting;
  std::vector<std::vector<uint32_t>> uses(n);  // rule -> alternatives waiting on it
  std::deque<uint32_t> ready;
  for (uint32_t r = 0; r < n; ++r) {
    for (const Sequence& alt : rules_[r].alts) {
      const auto a = static_cast<uint32_t>(alt_rule.size());
      alt_rule.push_back(r);
      size_t wait = 0;
      bool blocked = false;
      for (uint32_t item : alt) {
        if (Grammar::IsRule(item)) {
          uses[RuleOf(item)].push_back(a);
          ++wait;
        } else if (!sets_good || EmptySet(sets_[item])) {
          blocked = true;
        }
      }
      waiting.push_back(blocked ? SIZE_MAX : wait);
      if (wait == 0 && !blocked) ready.push_back(r);
    }
  }
  while (!ready.empty()) {
    const uint32_t r = ready.front();
    ready.pop_front();
    if (good[r]) continue;
    good[r] = true;
    for (uint32_t a : uses[r]) {
      if (waiting[a] != SIZE_MAX && --waiting[a] == 0) ready.push_back(alt_rule[a]);
    }
  }
  return good;
}

// A rule reaches rule c "at the left" when c follows only nullable items in one of its
// alternatives. Such a cycle makes the matcher's stack grow without reading a byte, unless every
// step of it is a tail call (c last in the alternative: the matcher replaces the frame), so a cycle
// with one step that is not a tail call is left recursion.
Status GrammarBuilder::CheckLeftRecursion(const std::vector<bool>& nullable) const {
  const uint32_t n = static_cast<uint32_t>(rules_.size());
  struct Edge {
    uint32_t to;
    bool tail;
  };
  std::vector<std::vector<Edge>> edges(n);
  for (uint32_t r = 0; r < n; ++r) {
    for (const Sequence& alt : rules_[r].alts) {
      for (size_t j = 0; j < alt.size(); ++j) {
        if (!Grammar::IsRule(alt[j])) break;
        const uint32_t c = RuleOf(alt[j]);
        edges[r].push_back({c, j + 1 == alt.size()});
        if (!nullable[c]) break;
      }
    }
  }
  // Strongly connected components (Tarjan's, iterative: chains of rules can be long).
  std::vector<uint32_t> index(n, UINT32_MAX), low(n, 0), comp(n, UINT32_MAX), stack;
  std::vector<bool> on_stack(n, false);
  uint32_t next_index = 0, n_comp = 0;
  for (uint32_t start = 0; start < n; ++start) {
    if (index[start] != UINT32_MAX) continue;
    std::vector<std::pair<uint32_t, size_t>> work{{start, 0}};
    index[start] = low[start] = next_index++;
    stack.push_back(start);
    on_stack[start] = true;
    while (!work.empty()) {
      auto& [v, i] = work.back();
      if (i < edges[v].size()) {
        const uint32_t w = edges[v][i++].to;
        if (index[w] == UINT32_MAX) {
          index[w] = low[w] = next_index++;
          stack.push_back(w);
          on_stack[w] = true;
          work.push_back({w, 0});
        } else if (on_stack[w]) {
          low[v] = std::min(low[v], index[w]);
        }
        continue;
      }
      const uint32_t done = v;
      work.pop_back();
      if (!work.empty()) low[work.back().first] = std::min(low[work.back().first], low[done]);
      if (low[done] == index[done]) {
        uint32_t w;
        do {
          w = stack.back();
          stack.pop_back();
          on_stack[w] = false;
          comp[w] = n_comp;
        } while (w != done);
        ++n_comp;
      }
    }
  }
  for (uint32_t r = 0; r < n; ++r) {
    for (const Edge& e : edges[r]) {
      if (e.tail || comp[e.to] != comp[r]) continue;
      // The cycle r -> e.to -> ... -> r, found by a breadth-first search inside the component.
      std::vector<uint32_t> from(n, UINT32_MAX);
      std::deque<uint32_t> queue{e.to};
      from[e.to] = e.to;
      while (!queue.empty() && from[r] == UINT32_MAX) {
        const uint32_t v = queue.front();
        queue.pop_front();
        for (const Edge& f : edges[v]) {
          if (comp[f.to] == comp[r] && from[f.to] == UINT32_MAX) {
            from[f.to] = v;
            queue.push_back(f.to);
          }
        }
      }
      std::vector<std::string> path{OriginName(r)};
      std::vector<uint32_t> back;
      for (uint32_t v = r; v != e.to; v = from[v]) back.push_back(v);
      back.push_back(e.to);
      std::reverse(back.begin(), back.end());
      for (uint32_t v : back) {
        if (path.back() != OriginName(v)) path.push_back(OriginName(v));
      }
      if (path.size() == 1) path.push_back(path[0]);
      return Error("grammar: rule '{}' is left-recursive: {}", OriginName(r),
                   fmt::join(path, " -> "));
    }
  }
  return Status::Ok();
}

Result<std::shared_ptr<const Grammar>> GrammarBuilder::Finish(const std::string& root_name) {
  auto root_it = by_name_.find(root_name);
  if (root_it == by_name_.end() || !rules_[root_it->second].defined) {
    return Error("grammar: no rule named '{}' (the start rule)", root_name);
  }
  for (const Rule& r : rules_) {
    if (!r.defined) return Error("grammar:{}: rule '{}' is not defined", r.where, r.name);
  }
  const uint32_t root = root_it->second;
  const std::vector<bool> productive = Solve(true);
  // Every rule reachable from the root must be able to end: otherwise a prefix could be accepted
  // that no continuation completes, and a constrained generation would run until its token limit.
  std::vector<bool> reached(rules_.size(), false);
  std::vector<uint32_t> todo{root};
  reached[root] = true;
  while (!todo.empty()) {
    const uint32_t r = todo.back();
    todo.pop_back();
    if (!productive[r]) {
      return Error(
          "grammar: rule '{}' can never end: every alternative needs itself or "
          "another rule that cannot end, or an empty character class",
          OriginName(r));
    }
    for (const Sequence& alt : rules_[r].alts) {
      for (uint32_t item : alt) {
        if (Grammar::IsRule(item) && !reached[RuleOf(item)]) {
          reached[RuleOf(item)] = true;
          todo.push_back(RuleOf(item));
        }
      }
    }
  }
  KV_RETURN_IF_ERROR(CheckLeftRecursion(Solve(false)));

  auto g = std::shared_ptr<Grammar>(new Grammar());
  g->limits_ = limits_;
  g->root_ = root;
  g->sets_ = sets_;
  for (const Rule& r : rules_) {
    g->names_.push_back(r.name);
    g->rule_alts_.push_back(static_cast<uint32_t>(g->alt_starts_.size()));
    for (const Sequence& alt : r.alts) {
      // An alternative holding an empty character class can match nothing: dropped, so that no
      // prefix of it is accepted.
      const bool dead = std::any_of(alt.begin(), alt.end(), [&](uint32_t item) {
        return Grammar::IsRule(item) ? !productive[RuleOf(item)] : EmptySet(sets_[item]);
      });
      if (dead) continue;
      g->alt_starts_.push_back(static_cast<uint32_t>(g->elements_.size()));
      g->elements_.insert(g->elements_.end(), alt.begin(), alt.end());
      g->elements_.push_back(Grammar::kEnd);
    }
  }
  g->rule_alts_.push_back(static_cast<uint32_t>(g->alt_starts_.size()));
  return std::shared_ptr<const Grammar>(std::move(g));
}

}  // namespace kvasir::grammar
