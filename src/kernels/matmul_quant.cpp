// Quantized weights x Q8_0 activations (Highway, dispatched at run time). Types other than
// Q8_0/Q4_0 go to the kernels of matmul_int_form.cpp. The x86 targets hand the
// work to the intrinsics kernels of matmul_x86.h (AVX3_DL: VNNI; AVX3, AVX2: AVX2); the others run
// the portable kernel below. All perform, for every (row, token),
// acc = fma(float(isum_b), dw_b * dx_b, acc) over the blocks in order with exact integer isum_b, so
// they agree with ref::MatMul bit for bit wherever MulAdd is fused.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/matmul_internal.h"
#include "kernels/matmul_x86.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul_quant.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvasir::kernels_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Exact integer dot product of a Q8_0 block's values with 32 activation values.
HWY_INLINE int32_t BlockDotQ8(const int8_t* w, const int8_t* x) {
  const hn::CappedTag<int16_t, 16> d16;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const hn::RepartitionToWide<decltype(d16)> d32;
  auto acc0 = hn::Zero(d32);
  auto acc1 = hn::Zero(d32);
  for (size_t i = 0; i < kQBlock; i += hn::Lanes(d16)) {
    const auto w16 = hn::PromoteTo(d16, hn::LoadU(d8, w + i));
    const auto x16 = hn::PromoteTo(d16, hn::LoadU(d8, x + i));
    acc0 = hn::ReorderWidenMulAccumulate(d32, w16, x16, acc0, acc1);
  }
  return hn::GetLane(hn::SumOfLanes(d32, hn::Add(acc0, acc1)));
}

// Same for a Q4_0 block (16 bytes of nibbles, values q - 8).
HWY_INLINE int32_t BlockDotQ4(const uint8_t* qs, const int8_t* x) {
  const hn::CappedTag<int16_t, 16> d16;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const hn::Rebind<uint8_t, decltype(d16)> du8;
  const hn::RepartitionToWide<decltype(d16)> d32;
  const auto eight = hn::Set(d16, 8);
  auto acc0 = hn::Zero(d32);
  auto acc1 = hn::Zero(d32);
  for (size_t i = 0; i < kQBlock / 2; i += hn::Lanes(d16)) {
    const auto q = hn::LoadU(du8, qs + i);
    const auto lo = hn::Sub(hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<decltype(d16)>(),
                                                           hn::And(q, hn::Set(du8, 0x0F)))),
                            eight);
    const auto hi = hn::Sub(hn::BitCast(d16, hn::PromoteTo(hn::RebindToUnsigned<decltype(d16)>(),
                                                           hn::ShiftRight<4>(q))),
                            eight);
    acc0 = hn::ReorderWidenMulAccumulate(d32, lo, hn::PromoteTo(d16, hn::LoadU(d8, x + i)), acc0,
                                         acc1);
    acc0 = hn::ReorderWidenMulAccumulate(d32, hi, hn::PromoteTo(d16, hn::LoadU(d8, x + 16 + i)),
                                         acc0, acc1);
  }
  return hn::GetLane(hn::SumOfLanes(d32, hn::Add(acc0, acc1)));
}

// Portable kernel: one f32 lane per row, up to 16 rows at a time.
template <bool kQ4>
void GenericRows(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                 int64_t row_end) {
  using DF = hn::CappedTag<float, 16>;
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t nb = w.cols / kQBlock;
  const size_t block_bytes = kQ4 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0);
  const auto* data = static_cast<const uint8_t*>(w.data);
  thread_local std::vector<float> scales;  // [nb, lanes] weight scales of the current rows
  scales.resize(static_cast<size_t>(nb * lanes));
  HWY_ALIGN int32_t isum[16];
  HWY_ALIGN float out[16];
  const uint8_t* rows[16];
  for (int64_t g0 = row_begin; g0 < row_end; g0 += lanes) {
    const int64_t nr = std::min(lanes, row_end - g0);
    for (int64_t i = 0; i < lanes; ++i) {
      rows[i] = data + static_cast<size_t>(g0 + std::min(i, nr - 1)) * w.row_bytes;
    }
    for (int64_t b = 0; b < nb; ++b) {
      for (int64_t i = 0; i < lanes; ++i) {
        uint16_t d;
        std::memcpy(&d, rows[i] + b * block_bytes, sizeof(d));
        scales[b * lanes + i] = F16ToF32(d);
      }
    }
    for (int64_t t0 = 0; t0 < acts.n_tokens; t0 += kActTile) {
      const int64_t nt = ActTileTokens(acts.n_tokens, t0);
      for (int64_t tt = 0; tt < nt; ++tt) {
        auto acc = hn::Zero(df);
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t slot = t0 * nb + b * nt + tt;
          const int8_t* xb = acts.qs + slot * kQBlock;
          for (int64_t i = 0; i < lanes; ++i) {
            const uint8_t* blk = rows[i] + b * block_bytes + 2;
            isum[i] =
                kQ4 ? BlockDotQ4(blk, xb) : BlockDotQ8(reinterpret_cast<const int8_t*>(blk), xb);
          }
          const auto scale =
              hn::Mul(hn::LoadU(df, scales.data() + b * lanes), hn::Set(df, acts.d[slot]));
          acc = hn::MulAdd(hn::ConvertTo(df, hn::Load(di, isum)), scale, acc);
        }
        hn::Store(acc, df, out);
        float* yt = y + (t0 + tt) * w.rows + g0;
        for (int64_t i = 0; i < nr; ++i) yt[i] = out[i];
      }
    }
  }
}

void MatMulQuantRowsT(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                      int64_t row_end) {
  if (w.type != TensorType::kQ4_0 && w.type != TensorType::kQ8_0) {
#if HWY_TARGET == HWY_AVX3_DL
    if (HaveX86Kernels() && HaveKQuantKernels(w.type)) {
      MatMulKQuantRowsVnni(w, acts, y, row_begin, row_end);
      return;
    }
#elif HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2
    if (HaveX86Kernels() && HaveKQuantKernels(w.type)) {
      MatMulKQuantRowsAvx2(w, acts, y, row_begin, row_end);
      return;
    }
#endif
    MatMulIntFormRows(w, acts, y, row_begin, row_end);
    return;
  }
#if HWY_TARGET == HWY_AVX3_DL
  if (HaveX86Kernels()) {
    MatMulQuantRowsVnni(w, acts, y, row_begin, row_end);
    return;
  }
#elif HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2
  if (HaveX86Kernels()) {
    MatMulQuantRowsAvx2(w, acts, y, row_begin, row_end);
    return;
  }
#endif
  if (w.type == TensorType::kQ4_0) {
    GenericRows<true>(w, acts, y, row_begin, row_end);
  } else {
    GenericRows<false>(w, acts, y, row_begin, row_end);
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvasir::kernels_internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvasir::kernels_internal {

HWY_EXPORT(MatMulQuantRowsT);

void MatMulQuantRows(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                     int64_t row_end) {
  HWY_DYNAMIC_DISPATCH(MatMulQuantRowsT)(w, acts, y, row_begin, row_end);
}

}  // namespace kvasir::kernels_internal
#endif  // HWY_ONCE
