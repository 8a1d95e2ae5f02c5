// Classes of characters by their first byte, for skipping whole subtrees of a vocabulary trie: a
// subtree records which classes its characters start with, a recognizer state which classes it
// accepts (every character of the class, complete or cut short, to the same next state). ASCII
// punctuation has a class each, digits and each case of letters one, control bytes one, and UTF-8
// lead bytes are grouped by the shape of their sequences.
#pragma once

#include <cstdint>

namespace kvasir::grammar {

inline constexpr int kCharClasses = 46;
inline constexpr uint8_t kNoClass = 0xFF;  // continuation and invalid bytes

// The class of a character that starts with `b`, or kNoClass.
inline uint8_t CharClassOf(uint8_t b) {
  if (b < 0x20) return 0;
  if (b < 0x30) return static_cast<uint8_t>(1 + (b - 0x20));   // space ! " ... /: 1..16
  if (b < 0x3A) return 17;                                     // 0-9
  if (b < 0x41) return static_cast<uint8_t>(18 + (b - 0x3A));  // : ; < = > ? @: 18..24
  if (b < 0x5B) return 25;                                     // A-Z
  if (b < 0x61) return static_cast<uint8_t>(26 + (b - 0x5B));  // [ \ ] ^ _ `: 26..31
  if (b < 0x7B) return 32;                                     // a-z
  if (b < 0x80) return static_cast<uint8_t>(33 + (b - 0x7B));  // { | } ~ DEL: 33..37
  if (b < 0xC2) return kNoClass;
  if (b < 0xE0) return 38;
  if (b == 0xE0) return 39;
  if (b < 0xED) return 40;
  if (b == 0xED) return 41;
  if (b < 0xF0) return 42;
  if (b == 0xF0) return 43;
  if (b < 0xF4) return 44;
  if (b == 0xF4) return 45;
  return kNoClass;
}

// The continuation bytes after lead byte `b` (0 for ASCII) and the range of the first one (the
// others are 0x80..0xBF); strict UTF-8: no overlongs, surrogates or values over U+10FFFF.
struct Utf8Lead {
  int continuation;
  uint8_t lo, hi;
};
inline Utf8Lead Utf8LeadOf(uint8_t b) {
  if (b < 0x80) return {0, 0, 0};
  if (b < 0xE0) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b < 0xF0) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  return {3, 0x80, 0xBF};
}

}  // namespace kvasir::grammar
