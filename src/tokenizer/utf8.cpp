#include "tokenizer/utf8.h"

#include <string>

#include "base/check.h"
#include "tokenizer/tokenizer.h"

namespace kvasir {

Utf8ScanResult ScanUtf8(std::string_view bytes) {
  KV_CHECK(!bytes.empty());
  const uint8_t b0 = static_cast<uint8_t>(bytes[0]);
  if (b0 < 0x80) return {Utf8Scan::kComplete, 1};
  // Continuation bytes needed, and the allowed range of the first one (the narrower ranges rule
  // out overlongs, surrogates and code points above U+10FFFF).
  size_t need = 0;
  uint8_t lo = 0x80;
  uint8_t hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Scan::kInvalid, 1};
  }
  for (size_t k = 1; k <= need; ++k) {
    if (k >= bytes.size()) return {Utf8Scan::kIncomplete, bytes.size()};
    const uint8_t c = static_cast<uint8_t>(bytes[k]);
    const uint8_t k_lo = k == 1 ? lo : 0x80;
    const uint8_t k_hi = k == 1 ? hi : 0xBF;
    if (c < k_lo || c > k_hi) return {Utf8Scan::kInvalid, k};
  }
  return {Utf8Scan::kComplete, need + 1};
}

std::string Utf8Stream::Push(std::string_view bytes) {
  pending_.append(bytes);
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    const Utf8ScanResult r = ScanUtf8(std::string_view(pending_).substr(i));
    if (r.kind == Utf8Scan::kIncomplete) break;
    if (r.kind == Utf8Scan::kComplete) {
      out.append(pending_, i, r.length);
    } else {
      out.append(kUtf8Replacement);
    }
    i += r.length;
  }
  pending_.erase(0, i);
  return out;
}

std::string Utf8Stream::Flush() {
  std::string out = Push({});
  // Whatever Push left is a valid but unfinished prefix of one character.
  if (!pending_.empty()) out.append(kUtf8Replacement);
  pending_.clear();
  return out;
}

}  // namespace kvasir
