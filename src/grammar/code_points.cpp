#include "grammar/code_points.h"

#include <algorithm>

namespace kvasir::grammar {
namespace {

constexpr uint32_t kSurrogateLo = 0xD800;
constexpr uint32_t kSurrogateHi = 0xDFFF;

int EncodedLength(uint32_t c) { return c < 0x80 ? 1 : c < 0x800 ? 2 : c < 0x10000 ? 3 : 4; }

void Encode(uint32_t c, uint8_t* b) {
  switch (EncodedLength(c)) {
    case 1:
      b[0] = static_cast<uint8_t>(c);
      break;
    case 2:
      b[0] = static_cast<uint8_t>(0xC0 | (c >> 6));
      b[1] = static_cast<uint8_t>(0x80 | (c & 0x3F));
      break;
    case 3:
      b[0] = static_cast<uint8_t>(0xE0 | (c >> 12));
      b[1] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | (c & 0x3F));
      break;
    default:
      b[0] = static_cast<uint8_t>(0xF0 | (c >> 18));
      b[1] = static_cast<uint8_t>(0x80 | ((c >> 12) & 0x3F));
      b[2] = static_cast<uint8_t>(0x80 | ((c >> 6) & 0x3F));
      b[3] = static_cast<uint8_t>(0x80 | (c & 0x3F));
  }
}

// Splits [lo, hi] (no surrogates inside) until each piece is a product of byte ranges: first at
// the encoded-length boundaries, then wherever a continuation byte would not span its whole range
// 0x80..0xBF while a more significant byte varies.
void Split(uint32_t lo, uint32_t hi, std::vector<Utf8Sequence>* out) {
  for (uint32_t boundary : {0x7Fu, 0x7FFu, 0xFFFFu}) {
    if (lo <= boundary && hi > boundary) {
      Split(lo, boundary, out);
      Split(boundary + 1, hi, out);
      return;
    }
  }
  const int n = EncodedLength(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) != (hi & ~m)) {
      if ((lo & m) != 0) {
        Split(lo, lo | m, out);
        Split((lo | m) + 1, hi, out);
        return;
      }
      if ((hi & m) != m) {
        Split(lo, (hi & ~m) - 1, out);
        Split(hi & ~m, hi, out);
        return;
      }
    }
  }
  uint8_t a[4], b[4];
  Encode(lo, a);
  Encode(hi, b);
  Utf8Sequence seq{};
  seq.length = n;
  for (int i = 0; i < n; ++i) seq.ranges[i] = {a[i], b[i]};
  out->push_back(seq);
}

}  // namespace

CodePointSet CodePointSet::All() {
  CodePointSet s;
  s.Add(0, kMaxCodePoint);
  return s;
}

void CodePointSet::Add(uint32_t lo, uint32_t hi) {
  hi = std::min(hi, kMaxCodePoint);
  if (lo > hi) return;
  if (lo < kSurrogateLo && hi >= kSurrogateLo) {
    ranges_.push_back({lo, kSurrogateLo - 1});
    if (hi > kSurrogateHi) ranges_.push_back({kSurrogateHi + 1, hi});
  } else if (lo >= kSurrogateLo && lo <= kSurrogateHi) {
    if (hi > kSurrogateHi) ranges_.push_back({kSurrogateHi + 1, hi});
  } else {
    ranges_.push_back({lo, hi});
  }
  Normalize();
}

void CodePointSet::AddSet(const CodePointSet& other) {
  ranges_.insert(ranges_.end(), other.ranges_.begin(), other.ranges_.end());
  Normalize();
}

void CodePointSet::Normalize() {
  std::sort(ranges_.begin(), ranges_.end(),
            [](const Range& a, const Range& b) { return a.lo < b.lo; });
  std::vector<Range> merged;
  for (const Range& r : ranges_) {
    if (!merged.empty() && r.lo <= merged.back().hi + 1) {
      merged.back().hi = std::max(merged.back().hi, r.hi);
    } else {
      merged.push_back(r);
    }
  }
  ranges_ = std::move(merged);
}

CodePointSet CodePointSet::Complement() const {
  CodePointSet out;
  uint32_t next = 0;
  for (const Range& r : ranges_) {
    if (r.lo > next) out.Add(next, r.lo - 1);
    next = r.hi + 1;
  }
  if (next <= kMaxCodePoint) out.Add(next, kMaxCodePoint);
  return out;
}

CodePointSet CodePointSet::Minus(const CodePointSet& other) const {
  CodePointSet out;
  const CodePointSet keep = other.Complement();
  // Intersection of two sorted range lists.
  size_t i = 0, j = 0;
  while (i < ranges_.size() && j < keep.ranges_.size()) {
    const uint32_t lo = std::max(ranges_[i].lo, keep.ranges_[j].lo);
    const uint32_t hi = std::min(ranges_[i].hi, keep.ranges_[j].hi);
    if (lo <= hi) out.ranges_.push_back({lo, hi});
    if (ranges_[i].hi < keep.ranges_[j].hi)
      ++i;
    else
      ++j;
  }
  out.Normalize();
  return out;
}

bool CodePointSet::Contains(uint32_t c) const {
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), c,
                             [](uint32_t v, const Range& r) { return v < r.lo; });
  return it != ranges_.begin() && c <= std::prev(it)->hi;
}

std::vector<Utf8Sequence> Utf8Sequences(const CodePointSet& set) {
  std::vector<Utf8Sequence> out;
  for (const auto& r : set.ranges()) Split(r.lo, r.hi, &out);
  return out;
}

void AppendUtf8(uint32_t c, std::string* out) {
  uint8_t b[4];
  Encode(c, b);
  out->append(reinterpret_cast<const char*>(b), EncodedLength(c));
}

int DecodeUtf8(const char* bytes, size_t size, uint32_t* c) {
  if (size == 0) return 0;
  const auto* b = reinterpret_cast<const uint8_t*>(bytes);
  if (b[0] < 0x80) {
    *c = b[0];
    return 1;
  }
  int n;
  uint32_t v, min;
  if ((b[0] & 0xE0) == 0xC0) {
    n = 2, v = b[0] & 0x1F, min = 0x80;
  } else if ((b[0] & 0xF0) == 0xE0) {
    n = 3, v = b[0] & 0x0F, min = 0x800;
  } else if ((b[0] & 0xF8) == 0xF0) {
    n = 4, v = b[0] & 0x07, min = 0x10000;
  } else {
    return 0;
  }
  if (size < static_cast<size_t>(n)) return 0;
  for (int i = 1; i < n; ++i) {
    if ((b[i] & 0xC0) != 0x80) return 0;
    v = (v << 6) | (b[i] & 0x3F);
  }
  if (v < min || v > kMaxCodePoint || (v >= kSurrogateLo && v <= kSurrogateHi)) return 0;
  *c = v;
  return n;
}

}  // namespace kvasir::grammar
