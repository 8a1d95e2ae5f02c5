#include "backend/cuda/cuda_device.h"

#include <fmt/format.h>

#include "backend/cuda/cuda_weights.h"

#ifndef KVASIR_CUDA_MIN_ARCH
#define KVASIR_CUDA_MIN_ARCH 80
#endif

namespace kvasir::cuda {
namespace {

// The device's properties and memory. Asking for free memory creates the device's primary
// context, which opening the backend would do anyway.
Result<DeviceInfo> Describe(int index) {
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, index); e != cudaSuccess) {
    cudaGetLastError();
    return Error("cuda:{}: cannot read its properties: {}", index, CudaErrorText(e));
  }
  DeviceInfo d;
  d.address = fmt::format("cuda:{}", index);
  d.name = fmt::format("{} (sm_{}{}, {} SMs)", prop.name, prop.major, prop.minor,
                       prop.multiProcessorCount);
  d.memory_bytes = prop.totalGlobalMem;
  size_t free = 0, total = 0;
  if (cudaSetDevice(index) == cudaSuccess && cudaMemGetInfo(&free, &total) == cudaSuccess) {
    d.free_bytes = free;
  }
  cudaGetLastError();
  d.types = CudaTypes();
  return d;
}

}  // namespace

int MinComputeCapability() { return KVASIR_CUDA_MIN_ARCH; }

std::string CudaErrorText(cudaError_t e) {
  return fmt::format("{} ({})", cudaGetErrorString(e), cudaGetErrorName(e));
}

Result<std::vector<DeviceInfo>> ListDevices() {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return Error(StatusCode::kUnavailable, "no CUDA device: {}", cudaGetErrorString(e));
  }
  std::vector<DeviceInfo> out;
  for (int i = 0; i < count; ++i) {
    KV_ASSIGN_OR_RETURN(DeviceInfo d, Describe(i));
    out.push_back(std::move(d));
  }
  return out;
}

Result<DeviceInfo> CheckDevice(int index) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return Error(StatusCode::kUnavailable, "no CUDA device: {}", cudaGetErrorString(e));
  }
  if (index >= count) {
    return Error(StatusCode::kNotFound, "backend cuda:{}: this machine has {} CUDA device{}", index,
                 count, count == 1 ? " (cuda:0)" : fmt::format("s (cuda:0 .. cuda:{})", count - 1));
  }
  cudaDeviceProp prop{};
  if (cudaError_t e = cudaGetDeviceProperties(&prop, index); e != cudaSuccess) {
    cudaGetLastError();
    return Error("backend cuda:{}: cannot read its properties: {}", index, CudaErrorText(e));
  }
  if (prop.major * 10 + prop.minor < MinComputeCapability()) {
    return Error(
        "backend cuda:{} ({}, sm_{}{}): this kvasir's CUDA kernels run on sm_{} and "
        "newer (configure with -DCMAKE_CUDA_ARCHITECTURES={}{} to add it)",
        index, prop.name, prop.major, prop.minor, MinComputeCapability(), prop.major, prop.minor);
  }
  return Describe(index);
}

}  // namespace kvasir::cuda
