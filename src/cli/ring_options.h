// Parsing of the ring-related flags shared by `stage`, `run` and `generate --ring`.
#pragma once

#include <string>

#include "base/status.h"
#include "ring/wire.h"

namespace kvasir::cli {

// "A:B" with 0 <= A < B. The model's layer count is checked when the model is loaded.
Status ParseLayers(const std::string& text, int* first, int* last);
// "f32", "f16" or "bf16".
Status ParseBoundary(const std::string& text, wire::Dtype* dtype);
// "debug", "info", "warn" or "error".
Status ApplyLogLevel(const std::string& text);

}  // namespace kvasir::cli
