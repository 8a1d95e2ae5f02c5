// Registering a model with the market (`kvasir market add-model`): its identity, per-tensor
// digests and the windows of each ring, planned for expected devices or split evenly.
#pragma once

#include <string>

#include "base/status.h"
#include "market/store.h"
#include "planner/tensor_hash.h"

namespace kvasir::market {

struct ModelSpecOptions {
  std::string model_path;  // local GGUF (read for its header and hashed)
  std::string url;         // where stages fetch it
  std::string name;        // default: the file's stem
  int rings = 1;
  int windows = 0;           // even split into this many windows, or
  std::string devices_path;  // plan the windows for these devices (docs/MANIFEST.md)
  int ctx = 2048;
};

// Reads and hashes the model and cuts its rings. Errors name the file and the broken constraint
// (more windows than layers, fewer than 2 windows, a name the API would refuse).
Result<ModelSpec> BuildModelSpec(const ModelSpecOptions& options,
                                 const HashProgressFn& progress = {});

}  // namespace kvasir::market
