// Weight blocks in their integer form (kernels/quant_ints.h), per 32 values: signed integers q
// (q0: values 0..15, q1: 16..31), integer scales s0 (for q0) and s1 (for q1), a float scale dw
// and, for Q4_K/Q5_K, a float offset dmin: value_i = dw * s * q_i (+ dmin). Weights stay in the
// file's block layout (ggml), rows `row_bytes` apart; bytes are read with vload16, which needs no
// alignment beyond a byte.

typedef struct {
  char16 q0, q1;
  int s0, s1;
  float dw, dmin;
} IntBlock;

// Q8_0 (34 bytes per 32): f16 d, 32 int8.
inline void decode_q8_0(__global const uchar* row, int b, IntBlock* o) {
  __global const uchar* p = row + b * 34;
  o->dw = load_half(p);
  o->dmin = 0.0f;
  o->s0 = o->s1 = 1;
  o->q0 = as_char16(vload16(0, p + 2));
  o->q1 = as_char16(vload16(0, p + 18));
}

// Q4_0 (18 bytes per 32): f16 d, 16 bytes of nibbles (value i low, value i + 16 high); d * (q - 8).
inline void decode_q4_0(__global const uchar* row, int b, IntBlock* o) {
  __global const uchar* p = row + b * 18;
  o->dw = load_half(p);
  o->dmin = 0.0f;
  o->s0 = o->s1 = 1;
  const uchar16 v = vload16(0, p + 2);
  o->q0 = as_char16(v & (uchar16)15) - (char16)8;
  o->q1 = as_char16(v >> (uchar16)4) - (char16)8;
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

// Q4_K (144 bytes per 256): f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles; sub-block j
// (32 values) is nibble j % 2 of bytes 32 * (j / 2) ...
inline void decode_q4_k(__global const uchar* row, int b, IntBlock* o) {
  __global const uchar* p = row + (b / 8) * 144;
  const int j = b % 8;
  int sc, m;
  q4k_scale_min(p + 4, j, &sc, &m);
  o->dw = load_half(p) * (float)sc;
  o->dmin = -(load_half(p + 2) * (float)m);
  o->s0 = o->s1 = 1;
  __global const uchar* qs = p + 16 + 32 * (j / 2);
  const uchar16 shift = (uchar16)(4 * (j % 2));
  o->q0 = as_char16((vload16(0, qs) >> shift) & (uchar16)15);
  o->q1 = as_char16((vload16(1, qs) >> shift) & (uchar16)15);
}

// Q5_K (176 bytes per 256): as Q4_K, with 32 bytes of fifth bits (bit j of byte l) before the
// nibbles.
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
  const uchar16 shift = (uchar16)(4 * (j % 2)), bit = (uchar16)j;
  o->q0 = as_char16(((vload16(0, qs) >> shift) & (uchar16)15) |
                    ((vload16(0, qh) >> bit) & (uchar16)1) << (uchar16)4);
  o->q1 = as_char16(((vload16(1, qs) >> shift) & (uchar16)15) |
                    ((vload16(1, qh) >> bit) & (uchar16)1) << (uchar16)4);
}

// Q6_K (210 bytes per 256): 128 bytes of low nibbles, 64 of high bit pairs, 16 int8 sub-block
// scales, f16 d; value = d * scale * (q - 32).
inline void decode_q6_k(__global const uchar* row, int b, IntBlock* o) {
  __global const uchar* p = row + (b / 8) * 210;
  const int j = b % 8;
  const int n = j / 4, c = j % 4;
  __global const uchar* ql = p + 64 * n + 32 * (c % 2);
  __global const uchar* qh = p + 128 + 32 * n;
  const uchar16 shift = (uchar16)(4 * (c / 2)), hshift = (uchar16)(2 * c);
  o->q0 = as_char16(((vload16(0, ql) >> shift) & (uchar16)15) |
                    ((vload16(0, qh) >> hshift) & (uchar16)3) << (uchar16)4) - (char16)32;
  o->q1 = as_char16(((vload16(1, ql) >> shift) & (uchar16)15) |
                    ((vload16(1, qh) >> hshift) & (uchar16)3) << (uchar16)4) - (char16)32;
  o->s0 = (char)p[192 + 2 * j];
  o->s1 = (char)p[192 + 2 * j + 1];
  o->dw = load_half(p + 208);
  o->dmin = 0.0f;
}

// Sum of a[i] * b[i] over 16 int8 pairs, exact (|a b| <= 128 * 127 fits a short).
inline int dot16(char16 a, char16 b) {
  const short16 p = convert_short16(a) * convert_short16(b);
  const int8 s8 = convert_int8(p.lo) + convert_int8(p.hi);
  const int4 s4 = s8.lo + s8.hi;
  const int2 s2 = s4.lo + s4.hi;
  return s2.x + s2.y;
}

// One block against one token's Q8_0 activation block (x: 32 int8, dx its f16-rounded scale, sums
// [sum, sum of the first 16]): the f32 steps of kernels/quant_ints.h, in the same order.
inline float block_step(const IntBlock* w, int has_min, __global const char* x, float dx,
                        __global const int* sums, float acc) {
  const int isum = w->s0 * dot16(w->q0, vload16(0, x)) + w->s1 * dot16(w->q1, vload16(1, x));
  acc = fma((float)isum, w->dw * dx, acc);
  if (has_min) acc = fma(w->dmin, dx * (float)sums[0], acc);
  return acc;
}
