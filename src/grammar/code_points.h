// Sets of Unicode code points and their UTF-8 encodings as sequences of byte ranges, so that a
// character class over code points becomes a grammar over bytes.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace kvasir::grammar {

inline constexpr uint32_t kMaxCodePoint = 0x10FFFF;

// A set of code points as sorted, disjoint, non-adjacent closed ranges. Surrogates (U+D800..DFFF)
// are never members: they have no UTF-8 encoding.
class CodePointSet {
 public:
  struct Range {
    uint32_t lo, hi;
    bool operator==(const Range&) const = default;
  };

  CodePointSet() = default;
  static CodePointSet All();

  // Adds [lo, hi] (clamped to kMaxCodePoint; surrogates dropped).
  void Add(uint32_t lo, uint32_t hi);
  void Add(uint32_t c) { Add(c, c); }
  void AddSet(const CodePointSet& other);
  // Every code point not in this set.
  CodePointSet Complement() const;
  // Members of this set that are not in `other`.
  CodePointSet Minus(const CodePointSet& other) const;
  bool Contains(uint32_t c) const;
  bool empty() const { return ranges_.empty(); }
  // True when every member is below 0x80 (one byte each).
  bool IsAscii() const { return ranges_.empty() || ranges_.back().hi < 0x80; }
  const std::vector<Range>& ranges() const { return ranges_; }
  bool operator==(const CodePointSet&) const = default;

 private:
  void Normalize();
  std::vector<Range> ranges_;
};

// One UTF-8 encoding shape: byte i of the character lies in ranges[i], for i < length. Every
// combination of bytes in the ranges is the encoding of one member.
struct Utf8Sequence {
  struct ByteRange {
    uint8_t lo, hi;
  };
  std::array<ByteRange, 4> ranges;
  int length;
};

// The encodings of every member of `set`, as disjoint sequences (in code point order).
std::vector<Utf8Sequence> Utf8Sequences(const CodePointSet& set);

// Appends the UTF-8 encoding of `c` (a scalar value: not a surrogate, at most kMaxCodePoint).
void AppendUtf8(uint32_t c, std::string* out);

// Decodes one strictly valid UTF-8 character at the start of `bytes` (no overlongs, surrogates or
// values over kMaxCodePoint). Returns its length (1..4) and sets *c, or 0 when the bytes are not a
// whole valid character.
int DecodeUtf8(const char* bytes, size_t size, uint32_t* c);

}  // namespace kvasir::grammar
