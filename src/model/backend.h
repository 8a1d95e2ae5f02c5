// The compute backend of a stage: the narrow set of operations a transformer layer needs, on
// activations in host memory. The CPU backend implements them with src/kernels on a thread pool; a
// GPU backend implements the same calls without any change to model code.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kernels/kernels.h"
#include "model/model_config.h"

namespace kvasir {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  virtual int n_threads() const = 0;

  // y[n, w.rows] = x[n, w.cols] · Wᵀ. Row results do not depend on n (batching is exact).
  virtual void MatMul(const MatrixView& w, const float* x, int n, float* y) = 0;
  // out[i, :] = row ids[i] of w, dequantized: out is [n, w.cols]. Ids are already validated.
  virtual void GetRows(const MatrixView& w, const int32_t* ids, int n, float* out) = 0;
  // y[r, :] = x[r, :] / rms(x[r, :]) * w for n_rows rows of `width`; y may alias x.
  virtual void RmsNorm(const float* x, const float* w, int n_rows, int width, float eps,
                       float* y) = 0;
  // Rotates the first n_rot dims of each head of x [n_rows, n_heads * head_dim] in place.
  // cos_sin: [n_rows, n_rot / 2, 2] (cos, sin) for each row's position.
  virtual void Rope(float* x, int n_rows, int n_heads, int head_dim, int n_rot, RopeType type,
                    const float* cos_sin) = 0;
  // Causal attention of n query rows at positions pos0 .. pos0+n-1 over one sequence's cache.
  // q: [n, n_head * head_dim]; k, v: [n_kv >= pos0 + n, n_head_kv * head_dim]; out like q.
  // Query head h reads KV head h / (n_head / n_head_kv). Scale 1/sqrt(head_dim).
  virtual void Attention(const float* q, int n, int pos0, const float* k, const float* v,
                         int n_head, int n_head_kv, int head_dim, float* out) = 0;
  // out[i] = silu(gate[i]) * up[i] over n values.
  virtual void SiluMul(const float* gate, const float* up, int64_t n, float* out) = 0;
  // y[i] += x[i] over n values.
  virtual void Add(float* y, const float* x, int64_t n) = 0;
  // y[r, :] += b for n_rows rows of `width`.
  virtual void AddBias(float* y, const float* b, int n_rows, int width) = 0;
  // y[i] *= sigmoid(gate[i]) over n values.
  virtual void SigmoidMul(float* y, const float* gate, int64_t n) = 0;
  // y[r, :] *= s[r] for n_rows rows of `width`.
  virtual void ScaleRows(float* y, const float* s, int n_rows, int width) = 0;

  // Gated DeltaNet, one sequence. Short convolution over n rows of `channels`:
  //   out[t, c] = silu(sum_j w[c, j] * in(t - kernel + 1 + j, c))
  // where in(t) is x[t] for t >= 0 and the saved inputs before it. w: [channels, kernel] (last tap
  // is the current row). state: [kernel - 1, channels], the sequence's last inputs, oldest first;
  // updated to the last kernel - 1 inputs. x, out: [n, channels]; out may not alias x.
  virtual void CausalConvSilu(const float* x, int n, int channels, int kernel, const float* w,
                              float* state, float* out) = 0;
  // Gated delta rule, one sequence of n rows. qkv: [n, row_stride], each row [q | k | v] with q and
  // k of n_k_heads * dim and v of n_v_heads * dim; alpha, beta: [n, n_v_heads] raw projections;
  // dt_bias, a: [n_v_heads] (a = -exp(A_log)). Per row and value head h (key head h % n_k_heads):
  //   q, k L2-normalised (x / max(|x|, eps)), q scaled by 1/sqrt(dim),
  //   g = softplus(alpha + dt_bias) * a, b = sigmoid(beta),
  //   S <- exp(g) S;  d = b (v - S^T k);  S <- S + k d^T;  o = S^T q.
  // state: [n_v_heads, dim (value j), dim (key i)], updated. out: [n, n_v_heads * dim].
  virtual void GatedDeltaRule(const float* qkv, int64_t row_stride, const float* alpha,
                              const float* beta, const float* dt_bias, const float* a, int n,
                              int n_k_heads, int n_v_heads, int dim, float eps, float* state,
                              float* out) = 0;
};

// The CPU backend with `n_threads` threads (the caller's thread included).
std::unique_ptr<Backend> MakeCpuBackend(int n_threads);

}  // namespace kvasir
