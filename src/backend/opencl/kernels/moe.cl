// Mixture-of-experts routing and the bookkeeping around the experts' products (mat_mul_id_* in
// mat_mul.cl): row-slots grouped by expert, and the weighted sum back into rows.

// The smallest normal f16, as llama.cpp clamps the sum of the chosen weights.
#define MIN_WEIGHT_SUM 6.103515625e-5f

// Per row: softmax over n_expert (written back into logits), the k largest (lower id first on
// ties), their weights renormalised. Global: (n).
__kernel void moe_route(__global float* logits, long l_off, int n_expert, int k,
                        __global int* ids, long ids_off, __global float* weights, long w_off) {
  const size_t r = get_global_id(0);
  __global float* p = logits + l_off + r * n_expert;
  float mx = p[0];
  for (int i = 1; i < n_expert; ++i) mx = fmax(mx, p[i]);
  float sum = 0.0f;
  for (int i = 0; i < n_expert; ++i) {
    const float e = exp(p[i] - mx);
    p[i] = e;
    sum += e;
  }
  const float inv = 1.0f / sum;
  for (int i = 0; i < n_expert; ++i) p[i] *= inv;
  // Selection in the order (p descending, id ascending): each pick is the best after the last.
  int last = -1;
  float total = 0.0f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int i = 0; i < n_expert; ++i) {
      const bool after = last < 0 || p[i] < p[last] || (p[i] == p[last] && i > last);
      if (after && (best < 0 || p[i] > p[best])) best = i;
    }
    ids[ids_off + r * k + j] = best;
    total += p[best];
    last = best;
  }
  total = fmax(total, MIN_WEIGHT_SUM);
  for (int j = 0; j < k; ++j) weights[w_off + r * k + j] = p[ids[ids_off + r * k + j]] / total;
}

// Groups the n * k row-slots by expert, stably (a counting sort, one work-item: the slots are
// few). order [picks]: slots by expert; pos [picks]: each slot's place in order; start
// [n_expert + 1].
__kernel void moe_group(__global const int* ids, long ids_off, int picks, int n_expert,
                        __global int* order, __global int* pos, __global int* start) {
  for (int e = 0; e <= n_expert; ++e) start[e] = 0;
  for (int i = 0; i < picks; ++i) ++start[ids[ids_off + i] + 1];
  for (int e = 0; e < n_expert; ++e) start[e + 1] += start[e];
  for (int i = 0; i < picks; ++i) {
    const int e = ids[ids_off + i];
    const int at = start[e]++;
    order[at] = i;
    pos[i] = at;
  }
}

// out[r, c] = sum over j in top-k order of weights[r, j] * y[pos[r * k + j], c]; y: [picks,
// n_embd] in grouped order. Global: (n_embd, n).
__kernel void moe_combine(__global const float* y, __global const int* pos,
                          __global const float* weights, long w_off, int k, int n_embd,
                          __global float* out, long o_off) {
  const int c = get_global_id(0);
  const size_t r = get_global_id(1);
  float o = 0.0f;
  for (int j = 0; j < k; ++j) {
    const float v = weights[w_off + r * k + j] * y[(size_t)pos[r * k + j] * n_embd + c];
    o = j == 0 ? v : o + v;
  }
  out[o_off + r * n_embd + c] = o;
}
