// UTF-8 helpers for the tokenizers: splitting text into characters the way llama.cpp does, and
// classifying byte sequences for streaming output.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kvasir {

// U+FFFD REPLACEMENT CHARACTER, UTF-8 encoded.
inline constexpr std::string_view kUtf8Replacement = "\xEF\xBF\xBD";

// Length of the character that starts with `lead`, judged from its high four bits only: 1 for
// ASCII and stray continuation bytes, 2 for 0xC0-0xDF, 3 for 0xE0-0xEF, 4 for 0xF0-0xFF. The
// following bytes are not checked (llama.cpp splits SPM input this way; callers clamp at the end).
inline size_t Utf8LenFromLead(uint8_t lead) {
  static constexpr uint8_t kLen[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return kLen[lead >> 4];
}

// Length of the SPM character at the start of non-empty `text`: a lead byte together with the
// continuation bytes its high bits ask for (the split llama.cpp makes), or 1 when those bytes are
// not all present and continuation bytes, so that a bad byte never swallows the next character.
inline size_t SpmCharLen(std::string_view text) {
  const size_t len = Utf8LenFromLead(static_cast<uint8_t>(text[0]));
  if (len > text.size()) return 1;
  for (size_t k = 1; k < len; ++k) {
    if ((static_cast<uint8_t>(text[k]) & 0xC0) != 0x80) return 1;
  }
  return len;
}

enum class Utf8Scan { kComplete, kInvalid, kIncomplete };

struct Utf8ScanResult {
  Utf8Scan kind;
  // kComplete: bytes of the character. kInvalid: bytes of the maximal ill-formed subpart (>= 1)
  // that one U+FFFD replaces. kIncomplete: bytes present so far (all of `bytes`).
  size_t length;
};

// Classifies the sequence at the start of non-empty `bytes` under the strict UTF-8 rules (no
// overlongs, no surrogates, nothing above U+10FFFF).
Utf8ScanResult ScanUtf8(std::string_view bytes);

}  // namespace kvasir
