// One CUDA device as the backend drives it: its stream (every op is queued there, in call order),
// device memory with errors that name the sizes, the first error of queued work (kept until the
// next Finish), grow-only scratch, and pinned host staging so that an upload neither waits for the
// queue nor keeps the caller's memory. Used from one thread at a time; every call first makes the
// device current for that thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "backend/backend.h"
#include "base/status.h"

namespace kvasir::cuda {

// Device memory a backend keeps for its own ops, grown when a call needs more.
struct Scratch {
  void* ptr = nullptr;
  size_t bytes = 0;
};

class CudaQueue {
 public:
  // Opens device `index` (its stream and staging event); `device` names it in messages.
  static Result<CudaQueue*> Open(int index, const DeviceInfo& device);
  ~CudaQueue();
  CudaQueue(const CudaQueue&) = delete;
  CudaQueue& operator=(const CudaQueue&) = delete;

  cudaStream_t stream() const { return stream_; }
  // Makes the device current for this thread (the runtime's current device is per thread).
  void Use() const { cudaSetDevice(index_); }

  // `bytes` of device memory, or an error naming `what`, the size and the device's free memory.
  Result<void*> Alloc(uint64_t bytes, std::string_view what);
  // Frees p once every queued op is done (one may still read it).
  void Free(void* p);
  // At least `bytes` of s (grown geometrically), or null with the error recorded.
  uint8_t* Grow(Scratch& s, size_t bytes, std::string_view what);

  // Queues dst[0, bytes) = src[0, bytes) from host memory through the pinned staging buffer;
  // src may be reused at once. For the small copies of every batch (its input rows, positions).
  void CopyIn(void* dst, const void* src, size_t bytes, std::string_view what);
  // The same for large one-off copies (weights at load): straight from src, waited for.
  void CopyInNow(void* dst, const void* src, size_t bytes, std::string_view what);

  // Keeps the first failure; `what` names the op.
  void Record(cudaError_t e, std::string_view what);
  bool failed() const { return !error_.ok(); }
  // Waits for the queue; the first error since the last Finish, which it clears.
  Status Finish();

 private:
  CudaQueue(int index, const DeviceInfo& device, cudaStream_t stream, cudaEvent_t staged)
      : index_(index),
        address_(device.address),
        name_(device.name),
        stream_(stream),
        staged_(staged) {}

  int index_;
  std::string address_, name_;  // for messages
  cudaStream_t stream_;
  cudaEvent_t staged_;       // recorded after the last copy out of the staging buffer
  void* staging_ = nullptr;  // pinned host memory
  size_t staging_bytes_ = 0;
  Status error_;
};

}  // namespace kvasir::cuda
