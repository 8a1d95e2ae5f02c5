// Portable kernel for the quantized types other than Q8_0/Q4_0 (Highway, dispatched at run time):
// rows in groups of one f32 lane each (up to 16). A group's blocks are first decoded into their
// integer form (quant_ints.h) in a thread-local panel, which every token then reuses; per block
// the integer sums are exact and the f32 steps are those of IntBlockStep, with the rows of the
// group side by side in the lanes.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/kernels.h"
#include "kernels/matmul_internal.h"
#include "kernels/quant_ints.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/matmul_int_form.cpp"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvasir::kernels_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Exact integer dot product of 16 int8 weights with 16 int8 activations.
HWY_INLINE int32_t Dot16(const int8_t* w, const int8_t* x) {
  const hn::CappedTag<int16_t, 16> d16;
  const hn::Rebind<int8_t, decltype(d16)> d8;
  const hn::RepartitionToWide<decltype(d16)> d32;
  auto acc0 = hn::Zero(d32);
  auto acc1 = hn::Zero(d32);
  for (size_t i = 0; i < 16; i += hn::Lanes(d16)) {
    const auto w16 = hn::PromoteTo(d16, hn::LoadU(d8, w + i));
    const auto x16 = hn::PromoteTo(d16, hn::LoadU(d8, x + i));
    acc0 = hn::ReorderWidenMulAccumulate(d32, w16, x16, acc0, acc1);
  }
  return hn::GetLane(hn::SumOfLanes(d32, hn::Add(acc0, acc1)));
}

// One group's decoded blocks: [nb, lanes] of each field.
struct IntPanel {
  std::vector<int8_t> q;   // [nb, lanes, 32]
  std::vector<int32_t> s;  // [nb, lanes, 2]
  std::vector<int32_t> m;  // [nb, lanes, 2]
  std::vector<float> dw;   // [nb, lanes]
  std::vector<float> dmin;
};

void MatMulIntFormRowsT(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                        int64_t row_end) {
  using DF = hn::CappedTag<float, 16>;
  const DF df;
  const hn::RebindToSigned<DF> di;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t nb = w.cols / kQBlock;
  const MinKind kind = MinKindOf(w.type);
  const auto* data = static_cast<const uint8_t*>(w.data);
  thread_local IntPanel panel;
  panel.q.resize(static_cast<size_t>(nb * lanes * kQBlock));
  panel.s.resize(static_cast<size_t>(nb * lanes * 2));
  panel.m.resize(static_cast<size_t>(nb * lanes * 2));
  panel.dw.resize(static_cast<size_t>(nb * lanes));
  panel.dmin.resize(static_cast<size_t>(nb * lanes));
  HWY_ALIGN int32_t isum[16];
  HWY_ALIGN int32_t imin[16];
  HWY_ALIGN float out[16];
  IntBlock blk;
  for (int64_t g0 = row_begin; g0 < row_end; g0 += lanes) {
    const int64_t nr = std::min(lanes, row_end - g0);
    for (int64_t i = 0; i < lanes; ++i) {
      // Lanes past the last row repeat it; their results are not stored.
      const uint8_t* row = data + static_cast<size_t>(g0 + std::min(i, nr - 1)) * w.row_bytes;
      for (int64_t b = 0; b < nb; ++b) {
        DecodeIntBlock(w.type, row, b, &blk);
        const int64_t slot = b * lanes + i;
        std::memcpy(&panel.q[static_cast<size_t>(slot * kQBlock)], blk.q, kQBlock);
        panel.s[2 * slot] = blk.s[0];
        panel.s[2 * slot + 1] = blk.s[1];
        panel.m[2 * slot] = blk.m[0];
        panel.m[2 * slot + 1] = blk.m[1];
        panel.dw[slot] = blk.dw;
        panel.dmin[slot] = blk.dmin;
      }
    }
    for (int64_t t0 = 0; t0 < acts.n_tokens; t0 += kActTile) {
      const int64_t nt = ActTileTokens(acts.n_tokens, t0);
      for (int64_t tt = 0; tt < nt; ++tt) {
        auto acc = hn::Zero(df);
        for (int64_t b = 0; b < nb; ++b) {
          const int64_t xslot = t0 * nb + b * nt + tt;
          const int8_t* xb = acts.qs + xslot * kQBlock;
          const int8_t* qb = panel.q.data() + b * lanes * kQBlock;
          const int32_t* sb = panel.s.data() + b * lanes * 2;
          for (int64_t i = 0; i < lanes; ++i) {
            isum[i] = sb[2 * i] * Dot16(qb + i * kQBlock, xb) +
                      sb[2 * i + 1] * Dot16(qb + i * kQBlock + 16, xb + 16);
          }
          const float dx = acts.d[xslot];
          const auto scale = hn::Mul(hn::LoadU(df, panel.dw.data() + b * lanes), hn::Set(df, dx));
          acc = hn::MulAdd(hn::ConvertTo(df, hn::Load(di, isum)), scale, acc);
          if (kind == MinKind::kFloat) {
            acc = hn::MulAdd(hn::LoadU(df, panel.dmin.data() + b * lanes),
                             hn::Set(df, acts.fsum[xslot]), acc);
          } else if (kind == MinKind::kInt16) {
            const int32_t lo = acts.sum_lo[xslot];
            const int32_t hi = acts.sum[xslot] - lo;
            const int32_t* mb = panel.m.data() + b * lanes * 2;
            for (int64_t i = 0; i < lanes; ++i) imin[i] = mb[2 * i] * lo + mb[2 * i + 1] * hi;
            const auto dm =
                hn::Mul(hn::LoadU(df, panel.dmin.data() + b * lanes), hn::Set(df, dx));
            acc = hn::MulAdd(hn::ConvertTo(df, hn::Load(di, imin)), dm, acc);
          }
        }
        hn::Store(acc, df, out);
        float* yt = y + (t0 + tt) * w.rows + g0;
        for (int64_t i = 0; i < nr; ++i) yt[i] = out[i];
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvasir::kernels_internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvasir::kernels_internal {

HWY_EXPORT(MatMulIntFormRowsT);

void MatMulIntFormRows(const MatrixView& w, const QuantActs& acts, float* y, int64_t row_begin,
                       int64_t row_end) {
  HWY_DYNAMIC_DISPATCH(MatMulIntFormRowsT)(w, acts, y, row_begin, row_end);
}

}  // namespace kvasir::kernels_internal
#endif  // HWY_ONCE
