// Weight matrices as the CUDA kernels read them, and the decoding of one block of 32 values into
// the integer form of kernels/quant_ints.h. Every function here is plain C++ that nvcc also
// compiles for the device (KV_HD), so the host tests check the same index arithmetic the kernels
// run (cuda_blocks_test.cpp compares every block of every type with DecodeIntBlock).
//
// Device layouts (cuda_weights.cpp writes them from the file's blocks), one matrix of a stack:
//   F32        [rows, ld] f32, ld = cols rounded up to 4, zero padded
//   F16, BF16  [rows, ld] 16-bit, ld = cols rounded up to 8, zero padded
//   Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (blocks of 32 values, nb = cols / 32 a row): each block split into
//              its quants, qs [rows, nb, 32 (Q8_0) or 16] at byte 0, and its head (the bytes
//              before the quants in the file's block: d; d, m; d, qh; d, m, qh), [rows, nb, 2 to
//              8] at byte `heads`
//   Q4_K, Q5_K the file's blocks of 144 and 176 bytes
//   Q6_K       the file's blocks of 210 bytes, each padded to 212 (4-byte aligned words)
// Each matrix starts 256-byte aligned, so every 16-byte load below is aligned.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#define KV_HD __host__ __device__ __forceinline__
#else
#define KV_HD inline
#endif

namespace kvasir::cuda {

// GGUF type ids of the weight types this backend multiplies (gguf/tensor_type.h).
enum WeightType : int {
  kWF32 = 0,
  kWF16 = 1,
  kWQ4_0 = 2,
  kWQ4_1 = 3,
  kWQ5_0 = 6,
  kWQ5_1 = 7,
  kWQ8_0 = 8,
  kWQ4_K = 12,
  kWQ5_K = 13,
  kWQ6_K = 14,
  kWBF16 = 30,
};

KV_HD constexpr bool IsFloatType(int t) { return t == kWF32 || t == kWF16 || t == kWBF16; }
// The types of blocks of 32 values, stored split into quants and heads.
KV_HD constexpr bool IsSplitType(int t) {
  return t == kWQ8_0 || t == kWQ4_0 || t == kWQ4_1 || t == kWQ5_0 || t == kWQ5_1;
}
// Bytes of a split block's quants and of its head.
KV_HD constexpr int QsBytes(int t) { return t == kWQ8_0 ? 32 : 16; }
KV_HD constexpr int HeadBytes(int t) {
  return t == kWQ4_1 ? 4 : t == kWQ5_0 ? 6 : t == kWQ5_1 ? 8 : 2;
}

inline constexpr int kQ6KDeviceBlock = 212;  // a Q6_K block of 210 bytes, padded

// A weight matrix (or stack of them) in device memory, as the kernels take it by value.
struct DevMatrix {
  const uint8_t* data = nullptr;  // matrix 0 of the stack
  int type = kWF32;
  int64_t rows = 0, cols = 0;
  int64_t row_bytes = 0;  // bytes from one row to the next (of the quants, for split types)
  int64_t heads = 0;      // split types: byte offset of the heads from the matrix's start
  int64_t stride = 0;     // bytes from one matrix of the stack to the next
};

// Block b of a row in integer form: value i = dw * s[i / 16] * q_i + dmin (kernels/quant_ints.h;
// dmin is 0 for types without an offset). q holds 32 int8 packed little-endian: word w holds
// values 4w .. 4w + 3.
struct QBlock {
  uint32_t q[8];
  int32_t s[2];
  float dw;
  float dmin;
};

// ---- Portable pieces: intrinsics on the device, plain loops on the host ----------------------

KV_HD float HalfToFloat(uint16_t h) {
#if defined(__CUDA_ARCH__)
  return __half2float(__ushort_as_half(h));
#else
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, mant = h & 0x3FF, bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000 | mant << 13;  // inf, NaN
  } else if (exp != 0) {
    bits = sign | (exp + 112) << 23 | mant << 13;
  } else if (mant == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    exp = 113;
    while ((mant & 0x400) == 0) {
      mant <<= 1;
      --exp;
    }
    bits = sign | exp << 23 | (mant & 0x3FF) << 13;
  }
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

// bf16 is the top half of an f32: widening is exact.
KV_HD float Bf16ToFloat(uint32_t bits16) {
  const uint32_t bits = bits16 << 16;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
#endif
}

KV_HD uint16_t LoadU16(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint16_t*>(p);
#else
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
#endif
}

KV_HD uint32_t LoadU32(const uint8_t* p) {
#if defined(__CUDA_ARCH__)
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
#endif
}

// Four words from a 16-byte aligned address (one 128-bit load on the device).
KV_HD void Load16(const uint8_t* p, uint32_t* w) {
#if defined(__CUDA_ARCH__)
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
#else
  std::memcpy(w, p, 16);
#endif
}

// Per byte a - b (mod 256), no borrow between bytes.
KV_HD uint32_t SubBytes(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __vsub4(a, b);
#else
  uint32_t r = 0;
  for (int i = 0; i < 32; i += 8) r |= (((a >> i) - (b >> i)) & 0xFF) << i;
  return r;
#endif
}

// c + the dot product of the four signed bytes of a and b.
KV_HD int32_t Dp4a(uint32_t a, uint32_t b, int32_t c) {
#if defined(__CUDA_ARCH__)
  return __dp4a(static_cast<int>(a), static_cast<int>(b), c);
#else
  for (int i = 0; i < 32; i += 8) {
    c += static_cast<int8_t>((a >> i) & 0xFF) * static_cast<int8_t>((b >> i) & 0xFF);
  }
  return c;
#endif
}

// ---- Block decoders: block b (values [32 b, 32 b + 32)) of row r of matrix `base` ------------

// Bits 0..3 of x as bit 4 of bytes 0..3.
KV_HD uint32_t SpreadBits4(uint32_t x) {
  return (x & 1u) << 4 | (x & 2u) << 11 | (x & 4u) << 18 | (x & 8u) << 25;
}

// Q8_0: q = the int8 quants. Q4_0, Q4_1: value i < 16 is the low nibble of byte i, value i + 16 its
// high nibble. Q5_0, Q5_1: those nibbles with bit i of the little-endian qh as bit 4. Q4_0 and Q5_0
// subtract 8 and 16; Q4_1 and Q5_1 add m * (the sum of the activations) instead (dmin = m).
template <int kType>
KV_HD void DecodeSplit(const DevMatrix& m, const uint8_t* base, int64_t r, int64_t b, QBlock* o) {
  const int64_t i = r * (m.cols / 32) + b;
  const uint8_t* qs = base + i * QsBytes(kType);
  const uint8_t* head = base + m.heads + i * HeadBytes(kType);
  o->s[0] = o->s[1] = 1;
  o->dw = HalfToFloat(LoadU16(head));
  o->dmin = kType == kWQ4_1 || kType == kWQ5_1 ? HalfToFloat(LoadU16(head + 2)) : 0.0f;
  if (kType == kWQ8_0) {
    Load16(qs, o->q);
    Load16(qs + 16, o->q + 4);
    return;
  }
  uint32_t v[4];
  Load16(qs, v);
  uint32_t qh = 0;
  if (kType == kWQ5_0 || kType == kWQ5_1) {
    const uint8_t* h = head + (kType == kWQ5_0 ? 2 : 4);
    qh = LoadU16(h) | static_cast<uint32_t>(LoadU16(h + 2)) << 16;
  }
  const uint32_t offset = kType == kWQ4_0 ? 0x08080808u : kType == kWQ5_0 ? 0x10101010u : 0u;
  for (int w = 0; w < 4; ++w) {
    const uint32_t lo = (v[w] & 0x0F0F0F0Fu) | SpreadBits4(qh >> (4 * w));
    const uint32_t hi = ((v[w] >> 4) & 0x0F0F0F0Fu) | SpreadBits4(qh >> (16 + 4 * w));
    o->q[w] = SubBytes(lo, offset);
    o->q[w + 4] = SubBytes(hi, offset);
  }
}

// Scale and min of sub-block j of a Q4_K/Q5_K block (kernels/quant_blocks.h, Q4KScaleMin), from
// its 12 scale bytes as three little-endian words (registers, where a byte array would not be).
KV_HD int ScaleByte(const uint32_t* w, int i) {
  const uint32_t word = i < 4 ? w[0] : (i < 8 ? w[1] : w[2]);
  return static_cast<int>((word >> (8 * (i % 4))) & 0xFF);
}

KV_HD void ScaleMinK(const uint32_t* w, int j, int* sc, int* mn) {
  if (j < 4) {
    *sc = ScaleByte(w, j) & 63;
    *mn = ScaleByte(w, j + 4) & 63;
  } else {
    *sc = (ScaleByte(w, j + 4) & 15) | (ScaleByte(w, j - 4) >> 6) << 4;
    *mn = (ScaleByte(w, j + 4) >> 4) | (ScaleByte(w, j) >> 6) << 4;
  }
}

// Q4_K (kQ5 false) and Q5_K: sub-block j = b % 8 of super-block b / 8; value l's nibble is nibble
// j % 2 of qs[32 (j / 2) + l]; Q5_K adds bit j of qh[l] as bit 4.
template <bool kQ5>
KV_HD void DecodeQ45K(const DevMatrix& m, const uint8_t* base, int64_t r, int64_t b, QBlock* o) {
  constexpr int kBytes = kQ5 ? 176 : 144;
  constexpr int kQs = kQ5 ? 48 : 16;
  const int j = static_cast<int>(b % 8);
  const uint8_t* blk = base + r * m.row_bytes + (b / 8) * kBytes;
  uint32_t v[8];
  Load16(blk + kQs + 32 * (j / 2), v);
  Load16(blk + kQs + 32 * (j / 2) + 16, v + 4);
  const int shift = 4 * (j % 2);
  for (int w = 0; w < 8; ++w) o->q[w] = (v[w] >> shift) & 0x0F0F0F0Fu;
  if (kQ5) {
    uint32_t h[8];
    Load16(blk + 16, h);
    Load16(blk + 32, h + 4);
    for (int w = 0; w < 8; ++w) o->q[w] |= ((h[w] >> j) & 0x01010101u) << 4;
  }
  uint32_t sc12[3];
  for (int i = 0; i < 3; ++i) sc12[i] = LoadU32(blk + 4 + 4 * i);
  int sc, mn;
  ScaleMinK(sc12, j, &sc, &mn);
  o->s[0] = o->s[1] = 1;
  o->dw = HalfToFloat(LoadU16(blk)) * static_cast<float>(sc);
  o->dmin = -(HalfToFloat(LoadU16(blk + 2)) * static_cast<float>(mn));
}

// Q6_K: sub-block b % 8 = 4 n + c; value l: q = (nibble c / 2 of ql[64 n + 32 (c % 2) + l]) |
// (bits 2c, 2c + 1 of qh[32 n + l]) << 4, minus 32; scales of its halves scales[2 (b % 8)], +1.
KV_HD void DecodeQ6K(const DevMatrix& m, const uint8_t* base, int64_t r, int64_t b, QBlock* o) {
  const int sub = static_cast<int>(b % 8), n = sub / 4, c = sub % 4;
  const uint8_t* blk = base + r * m.row_bytes + (b / 8) * kQ6KDeviceBlock;
  const uint8_t* ql = blk + 64 * n + 32 * (c % 2);
  const uint8_t* qh = blk + 128 + 32 * n;
  for (int w = 0; w < 8; ++w) {
    const uint32_t lo = (LoadU32(ql + 4 * w) >> (4 * (c / 2))) & 0x0F0F0F0Fu;
    const uint32_t hi = (LoadU32(qh + 4 * w) >> (2 * c)) & 0x03030303u;
    o->q[w] = SubBytes(lo | hi << 4, 0x20202020u);
  }
  o->s[0] = static_cast<int8_t>(blk[192 + 2 * sub]);
  o->s[1] = static_cast<int8_t>(blk[193 + 2 * sub]);
  o->dw = HalfToFloat(LoadU16(blk + 208));
  o->dmin = 0.0f;
}

template <int kType>
KV_HD void DecodeBlock(const DevMatrix& m, const uint8_t* base, int64_t r, int64_t b, QBlock* o) {
  if constexpr (IsSplitType(kType)) {
    DecodeSplit<kType>(m, base, r, b, o);
  } else if constexpr (kType == kWQ4_K) {
    DecodeQ45K<false>(m, base, r, b, o);
  } else if constexpr (kType == kWQ5_K) {
    DecodeQ45K<true>(m, base, r, b, o);
  } else {
    static_assert(kType == kWQ6_K, "not a quantized weight type of this backend");
    DecodeQ6K(m, base, r, b, o);
  }
}

// Types whose blocks add dmin * (sum of the activations) (MinKind::kFloat).
KV_HD constexpr bool HasMin(int type) {
  return type == kWQ4_1 || type == kWQ5_1 || type == kWQ4_K || type == kWQ5_K;
}

// The exact integer part of a block against 32 int8 activations x (packed as QBlock::q):
// s[0] * (dot of values 0..15) + s[1] * (dot of values 16..31).
KV_HD int32_t BlockDot(const QBlock& w, const uint32_t* x) {
  int32_t lo = 0, hi = 0;
  for (int i = 0; i < 4; ++i) {
    lo = Dp4a(w.q[i], x[i], lo);
    hi = Dp4a(w.q[i + 4], x[i + 4], hi);
  }
  return w.s[0] * lo + w.s[1] * hi;
}

// Signed int8 value i (0..31) of a decoded block.
KV_HD int QValue(const QBlock& w, int i) {
  return static_cast<int8_t>((w.q[i / 4] >> (8 * (i % 4))) & 0xFF);
}

// Products and sums rounded on their own, never fused, on both sides.
KV_HD float MulRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}

KV_HD float AddRn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}

// Value i of a decoded block as the CPU dequantizes it: (d * sub-block scale) * q + offset, where
// an offset of 0 is not added (so that -0 stays -0, as the CPU's d * q gives it).
KV_HD float BlockValue(const QBlock& w, int i) {
  const float scaled = MulRn(w.dw, static_cast<float>(w.s[i / 16]));
  const float v = MulRn(scaled, static_cast<float>(QValue(w, i)));
  return w.dmin == 0.0f ? v : AddRn(v, w.dmin);
}

}  // namespace kvasir::cuda
