#include "backend/cuda/cuda_weights.h"

#include <cstring>

#include "base/check.h"

namespace kvasir::cuda {
namespace {

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

bool CudaSupportsType(TensorType type) {
  for (TensorType t : CudaTypes()) {
    if (t == type) return true;
  }
  return false;
}

std::vector<TensorType> CudaTypes() {
  return {TensorType::kF32,  TensorType::kF16,  TensorType::kBF16, TensorType::kQ8_0,
          TensorType::kQ4_0, TensorType::kQ4_1, TensorType::kQ5_0, TensorType::kQ5_1,
          TensorType::kQ4_K, TensorType::kQ5_K, TensorType::kQ6_K};
}

DeviceLayout LayoutOf(TensorType type, int64_t rows, int64_t cols) {
  KV_CHECK(CudaSupportsType(type), "cuda LayoutOf: type {}", static_cast<uint32_t>(type));
  KV_CHECK(cols % BlockValues(type) == 0, "cuda LayoutOf: {} columns", cols);
  const int t = static_cast<int>(type);
  DeviceLayout l;
  if (IsFloatType(t)) {
    l.row_bytes = type == TensorType::kF32 ? RoundUp(cols, 4) * 4 : RoundUp(cols, 8) * 2;
  } else if (IsSplitType(t)) {
    const int64_t nb = cols / 32;
    l.row_bytes = nb * QsBytes(t);
    l.heads = RoundUp(rows * l.row_bytes, 256);
    l.bytes = RoundUp(l.heads + rows * nb * HeadBytes(t), 256);
    return l;
  } else {
    const int64_t block = type == TensorType::kQ4_K   ? 144
                          : type == TensorType::kQ5_K ? 176
                                                      : kQ6KDeviceBlock;
    l.row_bytes = cols / 256 * block;
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
      case TensorType::kBF16:
        std::memcpy(out, row, static_cast<size_t>(src.cols) * 2);
        break;
      case TensorType::kQ8_0:
      case TensorType::kQ4_0:
      case TensorType::kQ4_1:
      case TensorType::kQ5_0:
      case TensorType::kQ5_1: {
        // Blocks of [head | quants] split into the quant rows and the head array.
        const int t = static_cast<int>(src.type);
        const int64_t qs = QsBytes(t), head = HeadBytes(t);
        uint8_t* heads = dst + l.heads + r * nb * head;
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* blk = row + b * (head + qs);
          std::memcpy(heads + b * head, blk, static_cast<size_t>(head));
          std::memcpy(out + b * qs, blk + head, static_cast<size_t>(qs));
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
