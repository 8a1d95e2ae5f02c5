// Mixture-of-experts on the device: the router (softmax, top k, renormalised weights), the grouping
// of a batch's (row, expert) slots by expert into tiles of at most kTileTokens positions (which the
// product kernels of cuda_matmul.cu take as a TokenMap, so each expert's weights are read once per
// tile), and the weighted sum of each row's expert outputs in top-k order.
#include <climits>

#include "backend/cuda/cuda_kernels.h"

namespace kvasir::cuda {
namespace {

constexpr unsigned kFull = 0xFFFFFFFFu;
constexpr float kMinWeightSum = 6.103515625e-5f;  // the smallest normal f16, as llama.cpp

// One warp per row, 8 rows per block (backend/cpu/cpu_moe.cpp, CpuMoeRoute).
__global__ void MoeRouteKernel(float* logits, int64_t n, int n_expert, int k, int32_t* ids,
                               float* weights) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * 8 + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (r >= n) return;
  float* p = logits + r * n_expert;
  float mx = -INFINITY;
  for (int e = lane; e < n_expert; e += 32) mx = fmaxf(mx, p[e]);
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(kFull, mx, o));
  double sum = 0.0;
  for (int e = lane; e < n_expert; e += 32) {
    const float v = expf(p[e] - mx);
    p[e] = v;
    sum += v;
  }
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
  const float inv = static_cast<float>(1.0 / sum);
  for (int e = lane; e < n_expert; e += 32) p[e] *= inv;
  __syncwarp();
  // The k largest in order: higher probability first, the lower id on ties. Each pick is the
  // best of the experts that come after the previous pick in that order.
  float prev_p = INFINITY, total = 0.0f;
  int prev_id = -1;
  for (int j = 0; j < k; ++j) {
    float best_p = -1.0f;
    int best_id = INT_MAX;
    for (int e = lane; e < n_expert; e += 32) {
      const float v = p[e];
      const bool after = v < prev_p || (v == prev_p && e > prev_id);
      if (after && (v > best_p || (v == best_p && e < best_id))) best_p = v, best_id = e;
    }
    for (int o = 16; o > 0; o >>= 1) {
      const float op = __shfl_xor_sync(kFull, best_p, o);
      const int oid = __shfl_xor_sync(kFull, best_id, o);
      if (op > best_p || (op == best_p && oid < best_id)) best_p = op, best_id = oid;
    }
    if (best_id == INT_MAX) best_id = 0, best_p = 0.0f;  // NaN logits: no order at all
    if (lane == 0) ids[r * k + j] = best_id, weights[r * k + j] = best_p;
    total += best_p;
    prev_p = best_p, prev_id = best_id;
  }
  total = fmaxf(total, kMinWeightSum);
  if (lane == 0) {
    for (int j = 0; j < k; ++j) weights[r * k + j] = weights[r * k + j] / total;
  }
}

// One block. counts [n_expert]: the experts' slot counts, then their next free positions. An id
// outside [0, n_expert) (never from MoeRoute) counts as expert 0, so nothing is read out of place.
__global__ void MoeGroupKernel(const int32_t* ids, int64_t slots, int n_expert, int32_t* counts,
                               int32_t* sorted, int32_t* slot_pos, int32_t* tiles,
                               int64_t max_tiles) {
  auto expert = [&](int64_t s) {
    const int32_t e = ids[s];
    return e >= 0 && e < n_expert ? e : 0;
  };
  for (int e = threadIdx.x; e < n_expert; e += blockDim.x) counts[e] = 0;
  __syncthreads();
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) atomicAdd(&counts[expert(s)], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t pos = 0;
    int64_t nt = 0;
    for (int e = 0; e < n_expert; ++e) {
      const int32_t c = counts[e];
      for (int32_t f = 0; f < c && nt < max_tiles; f += kTileTokens, ++nt) {
        tiles[3 * nt] = e;
        tiles[3 * nt + 1] = pos + f;
        tiles[3 * nt + 2] = min(kTileTokens, c - f);
      }
      counts[e] = pos;
      pos += c;
    }
    tiles[3 * max_tiles] = static_cast<int32_t>(nt);
  }
  __syncthreads();
  // Within an expert the order of its slots is whatever the atomics give: every position's
  // result is the same wherever it lands.
  for (int64_t s = threadIdx.x; s < slots; s += blockDim.x) {
    const int32_t p = atomicAdd(&counts[expert(s)], 1);
    sorted[p] = static_cast<int32_t>(s);
    slot_pos[s] = p;
  }
}

__global__ void MoeCombineKernel(const float* ys, const int32_t* slot_pos, const float* weights,
                                 int64_t n, int k, int width, float* out) {
  const int64_t total = n * width;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / width, c = i % width;
    float o = 0.0f;
    for (int j = 0; j < k; ++j) {
      const float y = ys[static_cast<int64_t>(slot_pos[r * k + j]) * width + c];
      const float wy = __fmul_rn(weights[r * k + j], y);
      o = j == 0 ? wy : __fadd_rn(o, wy);
    }
    out[i] = o;
  }
}

}  // namespace

int64_t MoeMaxTiles(int64_t slots, int n_expert) {
  // Each tile holds at least one slot, and an expert's tiles are all full but its last.
  const int64_t bound = slots / kTileTokens + 1 + n_expert;
  return slots < bound ? slots : bound;
}

cudaError_t MoeRoute(float* logits, int64_t n, int n_expert, int k, int32_t* ids, float* weights,
                     cudaStream_t s) {
  MoeRouteKernel<<<static_cast<unsigned>((n + 7) / 8), 256, 0, s>>>(logits, n, n_expert, k, ids,
                                                                    weights);
  return cudaGetLastError();
}

cudaError_t MoeGroup(const int32_t* ids, int64_t slots, int n_expert, int32_t* counts,
                     int32_t* sorted, int32_t* slot_pos, int32_t* tiles, cudaStream_t s) {
  MoeGroupKernel<<<1, 1024, 0, s>>>(ids, slots, n_expert, counts, sorted, slot_pos, tiles,
                                    MoeMaxTiles(slots, n_expert));
  return cudaGetLastError();
}

cudaError_t MoeCombine(const float* ys, const int32_t* slot_pos, const float* weights, int64_t n,
                       int k, int width, float* out, cudaStream_t s) {
  const int64_t blocks = (n * width + 255) / 256;
  MoeCombineKernel<<<static_cast<unsigned>(blocks < (1 << 20) ? blocks : (1 << 20)), 256, 0, s>>>(
      ys, slot_pos, weights, n, k, width, out);
  return cudaGetLastError();
}

}  // namespace kvasir::cuda
