#include "backend/cuda/cuda_queue.h"

#include <algorithm>
#include <cstring>

#include "backend/cuda/cuda_device.h"
#include "base/human.h"

namespace kvasir::cuda {

Result<CudaQueue*> CudaQueue::Open(int index, const DeviceInfo& device) {
  cudaStream_t stream = nullptr;
  cudaEvent_t staged = nullptr;
  cudaError_t e = cudaSetDevice(index);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&staged, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    if (stream != nullptr) cudaStreamDestroy(stream);
    cudaGetLastError();
    return Error("backend {} ({}): cannot start: {}", device.address, device.name,
                 CudaErrorText(e));
  }
  return new CudaQueue(index, device, stream, staged);
}

CudaQueue::~CudaQueue() {
  Use();
  cudaStreamSynchronize(stream_);
  if (staging_ != nullptr) cudaFreeHost(staging_);
  cudaEventDestroy(staged_);
  cudaStreamDestroy(stream_);
  cudaGetLastError();
}

Result<void*> CudaQueue::Alloc(uint64_t bytes, std::string_view what) {
  Use();
  void* p = nullptr;
  const cudaError_t e = cudaMalloc(&p, bytes);
  if (e == cudaSuccess) return p;
  cudaGetLastError();  // a failed allocation is not sticky
  size_t free = 0, total = 0;
  cudaMemGetInfo(&free, &total);
  cudaGetLastError();
  if (e == cudaErrorMemoryAllocation) {
    return Error(StatusCode::kTooLarge,
                 "backend {} ({}): cannot allocate {} for {} ({} free of {})", address_, name_,
                 HumanBytes(bytes), what, HumanBytes(free), HumanBytes(total));
  }
  return Error("backend {} ({}): cannot allocate {} for {}: {}", address_, name_, HumanBytes(bytes),
               what, CudaErrorText(e));
}

void CudaQueue::Free(void* p) {
  if (p == nullptr) return;
  Use();
  Record(cudaStreamSynchronize(stream_), "running the queued ops");
  Record(cudaFree(p), "freeing device memory");
}

uint8_t* CudaQueue::Grow(Scratch& s, size_t bytes, std::string_view what) {
  if (s.bytes >= bytes) return static_cast<uint8_t*>(s.ptr);
  const size_t want = std::max(bytes, s.bytes * 2);  // geometric, so growth is rare
  Free(s.ptr);
  s = Scratch();
  auto p = Alloc(want, what);
  if (!p.ok()) {
    if (error_.ok()) error_ = p.status();
    return nullptr;
  }
  s.ptr = *p;
  s.bytes = want;
  return static_cast<uint8_t*>(s.ptr);
}

void CudaQueue::CopyIn(void* dst, const void* src, size_t bytes, std::string_view what) {
  Use();
  // The staging buffer is reused once the copy out of it before has run.
  Record(cudaEventSynchronize(staged_), what);
  if (staging_bytes_ < bytes) {
    if (staging_ != nullptr) cudaFreeHost(staging_);
    staging_ = nullptr;
    const size_t want = std::max({bytes, staging_bytes_ * 2, size_t{1} << 16});
    staging_bytes_ = 0;
    if (cudaMallocHost(&staging_, want) == cudaSuccess) {
      staging_bytes_ = want;
    } else {
      cudaGetLastError();
      staging_ = nullptr;
    }
  }
  if (staging_ == nullptr) return CopyInNow(dst, src, bytes, what);  // no pinned memory
  std::memcpy(staging_, src, bytes);
  Record(cudaMemcpyAsync(dst, staging_, bytes, cudaMemcpyHostToDevice, stream_), what);
  Record(cudaEventRecord(staged_, stream_), what);
}

void CudaQueue::CopyInNow(void* dst, const void* src, size_t bytes, std::string_view what) {
  Use();
  Record(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_), what);
  Record(cudaStreamSynchronize(stream_), what);
}

void CudaQueue::Record(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();
  if (error_.ok()) {
    error_ = Error(StatusCode::kUnavailable, "backend {} ({}): {}: {}", address_, name_, what,
                   CudaErrorText(e));
  }
}

Status CudaQueue::Finish() {
  Use();
  Record(cudaStreamSynchronize(stream_), "running the queued ops");
  Status s = error_;
  error_ = Status::Ok();
  return s;
}

}  // namespace kvasir::cuda
