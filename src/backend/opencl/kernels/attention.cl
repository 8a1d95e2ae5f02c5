// Causal attention of one sequence's chunk over its KV cache, with scale, soft-cap and sliding
// window. One work-group per (head, query row); keys go in tiles of ATT_TILE scores in local memory
// with a running max and sum (the softmax of the CPU backend, rescaled tile by tile), and each
// work-item accumulates the output dims d = lid, lid + L, ... (at most ATT_DIMS of them).
#define ATT_TILE 256
#define ATT_DIMS 8

// q, out: [n, n_head * head_dim]; caches [.., n_head_kv * head_dim]. Local: qs [head_dim], sc
// [ATT_TILE], red [local size, a power of two].
__kernel void attention(__global const float* q, long q_off, int pos0, __global const float* kc,
                        long k_off, __global const float* vc, long v_off, int n_head,
                        int n_head_kv, int head_dim, float scale, float softcap, int window,
                        __global float* out, long out_off, __local float* qs,
                        __local float* sc, __local float* red) {
  const int h = get_group_id(0), t = get_group_id(1);
  const int lid = get_local_id(0), step = get_local_size(0);
  const int pos = pos0 + t;
  const int j0 = window > 0 ? max(0, pos - window + 1) : 0;
  const int n_kv = pos + 1 - j0;
  const size_t q_stride = (size_t)n_head * head_dim, kv_stride = (size_t)n_head_kv * head_dim;
  const size_t kv_head = (size_t)(h / (n_head / n_head_kv)) * head_dim;
  __global const float* qh = q + q_off + t * q_stride + (size_t)h * head_dim;
  for (int d = lid; d < head_dim; d += step) qs[d] = qh[d];
  barrier(CLK_LOCAL_MEM_FENCE);

  float acc[ATT_DIMS];
  for (int m = 0; m < ATT_DIMS; ++m) acc[m] = 0.0f;
  float run_max = -INFINITY, run_sum = 0.0f;
  for (int tile = 0; tile < n_kv; tile += ATT_TILE) {
    const int tn = min(ATT_TILE, n_kv - tile);
    float local_max = -INFINITY;
    for (int jj = lid; jj < tn; jj += step) {
      __global const float* kj = kc + k_off + (size_t)(j0 + tile + jj) * kv_stride + kv_head;
      float s = 0.0f;
      for (int d = 0; d < head_dim; ++d) s = fma(qs[d], kj[d], s);
      s *= scale;
      if (softcap > 0.0f) s = softcap * tanh(s / softcap);
      sc[jj] = s;
      local_max = fmax(local_max, s);
    }
    const float new_max = fmax(run_max, group_max(local_max, red));
    const float carry = exp(run_max - new_max);  // 0 on the first tile
    float local_sum = 0.0f;
    for (int jj = lid; jj < tn; jj += step) {
      const float p = exp(sc[jj] - new_max);
      sc[jj] = p;
      local_sum += p;
    }
    run_sum = run_sum * carry + group_sum(local_sum, red);  // its barriers publish sc
    for (int m = 0; m < ATT_DIMS; ++m) {
      const int d = lid + m * step;
      if (d >= head_dim) break;
      __global const float* vd = vc + v_off + (size_t)(j0 + tile) * kv_stride + kv_head + d;
      float a = acc[m] * carry;
      for (int jj = 0; jj < tn; ++jj) a = fma(sc[jj], vd[(size_t)jj * kv_stride], a);
      acc[m] = a;
    }
    run_max = new_max;
    barrier(CLK_LOCAL_MEM_FENCE);  // sc is rewritten by the next tile
  }
  __global float* oh = out + out_off + t * q_stride + (size_t)h * head_dim;
  const float inv = 1.0f / run_sum;
  for (int m = 0; m < ATT_DIMS; ++m) {
    const int d = lid + m * step;
    if (d < head_dim) oh[d] = acc[m] * inv;
  }
}
