// TensorBinder: finds a window's tensors in a GGUF file, checks presence, shape and type, and
// uploads them to the window's backend: matrices as they are (the backend picks its layout; a type
// it cannot multiply is refused naming the tensor, its type and the backend), small vectors as f32
// (converted on the host when stored otherwise). The uploads are owned by a WindowWeights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"
#include "gguf/gguf_file.h"

namespace kvasir {

// What a window's weights hold in its backend (and the few values the host keeps).
struct WindowWeights {
  std::vector<std::unique_ptr<DeviceMatrix>> matrices;
  std::vector<std::unique_ptr<DeviceBuffer>> vectors;
  std::vector<std::vector<float>> host;  // f32 copies of host-side vectors (rope_freqs)
  uint64_t device_bytes = 0;             // backend memory the uploads take
};

class TensorBinder {
 public:
  // Adds the file bytes of every tensor bound to *bytes; uploads go to `backend`, owned by *out.
  TensorBinder(const GgufFile& file, Backend& backend, uint64_t* bytes, WindowWeights* out)
      : file_(file), backend_(backend), bytes_(bytes), out_(out) {}

  // A [rows, cols] matrix (GGUF shape [cols, rows]; a one-row matrix may be stored as a vector).
  Result<const DeviceMatrix*> Matrix(const std::string& name, int64_t cols, int64_t rows);
  // The stack of n_expert matrices [rows, cols] of an expert tensor (GGUF shape [cols, rows, n]).
  Result<const DeviceMatrix*> Experts(const std::string& name, int64_t cols, int64_t rows,
                                      int64_t n_expert);
  // A vector of n values as f32 in the backend (GGUF shape [n], or [n, 1]).
  Result<DevPtr> Vector(const std::string& name, int64_t n);
  // A [rows, cols] array stored row-major (GGUF shape [cols, rows]) as f32, e.g. conv taps.
  Result<DevPtr> Array2d(const std::string& name, int64_t cols, int64_t rows);
  // A vector of n values as f32 on the host, for what the host itself reads (rope_freqs).
  Result<const float*> HostVector(const std::string& name, int64_t n);

 private:
  Result<const GgufTensorInfo*> Find(const std::string& name);
  Status CheckType(const std::string& name, const GgufTensorInfo& t, bool for_backend);
  Result<const DeviceMatrix*> Upload(HostMatrix m);
  Result<const float*> AsF32(const std::string& name, const GgufTensorInfo& t, int64_t n);
  Result<DevPtr> UploadF32(const std::string& name, const float* values, int64_t n);

  const GgufFile& file_;
  Backend& backend_;
  uint64_t* bytes_;
  WindowWeights* out_;
};

}  // namespace kvasir
