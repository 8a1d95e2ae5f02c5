// Weight blocks in their integer form (kernels/quant_ints.h), per 32 values: signed integers q,
// integer scales s0 (values 0..15) and s1 (16..31), a float scale dw and, for Q4_K/Q5_K, a float
// offset dmin: value_i = dw * s * q_i (+ dmin). Weights stay in the file's block layout (ggml),
// rows `row_bytes` apart; blocks are read byte by byte, so no alignment is assumed.

typedef struct {
  int q[32];
  int s0, s1;
  float dw, dmin;
} IntBlock;

// Q8_0 (34 bytes per 32): f16 d, 32 int8.
inline void decode_q8_0(__global const uchar* row, int b, IntBlock* o) {
  __global const uchar* p = row + b * 34;
  o->dw = load_half(p);
  o->dmin = 0.0f;
  o->s0 = o->s1 = 1;
  for (int i = 0; i < 32; ++i) o->q[i] = (char)p[2 + i];
}

// Q4_0 (18 bytes per 32): f16 d, 16 bytes of nibbles; value = d * (q - 8).
inline void decode_q4_0(__global const uchar* row, int b, IntBlock* o) {
  __global const uchar* p = row + b * 18;
  o->dw = load_half(p);
  o->dmin = 0.0f;
  o->s0 = o->s1 = 1;
  for (int i = 0; i < 16; ++i) {
    const int v = p[2 + i];
    o->q[i] = (v & 15) - 8;
    o->q[i + 16] = (v >> 4) - 8;
  }
}

// Scale and min of sub-block j of a Q4_K/Q5_K block's 12 scale bytes (kernels/quant_blocks.h).
inline void q4k_scale_min(__global const uchar* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 63;
    *m = s[j + 4] & 63;
  } else {
    *sc = (s[j + 4] & 15) | (s[j - 4] >> 6) << 4;
    *m = (s[j + 4] >> 4) | (s[j] >> 6) << 4;
  }
}

// Q4_K (144 bytes per 256): f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles.
inline void decode_q4_k(__global const uchar* row, int b, IntBlock* o) {
  __global const uchar* p = row + (b / 8) * 144;
  const int j = b % 8;
  int sc, m;
  q4k_scale_min(p + 4, j, &sc, &m);
  o->dw = load_half(p) * (float)sc;
  o->dmin = -(load_half(p + 2) * (float)m);
  o->s0 = o->s1 = 1;
  __global const uchar* qs = p + 16 + 32 * (j / 2);
  const int shift = 4 * (j % 2);
  for (int l = 0; l < 32; ++l) o->q[l] = (qs[l] >> shift) & 15;
}

// Q5_K (176 bytes per 256): as Q4_K, with 32 bytes of fifth bits before the nibbles.
inline void decode_q5_k(__global const uchar* row, int b, IntBlock* o) {
  __global const uchar* p = row + (b / 8) * 176;
  const int j = b % 8;
  int sc, m;
  q4k_scale_min(p + 4, j, &sc, &m);
  o->dw = load_half(p) * (float)sc;
  o->dmin = -(load_half(p + 2) * (float)m);
  o->s0 = o->s1 = 1;
  __global const uchar* qh = p + 16;
  __global const uchar* qs = p + 48 + 32 * (j / 2);
  const int shift = 4 * (j % 2);
  for (int l = 0; l < 32; ++l) o->q[l] = ((qs[l] >> shift) & 15) | ((qh[l] >> j) & 1) << 4;
}

// Q6_K (210 bytes per 256): 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 sub-block
// scales, f16 d; value = d * scale * (q - 32).
inline void decode_q6_k(__global const uchar* row, int b, IntBlock* o) {
  __global const uchar* p = row + (b / 8) * 210;
  const int j = b % 8;
  const int n = j / 4, c = j % 4;
  __global const uchar* ql = p + 64 * n + 32 * (c % 2);
  __global const uchar* qh = p + 128 + 32 * n;
  const int shift = 4 * (c / 2);
  for (int l = 0; l < 32; ++l) {
    o->q[l] = (((ql[l] >> shift) & 15) | ((qh[l] >> (2 * c)) & 3) << 4) - 32;
  }
  o->s0 = (char)p[192 + 2 * j];
  o->s1 = (char)p[192 + 2 * j + 1];
  o->dw = load_half(p + 208);
  o->dmin = 0.0f;
}

// One block against one token's Q8_0 activation block (x: 32 int8, dx its f16-rounded scale, sums
// [sum, sum of the first 16]): the f32 steps of kernels/quant_ints.h, in the same order.
inline float block_step(const IntBlock* w, int has_min, __global const char* x, float dx,
                        __global const int* sums, float acc) {
  int dot0 = 0, dot1 = 0;
  for (int i = 0; i < 16; ++i) dot0 += w->q[i] * x[i];
  for (int i = 16; i < 32; ++i) dot1 += w->q[i] * x[i];
  const int isum = w->s0 * dot0 + w->s1 * dot1;
  acc = fma((float)isum, w->dw * dx, acc);
  if (has_min) acc = fma(w->dmin, dx * (float)sums[0], acc);
  return acc;
}
