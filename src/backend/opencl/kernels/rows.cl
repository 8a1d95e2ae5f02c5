// Row ops of a layer: RMS norm, RoPE, the q/gate split, and the element-wise ops. Each computes
// an element with the CPU backend's expression (exp aside, which OpenCL allows 3 ulp).

// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w; y may be x. One work-group per row; the
// local size is a power of two; red: [local size].
__kernel void rms_norm(__global const float* x, long x_off, __global const float* w, long w_off,
                       int width, float eps, __global float* y, long y_off,
                       __local float* red) {
  const size_t row = get_group_id(0);
  const int lid = get_local_id(0), step = get_local_size(0);
  __global const float* xr = x + x_off + row * width;
  float ss = 0.0f;
  for (int i = lid; i < width; i += step) ss += xr[i] * xr[i];
  ss = group_sum(ss, red);
  const float scale = 1.0f / sqrt(ss / (float)width + eps);
  __global float* yr = y + y_off + row * width;
  for (int i = lid; i < width; i += step) yr[i] = xr[i] * scale * w[w_off + i];
}

// Rotates pair i of head h of row r by that row's angles cs [n_rows, n_rot / 2, 2]: (2i, 2i+1),
// or (i, i + n_rot/2) with neox. Global: (n_rot / 2, n_heads, n_rows).
__kernel void rope(__global float* x, long x_off, int n_heads, int head_dim, int n_rot, int neox,
                   __global const float* cs, long cs_off) {
  const int i = get_global_id(0), h = get_global_id(1);
  const size_t r = get_global_id(2);
  const int half_rot = n_rot / 2;
  const float c = cs[cs_off + (r * half_rot + i) * 2], s = cs[cs_off + (r * half_rot + i) * 2 + 1];
  __global float* v = x + x_off + (r * n_heads + h) * head_dim;
  const int a = neox ? i : 2 * i, b = neox ? i + half_rot : 2 * i + 1;
  const float x0 = v[a], x1 = v[b];
  v[a] = x0 * c - x1 * s;
  v[b] = x0 * s + x1 * c;
}

// Per head [query | gate] into q and gate. Global: (head_dim, n_rows * n_head).
__kernel void split_q_gate(__global const float* src, long src_off, int head_dim,
                           __global float* q, long q_off, __global float* gate, long gate_off) {
  const int d = get_global_id(0);
  const size_t rh = get_global_id(1);
  q[q_off + rh * head_dim + d] = src[src_off + rh * 2 * head_dim + d];
  gate[gate_off + rh * head_dim + d] = src[src_off + rh * 2 * head_dim + head_dim + d];
}

// out = silu(gate) * up; out may be gate or up.
__kernel void silu_mul(__global const float* gate, long g_off, __global const float* up,
                       long u_off, __global float* out, long o_off) {
  const size_t i = get_global_id(0);
  const float g = gate[g_off + i];
  out[o_off + i] = g / (1.0f + exp(-g)) * up[u_off + i];
}

__kernel void add(__global float* y, long y_off, __global const float* x, long x_off) {
  const size_t i = get_global_id(0);
  y[y_off + i] += x[x_off + i];
}

// Global: (width, n_rows).
__kernel void add_bias(__global float* y, long y_off, __global const float* b, long b_off,
                       int width) {
  const int c = get_global_id(0);
  y[y_off + get_global_id(1) * width + c] += b[b_off + c];
}

__kernel void sigmoid_mul(__global float* y, long y_off, __global const float* g, long g_off) {
  const size_t i = get_global_id(0);
  y[y_off + i] *= 1.0f / (1.0f + exp(-g[g_off + i]));
}

__kernel void sigmoid(__global float* x, long x_off) {
  const size_t i = get_global_id(0);
  x[x_off + i] = 1.0f / (1.0f + exp(-x[x_off + i]));
}

// Global: (width, n_rows).
__kernel void scale_rows(__global float* y, long y_off, __global const float* s, long s_off,
                         int width) {
  const size_t r = get_global_id(1);
  y[y_off + r * width + get_global_id(0)] *= s[s_off + r];
}
