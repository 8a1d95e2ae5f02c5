// Gated DeltaNet on the device: the short causal convolution (one thread per channel, rows in
// order) and the gated delta rule (one thread block per value head, rows strictly in order, warps
// over the rows of the head's state matrix). The arithmetic follows backend/cpu/cpu_delta_net.cpp.
#include "backend/cuda/cuda_kernels.h"

namespace kvasir::cuda {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr int kDeltaWarps = 8;

__device__ __forceinline__ float SiluF(float x) { return x / (1.0f + expf(-x)); }

// As ggml: large inputs pass through, so exp cannot overflow.
__device__ __forceinline__ float SoftplusF(float x) { return x > 20.0f ? x : logf(1.0f + expf(x)); }

// in(s) is x[s] for s >= 0 and the saved input state[kernel - 1 + s] before it.
__global__ void CausalConvSiluKernel(const float* x, int n, int channels, int kernel,
                                     const float* w, float* state, float* out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= channels) return;
  const int hist = kernel - 1;
  const float* wc = w + c * kernel;
  for (int t = 0; t < n; ++t) {
    float sum = 0.0f;
    for (int j = 0; j < kernel; ++j) {
      const int s = t - hist + j;
      const float in = s >= 0 ? x[static_cast<int64_t>(s) * channels + c]
                              : state[static_cast<int64_t>(hist + s) * channels + c];
      sum = __fadd_rn(sum, __fmul_rn(in, wc[j]));
    }
    out[static_cast<int64_t>(t) * channels + c] = SiluF(sum);
  }
  // The last `hist` inputs, oldest first. Entry j reads entry n + j > j of the old state, which
  // this loop has not yet overwritten.
  for (int j = 0; j < hist; ++j) {
    const int s = n - hist + j;
    state[static_cast<int64_t>(j) * channels + c] =
        s >= 0 ? x[static_cast<int64_t>(s) * channels + c]
               : state[static_cast<int64_t>(hist + s) * channels + c];
  }
}

__device__ __forceinline__ double WarpSumD(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__device__ __forceinline__ float WarpSumF(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

// Block h: value head h (key head h % n_k_heads). Shared: the row's normalised q and k [dim] each.
// state row j (value j) is owned by warp j % kDeltaWarps; each lane reads back only what it wrote.
__global__ void __launch_bounds__(kDeltaWarps * 32)
    GatedDeltaRuleKernel(const float* qkv, int64_t row_stride, const float* alpha,
                         const float* beta, const float* dt_bias, const float* a, int n,
                         int n_k_heads, int n_v_heads, int dim, float eps, float* state,
                         float* out) {
  extern __shared__ float shared[];
  float* qn = shared;         // [dim]
  float* kn = shared + dim;   // [dim]
  __shared__ float gates[2];  // decay, beta
  const int h = blockIdx.x;
  const int kh = h % n_k_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(dim));
  const int64_t k_off = static_cast<int64_t>(n_k_heads) * dim;
  const int64_t v_off = 2 * k_off;
  const int64_t out_stride = static_cast<int64_t>(n_v_heads) * dim;
  float* s_head = state + static_cast<int64_t>(h) * dim * dim;
  for (int t = 0; t < n; ++t) {
    const float* row = qkv + t * row_stride;
    if (warp < 2) {
      // Warp 0 normalises q, warp 1 k: x / max(|x|, eps), the norm summed in double.
      const float* src = row + (warp == 0 ? 0 : k_off) + static_cast<int64_t>(kh) * dim;
      double ss = 0.0;
      for (int i = lane; i < dim; i += 32) ss += static_cast<double>(src[i]) * src[i];
      ss = WarpSumD(ss);
      const float scale =
          1.0f / fmaxf(sqrtf(static_cast<float>(ss)), eps) * (warp == 0 ? q_scale : 1.0f);
      float* dst = warp == 0 ? qn : kn;
      for (int i = lane; i < dim; i += 32) dst[i] = src[i] * scale;
    } else if (warp == 2 && lane == 0) {
      const int64_t gi = static_cast<int64_t>(t) * n_v_heads + h;
      gates[0] = expf(SoftplusF(alpha[gi] + dt_bias[h]) * a[h]);
      gates[1] = 1.0f / (1.0f + expf(-beta[gi]));
    }
    __syncthreads();
    const float decay = gates[0], b = gates[1];
    const float* v = row + v_off + static_cast<int64_t>(h) * dim;
    for (int j = warp; j < dim; j += kDeltaWarps) {
      float* sj = s_head + static_cast<int64_t>(j) * dim;
      // S <- exp(g) S;  d = b (v - S^T k);  S <- S + k d^T;  o = S^T q  (row j of each).
      float dot = 0.0f;
      for (int i = lane; i < dim; i += 32) {
        const float si = sj[i] * decay;
        sj[i] = si;
        dot = fmaf(si, kn[i], dot);
      }
      const float d = (v[j] - WarpSumF(dot)) * b;
      float o = 0.0f;
      for (int i = lane; i < dim; i += 32) {
        const float si = fmaf(d, kn[i], sj[i]);
        sj[i] = si;
        o = fmaf(si, qn[i], o);
      }
      o = WarpSumF(o);
      if (lane == 0) out[t * out_stride + static_cast<int64_t>(h) * dim + j] = o;
    }
    __syncthreads();  // q, k and the gates are rewritten for the next row
  }
}

}  // namespace

cudaError_t CausalConvSilu(const float* x, int n, int channels, int kernel, const float* w,
                           float* state, float* out, cudaStream_t s) {
  CausalConvSiluKernel<<<static_cast<unsigned>((channels + 127) / 128), 128, 0, s>>>(
      x, n, channels, kernel, w, state, out);
  return cudaGetLastError();
}

cudaError_t GatedDeltaRule(const float* qkv, int64_t row_stride, const float* alpha,
                           const float* beta, const float* dt_bias, const float* a, int n,
                           int n_k_heads, int n_v_heads, int dim, float eps, float* state,
                           float* out, cudaStream_t s) {
  const size_t shared = static_cast<size_t>(2 * dim) * sizeof(float);
  GatedDeltaRuleKernel<<<static_cast<unsigned>(n_v_heads), kDeltaWarps * 32, shared, s>>>(
      qkv, row_stride, alpha, beta, dt_bias, a, n, n_k_heads, n_v_heads, dim, eps, state, out);
  return cudaGetLastError();
}

}  // namespace kvasir::cuda
