// Block layouts of the quantized tensor types (ggml-compatible, little-endian, packed). Element
// indices below are within the block; f16 fields are IEEE half precision bit patterns.
#pragma once

#include <cstdint>

namespace kvasir {

inline constexpr int kSuperBlock = 256;  // values per K-quant block (ggml's QK_K)

#pragma pack(push, 1)
struct BlockQ8_0 {
  uint16_t d;     // f16 scale
  int8_t qs[32];  // value = d * qs[i]
};
struct BlockQ4_0 {
  uint16_t d;      // f16 scale
  uint8_t qs[16];  // element i (i<16) = low nibble of qs[i], element i+16 = high nibble; value = d*(q-8)
};
// value = d * q + m, q = nibble as in Q4_0 (0..15).
struct BlockQ4_1 {
  uint16_t d;  // f16 scale
  uint16_t m;  // f16 offset
  uint8_t qs[16];
};
// value = d * (q - 16), q = nibble as in Q4_0 | (bit i of the little-endian u32 qh) << 4.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
// value = d * q + m, q as in Q5_0 (0..31).
struct BlockQ5_1 {
  uint16_t d;
  uint16_t m;
  uint8_t qh[4];
  uint8_t qs[16];
};
// 16 sub-blocks of 16. Element v: q = (qs[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3,
// sub-block j = v / 16: value = d * (scales[j] & 15) * q - dmin * (scales[j] >> 4).
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d;
  uint16_t dmin;
};
// 16 sub-blocks of 16. Element v: q = (2-bit field as in Q2_K) - (bit v / 32 of hmask[v % 32] ? 0 : 4)
// (-4..3); sub-block j = v / 16 has the 6-bit scale s_j = (j < 8 ? scales[j] & 15 : scales[j - 8] >>
// 4) | ((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4; value = d * (s_j - 32) * q.
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
// 8 sub-blocks of 32. Element v: q = nibble (v / 32) % 2 of qs[32 * (v / 64) + v % 32]; sub-block
// j = v / 32 has 6-bit scale sc_j and min m_j packed in `scales` (see Q4KScaleMin); value =
// d * sc_j * q - dmin * m_j.
struct BlockQ4_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
// As Q4_K with q = nibble | (bit v / 32 of qh[v % 32]) << 4 (0..31).
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
// 16 sub-blocks of 16. Element v, n = v / 128, c = (v % 128) / 32, l = v % 32:
// q = (nibble c / 2 of ql[64 n + 32 (c % 2) + l]) | ((qh[32 n + l] >> 2c) & 3) << 4;
// value = d * scales[v / 16] * (q - 32).
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
#pragma pack(pop)
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

// Scale and min of sub-block j (0..7) of a Q4_K/Q5_K block: 6 bits each. Sub-blocks 0..3 keep
// theirs in the low 6 bits of bytes j and j + 4; 4..7 in the nibbles of byte j + 4 with the top
// two bits in the high bits of bytes j - 4 (scale) and j (min).
inline void Q4KScaleMin(const uint8_t* scales, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = (scales[j + 4] & 15) | (scales[j - 4] >> 6) << 4;
    *m = (scales[j + 4] >> 4) | (scales[j] >> 6) << 4;
  }
}

// The 6-bit scale of sub-block j (0..15) of a Q3_K block, 0..63 (the value uses it minus 32).
inline int Q3KScale(const uint8_t* scales, int j) {
  const int lo = j < 8 ? scales[j] & 15 : scales[j - 8] >> 4;
  const int hi = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
  return lo | hi << 4;
}

}  // namespace kvasir
