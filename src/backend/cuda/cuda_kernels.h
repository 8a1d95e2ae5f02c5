// The kernels of the CUDA backend, as host functions that queue them on a stream. Every pointer is
// device memory; every function returns the launch's error (cudaSuccess when it was queued), and
// errors while it runs surface at the next synchronisation (the backend keeps the first). Shapes
// are as backend/backend.h gives them; the backend has checked them.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "backend/cuda/cuda_blocks.h"

namespace kvasir::cuda {

// ---- Matrix products (cuda_matmul.cu) ---------------------------------------------------------

// Activations quantized to Q8_0 blocks, as the CPU kernels do: per row and block of 32, d = amax /
// 127 rounded to f16, q = round(x / d). qs: [rows, cols] int8; d, sum_d: [rows, cols / 32] f32,
// sum_d = d * (sum of the block's q) (for the types with a min).
struct QuantActs {
  int8_t* qs = nullptr;
  float* d = nullptr;
  float* sum_d = nullptr;
};
cudaError_t QuantizeActs(const float* x, int64_t rows, int64_t cols, const QuantActs& out,
                         cudaStream_t s);

// Which activation rows a product runs over. Dense (tiles == nullptr): rows 0 .. n - 1, output
// row t from activation row t. Grouped (mixture of experts): tiles [max_tiles, 3] of (expert,
// first position, count <= kTileTokens) and their number at tiles[3 * max_tiles]; position p reads
// activation row sorted[p] / k (sorted == nullptr: row p) and writes output row p.
struct TokenMap {
  const int32_t* tiles = nullptr;
  int64_t max_tiles = 0;
  const int32_t* sorted = nullptr;
  int k = 1;
};
inline constexpr int kTileTokens = 8;

// y[t, r] = sum_i W[r, i] x[t, i]. Quantized weights take QuantActs of x; F32/F16 weights take x
// itself (f32). `n` is the number of tokens (dense) or of positions (grouped). A (row, token)'s
// result is the same for any n and any grouping: blocks are split over the 32 lanes of a warp by
// block index modulo 32, each lane sums its blocks in order with fused multiply-adds, and the
// lanes' sums are added in a fixed tree.
cudaError_t MatMulQuant(const DevMatrix& w, const QuantActs& x, int64_t n, const TokenMap& map,
                        float* y, cudaStream_t s);
cudaError_t MatMulFloat(const DevMatrix& w, const float* x, int64_t n, const TokenMap& map,
                        float* y, cudaStream_t s);
// out[i, :] = row ids[i] of w, dequantized (out: [n, cols]).
cudaError_t GetRows(const DevMatrix& w, const int32_t* ids, int64_t n, float* out, cudaStream_t s);

// ---- Row and element ops (cuda_ops.cu) --------------------------------------------------------

cudaError_t Fill(float* dst, int64_t n, float value, cudaStream_t s);
cudaError_t RmsNorm(const float* x, const float* w, int64_t n_rows, int width, float eps, float* y,
                    cudaStream_t s);
// The parameters of kernels/rope_angles.h without the span (factors: device memory or null).
struct RopeArgs {
  int n_rot = 0;
  float base = 10000.0f, freq_scale = 1.0f, ext_factor = 0.0f, attn_factor = 1.0f;
  float corr_lo = 0.0f, corr_hi = 0.0f;
  bool imrope = false;
  int sections[4] = {0, 0, 0, 0};
  const float* factors = nullptr;  // [n_rot / 2] or null
};
cudaError_t RopeAngles(const RopeArgs& p, const int32_t* positions, int64_t n, float* out,
                       cudaStream_t s);
cudaError_t Rope(float* x, int64_t n_rows, int n_heads, int head_dim, int n_rot, bool neox,
                 const float* cos_sin, cudaStream_t s);
cudaError_t SiluMul(const float* gate, const float* up, int64_t n, float* out, cudaStream_t s);
cudaError_t Add(float* y, const float* x, int64_t n, cudaStream_t s);
cudaError_t AddBias(float* y, const float* b, int64_t n_rows, int width, cudaStream_t s);
cudaError_t SigmoidMul(float* y, const float* gate, int64_t n, cudaStream_t s);
cudaError_t Sigmoid(float* x, int64_t n, cudaStream_t s);
cudaError_t ScaleRows(float* y, const float* scale, int64_t n_rows, int width, cudaStream_t s);

// ---- Attention (cuda_attention.cu) ------------------------------------------------------------

inline constexpr int kMaxHeadDim = 512;
struct AttentionArgs {
  int n_head = 0, n_head_kv = 0, head_dim = 0;
  float scale = 0.0f, softcap = 0.0f;
  int window = 0;
};
cudaError_t Attention(const float* q, int n, int pos0, const float* k_cache, const float* v_cache,
                      const AttentionArgs& p, float* out, cudaStream_t s);

// ---- Gated DeltaNet (cuda_delta_net.cu) -------------------------------------------------------

cudaError_t CausalConvSilu(const float* x, int n, int channels, int kernel, const float* w,
                           float* state, float* out, cudaStream_t s);
cudaError_t GatedDeltaRule(const float* qkv, int64_t row_stride, const float* alpha,
                           const float* beta, const float* dt_bias, const float* a, int n,
                           int n_k_heads, int n_v_heads, int dim, float eps, float* state,
                           float* out, cudaStream_t s);

// ---- Mixture of experts (cuda_moe.cu) ---------------------------------------------------------

cudaError_t MoeRoute(float* logits, int64_t n, int n_expert, int k, int32_t* ids, float* weights,
                     cudaStream_t s);
// Groups the n * k slots (row r's j-th expert ids[r * k + j]) by expert: sorted [n * k] slots,
// expert by expert; slot_pos [n * k] each slot's place in sorted; tiles as TokenMap (max_tiles =
// MoeMaxTiles). counts: [n_expert + 1] scratch.
int64_t MoeMaxTiles(int64_t slots, int n_expert);
cudaError_t MoeGroup(const int32_t* ids, int64_t slots, int n_expert, int32_t* counts,
                     int32_t* sorted, int32_t* slot_pos, int32_t* tiles, cudaStream_t s);
// out[r, :] = sum over j in order of weights[r, j] * ys[slot_pos[r * k + j], :]; ys [n * k, width].
cudaError_t MoeCombine(const float* ys, const int32_t* slot_pos, const float* weights, int64_t n,
                       int k, int width, float* out, cudaStream_t s);

}  // namespace kvasir::cuda
