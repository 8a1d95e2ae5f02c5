// GPT-2's byte-level alphabet: every byte 0..255 stands for one printable code point, so that BPE
// can run on text made of "characters" only. Printable Latin-1 bytes ('!'..'~', U+00A1..U+00AC,
// U+00AE..U+00FF) stand for themselves; the other 68 bytes take U+0100.. in byte order (space is
// U+0120 'Ġ', newline U+010A 'Ċ').
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvasir {

// The code point that byte `b` stands for.
uint32_t ByteToCodepoint(uint8_t b);
// The byte that code point `cp` stands for, or -1 when `cp` is not in the alphabet.
int CodepointToByte(uint32_t cp);

// Appends the UTF-8 of ByteToCodepoint(b) for every byte of `bytes` to *out.
void AppendByteLevel(std::string_view bytes, std::string* out);

// Maps byte-level text back to bytes. A character outside the alphabet (or a stray byte of invalid
// UTF-8) is copied through unchanged, so the result is defined for any input. `*ok` (when given)
// becomes false if that happened.
std::string DecodeByteLevel(std::string_view text, bool* ok = nullptr);

}  // namespace kvasir
