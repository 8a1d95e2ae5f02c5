// The OpenCL backend: OpenCL 1.2 kernels (kernels/*.cl, embedded) on any device with an OpenCL
// driver: PoCL on a CPU (where it is verified), desktop GPUs, phone GPUs (Adreno, Mali). The only
// header of this folder that the registry includes; docs/BACKENDS.md describes the backend.
#pragma once

#include "backend/registry.h"

namespace kvasir::opencl {

// This backend's row in backend/registry.cpp: "opencl", devices opencl:PLATFORM:DEVICE.
const BackendRegistration* Registration();

}  // namespace kvasir::opencl
