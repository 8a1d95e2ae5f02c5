// The machine's CUDA devices as `kvasir devices` lists them, and the checks before one is opened.
#pragma once

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"

namespace kvasir::cuda {

// The oldest compute capability this build's kernels run on (10 * major + minor), from
// CMAKE_CUDA_ARCHITECTURES.
int MinComputeCapability();

// Every CUDA device with its name, memory and weight types; an error "no CUDA device: <why>" when
// the runtime finds none (no driver, no device).
Result<std::vector<DeviceInfo>> ListDevices();

// Device `index`, checked: it exists, and this build's kernels run on it.
Result<DeviceInfo> CheckDevice(int index);

// "an illegal memory access was encountered (cudaErrorIllegalAddress)".
std::string CudaErrorText(cudaError_t e);

}  // namespace kvasir::cuda
