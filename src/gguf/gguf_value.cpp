#include "gguf/gguf_value.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <type_traits>

namespace kvasir {
namespace {

// Strings longer than this are cut in display renderings.
constexpr size_t kMaxDisplayChars = 48;

std::string QuoteForDisplay(const std::string& s) {
  std::string out = "\"";
  const size_t n = std::min(s.size(), kMaxDisplayChars);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c == 0x7f) {
      out += fmt::format("\\x{:02x}", c);
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (n < s.size()) out += "...";
  out.push_back('"');
  return out;
}

template <typename T>
std::string ScalarForDisplay(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_same_v<T, std::string>) {
    return QuoteForDisplay(v);
  } else if constexpr (std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>) {
    return fmt::format("{}", static_cast<int>(v));
  } else if constexpr (std::is_arithmetic_v<T>) {
    return fmt::format("{}", v);
  } else {
    return std::string("[array]");  // arrays are rendered by ToDisplayString
  }
}

}  // namespace

const char* GgufTypeName(GgufType t) {
  switch (t) {
    case GgufType::kUint8:
      return "u8";
    case GgufType::kInt8:
      return "i8";
    case GgufType::kUint16:
      return "u16";
    case GgufType::kInt16:
      return "i16";
    case GgufType::kUint32:
      return "u32";
    case GgufType::kInt32:
      return "i32";
    case GgufType::kFloat32:
      return "f32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kUint64:
      return "u64";
    case GgufType::kInt64:
      return "i64";
    case GgufType::kFloat64:
      return "f64";
  }
  return "unknown";
}

size_t GgufArray::size() const {
  return std::visit([](const auto& v) { return v.size(); }, items);
}

std::optional<int64_t> GgufValue::AsInt() const {
  return std::visit(
      [](const auto& v) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool> || !std::is_integral_v<T>) {
          return std::nullopt;
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
          return static_cast<int64_t>(v);
        } else {
          return static_cast<int64_t>(v);
        }
      },
      value);
}

std::optional<uint64_t> GgufValue::AsUint() const {
  return std::visit(
      [](const auto& v) -> std::optional<uint64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool> || !std::is_integral_v<T>) {
          return std::nullopt;
        } else if constexpr (std::is_signed_v<T>) {
          if (v < 0) return std::nullopt;
          return static_cast<uint64_t>(v);
        } else {
          return static_cast<uint64_t>(v);
        }
      },
      value);
}

std::optional<double> GgufValue::AsDouble() const {
  return std::visit(
      [](const auto& v) -> std::optional<double> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, bool>) {
          return std::nullopt;
        } else if constexpr (std::is_arithmetic_v<T>) {
          return static_cast<double>(v);
        } else {
          return std::nullopt;
        }
      },
      value);
}

std::optional<bool> GgufValue::AsBool() const {
  if (const bool* b = std::get_if<bool>(&value)) return *b;
  return std::nullopt;
}

const std::string* GgufValue::AsString() const { return std::get_if<std::string>(&value); }

const GgufArray* GgufValue::AsArray() const { return std::get_if<GgufArray>(&value); }

std::string GgufValue::ToDisplayString(size_t max_items) const {
  const GgufArray* array = AsArray();
  if (array == nullptr) {
    return std::visit([](const auto& v) { return ScalarForDisplay(v); }, value);
  }
  const size_t n = array->size();
  std::string out = fmt::format("[{} x {}]", GgufTypeName(array->elem_type), n);
  std::visit(
      [&](const auto& items) {
        using E = typename std::decay_t<decltype(items)>::value_type;
        const size_t shown = std::min(n, max_items);
        for (size_t i = 0; i < shown; ++i) {
          out += i == 0 ? " " : ", ";
          if constexpr (std::is_same_v<E, GgufValue>) {
            out += items[i].ToDisplayString(0);  // nested arrays: only their element type and size
          } else {
            out += ScalarForDisplay(static_cast<E>(items[i]));
          }
        }
        if (shown > 0 && shown < n) out += ", ...";
      },
      array->items);
  return out;
}

bool operator==(const GgufArray& a, const GgufArray& b) {
  return a.elem_type == b.elem_type && a.items == b.items;
}

bool operator==(const GgufValue& a, const GgufValue& b) {
  return a.type == b.type && a.value == b.value;
}

}  // namespace kvasir
