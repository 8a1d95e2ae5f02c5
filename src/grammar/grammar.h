// A context-free grammar over bytes, written in a GBNF-like text format (docs/GRAMMAR.md):
//
//   root   ::= "{" ws pair ( "," ws pair )* "}"     # a comment
//   pair   ::= [a-z]+ ws ":" ws ( [0-9]{1,3} | "\"" [^"\\]* "\"" ) ws
//   ws     ::= [ \t\n]{0,8}
//
// Literals and character classes are Unicode text encoded as UTF-8; a class over code points
// compiles to alternatives of byte ranges, so matching runs byte by byte and a token may end in the
// middle of a character. Parsing refuses undefined and duplicate rules, left recursion and rules
// that can never end, naming them; the result is immutable and safe to share between threads.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace kvasir::grammar {

// Bounds on what a grammar may cost (a grammar may come from a client: it must not exhaust memory).
struct GrammarLimits {
  size_t max_text_bytes = 2 << 20;  // grammar text
  // Compiled items, after repetitions are expanded: parsing costs about 75 bytes and 0.4 us per
  // item at its peak, so about 80 MB and 0.4 s at this limit.
  size_t max_elements = 1 << 20;
  uint32_t max_repeat = 100000;  // m and n in x{m,n}
  int max_nesting = 64;          // parentheses inside parentheses
  // Parse stacks one matcher state may hold (ambiguity makes them multiply); a grammar whose start
  // state exceeds it is refused, and a matcher that reaches it reports an error.
  size_t max_stacks = 512;
};

class Grammar {
 public:
  // Parses and checks `text`; `root` names the start rule. Errors say where and what:
  // "grammar:3:14: expected '::=' after rule name 'value'", "grammar: rule 'expr' is
  // left-recursive: expr -> term -> expr", "grammar:2:9: rule 'vaule' is not defined".
  static Result<std::shared_ptr<const Grammar>> Parse(std::string_view text,
                                                      const GrammarLimits& limits = {},
                                                      std::string_view root = "root");

  // The compiled form, read by the recognizer. Each alternative is a run of items in elements()
  // ending with kEnd; an item below kRuleBit is a byte set index, else kRuleBit | rule index.
  static constexpr uint32_t kEnd = 0xFFFFFFFFu;
  static constexpr uint32_t kRuleBit = 0x80000000u;
  static bool IsRule(uint32_t item) { return item != kEnd && (item & kRuleBit) != 0; }

  std::span<const uint32_t> elements() const { return elements_; }
  // Start offsets in elements() of rule `rule`'s alternatives.
  std::span<const uint32_t> alternatives(uint32_t rule) const {
    return std::span<const uint32_t>(alt_starts_)
        .subspan(rule_alts_[rule], rule_alts_[rule + 1] - rule_alts_[rule]);
  }
  bool SetHas(uint32_t set, uint8_t byte) const {
    return (sets_[set][byte >> 6] >> (byte & 63)) & 1;
  }
  uint32_t root() const { return root_; }
  size_t rule_count() const { return names_.size(); }
  // A rule's name; rules made for groups and repetitions are named after the rule they appear in
  // ("value/3").
  const std::string& rule_name(uint32_t rule) const { return names_[rule]; }
  const GrammarLimits& limits() const { return limits_; }

 private:
  friend class GrammarBuilder;
  Grammar() = default;

  std::vector<uint32_t> elements_;
  std::vector<uint32_t> alt_starts_;
  std::vector<uint32_t> rule_alts_;  // [rule_count + 1] offsets into alt_starts_
  std::vector<std::array<uint64_t, 4>> sets_;
  std::vector<std::string> names_;
  uint32_t root_ = 0;
  GrammarLimits limits_;
};

}  // namespace kvasir::grammar
