// Matrix products and row lookups of every weight type the backend runs. Quantized weights meet
// activations quantized to Q8_0 on the device (quantize_q8, as the CPU does), then the integer
// form of blocks.cl, blocks in row order, so every (row, token) gets the CPU's exact f32 steps.
// Float weights (F32, F16 widened exactly) accumulate with fma in column order.
//
// Per type, two families of products, chosen per device (DecodePath in cl_device.h), each giving
// a (row, token) the same bits whatever the batch: mat_mul_<type>_x1 and _x8, one work-item per
// output row for one token (decode) or 8 (prefill: each weight block decoded once for them), in
// the CPU's sum order; mat_mul_<type>_s1 and _s8, a work-group per output row whose items take
// every L-th block, then a reduction (GPUs: adjacent items read adjacent blocks). And mat_mul_id_
// <type> (experts: 8 grouped row-slots per work-item, a weight block decoded once per run of slots
// that share an expert) and get_rows_<type>. The tile size changes only which work-item computes
// a (row, token), never its arithmetic, so a row's result does not depend on the batch.

// x [n, cols] f32 into Q8_0 blocks: xq [n, cols] int8, xd [n, nb] the f16-rounded scales, xs
// [n, nb, 2] the sums of each block's values and of its first 16. Global: (nb, n).
__kernel void quantize_q8(__global const float* x, long x_off, int cols, __global char* xq,
                          __global float* xd, __global int* xs) {
  const int b = get_global_id(0), t = get_global_id(1);
  const int nb = cols / 32;
  if (b >= nb) return;
  __global const float* xb = x + x_off + (size_t)t * cols + b * 32;
  float amax = 0.0f;
  for (int j = 0; j < 32; ++j) amax = fmax(amax, fabs(xb[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  __global char* q = xq + (size_t)t * cols + b * 32;
  int sum = 0, sum_lo = 0;
  for (int j = 0; j < 32; ++j) {
    const int v = (int)round(xb[j] * id);  // half away from zero, as the CPU
    q[j] = (char)v;
    sum += v;
    if (j < 16) sum_lo += v;
  }
  const size_t slot = (size_t)t * nb + b;
  xd[slot] = round_to_half(d);
  xs[2 * slot] = sum;
  xs[2 * slot + 1] = sum_lo;
}

#define MM_QUANT(TYPE, DECODE, HAS_MIN, T)                                                        \
  __kernel void mat_mul_##TYPE##_x##T(__global const uchar* w, int rows, int nb, int row_bytes,   \
                                      int n, __global const char* xq, __global const float* xd,   \
                                      __global const int* xs, __global float* y, long y_off) {    \
    const int r = get_global_id(0), t0 = get_global_id(1) * T;                                    \
    if (r >= rows || t0 >= n) return;                                                             \
    const int nt = min(T, n - t0);                                                                \
    __global const uchar* row = w + (size_t)r * row_bytes;                                        \
    float acc[T];                                                                                 \
    for (int i = 0; i < T; ++i) acc[i] = 0.0f;                                                    \
    for (int b = 0; b < nb; ++b) {                                                                \
      IntBlock blk;                                                                               \
      DECODE(row, b, &blk);                                                                       \
      for (int i = 0; i < nt; ++i) {                                                              \
        const size_t xb = (size_t)(t0 + i) * nb + b;                                              \
        acc[i] = block_step(&blk, HAS_MIN, xq + xb * 32, xd[xb], xs + 2 * xb, acc[i]);            \
      }                                                                                           \
    }                                                                                             \
    for (int i = 0; i < nt; ++i) y[y_off + (size_t)(t0 + i) * rows + r] = acc[i];                 \
  }

// The split products' reduction across a work-group: through subgroups where the device has them
// (KVASIR_SUBGROUPS), else local memory. red: [local size, a power of two]. Uniform: every item
// calls it.
#ifdef KVASIR_SUBGROUPS
#pragma OPENCL EXTENSION cl_khr_subgroups : enable
inline float row_sum(float v, __local float* red) {
  v = sub_group_reduce_add(v);
  if (get_sub_group_local_id() == 0) red[get_sub_group_id()] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  float s = 0.0f;
  for (uint i = 0; i < get_num_sub_groups(); ++i) s += red[i];
  barrier(CLK_LOCAL_MEM_FENCE);  // red is written again by the next call
  return s;
}
#else
inline float row_sum(float v, __local float* red) { return group_sum(v, red); }
#endif

#define MM_QUANT_SPLIT(TYPE, DECODE, HAS_MIN, T)                                                  \
  __kernel void mat_mul_##TYPE##_s##T(__global const uchar* w, int nb, int row_bytes, int n,      \
                                      __global const char* xq, __global const float* xd,          \
                                      __global const int* xs, __global float* y, long y_off,      \
                                      int rows, __local float* red) {                             \
    const size_t r = get_group_id(0);                                                             \
    const int t0 = get_group_id(1) * T, nt = min(T, n - t0);                                      \
    const int lid = get_local_id(0), step = get_local_size(0);                                    \
    __global const uchar* row = w + r * row_bytes;                                                \
    float acc[T];                                                                                 \
    for (int i = 0; i < T; ++i) acc[i] = 0.0f;                                                    \
    for (int b = lid; b < nb; b += step) {                                                        \
      IntBlock blk;                                                                               \
      DECODE(row, b, &blk);                                                                       \
      for (int i = 0; i < nt; ++i) {                                                              \
        const size_t xb = (size_t)(t0 + i) * nb + b;                                              \
        acc[i] = block_step(&blk, HAS_MIN, xq + xb * 32, xd[xb], xs + 2 * xb, acc[i]);            \
      }                                                                                           \
    }                                                                                             \
    for (int i = 0; i < nt; ++i) {                                                                \
      const float sum = row_sum(acc[i], red);                                                     \
      if (lid == 0) y[y_off + (size_t)(t0 + i) * rows + r] = sum;                                 \
    }                                                                                             \
  }

// Row-slots j0 .. j0+7 of the grouped order: slot order[j] uses expert ids[order[j]] and reads
// activation row order[j] / k (gather, the experts' input) or j (their own hidden rows).
#define MM_QUANT_ID(TYPE, DECODE, HAS_MIN)                                                        \
  __kernel void mat_mul_id_##TYPE(                                                                \
      __global const uchar* w, ulong expert_bytes, int rows, int nb, int row_bytes, int picks,    \
      __global const int* order, __global const int* ids, long ids_off, int k, int gather,        \
      __global const char* xq, __global const float* xd, __global const int* xs,                  \
      __global float* y) {                                                                        \
    const int r = get_global_id(0), j0 = get_global_id(1) * 8;                                    \
    if (r >= rows || j0 >= picks) return;                                                         \
    const int cnt = min(8, picks - j0);                                                           \
    float acc[8];                                                                                 \
    for (int i = 0; i < 8; ++i) acc[i] = 0.0f;                                                    \
    for (int p = 0; p < cnt;) {                                                                   \
      const int e = ids[ids_off + order[j0 + p]];                                                 \
      int q = p + 1;                                                                              \
      while (q < cnt && ids[ids_off + order[j0 + q]] == e) ++q;                                   \
      __global const uchar* row = w + (size_t)e * expert_bytes + (size_t)r * row_bytes;           \
      for (int b = 0; b < nb; ++b) {                                                              \
        IntBlock blk;                                                                             \
        DECODE(row, b, &blk);                                                                     \
        for (int i = p; i < q; ++i) {                                                             \
          const int a = gather ? order[j0 + i] / k : j0 + i;                                      \
          const size_t xb = (size_t)a * nb + b;                                                   \
          acc[i] = block_step(&blk, HAS_MIN, xq + xb * 32, xd[xb], xs + 2 * xb, acc[i]);          \
        }                                                                                         \
      }                                                                                           \
      p = q;                                                                                      \
    }                                                                                             \
    for (int i = 0; i < cnt; ++i) y[(size_t)(j0 + i) * rows + r] = acc[i];                        \
  }

// out[i, :] = row ids[i] dequantized: value = (dw * s) * q (+ dmin), the CPU's bits. Global:
// (cols / 32, n).
#define GET_ROWS_QUANT(TYPE, DECODE, HAS_MIN)                                                     \
  __kernel void get_rows_##TYPE(__global const uchar* w, int row_bytes, int cols,                 \
                                __global const int* ids, long ids_off, __global float* out,       \
                                long out_off) {                                                   \
    const int b = get_global_id(0), i = get_global_id(1);                                         \
    if (b >= cols / 32) return;                                                                   \
    IntBlock blk;                                                                                 \
    DECODE(w + (size_t)ids[ids_off + i] * row_bytes, b, &blk);                                    \
    __global float* o = out + out_off + (size_t)i * cols + b * 32;                                \
    float16 v0 = (blk.dw * (float)blk.s0) * convert_float16(blk.q0);                              \
    float16 v1 = (blk.dw * (float)blk.s1) * convert_float16(blk.q1);                              \
    if (HAS_MIN) {                                                                                \
      v0 = v0 + blk.dmin;                                                                         \
      v1 = v1 + blk.dmin;                                                                         \
    }                                                                                             \
    vstore16(v0, 0, o);                                                                           \
    vstore16(v1, 1, o);                                                                           \
  }

#define QUANT_TYPE(TYPE, HAS_MIN)                 \
  MM_QUANT(TYPE, decode_##TYPE, HAS_MIN, 1)       \
  MM_QUANT(TYPE, decode_##TYPE, HAS_MIN, 8)       \
  MM_QUANT_SPLIT(TYPE, decode_##TYPE, HAS_MIN, 1) \
  MM_QUANT_SPLIT(TYPE, decode_##TYPE, HAS_MIN, 8) \
  MM_QUANT_ID(TYPE, decode_##TYPE, HAS_MIN)       \
  GET_ROWS_QUANT(TYPE, decode_##TYPE, HAS_MIN)

QUANT_TYPE(q8_0, 0)
QUANT_TYPE(q4_0, 0)
QUANT_TYPE(q4_k, 1)
QUANT_TYPE(q5_k, 1)
QUANT_TYPE(q6_k, 0)

// Float weights: f32, or f16 widened exactly.
#define LOAD_f32(row, c) (((__global const float*)(row))[c])
#define LOAD_f16(row, c) half_to_float(((__global const ushort*)(row))[c])

#define MM_FLOAT(TYPE, T)                                                                         \
  __kernel void mat_mul_##TYPE##_x##T(__global const uchar* w, int rows, int cols, int row_bytes, \
                                      int n, __global const float* x, long x_off,                 \
                                      __global float* y, long y_off) {                            \
    const int r = get_global_id(0), t0 = get_global_id(1) * T;                                    \
    if (r >= rows || t0 >= n) return;                                                             \
    const int nt = min(T, n - t0);                                                                \
    __global const uchar* row = w + (size_t)r * row_bytes;                                        \
    __global const float* xt = x + x_off + (size_t)t0 * cols;                                     \
    float acc[T];                                                                                 \
    for (int i = 0; i < T; ++i) acc[i] = 0.0f;                                                    \
    for (int c = 0; c < cols; ++c) {                                                              \
      const float wv = LOAD_##TYPE(row, c);                                                       \
      for (int i = 0; i < nt; ++i) acc[i] = fma(wv, xt[(size_t)i * cols + c], acc[i]);            \
    }                                                                                             \
    for (int i = 0; i < nt; ++i) y[y_off + (size_t)(t0 + i) * rows + r] = acc[i];                 \
  }

#define MM_FLOAT_SPLIT(TYPE, T)                                                                   \
  __kernel void mat_mul_##TYPE##_s##T(__global const uchar* w, int cols, int row_bytes, int n,   \
                                      __global const float* x, long x_off, __global float* y,    \
                                      long y_off, int rows, __local float* red) {                \
    const size_t r = get_group_id(0);                                                            \
    const int t0 = get_group_id(1) * T, nt = min(T, n - t0);                                     \
    const int lid = get_local_id(0), step = get_local_size(0);                                   \
    __global const uchar* row = w + r * row_bytes;                                               \
    __global const float* xt = x + x_off + (size_t)t0 * cols;                                    \
    float acc[T];                                                                                \
    for (int i = 0; i < T; ++i) acc[i] = 0.0f;                                                   \
    for (int c = lid; c < cols; c += step) {                                                     \
      const float wv = LOAD_##TYPE(row, c);                                                      \
      for (int i = 0; i < nt; ++i) acc[i] = fma(wv, xt[(size_t)i * cols + c], acc[i]);           \
    }                                                                                            \
    for (int i = 0; i < nt; ++i) {                                                               \
      const float sum = row_sum(acc[i], red);                                                    \
      if (lid == 0) y[y_off + (size_t)(t0 + i) * rows + r] = sum;                                \
    }                                                                                            \
  }

#define MM_FLOAT_ID(TYPE)                                                                         \
  __kernel void mat_mul_id_##TYPE(                                                                \
      __global const uchar* w, ulong expert_bytes, int rows, int cols, int row_bytes, int picks,  \
      __global const int* order, __global const int* ids, long ids_off, int k, int gather,        \
      __global const float* x, long x_off, __global float* y) {                                   \
    const int r = get_global_id(0), j0 = get_global_id(1) * 8;                                    \
    if (r >= rows || j0 >= picks) return;                                                         \
    const int cnt = min(8, picks - j0);                                                           \
    float acc[8];                                                                                 \
    for (int i = 0; i < 8; ++i) acc[i] = 0.0f;                                                    \
    for (int p = 0; p < cnt;) {                                                                   \
      const int e = ids[ids_off + order[j0 + p]];                                                 \
      int q = p + 1;                                                                              \
      while (q < cnt && ids[ids_off + order[j0 + q]] == e) ++q;                                   \
      __global const uchar* row = w + (size_t)e * expert_bytes + (size_t)r * row_bytes;           \
      for (int c = 0; c < cols; ++c) {                                                            \
        const float wv = LOAD_##TYPE(row, c);                                                     \
        for (int i = p; i < q; ++i) {                                                             \
          const int a = gather ? order[j0 + i] / k : j0 + i;                                      \
          acc[i] = fma(wv, x[x_off + (size_t)a * cols + c], acc[i]);                              \
        }                                                                                         \
      }                                                                                           \
      p = q;                                                                                      \
    }                                                                                             \
    for (int i = 0; i < cnt; ++i) y[(size_t)(j0 + i) * rows + r] = acc[i];                        \
  }

// Global: (cols, n).
#define GET_ROWS_FLOAT(TYPE)                                                                      \
  __kernel void get_rows_##TYPE(__global const uchar* w, int row_bytes, int cols,                 \
                                __global const int* ids, long ids_off, __global float* out,       \
                                long out_off) {                                                   \
    const int c = get_global_id(0), i = get_global_id(1);                                         \
    if (c >= cols) return;                                                                        \
    __global const uchar* row = w + (size_t)ids[ids_off + i] * row_bytes;                         \
    out[out_off + (size_t)i * cols + c] = LOAD_##TYPE(row, c);                                    \
  }

#define FLOAT_TYPE(TYPE) \
  MM_FLOAT(TYPE, 1)      \
  MM_FLOAT(TYPE, 8)      \
  MM_FLOAT_SPLIT(TYPE, 1) \
  MM_FLOAT_SPLIT(TYPE, 8) \
  MM_FLOAT_ID(TYPE)      \
  GET_ROWS_FLOAT(TYPE)

FLOAT_TYPE(f32)
FLOAT_TYPE(f16)
