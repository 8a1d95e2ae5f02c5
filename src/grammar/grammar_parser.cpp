// The grammar text format (docs/GRAMMAR.md): rules `name ::= alternatives`, where a rule's body
// runs until the next `name ::=`; `|` between alternatives; sequences of literals "...", classes
// [...], [^...], `.`, rule names and groups ( ... ), each optionally followed by * + ? {m} {m,}
// {m,n}; `#` comments to the end of the line.
#include <fmt/format.h>

#include <charconv>
#include <optional>

#include "grammar/grammar_builder.h"
#include "grammar/recognizer.h"

namespace kvasir::grammar {
namespace {

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

std::string Printable(uint32_t c) {
  if (c >= 0x20 && c < 0x7F) return fmt::format("'{}'", static_cast<char>(c));
  return fmt::format("U+{:04X}", c);
}

class TextParser {
 public:
  TextParser(std::string_view text, GrammarBuilder* b, const GrammarLimits& limits)
      : text_(text), b_(b), max_nesting_(limits.max_nesting), max_repeat_(limits.max_repeat) {}

  Status ParseRules() {
    SkipSpace();
    if (AtEnd()) return Fail("empty grammar: expected a rule 'name ::= ...'");
    while (!AtEnd()) {
      const size_t at = pos_;
      const std::string name = Name();
      if (name.empty()) return Fail(fmt::format("expected a rule name, found {}", Here()));
      SkipSpace();
      if (text_.substr(pos_, 3) != "::=") {
        return Fail(fmt::format("expected '::=' after rule name '{}'", name));
      }
      pos_ += 3;
      const std::string where = Where(at);
      rule_ = b_->Named(name, where);
      std::vector<Sequence> alts;
      KV_RETURN_IF_ERROR(Alternatives(0, &alts));
      KV_RETURN_IF_ERROR(b_->Define(rule_, std::move(alts), where));
    }
    return Status::Ok();
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek() const { return AtEnd() ? '\0' : text_[pos_]; }

  // "LINE:COL" of byte offset `at` (1-based; columns count bytes).
  std::string Where(size_t at) const {
    size_t line = 1, col = 1;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        col = 1;
      } else {
        ++col;
      }
    }
    return fmt::format("{}:{}", line, col);
  }
  Status Fail(const std::string& what) const { return FailAt(pos_, what); }
  // A limit of GrammarLimits, at a place in the text.
  Status OverLimit(size_t at, const std::string& what) const {
    return Error(StatusCode::kTooLarge, "grammar:{}: {}", Where(at), what);
  }
  Status FailAt(size_t at, const std::string& what) const {
    return Error("grammar:{}: {}", Where(at), what);
  }
  std::string Here() const {
    if (AtEnd()) return "the end of the text";
    uint32_t c;
    if (DecodeUtf8(text_.data() + pos_, text_.size() - pos_, &c) == 0) return "a byte not UTF-8";
    return Printable(c);
  }

  void SkipSpace() {
    while (!AtEnd()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string Name() {
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(text_[pos_])) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  // True when the text at the cursor is `name ::=` (the start of the next rule).
  bool AtRuleStart() const {
    size_t p = pos_;
    while (p < text_.size() && IsNameChar(text_[p])) ++p;
    if (p == pos_) return false;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return text_.substr(p, 3) == "::=";
  }

  Status Alternatives(int depth, std::vector<Sequence>* alts) {
    while (true) {
      Sequence seq;
      KV_RETURN_IF_ERROR(SequenceOf(depth, &seq));
      alts->push_back(std::move(seq));
      if (Peek() != '|') return Status::Ok();
      ++pos_;
    }
  }

  Status SequenceOf(int depth, Sequence* seq) {
    while (true) {
      SkipSpace();
      if (AtEnd() || Peek() == '|') return Status::Ok();
      if (Peek() == ')') {
        if (depth == 0) return Fail("')' without a matching '('");
        return Status::Ok();
      }
      if (AtRuleStart()) {
        if (depth > 0) return Fail("missing ')' before the next rule");
        return Status::Ok();
      }
      Sequence unit;
      KV_RETURN_IF_ERROR(Primary(depth, &unit));
      KV_RETURN_IF_ERROR(Postfix(unit, seq));
    }
  }

  Status Primary(int depth, Sequence* unit) {
    const size_t at = pos_;
    const char c = Peek();
    if (c == '"') {
      std::string bytes;
      KV_RETURN_IF_ERROR(Literal(&bytes));
      *unit = b_->LiteralItems(bytes);
      return b_->Spend(unit->size());
    }
    if (c == '[') {
      CodePointSet set;
      KV_RETURN_IF_ERROR(Class(&set));
      *unit = b_->ClassItems(set, rule_);
      return b_->Spend(1);
    }
    if (c == '.') {
      ++pos_;
      *unit = b_->ClassItems(CodePointSet::All(), rule_);
      return b_->Spend(1);
    }
    if (c == '(') {
      if (depth >= max_nesting_) {
        return OverLimit(pos_, fmt::format("parentheses nested deeper than {}", max_nesting_));
      }
      ++pos_;
      std::vector<Sequence> alts;
      KV_RETURN_IF_ERROR(Alternatives(depth + 1, &alts));
      if (Peek() != ')') return FailAt(at, "'(' without a matching ')'");
      ++pos_;
      if (alts.size() == 1) {
        *unit = std::move(alts[0]);  // a plain sequence needs no rule of its own
      } else {
        KV_RETURN_IF_ERROR(b_->Spend(alts.size()));
        *unit = {Grammar::kRuleBit | b_->Synthetic(rule_, std::move(alts))};
      }
      return Status::Ok();
    }
    if (IsNameChar(c)) {
      const std::string name = Name();
      SkipInline();
      if (Peek() == ':' || Peek() == '=') {  // a mistyped definition, not a reference
        return Fail(fmt::format("expected '::=' after rule name '{}'", name));
      }
      *unit = {Grammar::kRuleBit | b_->Named(name, Where(at))};
      return b_->Spend(1);
    }
    return Fail(fmt::format("unexpected {}", Here()));
  }

  Status Postfix(Sequence unit, Sequence* seq) {
    const size_t at = pos_;
    const char c = Peek();
    uint32_t min = 1;
    std::optional<uint32_t> max = 1;
    if (c == '*') {
      min = 0, max.reset(), ++pos_;
    } else if (c == '+') {
      min = 1, max.reset(), ++pos_;
    } else if (c == '?') {
      min = 0, max = 1, ++pos_;
    } else if (c == '{') {
      ++pos_;
      KV_RETURN_IF_ERROR(Count(&min));
      max = min;
      if (Peek() == ',') {
        ++pos_;
        SkipInline();
        if (Peek() == '}') {
          max.reset();
        } else {
          uint32_t n;
          KV_RETURN_IF_ERROR(Count(&n));
          max = n;
        }
      }
      if (Peek() != '}')
        return Fail(fmt::format("expected '}}' to close the repetition, found {}", Here()));
      ++pos_;
      if (max && *max < min) {
        return FailAt(
            at, fmt::format("repetition {{{},{}}}: the maximum is below the minimum", min, *max));
      }
    } else {
      seq->insert(seq->end(), unit.begin(), unit.end());
      return Status::Ok();
    }
    if (unit.empty()) return FailAt(at, "repetition of an empty group");
    if (c == '*' || c == '+' || c == '?') {
      const char n = Peek();
      if (n == '*' || n == '+' || n == '?')
        return Fail("a repetition of a repetition: use a group");
    }
    return b_->AppendRepeat(unit, min, max, rule_, seq);
  }

  void SkipInline() {
    while (Peek() == ' ' || Peek() == '\t') ++pos_;
  }

  Status Count(uint32_t* out) {
    SkipInline();
    const size_t start = pos_;
    while (Peek() >= '0' && Peek() <= '9') ++pos_;
    if (start == pos_)
      return Fail(fmt::format("expected a count in the repetition, found {}", Here()));
    uint64_t v = 0;
    auto [p, ec] = std::from_chars(text_.data() + start, text_.data() + pos_, v);
    if (ec != std::errc() || v > max_repeat_) {
      const std::string_view digits = text_.substr(start, pos_ - start);
      return OverLimit(
          start, fmt::format("repetition count {}{} is over the limit {}", digits.substr(0, 20),
                             digits.size() > 20 ? "..." : "", max_repeat_));
    }
    SkipInline();
    *out = static_cast<uint32_t>(v);
    return Status::Ok();
  }

  // One character of a literal or class at the cursor (an escape or a UTF-8 character).
  Status Char(uint32_t* c) {
    const size_t at = pos_;
    if (Peek() != '\\') {
      const int n = DecodeUtf8(text_.data() + pos_, text_.size() - pos_, c);
      if (n == 0) return Fail("invalid UTF-8 in the grammar text");
      pos_ += n;
      return Status::Ok();
    }
    ++pos_;
    if (AtEnd()) return FailAt(at, "'\\' at the end of the text");
    const char e = text_[pos_++];
    int digits = 0;
    switch (e) {
      case 'n':
        *c = '\n';
        return Status::Ok();
      case 'r':
        *c = '\r';
        return Status::Ok();
      case 't':
        *c = '\t';
        return Status::Ok();
      case '0':
        *c = 0;
        return Status::Ok();
      case '\\':
      case '"':
      case '\'':
      case '[':
      case ']':
      case '-':
      case '^':
      case '/':
        *c = static_cast<uint8_t>(e);
        return Status::Ok();
      case 'x':
        digits = 2;
        break;
      case 'u':
        digits = 4;
        break;
      case 'U':
        digits = 8;
        break;
      default:
        return FailAt(at, fmt::format("unknown escape '\\{}'", e));
    }
    uint32_t v = 0;
    for (int i = 0; i < digits; ++i) {
      const char h = Peek();
      int d = h >= '0' && h <= '9'   ? h - '0'
              : h >= 'a' && h <= 'f' ? h - 'a' + 10
              : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                     : -1;
      if (d < 0) return FailAt(at, fmt::format("escape '\\{}' needs {} hex digits", e, digits));
      v = v * 16 + static_cast<uint32_t>(d);
      ++pos_;
    }
    if (v > kMaxCodePoint || (v >= 0xD800 && v <= 0xDFFF)) {
      return FailAt(at, fmt::format("escape U+{:X} is not a Unicode scalar value", v));
    }
    *c = v;
    return Status::Ok();
  }

  Status Literal(std::string* bytes) {
    const size_t at = pos_;
    ++pos_;  // opening quote
    while (true) {
      if (AtEnd()) return FailAt(at, "unterminated literal");
      if (Peek() == '"') break;
      if (Peek() == '\n') return Fail("line break inside a literal (write \\n)");
      uint32_t c;
      KV_RETURN_IF_ERROR(Char(&c));
      AppendUtf8(c, bytes);
    }
    ++pos_;
    return Status::Ok();
  }

  Status Class(CodePointSet* set) {
    const size_t at = pos_;
    ++pos_;  // '['
    const bool negated = Peek() == '^';
    if (negated) ++pos_;
    CodePointSet members;
    bool any = false;
    while (true) {
      if (AtEnd()) return FailAt(at, "unterminated character class");
      if (Peek() == ']') break;
      if (Peek() == '\n') return Fail("line break inside a character class (write \\n)");
      const size_t item_at = pos_;
      uint32_t lo, hi;
      KV_RETURN_IF_ERROR(Char(&lo));
      hi = lo;
      if (Peek() == '-' && pos_ + 1 < text_.size() && text_[pos_ + 1] != ']') {
        ++pos_;
        KV_RETURN_IF_ERROR(Char(&hi));
        if (hi < lo) {
          return FailAt(item_at,
                        fmt::format("range {}-{} is reversed", Printable(lo), Printable(hi)));
        }
      }
      members.Add(lo, hi);
      any = true;
    }
    ++pos_;
    if (!any) return FailAt(at, "empty character class");
    *set = negated ? members.Complement() : members;
    return Status::Ok();
  }

 private:
  std::string_view text_;
  GrammarBuilder* b_;
  int max_nesting_;
  uint32_t max_repeat_;
  size_t pos_ = 0;
  uint32_t rule_ = 0;
};

}  // namespace

Result<std::shared_ptr<const Grammar>> Grammar::Parse(std::string_view text,
                                                      const GrammarLimits& limits,
                                                      std::string_view root) {
  if (text.size() > limits.max_text_bytes) {
    return Error(StatusCode::kTooLarge, "grammar: {} bytes of text, over the limit of {}",
                 text.size(), limits.max_text_bytes);
  }
  GrammarBuilder builder(limits);
  TextParser parser(text, &builder, limits);
  KV_RETURN_IF_ERROR(parser.ParseRules());
  KV_ASSIGN_OR_RETURN(auto grammar, builder.Finish(std::string(root)));
  // The start state is computed once here so that a grammar too ambiguous to start within the
  // stack limit is refused at parse time rather than at the first token.
  Recognizer probe(grammar);
  KV_RETURN_IF_ERROR(probe.status());
  return grammar;
}

}  // namespace kvasir::grammar
