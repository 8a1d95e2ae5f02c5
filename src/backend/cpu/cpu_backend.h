// The CPU backend: src/kernels on a thread pool, over host memory. Weights stay in the file's
// mapping (the kernels read the GGUF layout directly), so a window's pages become resident only as
// they are used. The only header of this folder that the registry includes.
#pragma once

#include "backend/registry.h"

namespace kvasir::cpu {

// This backend's row in backend/registry.cpp: "cpu", one device (this machine).
const BackendRegistration* Registration();

}  // namespace kvasir::cpu
