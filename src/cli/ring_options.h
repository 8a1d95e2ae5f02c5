// Parsing of the ring-related flags shared by `stage`, `run` and `generate --ring`.
#pragma once

#include <string>

#include "base/status.h"
#include "planner/manifest.h"
#include "ring/wire.h"

namespace kvasir::cli {

// "A:B" with 0 <= A < B. The model's layer count is checked when the model is loaded.
Status ParseLayers(const std::string& text, int* first, int* last);
// "f32", "f16" or "bf16".
Status ParseBoundary(const std::string& text, wire::Dtype* dtype);
// Loads a rank manifest and checks that `model_path` (or, when empty, the manifest's own model) is
// the model it was planned for. Sets *model_path to the file to use.
Result<Manifest> LoadManifestFor(const std::string& manifest_path, std::string* model_path);

// Loads and validates a manifest and picks rank `rank` (a usage error when it has no such rank; the
// message names the flag and the valid range). *manifest gets the manifest.
Result<ManifestRank> ManifestRankFor(const std::string& manifest_path, int rank, Manifest* manifest,
                                     bool* usage_error);

// "debug", "info", "warn" or "error".
Status ApplyLogLevel(const std::string& text);

}  // namespace kvasir::cli
