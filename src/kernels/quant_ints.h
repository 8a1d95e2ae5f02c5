// The integer form of a quantized weight block of 32 values, which defines the arithmetic of every
// integer matrix product (ref::MatMul, the Highway kernels and the x86 intrinsics kernels).
//
// Every quantized type is, per 32 values, signed integer weights q[32] with integer scales s[0]
// (values 0..15) and s[1] (values 16..31), a float scale dw, and for some types an offset:
//   value_i = dw * s[i / 16] * q_i + offset_i, with
//   kNone  (Q8_0, Q4_0, Q5_0, Q3_K, Q6_K): offset 0,
//   kFloat (Q4_1, Q5_1, Q4_K, Q5_K):       offset = dmin (one float for the 32 values),
//   kInt16 (Q2_K):                         offset = dmin * m[i / 16] (dmin = -the f16 dmin).
// For 32-value sub-block types s = {1, 1} and the sub-block scale is in dw (Q4_K: dw = d * sc_j and
// dmin = -(dmin * m_j), both exact in f32). For 16-value sub-block types dw = d and s holds the
// sub-block scales, so that they apply exactly in integers.
//
// Against an activation block quantized to Q8_0 (int8 x[32], f32 scale dx, exact integer sums
// sum = sum_i x_i, sum_lo = sum_{i<16} x_i and fsum = dx * float(sum), exact in f32), the block adds
// to the f32 accumulator of its (row, token), blocks in row order:
//   isum = s[0] * sum_{i<16} q_i x_i + s[1] * sum_{i>=16} q_i x_i       (exact int32)
//   acc  = fma(float(isum), dw * dx, acc)
//   kFloat: acc = fma(dmin, fsum, acc)
//   kInt16: acc = fma(float(m[0] * sum_lo + m[1] * (sum - sum_lo)), dmin * dx, acc)
// Every SIMD kernel performs exactly these f32 operations (int32 -> f32 rounds to nearest even),
// so results agree bit for bit wherever multiply-add is fused. Magnitudes stay within int32:
// |isum| <= 2 * 128 * 32 * 127 * 16 (Q6_K).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "base/check.h"
#include "kernels/kernels.h"

namespace kvasir::kernels_internal {

enum class MinKind { kNone, kFloat, kInt16 };

struct IntBlock {
  int8_t q[32];
  int32_t s[2];
  int32_t m[2];  // kInt16 only
  float dw;
  float dmin;  // kFloat, kInt16
};

inline MinKind MinKindOf(TensorType type) {
  switch (type) {
    case TensorType::kQ4_1:
    case TensorType::kQ5_1:
    case TensorType::kQ4_K:
    case TensorType::kQ5_K:
      return MinKind::kFloat;
    case TensorType::kQ2_K:
      return MinKind::kInt16;
    default:
      return MinKind::kNone;
  }
}

inline bool IsQuantizedType(TensorType type) {
  switch (type) {
    case TensorType::kQ8_0:
    case TensorType::kQ4_0:
    case TensorType::kQ4_1:
    case TensorType::kQ5_0:
    case TensorType::kQ5_1:
    case TensorType::kQ2_K:
    case TensorType::kQ3_K:
    case TensorType::kQ4_K:
    case TensorType::kQ5_K:
    case TensorType::kQ6_K:
      return true;
    default:
      return false;
  }
}

namespace quant_ints_detail {

template <class Block>
inline Block LoadBlock(const uint8_t* row, int64_t index) {
  Block blk;  // rows may start at any byte
  std::memcpy(&blk, row + static_cast<size_t>(index) * sizeof(Block), sizeof(Block));
  return blk;
}

// The 5th bits of a Q5_0/Q5_1 block: bit i is element i's.
inline uint32_t HighBits(const uint8_t qh[4]) {
  return uint32_t{qh[0]} | uint32_t{qh[1]} << 8 | uint32_t{qh[2]} << 16 | uint32_t{qh[3]} << 24;
}

// The 2-bit field of element v of a Q2_K/Q3_K block.
inline int Q2Field(const uint8_t* qs, int v) {
  return (qs[32 * (v / 128) + v % 32] >> (2 * ((v / 32) % 4))) & 3;
}

}  // namespace quant_ints_detail

// Block b (values [32b, 32b + 32)) of a row of `type` in integer form.
inline void DecodeIntBlock(TensorType type, const uint8_t* row, int64_t b, IntBlock* out) {
  using namespace quant_ints_detail;
  out->s[0] = out->s[1] = 1;
  out->m[0] = out->m[1] = 0;
  out->dmin = 0.0f;
  switch (type) {
    case TensorType::kQ8_0: {
      const auto blk = LoadBlock<BlockQ8_0>(row, b);
      std::memcpy(out->q, blk.qs, 32);
      out->dw = F16ToF32(blk.d);
      return;
    }
    case TensorType::kQ4_0:
    case TensorType::kQ4_1: {
      const uint8_t* qs;
      BlockQ4_0 b0;
      BlockQ4_1 b1;
      const bool q41 = type == TensorType::kQ4_1;
      if (q41) {
        b1 = LoadBlock<BlockQ4_1>(row, b);
        qs = b1.qs;
        out->dw = F16ToF32(b1.d);
        out->dmin = F16ToF32(b1.m);
      } else {
        b0 = LoadBlock<BlockQ4_0>(row, b);
        qs = b0.qs;
        out->dw = F16ToF32(b0.d);
      }
      const int offset = q41 ? 0 : 8;
      for (int j = 0; j < 16; ++j) {
        out->q[j] = static_cast<int8_t>((qs[j] & 15) - offset);
        out->q[j + 16] = static_cast<int8_t>((qs[j] >> 4) - offset);
      }
      return;
    }
    case TensorType::kQ5_0:
    case TensorType::kQ5_1: {
      const uint8_t* qs;
      uint32_t qh;
      BlockQ5_0 b0;
      BlockQ5_1 b1;
      const bool q51 = type == TensorType::kQ5_1;
      if (q51) {
        b1 = LoadBlock<BlockQ5_1>(row, b);
        qs = b1.qs;
        qh = HighBits(b1.qh);
        out->dw = F16ToF32(b1.d);
        out->dmin = F16ToF32(b1.m);
      } else {
        b0 = LoadBlock<BlockQ5_0>(row, b);
        qs = b0.qs;
        qh = HighBits(b0.qh);
        out->dw = F16ToF32(b0.d);
      }
      const int offset = q51 ? 0 : 16;
      for (int j = 0; j < 16; ++j) {
        out->q[j] = static_cast<int8_t>(((qs[j] & 15) | ((qh >> j) & 1) << 4) - offset);
        out->q[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - offset);
      }
      return;
    }
    case TensorType::kQ2_K: {
      const auto blk = LoadBlock<BlockQ2_K>(row, b / 8);
      const int v0 = static_cast<int>(b % 8) * 32;
      for (int i = 0; i < 32; ++i) out->q[i] = static_cast<int8_t>(Q2Field(blk.qs, v0 + i));
      for (int h = 0; h < 2; ++h) {
        out->s[h] = blk.scales[v0 / 16 + h] & 15;
        out->m[h] = blk.scales[v0 / 16 + h] >> 4;
      }
      out->dw = F16ToF32(blk.d);
      out->dmin = -F16ToF32(blk.dmin);
      return;
    }
    case TensorType::kQ3_K: {
      const auto blk = LoadBlock<BlockQ3_K>(row, b / 8);
      const int v0 = static_cast<int>(b % 8) * 32;
      for (int i = 0; i < 32; ++i) {
        const int v = v0 + i;
        const int high = (blk.hmask[v % 32] >> (v / 32)) & 1;
        out->q[i] = static_cast<int8_t>(Q2Field(blk.qs, v) - (high ? 0 : 4));
      }
      for (int h = 0; h < 2; ++h) out->s[h] = Q3KScale(blk.scales, v0 / 16 + h) - 32;
      out->dw = F16ToF32(blk.d);
      return;
    }
    case TensorType::kQ4_K:
    case TensorType::kQ5_K: {
      const int j = static_cast<int>(b % 8);
      const uint8_t* qs;
      const uint8_t* qh = nullptr;
      const uint8_t* scales;
      uint16_t d, dmin;
      BlockQ4_K b4;
      BlockQ5_K b5;
      if (type == TensorType::kQ4_K) {
        b4 = LoadBlock<BlockQ4_K>(row, b / 8);
        qs = b4.qs;
        scales = b4.scales;
        d = b4.d;
        dmin = b4.dmin;
      } else {
        b5 = LoadBlock<BlockQ5_K>(row, b / 8);
        qs = b5.qs;
        qh = b5.qh;
        scales = b5.scales;
        d = b5.d;
        dmin = b5.dmin;
      }
      for (int l = 0; l < 32; ++l) {
        int q = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
        if (qh != nullptr) q |= ((qh[l] >> j) & 1) << 4;
        out->q[l] = static_cast<int8_t>(q);
      }
      int sc, m;
      Q4KScaleMin(scales, j, &sc, &m);
      out->dw = F16ToF32(d) * static_cast<float>(sc);
      out->dmin = -(F16ToF32(dmin) * static_cast<float>(m));
      return;
    }
    case TensorType::kQ6_K: {
      const auto blk = LoadBlock<BlockQ6_K>(row, b / 8);
      const int n = static_cast<int>(b % 8) / 4;
      const int c = static_cast<int>(b % 8) % 4;
      for (int l = 0; l < 32; ++l) {
        const int lo = (blk.ql[64 * n + 32 * (c % 2) + l] >> (4 * (c / 2))) & 15;
        const int hi = (blk.qh[32 * n + l] >> (2 * c)) & 3;
        out->q[l] = static_cast<int8_t>((lo | hi << 4) - 32);
      }
      out->s[0] = blk.scales[2 * (b % 8)];
      out->s[1] = blk.scales[2 * (b % 8) + 1];
      out->dw = F16ToF32(blk.d);
      return;
    }
    default:
      KV_CHECK(false, "DecodeIntBlock: type {} is not quantized", static_cast<uint32_t>(type));
  }
}

// The reference step of the header comment for one (row, token, block).
inline float IntBlockStep(const IntBlock& w, MinKind kind, const int8_t* x, float dx, int32_t sum,
                          int32_t sum_lo, float fsum, float acc) {
  int32_t dot[2] = {0, 0};
  for (int i = 0; i < 32; ++i) dot[i / 16] += int32_t{w.q[i]} * int32_t{x[i]};
  const int32_t isum = w.s[0] * dot[0] + w.s[1] * dot[1];
  acc = std::fma(static_cast<float>(isum), w.dw * dx, acc);
  if (kind == MinKind::kFloat) {
    acc = std::fma(w.dmin, fsum, acc);
  } else if (kind == MinKind::kInt16) {
    const int32_t imin = w.m[0] * sum_lo + w.m[1] * (sum - sum_lo);
    acc = std::fma(static_cast<float>(imin), w.dmin * dx, acc);
  }
  return acc;
}

}  // namespace kvasir::kernels_internal
