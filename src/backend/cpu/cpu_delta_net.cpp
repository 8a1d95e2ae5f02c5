#include "backend/cpu/cpu_delta_net.h"

#include <cmath>
#include <vector>

#include "kernels/kernels.h"

namespace kvasir::cpu {
namespace {

float Silu(float x) { return x / (1.0f + std::exp(-x)); }

// As ggml: large inputs pass through, so exp cannot overflow.
float Softplus(float x) { return x > 20.0f ? x : std::log(1.0f + std::exp(x)); }

// out = x / max(|x|, eps) * extra_scale, the norm summed in double.
void L2Normalize(const float* x, int n, float eps, float extra_scale, float* out) {
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  const float scale = 1.0f / std::max(std::sqrt(static_cast<float>(sum)), eps) * extra_scale;
  for (int i = 0; i < n; ++i) out[i] = x[i] * scale;
}

}  // namespace

void CpuCausalConvSilu(const float* x, int n, int channels, int kernel, const float* w,
                       float* state, float* out, ThreadPool& pool) {
  const int hist = kernel - 1;
  pool.ParallelFor(channels, 32, [&](int64_t c0, int64_t c1) {
    thread_local std::vector<float> win;  // [kernel]: inputs t - kernel + 1 .. t of one channel
    win.resize(kernel);
    for (int64_t c = c0; c < c1; ++c) {
      const float* wc = w + c * kernel;
      for (int j = 0; j < hist; ++j) win[j] = state[static_cast<int64_t>(j) * channels + c];
      for (int t = 0; t < n; ++t) {
        win[hist] = x[static_cast<int64_t>(t) * channels + c];
        float sum = 0.0f;
        for (int j = 0; j < kernel; ++j) sum += win[j] * wc[j];
        out[static_cast<int64_t>(t) * channels + c] = Silu(sum);
        for (int j = 0; j < hist; ++j) win[j] = win[j + 1];
      }
      for (int j = 0; j < hist; ++j) state[static_cast<int64_t>(j) * channels + c] = win[j];
    }
  });
}

void CpuGatedDeltaRule(const float* qkv, int64_t row_stride, const float* alpha, const float* beta,
                       const float* dt_bias, const float* a, int n, int n_k_heads, int n_v_heads,
                       int dim, float eps, float* state, float* out, ThreadPool& pool) {
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(dim));
  const int64_t k_off = static_cast<int64_t>(n_k_heads) * dim;
  const int64_t v_off = 2 * k_off;
  const int64_t out_stride = static_cast<int64_t>(n_v_heads) * dim;
  pool.ParallelFor(n_v_heads, 1, [&](int64_t h0, int64_t h1) {
    thread_local std::vector<float> q, k;  // [dim] normalised query and key of one row
    q.resize(dim);
    k.resize(dim);
    for (int64_t h = h0; h < h1; ++h) {
      const int64_t kh = h % n_k_heads;
      float* s = state + h * dim * dim;  // row j: value j's weights over the key dims
      for (int t = 0; t < n; ++t) {
        const float* row = qkv + t * row_stride;
        L2Normalize(row + kh * dim, dim, eps, q_scale, q.data());
        L2Normalize(row + k_off + kh * dim, dim, eps, 1.0f, k.data());
        const float* v = row + v_off + h * dim;
        const int64_t gi = static_cast<int64_t>(t) * n_v_heads + h;
        const float decay = std::exp(Softplus(alpha[gi] + dt_bias[h]) * a[h]);
        const float b = 1.0f / (1.0f + std::exp(-beta[gi]));
        float* o = out + t * out_stride + h * dim;
        for (int j = 0; j < dim; ++j) {
          float* sj = s + static_cast<int64_t>(j) * dim;
          for (int i = 0; i < dim; ++i) sj[i] *= decay;
          const float d = (v[j] - DotF32(sj, k.data(), dim)) * b;
          Axpy(d, k.data(), dim, sj);
          o[j] = DotF32(sj, q.data(), dim);
        }
      }
    }
  });
}

}  // namespace kvasir::cpu
