// Element-wise and row operations of a transformer layer (Highway, dispatched at run time), and
// the name of the chosen SIMD target.
#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/kernels.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/vector_ops.cpp"
// Highway needs foreach_target.h, then highway.h, then its -inl.h headers.
// clang-format off
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
#include "hwy/contrib/math/math-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace kvasir::kernels_internal {
namespace HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;

int64_t TargetT() { return HWY_TARGET; }

float DotF32T(const float* a, const float* b, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto acc0 = hn::Zero(df);
  auto acc1 = hn::Zero(df);
  auto acc2 = hn::Zero(df);
  auto acc3 = hn::Zero(df);
  int64_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
    acc1 = hn::MulAdd(hn::LoadU(df, a + i + lanes), hn::LoadU(df, b + i + lanes), acc1);
    acc2 = hn::MulAdd(hn::LoadU(df, a + i + 2 * lanes), hn::LoadU(df, b + i + 2 * lanes), acc2);
    acc3 = hn::MulAdd(hn::LoadU(df, a + i + 3 * lanes), hn::LoadU(df, b + i + 3 * lanes), acc3);
  }
  for (; i + lanes <= n; i += lanes) {
    acc0 = hn::MulAdd(hn::LoadU(df, a + i), hn::LoadU(df, b + i), acc0);
  }
  const auto acc = hn::Add(hn::Add(acc0, acc1), hn::Add(acc2, acc3));
  float s = hn::GetLane(hn::SumOfLanes(df, acc));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// Sum of x[i]^2, accumulated in f64 where the target has it.
double SumSquares(const float* x, int64_t n) {
  int64_t i = 0;
  double s = 0.0;
#if HWY_HAVE_FLOAT64 && HWY_TARGET != HWY_SCALAR
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const hn::Repartition<double, DF> dd;
  const hn::Half<DF> dh;
  auto acc_lo = hn::Zero(dd);
  auto acc_hi = hn::Zero(dd);
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(df, x + i);
    const auto lo = hn::PromoteTo(dd, hn::LowerHalf(dh, v));
    const auto hi = hn::PromoteTo(dd, hn::UpperHalf(dh, v));
    acc_lo = hn::MulAdd(lo, lo, acc_lo);
    acc_hi = hn::MulAdd(hi, hi, acc_hi);
  }
  s = hn::GetLane(hn::SumOfLanes(dd, hn::Add(acc_lo, acc_hi)));
#endif
  for (; i < n; ++i) s += static_cast<double>(x[i]) * x[i];
  return s;
}

void RmsNormT(const float* x, const float* w, int64_t n, float eps, float* y) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const double ss = SumSquares(x, n);
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / static_cast<double>(n) + eps));
  const auto vscale = hn::Set(df, scale);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(df, x + i), vscale), hn::LoadU(df, w + i)), df, y + i);
  }
  for (; i < n; ++i) y[i] = x[i] * scale * w[i];
}

// exp(v) for v <= 0 (softmax) or any v (SiLU): Highway's Exp is valid on [-FLT_MAX, +88]; inputs
// are clamped into its range and results below the f32 range are flushed to zero.
HWY_INLINE hn::Vec<DF> SafeExp(DF df, hn::Vec<DF> v) {
  const auto lo = hn::Set(df, -87.0f);
  const auto e = hn::CallExp(df, hn::Min(hn::Max(v, lo), hn::Set(df, 88.0f)));
  return hn::IfThenZeroElse(hn::Lt(v, lo), e);
}

void SoftmaxT(float* x, int64_t n) {
  if (n <= 0) return;
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  float max = x[0];
  if (n >= lanes) {
    auto vmax = hn::LoadU(df, x);
    for (i = lanes; i + lanes <= n; i += lanes) vmax = hn::Max(vmax, hn::LoadU(df, x + i));
    max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  }
  for (; i < n; ++i) max = std::max(max, x[i]);
  const auto vmax = hn::Set(df, max);
  double sum = 0.0;
  i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto e = SafeExp(df, hn::Sub(hn::LoadU(df, x + i), vmax));
    hn::StoreU(e, df, x + i);
    sum += static_cast<double>(hn::GetLane(hn::SumOfLanes(df, e)));
  }
  for (; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  const auto vinv = hn::Set(df, inv);
  for (i = 0; i + lanes <= n; i += lanes)
    hn::StoreU(hn::Mul(hn::LoadU(df, x + i), vinv), df, x + i);
  for (; i < n; ++i) x[i] *= inv;
}

void SiluMulT(const float* gate, const float* up, int64_t n, float* out) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto one = hn::Set(df, 1.0f);
  auto step = [&](const float* g_in, const float* u_in, float* o) {
    const auto g = hn::LoadU(df, g_in);
    const auto silu = hn::Div(g, hn::Add(one, SafeExp(df, hn::Neg(g))));
    hn::StoreU(hn::Mul(silu, hn::LoadU(df, u_in)), df, o);
  };
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) step(gate + i, up + i, out + i);
  if (i < n) {
    // The tail takes the same vector path (through a padded copy): a value's result must not
    // depend on where it lies in the buffer, or rows batched differently would differ in bits.
    HWY_ALIGN float g[HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN float u[HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN float o[HWY_MAX_BYTES / sizeof(float)];
    const int64_t rest = n - i;
    std::copy_n(gate + i, rest, g);
    std::copy_n(up + i, rest, u);
    step(g, u, o);
    std::copy_n(o, rest, out + i);
  }
}

void AddInPlaceT(float* y, const float* x, int64_t n) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(df, y + i), hn::LoadU(df, x + i)), df, y + i);
  }
  for (; i < n; ++i) y[i] += x[i];
}

void AxpyT(float a, const float* x, int64_t n, float* y) {
  const DF df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  const auto va = hn::Set(df, a);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::MulAdd(va, hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, y + i);
  }
  for (; i < n; ++i) y[i] += a * x[i];
}

}  // namespace HWY_NAMESPACE
}  // namespace kvasir::kernels_internal
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvasir {
namespace kernels_internal {
namespace {

HWY_EXPORT(TargetT);
HWY_EXPORT(DotF32T);
HWY_EXPORT(RmsNormT);
HWY_EXPORT(SoftmaxT);
HWY_EXPORT(SiluMulT);
HWY_EXPORT(AddInPlaceT);
HWY_EXPORT(AxpyT);

}  // namespace

int64_t ChosenTarget() { return HWY_DYNAMIC_DISPATCH(TargetT)(); }
float DotF32(const float* a, const float* b, int64_t n) {
  return HWY_DYNAMIC_DISPATCH(DotF32T)(a, b, n);
}
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  HWY_DYNAMIC_DISPATCH(RmsNormT)(x, w, n, eps, y);
}
void Softmax(float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(SoftmaxT)(x, n); }
void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  HWY_DYNAMIC_DISPATCH(SiluMulT)(gate, up, n, out);
}
void AddInPlace(float* y, const float* x, int64_t n) { HWY_DYNAMIC_DISPATCH(AddInPlaceT)(y, x, n); }
void Axpy(float a, const float* x, int64_t n, float* y) { HWY_DYNAMIC_DISPATCH(AxpyT)(a, x, n, y); }

}  // namespace kernels_internal

float DotF32(const float* a, const float* b, int64_t n) {
  return kernels_internal::DotF32(a, b, n);
}
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* y) {
  kernels_internal::RmsNorm(x, w, n, eps, y);
}
void Softmax(float* x, int64_t n) { kernels_internal::Softmax(x, n); }
void SiluMul(const float* gate, const float* up, int64_t n, float* out) {
  kernels_internal::SiluMul(gate, up, n, out);
}
void AddInPlace(float* y, const float* x, int64_t n) { kernels_internal::AddInPlace(y, x, n); }
void Axpy(float a, const float* x, int64_t n, float* y) { kernels_internal::Axpy(a, x, n, y); }

std::string SimdTargetName() { return hwy::TargetName(kernels_internal::ChosenTarget()); }

}  // namespace kvasir
#endif  // HWY_ONCE
