// Matrix products of the CUDA backend: activations quantized to Q8_0 blocks, products of quantized
// weights as integer dot products (dp4a) per block of 32, of F32/F16 weights in f32, and the
// embedding rows. One kernel shape serves decode and prefill: a warp owns kRows weight rows and
// kTok tokens, its lanes take the row's blocks by index modulo 32, and lanes' sums meet in a fixed
// tree at the end, so a (row, token) gets the same bits however many tokens run with it.
#include <climits>

#include "backend/cuda/cuda_kernels.h"

namespace kvasir::cuda {
namespace {

constexpr int kWarps = 4;  // warps per block of the product kernels
constexpr unsigned kFull = 0xFFFFFFFFu;

__device__ __forceinline__ float WarpSum(float v) {
  // Lanes i and i ^ o add the same two values, so every lane ends with the same sum.
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  return v;
}

__global__ void QuantizeKernel(const float* x, int64_t rows, int64_t cols, QuantActs out) {
  const int64_t nb = cols / 32;
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (blk >= rows * nb) return;  // whole warps leave together
  const int64_t at = (blk / nb) * cols + (blk % nb) * 32 + lane;
  const float v = x[at];
  float amax = fabsf(v);
  for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(kFull, amax, o));
  // As the CPU's quantizer (kernels/quantize.cpp): scale from the f32 amax, q rounded half away
  // from zero, the scale then kept as f16.
  const float d = amax / 127.0f;
  const float inv = d != 0.0f ? 1.0f / d : 0.0f;
  const int q = static_cast<int>(roundf(v * inv));
  int sum = q;
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(kFull, sum, o);
  out.qs[at] = static_cast<int8_t>(q);
  if (lane == 0) {
    const float dh = __half2float(__float2half_rn(d));
    out.d[blk] = dh;
    out.sum_d[blk] = dh * static_cast<float>(sum);
  }
}

// The tokens of one block of a product: positions p0 .. p0 + count - 1 of expert `expert`.
struct Tile {
  int64_t expert = 0, p0 = 0, count = 0;
};

// false when the tile index is past the grouped tiles that exist.
__device__ __forceinline__ bool FindTile(const TokenMap& map, int64_t n, int64_t tile, int tok,
                                         Tile* t) {
  if (map.tiles == nullptr) {
    t->p0 = tile * tok;
    t->count = min(static_cast<int64_t>(tok), n - t->p0);
    return t->count > 0;
  }
  if (tile >= map.tiles[3 * map.max_tiles]) return false;
  t->expert = map.tiles[3 * tile];
  t->p0 = map.tiles[3 * tile + 1];
  t->count = map.tiles[3 * tile + 2];
  return true;
}

__device__ __forceinline__ int64_t ActRow(const TokenMap& map, int64_t p) {
  return map.sorted != nullptr ? map.sorted[p] / map.k : p;
}

// Grid: row_blocks x tiles blocks (flattened, tile0 onwards), kWarps warps each.
template <int kType, int kRows, int kTok>
__global__ void __launch_bounds__(kWarps * 32)
    MatMulQuantKernel(DevMatrix w, QuantActs x, int64_t n, TokenMap map, float* y,
                      int64_t row_blocks, int64_t tile0) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Tile t;
  if (!FindTile(map, n, tile0 + blockIdx.x / row_blocks, kTok, &t)) return;
  const int64_t r0 = ((blockIdx.x % row_blocks) * kWarps + warp) * kRows;
  if (r0 >= w.rows) return;
  const uint8_t* base = w.data + t.expert * w.stride;
  const int64_t nb = w.cols / 32;
  int64_t xrow[kTok];
#pragma unroll
  for (int j = 0; j < kTok; ++j)
    xrow[j] = ActRow(map, t.p0 + min(static_cast<int64_t>(j), t.count - 1));

  float acc[kRows][kTok];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kTok; ++j) acc[i][j] = 0.0f;
  }
  for (int64_t b = lane; b < nb; b += 32) {
    QBlock blk[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      if (r0 + i < w.rows) DecodeBlock<kType>(w, base, r0 + i, b, &blk[i]);
    }
#pragma unroll
    for (int j = 0; j < kTok; ++j) {
      if (j >= t.count) break;
      uint32_t xq[8];
      const int8_t* xb = x.qs + xrow[j] * w.cols + b * 32;
      Load16(reinterpret_cast<const uint8_t*>(xb), xq);
      Load16(reinterpret_cast<const uint8_t*>(xb) + 16, xq + 4);
      const float dx = x.d[xrow[j] * nb + b];
      const float sum_d = HasMin(kType) ? x.sum_d[xrow[j] * nb + b] : 0.0f;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        if (r0 + i >= w.rows) break;
        // kernels/quant_ints.h, IntBlockStep: the CPU's arithmetic per block.
        const float isum = static_cast<float>(BlockDot(blk[i], xq));
        acc[i][j] = fmaf(isum, __fmul_rn(blk[i].dw, dx), acc[i][j]);
        if (HasMin(kType)) acc[i][j] = fmaf(blk[i].dmin, sum_d, acc[i][j]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kTok; ++j) {
      const float v = WarpSum(acc[i][j]);
      if (lane == 0 && j < t.count && r0 + i < w.rows) y[(t.p0 + j) * w.rows + r0 + i] = v;
    }
  }
}

// F32/F16/BF16 weights: lane l takes the column pairs 2l + 64 m, in order. Rows are padded with
// zeros to an even length, so a pair never reads past its row; x past cols counts as 0.
template <int kType, int kRows, int kTok>
__global__ void __launch_bounds__(kWarps * 32)
    MatMulFloatKernel(DevMatrix w, const float* x, int64_t n, TokenMap map, float* y,
                      int64_t row_blocks, int64_t tile0) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  Tile t;
  if (!FindTile(map, n, tile0 + blockIdx.x / row_blocks, kTok, &t)) return;
  const int64_t r0 = ((blockIdx.x % row_blocks) * kWarps + warp) * kRows;
  if (r0 >= w.rows) return;
  const uint8_t* base = w.data + t.expert * w.stride;
  const float* xr[kTok];
#pragma unroll
  for (int j = 0; j < kTok; ++j) {
    xr[j] = x + ActRow(map, t.p0 + min(static_cast<int64_t>(j), t.count - 1)) * w.cols;
  }
  float acc[kRows][kTok];
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kTok; ++j) acc[i][j] = 0.0f;
  }
  for (int64_t c = 2 * lane; c < w.cols; c += 64) {
    float w0[kRows], w1[kRows];
#pragma unroll
    for (int i = 0; i < kRows; ++i) {
      w0[i] = w1[i] = 0.0f;
      if (r0 + i >= w.rows) continue;
      const uint8_t* row = base + (r0 + i) * w.row_bytes;
      if constexpr (kType == kWF32) {
        const float2 v = *reinterpret_cast<const float2*>(row + c * 4);
        w0[i] = v.x, w1[i] = v.y;
      } else if constexpr (kType == kWF16) {
        const float2 v = __half22float2(*reinterpret_cast<const __half2*>(row + c * 2));
        w0[i] = v.x, w1[i] = v.y;
      } else {
        const uint32_t v = LoadU32(row + c * 2);  // two bf16, the first in the low half
        w0[i] = Bf16ToFloat(v & 0xFFFFu), w1[i] = Bf16ToFloat(v >> 16);
      }
    }
#pragma unroll
    for (int j = 0; j < kTok; ++j) {
      if (j >= t.count) break;
      const float x0 = xr[j][c], x1 = c + 1 < w.cols ? xr[j][c + 1] : 0.0f;
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        acc[i][j] = fmaf(w0[i], x0, acc[i][j]);
        acc[i][j] = fmaf(w1[i], x1, acc[i][j]);
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
#pragma unroll
    for (int j = 0; j < kTok; ++j) {
      const float v = WarpSum(acc[i][j]);
      if (lane == 0 && j < t.count && r0 + i < w.rows) y[(t.p0 + j) * w.rows + r0 + i] = v;
    }
  }
}

// Quantized rows: one thread per (id, block of 32). Float rows: one thread per value. An id
// outside the matrix (never passed by the window) gives NaN rather than a stray read.
template <int kType>
__global__ void GetRowsKernel(DevMatrix w, const int32_t* ids, int64_t n, float* out) {
  constexpr int kPer = IsFloatType(kType) ? 1 : 32;  // values a thread writes
  const int64_t per_row = w.cols / kPer;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n * per_row) return;
  const int64_t t = i / per_row, c = i % per_row;
  const int64_t r = ids[t];
  if (r < 0 || r >= w.rows) {
    for (int v = 0; v < kPer; ++v) out[t * w.cols + c * kPer + v] = __int_as_float(0x7FC00000);
    return;
  }
  const uint8_t* row = w.data + r * w.row_bytes;
  if constexpr (kType == kWF32) {
    out[t * w.cols + c] = reinterpret_cast<const float*>(row)[c];
  } else if constexpr (kType == kWF16) {
    out[t * w.cols + c] = __half2float(reinterpret_cast<const __half*>(row)[c]);
  } else if constexpr (kType == kWBF16) {
    out[t * w.cols + c] = Bf16ToFloat(LoadU16(row + 2 * c));
  } else {
    QBlock blk;
    DecodeBlock<kType>(w, w.data, r, c, &blk);
    float* o = out + t * w.cols + c * 32;
    for (int v = 0; v < 32; ++v) o[v] = BlockValue(blk, v);
  }
}

template <int kRows, int kTok, class Launch>
cudaError_t LaunchTiles(const DevMatrix& w, int64_t n, const TokenMap& map, Launch launch) {
  const int64_t row_blocks = (w.rows + kWarps * kRows - 1) / (kWarps * kRows);
  const int64_t tiles = map.tiles != nullptr ? map.max_tiles : (n + kTok - 1) / kTok;
  // Grids of more than INT_MAX blocks go in parts.
  const int64_t per_launch = INT_MAX / row_blocks;
  for (int64_t t0 = 0; t0 < tiles; t0 += per_launch) {
    const int64_t count = tiles - t0 < per_launch ? tiles - t0 : per_launch;
    launch(static_cast<unsigned>(row_blocks * count), row_blocks, t0);
  }
  return cudaGetLastError();
}

template <int kType>
cudaError_t MatMulQuantT(const DevMatrix& w, const QuantActs& x, int64_t n, const TokenMap& map,
                         float* y, cudaStream_t s) {
  if (map.tiles == nullptr && n == 1) {
    return LaunchTiles<1, 1>(w, n, map, [&](unsigned blocks, int64_t rb, int64_t t0) {
      MatMulQuantKernel<kType, 1, 1><<<blocks, kWarps * 32, 0, s>>>(w, x, n, map, y, rb, t0);
    });
  }
  return LaunchTiles<4, kTileTokens>(w, n, map, [&](unsigned blocks, int64_t rb, int64_t t0) {
    MatMulQuantKernel<kType, 4, kTileTokens>
        <<<blocks, kWarps * 32, 0, s>>>(w, x, n, map, y, rb, t0);
  });
}

template <int kType>
cudaError_t MatMulFloatT(const DevMatrix& w, const float* x, int64_t n, const TokenMap& map,
                         float* y, cudaStream_t s) {
  if (map.tiles == nullptr && n == 1) {
    return LaunchTiles<1, 1>(w, n, map, [&](unsigned blocks, int64_t rb, int64_t t0) {
      MatMulFloatKernel<kType, 1, 1><<<blocks, kWarps * 32, 0, s>>>(w, x, n, map, y, rb, t0);
    });
  }
  return LaunchTiles<4, kTileTokens>(w, n, map, [&](unsigned blocks, int64_t rb, int64_t t0) {
    MatMulFloatKernel<kType, 4, kTileTokens>
        <<<blocks, kWarps * 32, 0, s>>>(w, x, n, map, y, rb, t0);
  });
}

template <int kType>
cudaError_t GetRowsT(const DevMatrix& w, const int32_t* ids, int64_t n, float* out,
                     cudaStream_t s) {
  const int64_t threads = n * (IsFloatType(kType) ? w.cols : w.cols / 32);
  GetRowsKernel<kType><<<static_cast<unsigned>((threads + 255) / 256), 256, 0, s>>>(w, ids, n, out);
  return cudaGetLastError();
}

}  // namespace

cudaError_t QuantizeActs(const float* x, int64_t rows, int64_t cols, const QuantActs& out,
                         cudaStream_t s) {
  const int64_t blocks = rows * (cols / 32);  // one warp each, 8 warps a thread block
  QuantizeKernel<<<static_cast<unsigned>((blocks + 7) / 8), 256, 0, s>>>(x, rows, cols, out);
  return cudaGetLastError();
}

cudaError_t MatMulQuant(const DevMatrix& w, const QuantActs& x, int64_t n, const TokenMap& map,
                        float* y, cudaStream_t s) {
  switch (w.type) {
    case kWQ4_0:
      return MatMulQuantT<kWQ4_0>(w, x, n, map, y, s);
    case kWQ4_1:
      return MatMulQuantT<kWQ4_1>(w, x, n, map, y, s);
    case kWQ5_0:
      return MatMulQuantT<kWQ5_0>(w, x, n, map, y, s);
    case kWQ5_1:
      return MatMulQuantT<kWQ5_1>(w, x, n, map, y, s);
    case kWQ8_0:
      return MatMulQuantT<kWQ8_0>(w, x, n, map, y, s);
    case kWQ4_K:
      return MatMulQuantT<kWQ4_K>(w, x, n, map, y, s);
    case kWQ5_K:
      return MatMulQuantT<kWQ5_K>(w, x, n, map, y, s);
    case kWQ6_K:
      return MatMulQuantT<kWQ6_K>(w, x, n, map, y, s);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t MatMulFloat(const DevMatrix& w, const float* x, int64_t n, const TokenMap& map,
                        float* y, cudaStream_t s) {
  if (w.type == kWF32) return MatMulFloatT<kWF32>(w, x, n, map, y, s);
  if (w.type == kWF16) return MatMulFloatT<kWF16>(w, x, n, map, y, s);
  if (w.type == kWBF16) return MatMulFloatT<kWBF16>(w, x, n, map, y, s);
  return cudaErrorInvalidValue;
}

cudaError_t GetRows(const DevMatrix& w, const int32_t* ids, int64_t n, float* out, cudaStream_t s) {
  switch (w.type) {
    case kWF32:
      return GetRowsT<kWF32>(w, ids, n, out, s);
    case kWF16:
      return GetRowsT<kWF16>(w, ids, n, out, s);
    case kWBF16:
      return GetRowsT<kWBF16>(w, ids, n, out, s);
    case kWQ4_0:
      return GetRowsT<kWQ4_0>(w, ids, n, out, s);
    case kWQ4_1:
      return GetRowsT<kWQ4_1>(w, ids, n, out, s);
    case kWQ5_0:
      return GetRowsT<kWQ5_0>(w, ids, n, out, s);
    case kWQ5_1:
      return GetRowsT<kWQ5_1>(w, ids, n, out, s);
    case kWQ8_0:
      return GetRowsT<kWQ8_0>(w, ids, n, out, s);
    case kWQ4_K:
      return GetRowsT<kWQ4_K>(w, ids, n, out, s);
    case kWQ5_K:
      return GetRowsT<kWQ5_K>(w, ids, n, out, s);
    case kWQ6_K:
      return GetRowsT<kWQ6_K>(w, ids, n, out, s);
    default:
      return cudaErrorInvalidValue;
  }
}

}  // namespace kvasir::cuda
