// Helpers that every program of the OpenCL backend starts with (OpenCL C 1.2: no half arithmetic,
// no subgroups). Buffers are passed as a pointer and an element offset (a DevPtr), offsets as long.
//
// Numerics follow the CPU backend: no contraction of a * b + c into fma (the CPU is built without
// it), fma only where the CPU's integer form uses it (kernels/quant_ints.h), f16 scales decoded
// bit-exactly without cl_khr_fp16.
#pragma OPENCL FP_CONTRACT OFF

// IEEE half bits to float, exact (subnormals, inf and NaN included).
inline float half_to_float(uint h) {
  const uint sign = (h & 0x8000u) << 16;
  const uint e = (h >> 10) & 0x1Fu;
  const uint mant = h & 0x3FFu;
  if (e == 0) {
    const float v = (float)mant * 5.9604644775390625e-8f;  // mant * 2^-24, exact
    return sign != 0 ? -v : v;
  }
  if (e == 31) return as_float(sign | 0x7F800000u | mant << 13);
  return as_float(sign | (e + 112u) << 23 | mant << 13);
}

// Two little-endian bytes at p as half bits (p need not be aligned).
inline float load_half(__global const uchar* p) {
  return half_to_float((uint)p[0] | (uint)p[1] << 8);
}

// f rounded to the nearest half (ties to even) and back to float: the CPU's F32ToF16 then
// F16ToF32, as the Q8_0 activation scale is stored.
inline float round_to_half(float f) {
  const uint bits = as_uint(f);
  const uint sign = (bits >> 16) & 0x8000u;
  const uint a = bits & 0x7FFFFFFFu;
  uint h;
  if (a > 0x7F800000u) {
    h = sign | 0x7E00u | ((a >> 13) & 0x3FFu);
  } else if (a >= 0x477FF000u) {
    h = sign | 0x7C00u;
  } else if (a < 0x38800000u) {
    if (a <= 0x33000000u) {
      h = sign;
    } else {
      const uint mant = (a & 0x7FFFFFu) | 0x800000u;
      const uint shift = 126u - (a >> 23);
      uint r = mant >> shift;
      const uint rem = mant & ((1u << shift) - 1u);
      const uint half_ulp = 1u << (shift - 1u);
      if (rem > half_ulp || (rem == half_ulp && (r & 1u) != 0)) ++r;
      h = sign | r;
    }
  } else {
    uint r = (a >> 13) - (112u << 10);
    const uint rem = a & 0x1FFFu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u) != 0)) ++r;
    h = sign | r;
  }
  return half_to_float(h);
}

// Sum and max over a work-group whose local size is a power of two; red: [local size]. Every
// work-item of the group must call them (they hold barriers) and gets the result.
inline float group_sum(float v, __local float* red) {
  const int lid = get_local_id(0);
  red[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = get_local_size(0) / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] += red[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = red[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

inline float group_max(float v, __local float* red) {
  const int lid = get_local_id(0);
  red[lid] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = get_local_size(0) / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] = fmax(red[lid], red[lid + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float r = red[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}
