#include "grammar/json_schema_parts.h"

#include <fmt/format.h>

#include <vector>

#include "base/json_escape.h"

namespace kvasir::grammar::json_parts {
namespace {

std::string ClassChar(uint32_t c) {
  if ((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
    return std::string(1, static_cast<char>(c));
  }
  if (c < 0x100) return fmt::format("\\x{:02X}", c);
  if (c < 0x10000) return fmt::format("\\u{:04X}", c);
  return fmt::format("\\U{:08X}", c);
}

std::string Alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : "") + alts[i];
  return out + ")";
}

// Magnitudes (digit strings without leading zeros).
int CompareMag(const std::string& a, const std::string& b) {
  if (a.size() != b.size()) return a.size() < b.size() ? -1 : 1;
  return a < b ? -1 : a > b ? 1 : 0;
}

std::string MagSucc(std::string d) {
  int i = static_cast<int>(d.size()) - 1;
  while (i >= 0 && d[i] == '9') d[i--] = '0';
  if (i < 0) return "1" + d;
  ++d[i];
  return d;
}

std::string MagPred(std::string d) {  // d > 0
  int i = static_cast<int>(d.size()) - 1;
  while (d[i] == '0') d[i--] = '9';
  --d[i];
  if (d.size() > 1 && d[0] == '0') d.erase(0, 1);
  return d;
}

std::string DigitClass(char lo, char hi) {
  return lo == hi ? Literal(std::string(1, lo)) : fmt::format("[{}-{}]", lo, hi);
}

std::string AnyDigits(size_t n) {
  if (n == 0) return "";
  return n == 1 ? "[0-9]" : fmt::format("[0-9]{{{}}}", n);
}

std::string Join(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (b.empty()) return a;
  return a + " " + b;
}

// Digit strings of equal length (leading zeros allowed) from a to b.
std::string SameLength(const std::string& a, const std::string& b) {
  const size_t n = a.size();
  if (n == 0) return "";
  if (a == b) return Literal(a);
  if (n == 1) return DigitClass(a[0], b[0]);
  if (a[0] == b[0]) return Join(Literal(a.substr(0, 1)), SameLength(a.substr(1), b.substr(1)));
  std::vector<std::string> alts;
  const std::string rest_a = a.substr(1), rest_b = b.substr(1);
  char first = a[0], last = b[0];
  if (rest_a != std::string(n - 1, '0')) {
    alts.push_back(Join(Literal(a.substr(0, 1)), SameLength(rest_a, std::string(n - 1, '9'))));
    ++first;
  }
  std::string high;
  if (rest_b != std::string(n - 1, '9')) {
    high = Join(Literal(b.substr(0, 1)), SameLength(std::string(n - 1, '0'), rest_b));
    --last;
  }
  if (first <= last) alts.push_back(Join(DigitClass(first, last), AnyDigits(n - 1)));
  if (!high.empty()) alts.push_back(high);
  return Alternatives(alts);
}

// Magnitudes from a to b (a <= b), without leading zeros.
std::string NonNegative(const std::string& a, const std::string& b) {
  std::vector<std::string> alts;
  size_t full_lo = 0, full_hi = 0;  // lengths whose every number is in range, merged
  for (size_t len = a.size(); len <= b.size(); ++len) {
    const std::string lo = len == a.size() ? a : "1" + std::string(len - 1, '0');
    const std::string hi = len == b.size() ? b : std::string(len, '9');
    if (len >= 2 && lo == "1" + std::string(len - 1, '0') && hi == std::string(len, '9')) {
      if (full_lo == 0) full_lo = len;
      full_hi = len;
      continue;
    }
    alts.push_back(SameLength(lo, hi));
  }
  if (full_lo != 0) {
    alts.push_back(full_lo == full_hi
                       ? Join("[1-9]", AnyDigits(full_lo - 1))
                       : fmt::format("[1-9] [0-9]{{{},{}}}", full_lo - 1, full_hi - 1));
  }
  return Alternatives(alts);
}

std::string Clamp(const std::string& d, const std::string& max) {
  return CompareMag(d, max) > 0 ? max : d;
}

// Numbers whose magnitude M satisfies a <= M <= b (b absent: unbounded), a and b integers: the
// integer part in [a, b - 1] with any fraction, or equal to b with a fraction of zeros only.
std::string Magnitude(const std::string& a, const std::optional<std::string>& b,
                      const std::string& max, int fraction) {
  const std::string frac = fmt::format("( \".\" [0-9]{{1,{}}} )?", fraction);
  const std::string zeros = fmt::format("( \".\" \"0\"{{1,{}}} )?", fraction);
  if (CompareMag(a, max) > 0) return "";
  if (!b) return NonNegative(a, max) + " " + frac;
  std::vector<std::string> alts;
  if (*b != "0" && CompareMag(a, MagPred(*b)) <= 0) {
    alts.push_back(NonNegative(a, Clamp(MagPred(*b), max)) + " " + frac);
  }
  if (CompareMag(*b, max) <= 0) alts.push_back(Literal(*b) + " " + zeros);
  return alts.empty() ? "" : Alternatives(alts);
}

}  // namespace

std::string Literal(std::string_view bytes) { return "\"" + JsonEscape(bytes) + "\""; }

std::string Class(const CodePointSet& set) {
  std::string out = "[";
  for (const auto& r : set.ranges()) {
    out += ClassChar(r.lo);
    if (r.hi != r.lo) out += "-" + ClassChar(r.hi);
  }
  return out + "]";
}

int Compare(const Decimal& a, const Decimal& b) {
  const bool a_zero = a.digits == "0", b_zero = b.digits == "0";
  const bool a_neg = a.negative && !a_zero, b_neg = b.negative && !b_zero;
  if (a_neg != b_neg) return a_neg ? -1 : 1;
  const int m = CompareMag(a.digits, b.digits);
  return a_neg ? -m : m;
}

Decimal Succ(const Decimal& x) {
  if (x.negative && x.digits != "0") {
    Decimal r{true, MagPred(x.digits)};
    if (r.digits == "0") r.negative = false;
    return r;
  }
  return {false, MagSucc(x.digits)};
}

Decimal Pred(const Decimal& x) {
  if (!x.negative || x.digits == "0") {
    if (x.digits == "0") return {true, "1"};
    return {false, MagPred(x.digits)};
  }
  return {true, MagSucc(x.digits)};
}

std::string IntegerRange(const std::optional<Decimal>& lo, const std::optional<Decimal>& hi,
                         int max_digits) {
  const std::string max(static_cast<size_t>(max_digits), '9');
  std::vector<std::string> alts;
  const bool lo_neg = lo && lo->negative && lo->digits != "0";
  const bool hi_neg = hi && hi->negative && hi->digits != "0";
  if (!hi_neg) {  // zero and up
    const std::string a = lo && !lo_neg ? lo->digits : "0";
    const std::string b = hi ? Clamp(hi->digits, max) : max;
    if (CompareMag(a, b) <= 0) alts.push_back(NonNegative(a, b));
  }
  if (!lo || lo_neg) {  // below zero: "-" and the magnitude
    const std::string c = hi_neg ? hi->digits : "1";
    const std::string d = lo ? Clamp(lo->digits, max) : max;
    if (CompareMag(c, d) <= 0) alts.push_back("\"-\" " + NonNegative(c, d));
  }
  return alts.empty() ? "" : Alternatives(alts);
}

std::string NumberRange(const std::optional<Decimal>& lo, const std::optional<Decimal>& hi,
                        int max_digits, int max_fraction) {
  const std::string max(static_cast<size_t>(max_digits), '9');
  std::vector<std::string> alts;
  const bool lo_neg = lo && lo->negative && lo->digits != "0";
  const bool hi_neg = hi && hi->negative && hi->digits != "0";
  if (!hi_neg) {
    const std::string a = lo && !lo_neg ? lo->digits : "0";
    std::optional<std::string> b;
    if (hi) b = hi->digits;
    if (!b || CompareMag(a, *b) <= 0) {
      const std::string m = Magnitude(a, b, max, max_fraction);
      if (!m.empty()) alts.push_back(m);
    }
  }
  if (!lo || lo_neg) {
    // "-0" and "-0.5" are allowed when zero is in range: their values are in range.
    const std::string c = hi_neg ? hi->digits : "0";
    std::optional<std::string> d;
    if (lo) d = lo->digits;
    if (!d || CompareMag(c, *d) <= 0) {
      const std::string m = Magnitude(c, d, max, max_fraction);
      if (!m.empty()) alts.push_back("\"-\" " + m);
    }
  }
  return alts.empty() ? "" : Alternatives(alts);
}

Result<std::string> FormatBody(std::string_view format) {
  // Dates: days per month exact, 29 February only in leap years (divisible by 4, centuries only
  // when divisible by 400), so that strict validators accept every date produced.
  static const std::string kDate =
      "( [0-9]{4} \"-\" ( \"02-\" ( \"0\" [1-9] | \"1\" [0-9] | \"2\" [0-8] ) "
      "| ( \"0\" [13578] | \"1\" [02] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" [01] ) "
      "| ( \"0\" [469] | \"11\" ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"30\" ) ) "
      "| ( [0-9]{2} ( \"0\" [48] | [2468] [048] | [13579] [26] ) "
      "| ( [02468] [048] | [13579] [26] ) \"00\" ) \"-02-29\" )";
  // RFC 3339 full-time, with its time zone (strict validators require one); no leap second.
  static const std::string kTime =
      "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? "
      "( \"Z\" | [+\\-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )";
  static const std::string kHex = "[0-9a-fA-F]";
  if (format == "date") return kDate;
  if (format == "time") return kTime;
  if (format == "date-time") return kDate + " \"T\" " + kTime;
  if (format == "uuid") {
    return fmt::format("{0}{{8}} \"-\" {0}{{4}} \"-\" {0}{{4}} \"-\" {0}{{4}} \"-\" {0}{{12}}",
                       kHex);
  }
  if (format == "email") {
    // A conservative subset of RFC 5322 addresses that every common validator accepts: a
    // dot-atom of letters, digits and _%+- before the @, and a domain of at least two labels of
    // letters, digits and inner hyphens (at most 63 characters each). Quoted local parts, IP
    // literals and non-ASCII addresses are not produced.
    static const std::string kAtom = "[A-Za-z0-9_%+\\-]+";
    static const std::string kLabel = "[A-Za-z0-9] ( [A-Za-z0-9\\-]{0,61} [A-Za-z0-9] )?";
    return fmt::format("{0} ( \".\" {0} )* \"@\" {1} ( \".\" {1} )+", kAtom, kLabel);
  }
  if (format == "ipv4") {
    static const std::string kOctet =
        "( \"25\" [0-5] | \"2\" [0-4] [0-9] | \"1\" [0-9] [0-9] | [1-9] [0-9] | [0-9] )";
    return fmt::format("{0} \".\" {0} \".\" {0} \".\" {0}", kOctet);
  }
  return Error("format '{}' is not supported (supported: {})", format, kSupportedFormats);
}

}  // namespace kvasir::grammar::json_parts
