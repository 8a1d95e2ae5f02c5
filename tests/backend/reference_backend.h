// A second backend for the tests: every op as a plain scalar loop (double sums where they matter),
// over the scalar reference kernels of kernels_ref.h, in memory of its own. It copies each weight
// matrix into that memory at upload, so a window that runs on it reads no weight from the file's
// mapping. It judges the CPU backend in the op-by-op test, and lets the window tests refuse types
// and ops, run out of memory, and count what crosses between host and device.
#pragma once

#include <cstdint>
#include <memory>
#include <set>

#include "backend/backend.h"

namespace kvasir::testing {

struct ReferenceOptions {
  std::set<TensorType> refuse_types;          // weight types it claims not to run
  std::set<Op> refuse_ops;                    // ops it claims not to run
  uint64_t memory_bytes = uint64_t{1} << 40;  // its "device" memory
};

// What crossed between host and device: elements passed to Upload and Download.
struct TransferCounts {
  int64_t uploaded = 0;
  int64_t downloaded = 0;
};

// `counts` (may be null) is updated by every Upload and Download.
std::unique_ptr<Backend> MakeReferenceBackend(const ReferenceOptions& options = {},
                                              TransferCounts* counts = nullptr);

}  // namespace kvasir::testing
