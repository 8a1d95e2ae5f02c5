// Internal to the JSON schema compiler: grammar text for literals, classes, numbers, formats and
// patterns.
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "base/status.h"
#include "grammar/code_points.h"

namespace kvasir::grammar::json_parts {

// A grammar literal matching exactly `bytes` (valid UTF-8).
std::string Literal(std::string_view bytes);
// A grammar character class matching one member of `set` (non-empty).
std::string Class(const CodePointSet& set);

// A decimal integer: sign and digits (no leading zeros; "0" for zero).
struct Decimal {
  bool negative = false;
  std::string digits = "0";
};
// Grammar expression for the decimal integers in [lo, hi] (a missing bound: up to `max_digits`
// digits) written without leading zeros or "-0". Empty when the range holds no such integer.
std::string IntegerRange(const std::optional<Decimal>& lo, const std::optional<Decimal>& hi,
                         int max_digits);
// Grammar expression for the numbers in [lo, hi] written without an exponent, with up to
// `max_digits` integer digits and `max_fraction` fraction digits. Empty when there are none.
std::string NumberRange(const std::optional<Decimal>& lo, const std::optional<Decimal>& hi,
                        int max_digits, int max_fraction);
// x - 1 and x + 1.
Decimal Pred(const Decimal& x);
Decimal Succ(const Decimal& x);
int Compare(const Decimal& a, const Decimal& b);

// The contents (between the quotes) of JSON strings of a format; an error names unsupported ones.
Result<std::string> FormatBody(std::string_view format);
inline constexpr std::string_view kSupportedFormats = "date, time, date-time, uuid, email, ipv4";

// The contents of JSON strings matching ECMAScript regular expression `pattern` anywhere (as JSON
// Schema's `pattern` does); `any_char` names the rule for one JSON string character. Errors name
// the construct that cannot be expressed and its offset.
Result<std::string> PatternBody(std::string_view pattern, const std::string& any_char,
                                uint32_t max_repeat);

}  // namespace kvasir::grammar::json_parts
