#include "base/json_escape.h"

namespace kvasir {

void AppendJsonEscaped(std::string_view bytes, std::string* out) {
  constexpr char kHex[] = "0123456789abcdef";
  for (const char c : bytes) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(c);
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '\r') {
      out->append("\\r");
    } else if (c == '\t') {
      out->append("\\t");
    } else if (u < 0x20) {
      out->append("\\u00");
      out->push_back(kHex[u >> 4]);
      out->push_back(kHex[u & 0xF]);
    } else {
      out->push_back(c);
    }
  }
}

std::string JsonEscape(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  AppendJsonEscaped(bytes, &out);
  return out;
}

}  // namespace kvasir
