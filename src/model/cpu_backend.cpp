#include <cmath>
#include <vector>

#include "base/thread_pool.h"
#include "model/backend.h"
#include "model/cpu_delta_net.h"

namespace kvasir {
namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int n_threads) : pool_(n_threads) {}

  std::string name() const override { return "cpu"; }
  int n_threads() const override { return pool_.size(); }

  void MatMul(const MatrixView& w, const float* x, int n, float* y) override {
    kvasir::MatMul(w, x, n, y, pool_);
  }

  void GetRows(const MatrixView& w, const int32_t* ids, int n, float* out) override {
    for (int i = 0; i < n; ++i) GetRow(w, ids[i], out + static_cast<int64_t>(i) * w.cols);
  }

  void RmsNorm(const float* x, const float* w, int n_rows, int width, float eps,
               float* y) override {
    for (int r = 0; r < n_rows; ++r) {
      const int64_t off = static_cast<int64_t>(r) * width;
      kvasir::RmsNorm(x + off, w, width, eps, y + off);
    }
  }

  void Rope(float* x, int n_rows, int n_heads, int head_dim, int n_rot, RopeType type,
            const float* cos_sin) override {
    const int half = n_rot / 2;
    for (int r = 0; r < n_rows; ++r) {
      const float* cs = cos_sin + static_cast<int64_t>(r) * half * 2;
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + (static_cast<int64_t>(r) * n_heads + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const float c = cs[2 * i], s = cs[2 * i + 1];
          // kNormal rotates adjacent pairs; kNeox rotates element i with element i + n_rot/2.
          const int a = type == RopeType::kNormal ? 2 * i : i;
          const int b = type == RopeType::kNormal ? 2 * i + 1 : i + half;
          const float x0 = v[a], x1 = v[b];
          v[a] = x0 * c - x1 * s;
          v[b] = x0 * s + x1 * c;
        }
      }
    }
  }

  void Attention(const float* q, int n, int pos0, const float* k, const float* v, int n_head,
                 int n_head_kv, int head_dim, float* out) override {
    const int group = n_head / n_head_kv;
    const int64_t q_stride = static_cast<int64_t>(n_head) * head_dim;
    const int64_t kv_stride = static_cast<int64_t>(n_head_kv) * head_dim;
    const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
    const int64_t n_items = static_cast<int64_t>(n) * n_head;
    // Each (query row, head) pair is independent; scores live in a per-thread buffer.
    pool_.ParallelFor(n_items, 1, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> scores;
      for (int64_t item = begin; item < end; ++item) {
        const int t = static_cast<int>(item / n_head);
        const int h = static_cast<int>(item % n_head);
        const int n_kv = pos0 + t + 1;  // causal: positions 0 .. pos0 + t
        const float* qh = q + t * q_stride + static_cast<int64_t>(h) * head_dim;
        const int64_t kv_off = static_cast<int64_t>(h / group) * head_dim;
        scores.resize(n_kv);
        for (int j = 0; j < n_kv; ++j) {
          scores[j] = DotF32(qh, k + j * kv_stride + kv_off, head_dim) * scale;
        }
        Softmax(scores.data(), n_kv);
        float* oh = out + t * q_stride + static_cast<int64_t>(h) * head_dim;
        for (int d = 0; d < head_dim; ++d) oh[d] = 0.0f;
        for (int j = 0; j < n_kv; ++j) Axpy(scores[j], v + j * kv_stride + kv_off, head_dim, oh);
      }
    });
  }

  void SiluMul(const float* gate, const float* up, int64_t n, float* out) override {
    kvasir::SiluMul(gate, up, n, out);
  }

  void Add(float* y, const float* x, int64_t n) override { AddInPlace(y, x, n); }

  void AddBias(float* y, const float* b, int n_rows, int width) override {
    for (int r = 0; r < n_rows; ++r) AddInPlace(y + static_cast<int64_t>(r) * width, b, width);
  }

  void SigmoidMul(float* y, const float* gate, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) y[i] *= 1.0f / (1.0f + std::exp(-gate[i]));
  }

  void ScaleRows(float* y, const float* s, int n_rows, int width) override {
    for (int r = 0; r < n_rows; ++r) {
      float* row = y + static_cast<int64_t>(r) * width;
      for (int i = 0; i < width; ++i) row[i] *= s[r];
    }
  }

  void CausalConvSilu(const float* x, int n, int channels, int kernel, const float* w,
                      float* state, float* out) override {
    CpuCausalConvSilu(x, n, channels, kernel, w, state, out, pool_);
  }

  void GatedDeltaRule(const float* qkv, int64_t row_stride, const float* alpha, const float* beta,
                      const float* dt_bias, const float* a, int n, int n_k_heads, int n_v_heads,
                      int dim, float eps, float* state, float* out) override {
    CpuGatedDeltaRule(qkv, row_stride, alpha, beta, dt_bias, a, n, n_k_heads, n_v_heads, dim, eps,
                      state, out, pool_);
  }

 private:
  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int n_threads) {
  return std::make_unique<CpuBackend>(n_threads);
}

}  // namespace kvasir
