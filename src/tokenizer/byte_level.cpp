#include "tokenizer/byte_level.h"

#include <array>

#include "tokenizer/utf8.h"

namespace kvasir {
namespace {

bool StandsForItself(uint32_t b) {
  return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

struct Tables {
  std::array<uint32_t, 256> to_cp{};
  // [0x144] the byte for each code point below U+0144, or -1.
  std::array<int16_t, 0x144> to_byte{};
  // [256] UTF-8 of to_cp, 1 or 2 bytes each.
  std::array<std::string, 256> utf8;
};

const Tables& GetTables() {
  static const Tables t = [] {
    Tables t;
    t.to_byte.fill(-1);
    uint32_t next = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      const uint32_t cp = StandsForItself(b) ? b : next++;
      t.to_cp[b] = cp;
      t.to_byte[cp] = static_cast<int16_t>(b);
      // Every code point here is below U+0800: one or two UTF-8 bytes.
      if (cp < 0x80) {
        t.utf8[b] = std::string(1, static_cast<char>(cp));
      } else {
        t.utf8[b] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
      }
    }
    return t;
  }();
  return t;
}

}  // namespace

uint32_t ByteToCodepoint(uint8_t b) { return GetTables().to_cp[b]; }

int CodepointToByte(uint32_t cp) {
  const Tables& t = GetTables();
  return cp < t.to_byte.size() ? t.to_byte[cp] : -1;
}

void AppendByteLevel(std::string_view bytes, std::string* out) {
  const Tables& t = GetTables();
  for (char c : bytes) out->append(t.utf8[static_cast<uint8_t>(c)]);
}

std::string DecodeByteLevel(std::string_view text, bool* ok) {
  std::string out;
  out.reserve(text.size());
  if (ok != nullptr) *ok = true;
  size_t i = 0;
  while (i < text.size()) {
    const Utf8ScanResult r = ScanUtf8(text.substr(i));
    if (r.kind == Utf8Scan::kComplete && r.length <= 2) {
      const uint8_t b0 = static_cast<uint8_t>(text[i]);
      const uint32_t cp =
          r.length == 1 ? b0 : ((b0 & 0x1Fu) << 6) | (static_cast<uint8_t>(text[i + 1]) & 0x3Fu);
      const int byte = CodepointToByte(cp);
      if (byte >= 0) {
        out.push_back(static_cast<char>(byte));
        i += r.length;
        continue;
      }
    }
    // Not a character of the alphabet: keep its bytes as they are.
    const size_t n = r.kind == Utf8Scan::kIncomplete ? text.size() - i : r.length;
    out.append(text.substr(i, n));
    if (ok != nullptr) *ok = false;
    i += n;
  }
  return out;
}

}  // namespace kvasir
