// The CUDA backend: weights repacked once into device memory (cuda_blocks.h gives the layouts),
// each sequence's KV cache and DeltaNet state and a batch's activations in device memory, every op
// a kernel queued on one stream. Errors of queued work are kept and returned by the next Download
// or Finish. The CUDA runtime is linked statically, so a kvasir built with this backend starts on
// a machine without the driver; there `--backend cuda` says "no CUDA device: ..." and exits 1.
// The only header of this folder that the registry includes.
#pragma once

#include "backend/registry.h"

namespace kvasir::cuda {

// This backend's row in backend/registry.cpp: "cuda", one device per CUDA device (cuda:N).
const BackendRegistration* Registration();

}  // namespace kvasir::cuda
