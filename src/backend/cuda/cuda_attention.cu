// Causal attention of a chunk over its sequence's cache: one thread block per (query row, head),
// its warps taking the visible keys in turn with a running (online) softmax each, merged at the
// end. Keys past the query's position are never read.
#include "backend/cuda/cuda_kernels.h"

namespace kvasir::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kPerLane = kMaxHeadDim / 32;  // head dims a lane keeps of the output
constexpr unsigned kFull = 0xFFFFFFFFu;

__global__ void __launch_bounds__(kWarps * 32)
    AttentionKernel(const float* q, int pos0, const float* k_cache, const float* v_cache,
                    AttentionArgs p, float* out) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float w_max[kWarps], w_sum[kWarps];
  __shared__ float w_acc[kWarps][kMaxHeadDim];
  const int64_t t = blockIdx.x / p.n_head;
  const int h = static_cast<int>(blockIdx.x % p.n_head);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int hd = p.head_dim;
  const int64_t q_stride = static_cast<int64_t>(p.n_head) * hd;
  const int64_t kv_stride = static_cast<int64_t>(p.n_head_kv) * hd;
  const int64_t kv_off = static_cast<int64_t>(h / (p.n_head / p.n_head_kv)) * hd;
  const int pos = pos0 + static_cast<int>(t);
  // Causal: keys 0 .. pos; with a sliding window only the last `window` of them.
  const int j0 = p.window > 0 ? max(0, pos - p.window + 1) : 0;

  for (int d = threadIdx.x; d < hd; d += blockDim.x) qs[d] = q[t * q_stride + h * hd + d];
  __syncthreads();

  float m = -INFINITY, l = 0.0f;
  float acc[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) acc[i] = 0.0f;
  for (int j = j0 + warp; j <= pos; j += kWarps) {
    const float* kj = k_cache + j * kv_stride + kv_off;
    float s = 0.0f;
    for (int d = lane; d < hd; d += 32) s = fmaf(qs[d], kj[d], s);
    for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
    s *= p.scale;
    if (p.softcap > 0.0f) s = p.softcap * tanhf(s / p.softcap);
    const float m_new = fmaxf(m, s);
    const float corr = expf(m - m_new);  // 0 for the first key (m = -inf)
    const float e = expf(s - m_new);
    l = l * corr + e;
    const float* vj = v_cache + j * kv_stride + kv_off;
#pragma unroll
    for (int i = 0; i < kPerLane; ++i) {
      const int d = lane + 32 * i;
      if (d < hd) acc[i] = acc[i] * corr + e * vj[d];
    }
    m = m_new;
  }
  if (lane == 0) w_max[warp] = m, w_sum[warp] = l;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const int d = lane + 32 * i;
    if (d < hd) w_acc[warp][d] = acc[i];
  }
  __syncthreads();
  // Merge the warps' partial softmaxes; a warp that saw no key has sum 0 and is left out.
  float all_max = -INFINITY;
  for (int w = 0; w < kWarps; ++w) {
    if (w_sum[w] > 0.0f) all_max = fmaxf(all_max, w_max[w]);
  }
  float total = 0.0f;
  for (int w = 0; w < kWarps; ++w) {
    if (w_sum[w] > 0.0f) total += w_sum[w] * expf(w_max[w] - all_max);
  }
  for (int d = threadIdx.x; d < hd; d += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kWarps; ++w) {
      if (w_sum[w] > 0.0f) o += w_acc[w][d] * expf(w_max[w] - all_max);
    }
    out[t * q_stride + h * hd + d] = o / total;
  }
}

}  // namespace

cudaError_t Attention(const float* q, int n, int pos0, const float* k_cache, const float* v_cache,
                      const AttentionArgs& p, float* out, cudaStream_t s) {
  const int64_t blocks = static_cast<int64_t>(n) * p.n_head;
  AttentionKernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, s>>>(q, pos0, k_cache, v_cache,
                                                                        p, out);
  return cudaGetLastError();
}

}  // namespace kvasir::cuda
