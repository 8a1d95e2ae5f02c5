#include "backend/cuda/cuda_weights.h"

#include <cstring>

#include "base/check.h"

namespace kvasir::cuda {
namespace {

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

bool CudaSupportsType(TensorType type) {
  switch (type) {
    case TensorType::kF32:
    case TensorType::kF16:
    case TensorType::kQ4_0:
    case TensorType::kQ8_0:
    case TensorType::kQ4_K:
    case TensorType::kQ5_K:
    case TensorType::kQ6_K:
      return true;
    default:
      return false;
  }
}

std::vector<TensorType> CudaTypes() {
  return {TensorType::kF32,  TensorType::kF16,  TensorType::kQ4_0, TensorType::kQ8_0,
          TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K};
}

DeviceLayout LayoutOf(TensorType type, int64_t rows, int64_t cols) {
  KV_CHECK(CudaSupportsType(type), "cuda LayoutOf: type {}", static_cast<uint32_t>(type));
  DeviceLayout l;
  const int64_t nb = cols / 32, nsb = cols / 256;
  switch (type) {
    case TensorType::kF32:
      l.row_bytes = RoundUp(cols, 4) * 4;
      break;
    case TensorType::kF16:
      l.row_bytes = RoundUp(cols, 8) * 2;
      break;
    case TensorType::kQ8_0:
    case TensorType::kQ4_0:
      KV_CHECK(cols % 32 == 0, "cuda LayoutOf: {} columns", cols);
      l.row_bytes = nb * (type == TensorType::kQ8_0 ? 32 : 16);
      l.scales = RoundUp(rows * l.row_bytes, 256);
      l.bytes = RoundUp(l.scales + rows * nb * 2, 256);
      return l;
    case TensorType::kQ4_K:
    case TensorType::kQ5_K:
      KV_CHECK(cols % 256 == 0, "cuda LayoutOf: {} columns", cols);
      l.row_bytes = nsb * (type == TensorType::kQ4_K ? 144 : 176);
      break;
    case TensorType::kQ6_K:
      KV_CHECK(cols % 256 == 0, "cuda LayoutOf: {} columns", cols);
      l.row_bytes = nsb * kQ6KDeviceBlock;
      break;
    default:
      break;
  }
  l.bytes = RoundUp(rows * l.row_bytes, 256);
  return l;
}

void Repack(const MatrixView& src, const DeviceLayout& l, uint8_t* dst) {
  std::memset(dst, 0, static_cast<size_t>(l.bytes));
  const auto* in = static_cast<const uint8_t*>(src.data);
  const int64_t nb = src.cols / 32;
  for (int64_t r = 0; r < src.rows; ++r) {
    const uint8_t* row = in + static_cast<size_t>(r) * src.row_bytes;
    uint8_t* out = dst + r * l.row_bytes;
    switch (src.type) {
      case TensorType::kF32:
        std::memcpy(out, row, static_cast<size_t>(src.cols) * 4);
        break;
      case TensorType::kF16:
        std::memcpy(out, row, static_cast<size_t>(src.cols) * 2);
        break;
      case TensorType::kQ8_0:
      case TensorType::kQ4_0: {
        // Blocks of [d (2 bytes) | qs (32 or 16 bytes)] split into the qs rows and the d array.
        const int64_t qs = src.type == TensorType::kQ8_0 ? 32 : 16;
        uint8_t* d = dst + l.scales + r * nb * 2;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* blk = row + b * (2 + qs);
          std::memcpy(d + 2 * b, blk, 2);
          std::memcpy(out + b * qs, blk + 2, static_cast<size_t>(qs));
        }
        break;
      }
      case TensorType::kQ4_K:
      case TensorType::kQ5_K:
        std::memcpy(out, row, static_cast<size_t>(l.row_bytes));
        break;
      case TensorType::kQ6_K:
        for (int64_t b = 0; b < src.cols / 256; ++b) {
          std::memcpy(out + b * kQ6KDeviceBlock, row + b * sizeof(BlockQ6_K), sizeof(BlockQ6_K));
        }
        break;
      default:
        KV_CHECK(false, "cuda Repack: type {}", static_cast<uint32_t>(src.type));
    }
  }
}

}  // namespace kvasir::cuda
