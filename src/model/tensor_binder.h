// TensorBinder: finds a window's tensors in a GGUF file, checks presence, shape and type, and hands
// out views of the mapped bytes. Small vectors stored in other types than f32 (or misaligned) are
// converted to f32 copies that the binder owns until TakeOwned().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "kernels/kernels.h"

namespace kvasir {

class TensorBinder {
 public:
  // Adds the bytes of every tensor bound to *bytes.
  TensorBinder(const GgufFile& file, uint64_t* bytes) : file_(file), bytes_(bytes) {}

  // A [rows, cols] matrix (GGUF shape [cols, rows]; a one-row matrix may be stored as a vector).
  Result<MatrixView> Matrix(const std::string& name, int64_t cols, int64_t rows);
  // The n_expert matrices [rows, cols] of a stacked expert tensor (GGUF shape [cols, rows, n]).
  Result<std::vector<MatrixView>> Experts(const std::string& name, int64_t cols, int64_t rows,
                                          int64_t n_expert);
  // A vector of n values as f32 (GGUF shape [n], or [n, 1]).
  Result<const float*> Vector(const std::string& name, int64_t n);
  // A [rows, cols] f32 array stored row-major (GGUF shape [cols, rows]), e.g. conv taps.
  Result<const float*> Array2d(const std::string& name, int64_t cols, int64_t rows);

  std::vector<std::vector<float>> TakeOwned() { return std::move(owned_); }

 private:
  Result<const GgufTensorInfo*> Find(const std::string& name);
  Status CheckType(const std::string& name, const GgufTensorInfo& t);
  Result<const float*> AsF32(const std::string& name, const GgufTensorInfo& t, int64_t n);

  const GgufFile& file_;
  uint64_t* bytes_;
  std::vector<std::vector<float>> owned_;
};

}  // namespace kvasir
