// Row and element ops of the CUDA backend: fill, RMS norm, RoPE angles and rotation, SwiGLU and the
// other element-wise ops. Element-wise kernels are grid-stride loops over 64-bit indices; every
// thread reads an element before it writes it, so in-place calls are safe.
#include "backend/cuda/cuda_kernels.h"

namespace kvasir::cuda {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kThreads = 256;

unsigned GridFor(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < (1 << 20) ? (blocks > 0 ? blocks : 1) : (1 << 20));
}

#define KV_GRID_STRIDE(i, n)                                                             \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)

__global__ void FillKernel(float* dst, int64_t n, float value) {
  KV_GRID_STRIDE(i, n) dst[i] = value;
}

// One warp per row, 8 rows per block. Every lane has read its whole share of x before the sum's
// shuffles, and writes only elements it read itself, so y may be x.
__global__ void RmsNormKernel(const float* x, const float* w, int64_t n_rows, int width, float eps,
                              float* y) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= n_rows) return;
  const float* xr = x + r * width;
  float* yr = y + r * width;
  float ss = 0.0f;
  for (int i = lane; i < width; i += 32) ss = fmaf(xr[i], xr[i], ss);
  for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(kFull, ss, o);
  const float scale = 1.0f / sqrtf(ss / static_cast<float>(width) + eps);
  for (int i = lane; i < width; i += 32) yr[i] = __fmul_rn(__fmul_rn(xr[i], scale), w[i]);
}

// kernels/rope_angles.cpp, one thread per (position, pair), in double precision as there.
__global__ void RopeAnglesKernel(RopeArgs p, const int32_t* positions, int64_t n, float* out) {
  const int half = p.n_rot / 2;
  KV_GRID_STRIDE(idx, n * half) {
    const int64_t t = idx / half;
    const int i = static_cast<int>(idx % half);
    double x = positions[t];
    if (p.imrope) {
      // IMROPE: pairs outside the t/h/w sections take the position's fourth component, 0 for text.
      const int* sec = p.sections;
      const int sect_dims = sec[0] + sec[1] + sec[2] + sec[3];
      const int sector = sect_dims > 0 ? i % sect_dims : 0;
      const bool thw = (sector % 3 == 0 && sector < 3 * sec[0]) ||
                       (sector % 3 == 1 && sector < 3 * sec[1]) ||
                       (sector % 3 == 2 && sector < 3 * sec[2]);
      if (!thw) x = 0;
    }
    double theta_extrap =
        x * pow(static_cast<double>(p.base), -2.0 * i / static_cast<double>(p.n_rot));
    if (p.factors != nullptr) theta_extrap /= p.factors[i];
    const double freq_scale = p.freq_scale;
    const double ext = p.ext_factor;
    const double theta_interp = freq_scale * theta_extrap;
    double theta = theta_interp;
    double mscale = p.attn_factor;
    if (ext != 0.0) {
      mscale *= 1.0 + 0.1 * log(1.0 / freq_scale);
      const double y = static_cast<double>(static_cast<float>(i) - p.corr_lo) /
                       fmax(0.001, static_cast<double>(p.corr_hi - p.corr_lo));
      const double ramp = (1.0 - fmin(fmax(y, 0.0), 1.0)) * ext;
      theta = theta_interp * (1.0 - ramp) + theta_extrap * ramp;
    }
    out[2 * idx] = static_cast<float>(cos(theta) * mscale);
    out[2 * idx + 1] = static_cast<float>(sin(theta) * mscale);
  }
}

// One thread per (row, head, rotated pair); pairs are disjoint, so threads never share an element.
__global__ void RopeKernel(float* x, int64_t n_rows, int n_heads, int head_dim, int n_rot,
                           bool neox, const float* cos_sin) {
  const int half = n_rot / 2;
  KV_GRID_STRIDE(idx, n_rows * n_heads * half) {
    const int i = static_cast<int>(idx % half);
    const int64_t rh = idx / half;  // row * n_heads + head
    const int64_t r = rh / n_heads;
    const float c = cos_sin[(r * half + i) * 2], s = cos_sin[(r * half + i) * 2 + 1];
    float* v = x + rh * head_dim;
    const int a = neox ? i : 2 * i;
    const int b = neox ? i + half : 2 * i + 1;
    const float x0 = v[a], x1 = v[b];
    // Unfused, as the CPU backend rounds each product.
    v[a] = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    v[b] = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
}

__device__ __forceinline__ float SigmoidF(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void SiluMulKernel(const float* gate, const float* up, int64_t n, float* out) {
  KV_GRID_STRIDE(i, n) {
    const float g = gate[i];
    out[i] = __fmul_rn(g / (1.0f + expf(-g)), up[i]);
  }
}

__global__ void AddKernel(float* y, const float* x, int64_t n) {
  KV_GRID_STRIDE(i, n) y[i] += x[i];
}

__global__ void AddBiasKernel(float* y, const float* b, int64_t n, int width) {
  KV_GRID_STRIDE(i, n) y[i] += b[i % width];
}

__global__ void SigmoidMulKernel(float* y, const float* gate, int64_t n) {
  KV_GRID_STRIDE(i, n) y[i] = __fmul_rn(y[i], SigmoidF(gate[i]));
}

__global__ void SigmoidKernel(float* x, int64_t n) { KV_GRID_STRIDE(i, n) x[i] = SigmoidF(x[i]); }

__global__ void ScaleRowsKernel(float* y, const float* scale, int64_t n, int width) {
  KV_GRID_STRIDE(i, n) y[i] *= scale[i / width];
}

}  // namespace

cudaError_t Fill(float* dst, int64_t n, float value, cudaStream_t s) {
  FillKernel<<<GridFor(n), kThreads, 0, s>>>(dst, n, value);
  return cudaGetLastError();
}

cudaError_t RmsNorm(const float* x, const float* w, int64_t n_rows, int width, float eps, float* y,
                    cudaStream_t s) {
  RmsNormKernel<<<static_cast<unsigned>((n_rows + 7) / 8), 256, 0, s>>>(x, w, n_rows, width, eps,
                                                                        y);
  return cudaGetLastError();
}

cudaError_t RopeAngles(const RopeArgs& p, const int32_t* positions, int64_t n, float* out,
                       cudaStream_t s) {
  RopeAnglesKernel<<<GridFor(n * (p.n_rot / 2)), kThreads, 0, s>>>(p, positions, n, out);
  return cudaGetLastError();
}

cudaError_t Rope(float* x, int64_t n_rows, int n_heads, int head_dim, int n_rot, bool neox,
                 const float* cos_sin, cudaStream_t s) {
  const int64_t n = n_rows * n_heads * (n_rot / 2);
  RopeKernel<<<GridFor(n), kThreads, 0, s>>>(x, n_rows, n_heads, head_dim, n_rot, neox, cos_sin);
  return cudaGetLastError();
}

cudaError_t SiluMul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t s) {
  SiluMulKernel<<<GridFor(n), kThreads, 0, s>>>(gate, up, n, out);
  return cudaGetLastError();
}

cudaError_t Add(float* y, const float* x, int64_t n, cudaStream_t s) {
  AddKernel<<<GridFor(n), kThreads, 0, s>>>(y, x, n);
  return cudaGetLastError();
}

cudaError_t AddBias(float* y, const float* b, int64_t n_rows, int width, cudaStream_t s) {
  AddBiasKernel<<<GridFor(n_rows * width), kThreads, 0, s>>>(y, b, n_rows * width, width);
  return cudaGetLastError();
}

cudaError_t SigmoidMul(float* y, const float* gate, int64_t n, cudaStream_t s) {
  SigmoidMulKernel<<<GridFor(n), kThreads, 0, s>>>(y, gate, n);
  return cudaGetLastError();
}

cudaError_t Sigmoid(float* x, int64_t n, cudaStream_t s) {
  SigmoidKernel<<<GridFor(n), kThreads, 0, s>>>(x, n);
  return cudaGetLastError();
}

cudaError_t ScaleRows(float* y, const float* scale, int64_t n_rows, int width, cudaStream_t s) {
  ScaleRowsKernel<<<GridFor(n_rows * width), kThreads, 0, s>>>(y, scale, n_rows * width, width);
  return cudaGetLastError();
}

}  // namespace kvasir::cuda
