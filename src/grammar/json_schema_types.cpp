// JSON schema types other than objects: integers and numbers with bounds, strings with lengths,
// formats or patterns, arrays with items and counts.
#include <fmt/format.h>

#include <cmath>

#include "grammar/json_schema_compiler.h"
#include "grammar/json_schema_parts.h"

namespace kvasir::grammar {
namespace {

using json_parts::Decimal;

constexpr char kQuote[] = "\"\\\"\"";  // the grammar literal for one '"'

Decimal FromJsonInteger(const OrderedJson& v) {
  if (v.is_number_unsigned()) return {false, std::to_string(v.get<uint64_t>())};
  const int64_t x = v.get<int64_t>();
  if (x >= 0) return {false, std::to_string(x)};
  // Magnitude without overflowing at INT64_MIN.
  return {true, std::to_string(static_cast<uint64_t>(-(x + 1)) + 1)};
}

Decimal FromWholeDouble(double d) {
  std::string s = fmt::format("{:.0f}", d);
  Decimal r;
  r.negative = !s.empty() && s[0] == '-';
  r.digits = r.negative ? s.substr(1) : s;
  if (r.digits == "0") r.negative = false;
  return r;
}

// A count keyword (minItems, maxLength, ...): a non-negative integer, at most `limit`.
Result<std::optional<uint32_t>> CountKeyword(const OrderedJson& schema, const char* key,
                                             uint32_t limit) {
  if (!schema.contains(key)) return std::optional<uint32_t>();
  const OrderedJson& v = schema[key];
  if (!v.is_number_integer() || (!v.is_number_unsigned() && v.get<int64_t>() < 0)) {
    return Error("'{}' must be a non-negative integer", key);
  }
  if (v.get<uint64_t>() > limit) {
    return Error("'{}' {} is over the supported limit of {}", key, v.dump(), limit);
  }
  return std::optional<uint32_t>(static_cast<uint32_t>(v.get<uint64_t>()));
}

}  // namespace

Result<std::string> SchemaCompiler::Integer(const OrderedJson& schema, const std::string& path) {
  std::optional<Decimal> lo, hi;
  for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
    if (!schema.contains(key)) continue;
    const OrderedJson& v = schema[key];
    if (!v.is_number()) {
      return At(path, fmt::format("'{}' must be a number (the draft-4 boolean form of the "
                                  "exclusive bounds is not supported)",
                                  key));
    }
    const std::string k = key;
    const bool lower = k == "minimum" || k == "exclusiveMinimum";
    const bool exclusive = k.starts_with("exclusive");
    Decimal b;
    if (v.is_number_integer()) {
      b = FromJsonInteger(v);
      if (exclusive) b = lower ? json_parts::Succ(b) : json_parts::Pred(b);
    } else {
      const double d = v.get<double>();
      if (!std::isfinite(d)) return At(path, fmt::format("'{}' is not finite", key));
      // The integers above (below) a bound: ceil (floor); exclusive: strictly above (below).
      double whole = lower ? (exclusive ? std::floor(d) + 1 : std::ceil(d))
                           : (exclusive ? std::ceil(d) - 1 : std::floor(d));
      b = FromWholeDouble(whole);
    }
    auto& slot = lower ? lo : hi;
    if (!slot || (lower ? json_parts::Compare(b, *slot) > 0 : json_parts::Compare(b, *slot) < 0)) {
      slot = b;
    }
  }
  if (!lo && !hi) return std::string("integer");
  std::string body = json_parts::IntegerRange(lo, hi, o_.max_integer_digits);
  if (body.empty()) {
    return At(path, fmt::format("no integer of at most {} digits lies within the bounds",
                                o_.max_integer_digits));
  }
  return body;
}

Result<std::string> SchemaCompiler::Number(const OrderedJson& schema, const std::string& path) {
  std::optional<Decimal> lo, hi;
  for (const char* key : {"exclusiveMinimum", "exclusiveMaximum"}) {
    if (schema.contains(key)) {
      return At(path, fmt::format("'{}' on a number is not supported (on an integer it is)", key));
    }
  }
  for (const char* key : {"minimum", "maximum"}) {
    if (!schema.contains(key)) continue;
    const OrderedJson& v = schema[key];
    if (!v.is_number()) return At(path, fmt::format("'{}' must be a number", key));
    Decimal b;
    if (v.is_number_integer()) {
      b = FromJsonInteger(v);
    } else {
      const double d = v.get<double>();
      if (!std::isfinite(d) || std::floor(d) != d) {
        return At(path, fmt::format("'{}' {} on a number is not supported (only whole-number "
                                    "bounds are)",
                                    key, v.dump()));
      }
      b = FromWholeDouble(d);
    }
    (std::string(key) == "minimum" ? lo : hi) = b;
  }
  if (!lo && !hi) return std::string("number");
  std::string body = json_parts::NumberRange(lo, hi, o_.max_integer_digits, o_.max_fraction_digits);
  if (body.empty()) return At(path, "no number lies within the bounds");
  return body;
}

Result<std::string> SchemaCompiler::String(const OrderedJson& schema, const std::string& path) {
  const bool has_length = schema.contains("minLength") || schema.contains("maxLength");
  if (schema.contains("format")) {
    if (has_length || schema.contains("pattern")) {
      return At(path,
                "'format' together with 'pattern', 'minLength' or 'maxLength' is not "
                "supported");
    }
    if (!schema["format"].is_string()) return At(path, "'format' must be a string");
    auto body = json_parts::FormatBody(schema["format"].get<std::string>());
    if (!body.ok()) return At(path, body.status().message());
    return fmt::format("{} {} {}", kQuote, *body, kQuote);
  }
  if (schema.contains("pattern")) {
    if (has_length) {
      return At(path, "'pattern' together with 'minLength' or 'maxLength' is not supported");
    }
    if (!schema["pattern"].is_string()) return At(path, "'pattern' must be a string");
    auto body =
        json_parts::PatternBody(schema["pattern"].get<std::string>(), "char", o_.max_repeat);
    if (!body.ok()) return At(path, body.status().message());
    return fmt::format("{} {} {}", kQuote, *body, kQuote);
  }
  if (!has_length) return std::string("string");
  auto min = CountKeyword(schema, "minLength", o_.max_repeat);
  if (!min.ok()) return At(path, min.status().message());
  auto max = CountKeyword(schema, "maxLength", o_.max_repeat);
  if (!max.ok()) return At(path, max.status().message());
  const uint32_t lo = min->value_or(0);
  if (*max && **max < lo) return At(path, "'maxLength' is below 'minLength'");
  // One `char` is one code point (escapes included; a surrogate pair is one), as JSON Schema
  // counts length.
  const std::string reps = *max ? fmt::format("{{{},{}}}", lo, **max) : fmt::format("{{{},}}", lo);
  return fmt::format("{} char{} {}", kQuote, reps, kQuote);
}

Result<std::string> SchemaCompiler::Array(const OrderedJson& schema, const std::string& path,
                                          const std::string& hint, int depth) {
  if (schema.contains("items") && schema["items"].is_array()) {
    return At(path, "'items' as a list of schemas (tuples) is not supported");
  }
  auto min = CountKeyword(schema, "minItems", o_.max_repeat);
  if (!min.ok()) return At(path, min.status().message());
  auto max = CountKeyword(schema, "maxItems", o_.max_repeat);
  if (!max.ok()) return At(path, max.status().message());
  const uint32_t lo = min->value_or(0);
  std::optional<uint32_t> hi = *max;
  std::string item = "value";
  if (schema.contains("items")) {
    const OrderedJson& items = schema["items"];
    if (items.is_boolean() && !items.get<bool>()) {
      hi = 0;
    } else if (!items.is_boolean()) {
      KV_ASSIGN_OR_RETURN(item, Sub(items, path + "/items", hint + "-items", depth));
    }
  }
  if (hi && *hi < lo) return At(path, "'maxItems' is below 'minItems' (or 'items' is false)");
  if (hi && *hi == 0) return std::string("\"[\" ws \"]\"");
  const std::string more = fmt::format("( \",\" ws {} ws )", item);
  const uint32_t more_lo = lo == 0 ? 0 : lo - 1;
  std::string reps;
  if (!hi) {
    reps = more_lo == 0 ? "*" : fmt::format("{{{},}}", more_lo);
  } else if (*hi - 1 == more_lo) {
    reps = more_lo == 0 ? "" : fmt::format("{{{}}}", more_lo);
  } else {
    reps = fmt::format("{{{},{}}}", more_lo, *hi - 1);
  }
  const std::string items = fmt::format("{} ws{}", item, reps.empty() ? "" : " " + more + reps);
  if (lo == 0) return fmt::format("\"[\" ws ( {} )? \"]\"", items);
  return fmt::format("\"[\" ws {} \"]\"", items);
}

}  // namespace kvasir::grammar
