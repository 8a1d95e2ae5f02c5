// JSON Schema `pattern` (an ECMAScript regular expression, unanchored, Unicode mode) compiled to
// the grammar of the JSON string contents it matches. Supported: literals and escapes, classes
// with ranges and negation, . \d \D \w \W \s \S, groups (plain, (?: and named), alternation,
// * + ? {m} {m,} {m,n} (lazy forms too: they match the same strings), ^ and $ at the ends of the
// top-level alternatives. Refused: lookaround, backreferences, word boundaries, Unicode property
// classes, anchors elsewhere.
#include <fmt/format.h>

#include <vector>

#include "grammar/json_schema_parts.h"

namespace kvasir::grammar::json_parts {
namespace {

// Groups nest at most this deep: each level may add two levels of parentheses to the grammar text,
// which must stay within GrammarLimits::max_nesting.
constexpr int kMaxDepth = 16;

CodePointSet Single(uint32_t c) {
  CodePointSet s;
  s.Add(c);
  return s;
}

CodePointSet Digits() {
  CodePointSet s;
  s.Add('0', '9');
  return s;
}

CodePointSet Word() {
  CodePointSet s;
  s.Add('a', 'z');
  s.Add('A', 'Z');
  s.Add('0', '9');
  s.Add('_');
  return s;
}

// ECMAScript \s: WhiteSpace and LineTerminator.
CodePointSet Space() {
  CodePointSet s;
  for (uint32_t c : {0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x20u, 0xA0u, 0x1680u, 0x2028u, 0x2029u,
                     0x202Fu, 0x205Fu, 0x3000u, 0xFEFFu}) {
    s.Add(c);
  }
  s.Add(0x2000, 0x200A);
  return s;
}

// The grammar for one JSON string character in `set`, in its one canonical encoding: the
// character itself, or the escape JSON requires (\" \\ \b \f \n \r \t \u00XX).
std::string JsonChars(const CodePointSet& set) {
  CodePointSet special;
  special.Add(0, 0x1F);
  special.Add('"');
  special.Add('\\');
  std::vector<std::string> alts;
  const CodePointSet plain = set.Minus(special);
  if (!plain.empty()) alts.push_back(Class(plain));
  for (const auto& r : set.ranges()) {
    for (uint32_t c = r.lo; c <= r.hi && c <= 0x5C; ++c) {
      if (!special.Contains(c)) continue;
      switch (c) {
        case '"':
          alts.push_back(Literal("\\\""));
          break;
        case '\\':
          alts.push_back(Literal("\\\\"));
          break;
        case 0x08:
          alts.push_back(Literal("\\b"));
          break;
        case 0x0C:
          alts.push_back(Literal("\\f"));
          break;
        case '\n':
          alts.push_back(Literal("\\n"));
          break;
        case '\r':
          alts.push_back(Literal("\\r"));
          break;
        case '\t':
          alts.push_back(Literal("\\t"));
          break;
        default:
          alts.push_back(Literal(fmt::format("\\u{:04x}", c)));
      }
    }
  }
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : " ") + alts[i];
  return out + " )";
}

class PatternCompiler {
 public:
  PatternCompiler(std::string_view p, const std::string& any_char, uint32_t max_repeat)
      : p_(p), any_(any_char), max_repeat_(max_repeat) {}

  Result<std::string> Run() {
    std::vector<std::string> alts;
    while (true) {
      const bool start = Peek() == '^';
      if (start) ++pos_;
      std::string seq;
      KV_RETURN_IF_ERROR(Sequence(0, &seq));
      bool end = false;
      if (Peek() == '$') {
        ++pos_;
        end = true;
        if (!AtEnd() && Peek() != '|') return Fail("'$' before the end of the pattern");
      }
      std::string alt = start ? "" : any_ + "*";
      if (!seq.empty()) alt += (alt.empty() ? "" : " ") + seq;
      if (!end) alt += (alt.empty() ? "" : " ") + any_ + "*";
      alts.push_back(alt.empty() ? "\"\"" : alt);
      if (AtEnd()) break;
      if (Peek() == ')') return Fail("')' without a matching '('");
      ++pos_;  // '|'
    }
    if (alts.size() == 1) return alts[0];
    std::string out = "(";
    for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : " ") + alts[i];
    return out + " )";
  }

 private:
  bool AtEnd() const { return pos_ >= p_.size(); }
  char Peek() const { return AtEnd() ? '\0' : p_[pos_]; }
  Status Fail(const std::string& what) const { return FailAt(pos_, what); }
  Status FailAt(size_t at, const std::string& what) const {
    return Error("pattern '{}': {} (at offset {})", p_, what, at);
  }

  // Atoms with their quantifiers until '|', ')', '$' or the end.
  Status Sequence(int depth, std::string* out) {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == '|' || c == ')' || c == '$') return Status::Ok();
      if (c == '^') return Fail("'^' is supported only at the start of the pattern");
      std::string atom;
      KV_RETURN_IF_ERROR(Atom(depth, &atom));
      KV_RETURN_IF_ERROR(Quantifier(&atom));
      if (!atom.empty()) *out += (out->empty() ? "" : " ") + atom;
    }
    return Status::Ok();
  }

  Status Alternatives(int depth, std::string* out) {
    std::vector<std::string> alts;
    while (true) {
      std::string seq;
      KV_RETURN_IF_ERROR(Sequence(depth, &seq));
      if (Peek() == '$') return Fail("'$' is supported only at the end of the pattern");
      alts.push_back(seq);
      if (Peek() != '|') break;
      ++pos_;
    }
    std::string group = "(";
    for (size_t i = 0; i < alts.size(); ++i) group += (i ? " | " : " ") + alts[i];
    *out = std::move(group) + " )";
    return Status::Ok();
  }

  Status Atom(int depth, std::string* out) {
    const size_t at = pos_;
    const char c = Peek();
    if (c == '(') {
      if (depth >= kMaxDepth) return Fail(fmt::format("groups nested deeper than {}", kMaxDepth));
      ++pos_;
      if (Peek() == '?') {
        const std::string_view rest = p_.substr(pos_);
        if (rest.starts_with("?:")) {
          pos_ += 2;
        } else if (rest.starts_with("?<") && !rest.starts_with("?<=") && !rest.starts_with("?<!")) {
          const size_t close = p_.find('>', pos_);
          if (close == std::string_view::npos) return Fail("unterminated group name");
          pos_ = close + 1;
        } else {
          return FailAt(at, fmt::format("lookaround or group flags '({}' are not supported",
                                        p_.substr(pos_, std::min<size_t>(3, p_.size() - pos_))));
        }
      }
      KV_RETURN_IF_ERROR(Alternatives(depth + 1, out));
      if (Peek() != ')') return FailAt(at, "'(' without a matching ')'");
      ++pos_;
      return Status::Ok();
    }
    if (c == '[') {
      CodePointSet set;
      KV_RETURN_IF_ERROR(Class(&set));
      if (set.empty()) return FailAt(at, "the class matches no character");
      *out = JsonChars(set);
      return Status::Ok();
    }
    if (c == '.') {
      ++pos_;
      CodePointSet line_ends;
      for (uint32_t e : {0x0Au, 0x0Du, 0x2028u, 0x2029u}) line_ends.Add(e);
      *out = JsonChars(CodePointSet::All().Minus(line_ends));
      return Status::Ok();
    }
    if (c == '*' || c == '+' || c == '?')
      return Fail(fmt::format("'{}' with nothing to repeat", c));
    if (c == '{' || c == '}' || c == ']') {
      return Fail(fmt::format("a lone '{}' (write \\{})", c, c));
    }
    CodePointSet set;
    KV_RETURN_IF_ERROR(Char(false, &set));
    *out = JsonChars(set);
    return Status::Ok();
  }

  // One character or escape at the cursor, as a set (escapes such as \d stand for several).
  Status Char(bool in_class, CodePointSet* set) {
    const size_t at = pos_;
    if (Peek() != '\\') {
      uint32_t c;
      const int n = DecodeUtf8(p_.data() + pos_, p_.size() - pos_, &c);
      if (n == 0) return Fail("invalid UTF-8");
      pos_ += n;
      *set = Single(c);
      return Status::Ok();
    }
    ++pos_;
    if (AtEnd()) return FailAt(at, "'\\' at the end");
    const char e = p_[pos_++];
    switch (e) {
      case 'd':
        *set = Digits();
        return Status::Ok();
      case 'D':
        *set = Digits().Complement();
        return Status::Ok();
      case 'w':
        *set = Word();
        return Status::Ok();
      case 'W':
        *set = Word().Complement();
        return Status::Ok();
      case 's':
        *set = Space();
        return Status::Ok();
      case 'S':
        *set = Space().Complement();
        return Status::Ok();
      case 'n':
        *set = Single('\n');
        return Status::Ok();
      case 'r':
        *set = Single('\r');
        return Status::Ok();
      case 't':
        *set = Single('\t');
        return Status::Ok();
      case 'v':
        *set = Single(0x0B);
        return Status::Ok();
      case 'f':
        *set = Single(0x0C);
        return Status::Ok();
      case 'x':
      case 'u': {
        uint32_t v = 0;
        KV_RETURN_IF_ERROR(Hex(e, at, &v));
        *set = Single(v);
        return Status::Ok();
      }
      case '0':
        if (Peek() >= '0' && Peek() <= '9') return FailAt(at, "octal escapes are not supported");
        *set = Single(0);
        return Status::Ok();
      case 'b':
        if (in_class) {
          *set = Single(0x08);
          return Status::Ok();
        }
        return FailAt(at, "word boundary '\\b' is not supported");
      case '-':
        if (!in_class) break;
        *set = Single('-');
        return Status::Ok();
      default:
        if (std::string_view("^$\\.*+?()[]{}|/").find(e) != std::string_view::npos) {
          *set = Single(static_cast<uint8_t>(e));
          return Status::Ok();
        }
        if (e >= '1' && e <= '9') return FailAt(at, "backreferences are not supported");
    }
    return FailAt(at, fmt::format("escape '\\{}' is not supported", e));
  }

  Status Hex(char kind, size_t at, uint32_t* v) {
    auto digit = [](char h) {
      return h >= '0' && h <= '9'   ? h - '0'
             : h >= 'a' && h <= 'f' ? h - 'a' + 10
             : h >= 'A' && h <= 'F' ? h - 'A' + 10
                                    : -1;
    };
    const bool braces = kind == 'u' && Peek() == '{';
    if (braces) ++pos_;
    const int want = kind == 'x' ? 2 : 4;
    int n = 0;
    while (!AtEnd() && digit(Peek()) >= 0 && (braces ? n < 6 : n < want)) {
      *v = *v * 16 + static_cast<uint32_t>(digit(Peek()));
      ++pos_, ++n;
    }
    if (braces ? (n == 0 || Peek() != '}') : n != want) {
      return FailAt(at, fmt::format("malformed escape '\\{}'", kind));
    }
    if (braces) ++pos_;
    if (*v > kMaxCodePoint || (*v >= 0xD800 && *v <= 0xDFFF)) {
      return FailAt(at, fmt::format("escape U+{:X} is not a Unicode scalar value", *v));
    }
    return Status::Ok();
  }

  Status Class(CodePointSet* out) {
    const size_t at = pos_;
    ++pos_;
    const bool negated = Peek() == '^';
    if (negated) ++pos_;
    CodePointSet set;
    while (true) {
      if (AtEnd()) return FailAt(at, "unterminated class");
      if (Peek() == ']') break;
      CodePointSet lo;
      const size_t item = pos_;
      KV_RETURN_IF_ERROR(Char(true, &lo));
      if (Peek() == '-' && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        ++pos_;
        CodePointSet hi;
        KV_RETURN_IF_ERROR(Char(true, &hi));
        if (lo.ranges().size() != 1 || lo.ranges()[0].lo != lo.ranges()[0].hi ||
            hi.ranges().size() != 1 || hi.ranges()[0].lo != hi.ranges()[0].hi) {
          return FailAt(item, "a range between classes such as \\d");
        }
        const uint32_t a = lo.ranges()[0].lo, b = hi.ranges()[0].lo;
        if (b < a) return FailAt(item, "the range is reversed");
        set.Add(a, b);
      } else {
        set.AddSet(lo);
      }
    }
    ++pos_;
    *out = negated ? set.Complement() : set;
    return Status::Ok();
  }

  Status Quantifier(std::string* atom) {
    const size_t at = pos_;
    std::string q;
    const char c = Peek();
    if (c == '*' || c == '+' || c == '?') {
      q = std::string(1, c);
      ++pos_;
    } else if (c == '{') {
      ++pos_;
      uint32_t m = 0, n = 0;
      bool has_n = true;
      KV_RETURN_IF_ERROR(Count(at, &m));
      n = m;
      if (Peek() == ',') {
        ++pos_;
        if (Peek() == '}') {
          has_n = false;
        } else {
          KV_RETURN_IF_ERROR(Count(at, &n));
        }
      }
      if (Peek() != '}') return FailAt(at, "'{' is not a valid quantifier (write \\{)");
      ++pos_;
      if (has_n && n < m) return FailAt(at, "the quantifier's maximum is below its minimum");
      q = has_n ? (m == n ? fmt::format("{{{}}}", m) : fmt::format("{{{},{}}}", m, n))
                : fmt::format("{{{},}}", m);
    } else {
      return Status::Ok();
    }
    if (Peek() == '?') ++pos_;  // lazy: the same set of strings
    const char next = Peek();
    if (next == '*' || next == '+' || next == '?' || next == '{') {
      return Fail("a quantifier after a quantifier");
    }
    if (!atom->empty()) *atom = "( " + *atom + " )" + q;
    return Status::Ok();
  }

  Status Count(size_t at, uint32_t* v) {
    const size_t start = pos_;
    uint64_t n = 0;
    while (Peek() >= '0' && Peek() <= '9' && n <= max_repeat_) n = n * 10 + (p_[pos_++] - '0');
    if (pos_ == start) return FailAt(at, "'{' is not a valid quantifier (write \\{)");
    if (n > max_repeat_) return FailAt(at, fmt::format("a count over the limit {}", max_repeat_));
    *v = static_cast<uint32_t>(n);
    return Status::Ok();
  }

  std::string_view p_;
  std::string any_;
  uint32_t max_repeat_;
  size_t pos_ = 0;
};

}  // namespace

Result<std::string> PatternBody(std::string_view pattern, const std::string& any_char,
                                uint32_t max_repeat) {
  return PatternCompiler(pattern, any_char, max_repeat).Run();
}

}  // namespace kvasir::grammar::json_parts
