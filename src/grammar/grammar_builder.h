// Internal: rules under construction (what the text parser produces), and the checks and
// flattening that turn them into a Grammar.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "grammar/code_points.h"
#include "grammar/grammar.h"

namespace kvasir::grammar {

// Items as in Grammar::elements(): a byte set index, or Grammar::kRuleBit | rule.
using Sequence = std::vector<uint32_t>;
using ByteSet = std::array<uint64_t, 4>;

class GrammarBuilder {
 public:
  explicit GrammarBuilder(const GrammarLimits& limits) : limits_(limits) {}

  // The rule called `name`, declared (not yet defined) on first use; `where` is "LINE:COL" of that
  // first use, for the "not defined" error.
  uint32_t Named(const std::string& name, const std::string& where);
  // Defines a named rule; refuses a second definition.
  Status Define(uint32_t rule, std::vector<Sequence> alts, const std::string& where);
  // A new rule for a group or a repetition inside rule `origin`.
  uint32_t Synthetic(uint32_t origin, std::vector<Sequence> alts);

  uint32_t SetIndex(const ByteSet& set);
  // Items matching exactly one character of `set`: one byte set when every member is ASCII, else a
  // rule whose alternatives are the UTF-8 byte-range sequences (shared between equal classes).
  Sequence ClassItems(const CodePointSet& set, uint32_t origin);
  // The rule matching `n` (1..3) continuation bytes 0x80..0xBF, shared by all classes.
  uint32_t Continuation(int n, uint32_t origin);
  // Items matching the UTF-8 bytes of `text` (already valid UTF-8) one byte each.
  Sequence LiteralItems(std::string_view text);
  // Appends `unit` repeated min..max times (max absent: unbounded) to `out`.
  Status AppendRepeat(const Sequence& unit, uint32_t min, std::optional<uint32_t> max,
                      uint32_t origin, Sequence* out);
  // Counts `n` more items against limits.max_elements.
  Status Spend(size_t n);

  // Checks (every rule defined, no left recursion, every reachable rule can end) and flattens.
  Result<std::shared_ptr<const Grammar>> Finish(const std::string& root);

 private:
  struct Rule {
    std::string name;
    uint32_t origin;  // the named rule it belongs to (itself when named)
    bool defined = false;
    std::string where;
    std::vector<Sequence> alts;
  };
  // Rules for which some alternative has every item "good" (least fixpoint); a byte set item is
  // good when `set_good` says so. Nullable: no set is good. Productive: non-empty sets are.
  std::vector<bool> Solve(bool sets_good) const;
  Status CheckLeftRecursion(const std::vector<bool>& nullable) const;
  std::string OriginName(uint32_t rule) const { return rules_[rules_[rule].origin].name; }

  GrammarLimits limits_;
  std::vector<Rule> rules_;
  std::unordered_map<std::string, uint32_t> by_name_;
  std::vector<ByteSet> sets_;
  std::map<ByteSet, uint32_t> set_index_;
  std::map<std::vector<uint32_t>, uint32_t> class_rules_;  // flattened ranges -> rule
  std::unordered_map<uint32_t, uint32_t> synthetic_count_;
  uint32_t continuation_[4] = {0, 0, 0, 0};  // rule ids; 0: not made yet (rule 0 is named)
  size_t elements_ = 0;
};

}  // namespace kvasir::grammar
