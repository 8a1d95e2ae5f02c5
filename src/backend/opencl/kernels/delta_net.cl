// The gated DeltaNet token mixer of one sequence (Backend::CausalConvSilu, GatedDeltaRule): rows
// strictly in order, each step the CPU backend's expression.

inline float silu(float x) { return x / (1.0f + exp(-x)); }
inline float softplus(float x) { return x > 20.0f ? x : log(1.0f + exp(x)); }

// Input row u (u >= 0: x; before it, the saved state) of channel c.
inline float input_at(__global const float* x, long x_off, __global const float* state, long s_off,
                      int u, int hist, int channels, int c) {
  return u >= 0 ? x[x_off + (size_t)u * channels + c]
                : state[s_off + (size_t)(hist + u) * channels + c];
}

// One work-item per channel, rows in order. x, out: [n, channels]; w: [channels, kernel]; state
// [kernel - 1, channels], the last inputs before x, oldest first, updated. Global: (channels).
__kernel void causal_conv_silu(__global const float* x, long x_off, int n, int channels,
                               int kernel_size, __global const float* w, long w_off,
                               __global float* state, long s_off, __global float* out,
                               long o_off) {
  const int c = get_global_id(0);
  const int hist = kernel_size - 1;
  __global const float* wc = w + w_off + (size_t)c * kernel_size;
  for (int t = 0; t < n; ++t) {
    float sum = 0.0f;
    for (int j = 0; j < kernel_size; ++j) {
      const int u = t - hist + j;  // input row; before 0, the saved state
      sum += input_at(x, x_off, state, s_off, u, hist, channels, c) * wc[j];
    }
    out[o_off + (size_t)t * channels + c] = silu(sum);
  }
  // The last `hist` inputs; slot j reads slot j + n (higher) before it is overwritten.
  for (int j = 0; j < hist; ++j) {
    const int u = n - hist + j;
    const float in = input_at(x, x_off, state, s_off, u, hist, channels, c);
    state[s_off + (size_t)j * channels + c] = in;
  }
}

// One work-group per value head h (key head h % n_k_heads); work-item lid owns the state rows
// j = lid, lid + L, ... (value j's weights over the key dims). Per row: q and k L2-normalised
// (q also by 1/sqrt(dim)), g = softplus(alpha + dt_bias) * a, b = sigmoid(beta), then
// S <- exp(g) S; d = b (v - S^T k); S <- S + k d^T; o = S^T q. Local: ql, kl [dim], red [L].
__kernel void gated_delta_rule(__global const float* qkv, long qkv_off, long row_stride,
                               __global const float* alpha, long al_off,
                               __global const float* beta, long be_off,
                               __global const float* dt_bias, long dt_off,
                               __global const float* a, long a_off, int n, int n_k_heads,
                               int n_v_heads, int dim, float eps, __global float* state,
                               long s_off, __global float* out, long o_off,
                               __local float* ql, __local float* kl, __local float* red) {
  const int h = get_group_id(0), kh = h % n_k_heads;
  const int lid = get_local_id(0), step = get_local_size(0);
  const float q_scale = 1.0f / sqrt((float)dim);
  const size_t k_off = (size_t)n_k_heads * dim, v_off = 2 * k_off;
  __global float* s = state + s_off + (size_t)h * dim * dim;
  for (int t = 0; t < n; ++t) {
    __global const float* row = qkv + qkv_off + (size_t)t * row_stride;
    float qq = 0.0f, kk = 0.0f;
    for (int i = lid; i < dim; i += step) {
      const float qv = row[(size_t)kh * dim + i], kv = row[k_off + (size_t)kh * dim + i];
      ql[i] = qv;
      kl[i] = kv;
      qq += qv * qv;
      kk += kv * kv;
    }
    qq = group_sum(qq, red);  // its barriers publish ql and kl
    kk = group_sum(kk, red);
    const float qs = 1.0f / fmax(sqrt(qq), eps) * q_scale;
    const float ks = 1.0f / fmax(sqrt(kk), eps);
    const size_t gi = (size_t)t * n_v_heads + h;
    const float decay = exp(softplus(alpha[al_off + gi] + dt_bias[dt_off + h]) * a[a_off + h]);
    const float b = 1.0f / (1.0f + exp(-beta[be_off + gi]));
    __global const float* v = row + v_off + (size_t)h * dim;
    __global float* o = out + o_off + (size_t)t * n_v_heads * dim + (size_t)h * dim;
    for (int j = lid; j < dim; j += step) {
      __global float* sj = s + (size_t)j * dim;
      float dot = 0.0f;
      for (int i = 0; i < dim; ++i) {
        const float sv = sj[i] * decay;
        sj[i] = sv;
        dot = fma(sv, kl[i] * ks, dot);
      }
      const float d = (v[j] - dot) * b;
      float oj = 0.0f;
      for (int i = 0; i < dim; ++i) {
        const float sv = fma(d, kl[i] * ks, sj[i]);
        sj[i] = sv;
        oj = fma(sv, ql[i] * qs, oj);
      }
      o[j] = oj;
    }
    barrier(CLK_LOCAL_MEM_FENCE);  // ql and kl are rewritten by the next row
  }
}
