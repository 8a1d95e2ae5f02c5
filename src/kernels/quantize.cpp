// Quantization and dequantization of rows (Highway, dispatched at run time), the activation
// quantizer of the integer matrix products, and GetRow.
#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "kernels/kernels.h"
#include "kernels/kernels_ref.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant_ints.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/quantize.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

#ifndef KVASIR_KERNELS_QUANTIZE_ONCE
#define KVASIR_KERNELS_QUANTIZE_ONCE
namespace kvasir::kernels_internal {

// Dequantizes through the integer form: per half block, value = (dw * s) * q (+ offset). These are
// exactly the operations of ggml's dequantizers (dw * s and the offsets are exact products, and
// a - b equals a + (-b)), so the result equals ref::DequantizeRow bit for bit.
inline void DequantizeIntForm(TensorType type, const void* src, int64_t n, float* dst) {
  KV_CHECK(IsQuantizedType(type), "DequantizeRow: unsupported type {}",
           static_cast<uint32_t>(type));
  const int64_t values = BlockValues(type);
  KV_CHECK(n % values == 0, "{} row of {} values", TensorTypeName(static_cast<uint32_t>(type)), n);
  const MinKind kind = MinKindOf(type);
  IntBlock blk;
  for (int64_t b = 0; b < n / kQBlock; ++b) {
    DecodeIntBlock(type, static_cast<const uint8_t*>(src), b, &blk);
    for (int h = 0; h < 2; ++h) {
      const float scale = blk.dw * static_cast<float>(blk.s[h]);
      float* out = dst + b * kQBlock + 16 * h;
      const int8_t* q = blk.q + 16 * h;
      if (kind == MinKind::kNone) {
        for (int i = 0; i < 16; ++i) out[i] = scale * static_cast<float>(q[i]);
      } else {
        const float off = kind == MinKind::kFloat ? blk.dmin : blk.dmin * static_cast<float>(blk.m[h]);
        for (int i = 0; i < 16; ++i) out[i] = scale * static_cast<float>(q[i]) + off;
      }
    }
  }
}

}  // namespace kvasir::kernels_internal
#endif

HWY_BEFORE_NAMESPACE();
namespace kvasir::kernels_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Up to 16 f32 lanes: a Q8_0 block is a whole number of vectors on every target.
using DF = hn::CappedTag<float, 16>;
using DI = hn::RebindToSigned<DF>;

// roundf(v): round half away from zero, exactly as the C library does it.
HWY_INLINE hn::Vec<DF> RoundHalfAway(DF df, hn::Vec<DF> v) {
  const auto truncated = hn::Trunc(v);
  const auto frac = hn::Abs(hn::Sub(v, truncated));
  const auto bump =
      hn::IfThenElseZero(hn::Ge(frac, hn::Set(df, 0.5f)), hn::CopySign(hn::Set(df, 1.0f), v));
  return hn::Add(truncated, bump);
}

// Quantizes nb consecutive blocks of 32 values as ggml's reference Q8_0 quantizer does. Block b's
// values go to qs_at(b); done(b, f16 scale, sum of the quantized values, sum of the first 16)
// reports the rest. Blocks
// go in chunks, each step over a whole chunk, so the per-block divisions and reductions overlap.
template <class QsAt, class Done>
HWY_INLINE void QuantizeBlocksQ8(const float* x, int64_t nb, QsAt qs_at, Done done) {
  const DF df;
  const DI di;
  const hn::Rebind<int8_t, DI> d8;
  const size_t n = hn::Lanes(df);
  constexpr int64_t kChunk = 32;
  float scale[kChunk];
  float inv[kChunk];
  for (int64_t c0 = 0; c0 < nb; c0 += kChunk) {
    const int64_t nc = std::min(kChunk, nb - c0);
    for (int64_t i = 0; i < nc; ++i) {
      const float* xb = x + (c0 + i) * kQBlock;
      auto vmax = hn::Zero(df);
      for (size_t j = 0; j < kQBlock; j += n) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, xb + j)));
      scale[i] = hn::GetLane(hn::MaxOfLanes(df, vmax)) / 127.0f;
    }
    for (int64_t i = 0; i < nc; ++i) inv[i] = scale[i] != 0.0f ? 1.0f / scale[i] : 0.0f;
    for (int64_t i = 0; i < nc; ++i) {
      const float* xb = x + (c0 + i) * kQBlock;
      int8_t* qs = qs_at(c0 + i);
      const auto vinv = hn::Set(df, inv[i]);
      auto vlo = hn::Zero(di);
      auto vhi = hn::Zero(di);
      for (size_t j = 0; j < kQBlock; j += n) {
        const auto q = hn::ConvertTo(di, RoundHalfAway(df, hn::Mul(hn::LoadU(df, xb + j), vinv)));
        if (j < kQBlock / 2) {
          vlo = hn::Add(vlo, q);
        } else {
          vhi = hn::Add(vhi, q);
        }
        hn::StoreU(hn::DemoteTo(d8, q), d8, qs + j);
      }
      // At most 16 lanes, so no vector straddles the two halves.
      const int32_t lo = hn::GetLane(hn::SumOfLanes(di, vlo));
      const int32_t hi = hn::GetLane(hn::SumOfLanes(di, vhi));
      done(c0 + i, F32ToF16(scale[i]), lo + hi, lo);
    }
  }
}

void QuantizeActsT(const float* x, int32_t bias, const QuantActs& out, int64_t tile_begin,
                   int64_t tile_end) {
  const int64_t cols = out.cols;
  const int64_t nb = cols / kQBlock;
  for (int64_t tile = tile_begin; tile < tile_end; ++tile) {
    const int64_t t0 = tile * kActTile;
    const int64_t nt = ActTileTokens(out.n_tokens, t0);
    int8_t* qs = out.qs + t0 * cols;
    float* d = out.d + t0 * nb;
    int32_t* corr = out.corr + t0 * nb;
    for (int64_t tt = 0; tt < nt; ++tt) {
      QuantizeBlocksQ8(
          x + (t0 + tt) * cols, nb, [&](int64_t b) { return qs + (b * nt + tt) * kQBlock; },
          [&](int64_t b, uint16_t d16, int32_t sum, int32_t sum_lo) {
            const int64_t slot = b * nt + tt;
            d[slot] = F16ToF32(d16);
            corr[slot] = -bias * sum;
            out.sum[t0 * nb + slot] = sum;
            out.sum_lo[t0 * nb + slot] = sum_lo;
            out.fsum[t0 * nb + slot] = d[slot] * static_cast<float>(sum);
          });
    }
  }
}

void QuantizeRowQ8T(const float* src, int64_t n, BlockQ8_0* dst) {
  QuantizeBlocksQ8(
      src, n / kQBlock, [&](int64_t b) { return dst[b].qs; },
      [&](int64_t b, uint16_t d16, int32_t, int32_t) { dst[b].d = d16; });
}

// Hardware half-precision conversion (F16C on x86, NEON on Arm) is exact for every input; the
// emulation on older targets is not for inf/NaN, so those use the scalar conversion.
#undef KV_EXACT_F16_PROMOTE
#if (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2) || \
    (HWY_ARCH_ARM_A64 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR)
#define KV_EXACT_F16_PROMOTE 1
#else
#define KV_EXACT_F16_PROMOTE 0
#endif

// Rows may start at any byte (any row stride is allowed).
HWY_INLINE uint16_t LoadU16(const uint16_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

void DequantizeRowT(TensorType type, const void* src, int64_t n, float* dst) {
  const DF df;
  const DI di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  switch (type) {
    case TensorType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case TensorType::kF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      int64_t i = 0;
#if KV_EXACT_F16_PROMOTE
      const hn::Rebind<hwy::float16_t, DF> dh;
      for (; i + lanes <= n; i += lanes) {
        hn::StoreU(hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(h) + i)),
                   df, dst + i);
      }
#endif
      for (; i < n; ++i) dst[i] = F16ToF32(LoadU16(h + i));
      return;
    }
    case TensorType::kBF16: {
      const auto* h = static_cast<const uint16_t*>(src);
      const hn::Rebind<hwy::bfloat16_t, DF> dh;
      int64_t i = 0;
      for (; i + lanes <= n; i += lanes) {
        hn::StoreU(
            hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::bfloat16_t*>(h) + i)), df,
            dst + i);
      }
      for (; i < n; ++i) dst[i] = BF16ToF32(LoadU16(h + i));
      return;
    }
    case TensorType::kQ8_0: {
      KV_CHECK(n % kQBlock == 0, "q8_0 row of {} values", n);
      const hn::Rebind<int8_t, DI> d8;
      const auto* blk = static_cast<const BlockQ8_0*>(src);
      for (int64_t b = 0; b < n / kQBlock; ++b) {
        const auto scale = hn::Set(df, F16ToF32(blk[b].d));
        for (int64_t i = 0; i < kQBlock; i += lanes) {
          const auto q = hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, blk[b].qs + i)));
          hn::StoreU(hn::Mul(scale, q), df, dst + b * kQBlock + i);
        }
      }
      return;
    }
    case TensorType::kQ4_0: {
      KV_CHECK(n % kQBlock == 0, "q4_0 row of {} values", n);
      const hn::Rebind<uint8_t, DI> du8;
      const auto* blk = static_cast<const BlockQ4_0*>(src);
      const auto eight = hn::Set(di, 8);
      for (int64_t b = 0; b < n / kQBlock; ++b) {
        const auto scale = hn::Set(df, F16ToF32(blk[b].d));
        float* out = dst + b * kQBlock;
        for (int64_t i = 0; i < kQBlock / 2; i += lanes) {
          const auto q = hn::LoadU(du8, blk[b].qs + i);
          const auto lo = hn::Sub(hn::PromoteTo(di, hn::And(q, hn::Set(du8, 0x0F))), eight);
          const auto hi = hn::Sub(hn::PromoteTo(di, hn::ShiftRight<4>(q)), eight);
          hn::StoreU(hn::Mul(scale, hn::ConvertTo(df, lo)), df, out + i);
          hn::StoreU(hn::Mul(scale, hn::ConvertTo(df, hi)), df, out + 16 + i);
        }
      }
      return;
    }
    default:
      DequantizeIntForm(type, src, n, dst);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvasir::kernels_internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvasir {
namespace kernels_internal {

HWY_EXPORT(QuantizeActsT);
HWY_EXPORT(QuantizeRowQ8T);
HWY_EXPORT(DequantizeRowT);

void QuantizeActs(const float* x, int32_t bias, const QuantActs& out, int64_t tile_begin,
                  int64_t tile_end) {
  HWY_DYNAMIC_DISPATCH(QuantizeActsT)(x, bias, out, tile_begin, tile_end);
}

namespace {
void QuantizeRowQ8(const float* src, int64_t n, BlockQ8_0* dst) {
  HWY_DYNAMIC_DISPATCH(QuantizeRowQ8T)(src, n, dst);
}
void DequantizeRowSimd(TensorType type, const void* src, int64_t n, float* dst) {
  HWY_DYNAMIC_DISPATCH(DequantizeRowT)(type, src, n, dst);
}
}  // namespace

}  // namespace kernels_internal

void QuantizeRow(TensorType type, const float* src, int64_t n, void* dst) {
  if (type == TensorType::kQ8_0) {
    KV_CHECK(n % kernels_internal::kQBlock == 0, "q8_0 row of {} values", n);
    kernels_internal::QuantizeRowQ8(src, n, static_cast<BlockQ8_0*>(dst));
    return;
  }
  ref::QuantizeRow(type, src, n, dst);
}

void DequantizeRow(TensorType type, const void* src, int64_t n, float* dst) {
  kernels_internal::DequantizeRowSimd(type, src, n, dst);
}

void GetRow(const MatrixView& w, int64_t r, float* out) {
  KV_CHECK(r >= 0 && r < w.rows, "GetRow: row {} of {}", r, w.rows);
  DequantizeRow(w.type, static_cast<const uint8_t*>(w.data) + static_cast<size_t>(r) * w.row_bytes,
                w.cols, out);
}

}  // namespace kvasir
#endif  // HWY_ONCE
