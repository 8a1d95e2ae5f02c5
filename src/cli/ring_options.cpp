#include "cli/ring_options.h"

#include <cstdlib>

#include "base/log.h"
#include "gguf/gguf_file.h"
#include "model/model_id.h"

namespace kvasir::cli {

Status ParseLayers(const std::string& text, int* first, int* last) {
  const size_t colon = text.find(':');
  auto parse = [](const std::string& s, int* out) {
    if (s.empty() || s.size() > 6) return false;
    for (char c : s) {
      if (c < '0' || c > '9') return false;
    }
    *out = std::atoi(s.c_str());
    return true;
  };
  if (colon == std::string::npos || !parse(text.substr(0, colon), first) ||
      !parse(text.substr(colon + 1), last)) {
    return Error("--layers '{}' is not A:B (for example 0:4)", text);
  }
  if (*first >= *last) return Error("--layers {}: the window is empty (need A < B)", text);
  return Status::Ok();
}

Status ParseBoundary(const std::string& text, wire::Dtype* dtype) {
  if (text == "f32") {
    *dtype = wire::Dtype::kF32;
  } else if (text == "f16") {
    *dtype = wire::Dtype::kF16;
  } else if (text == "bf16") {
    *dtype = wire::Dtype::kBF16;
  } else {
    return Error("--boundary '{}' is not one of f32, f16, bf16", text);
  }
  return Status::Ok();
}

Result<Manifest> LoadManifestFor(const std::string& manifest_path, std::string* model_path) {
  KV_ASSIGN_OR_RETURN(Manifest m, LoadManifest(manifest_path));
  if (model_path->empty()) *model_path = m.model;
  KV_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(*model_path));
  KV_ASSIGN_OR_RETURN(ModelId id, ComputeModelId(file.header(), *model_path));
  if (ModelIdHex(id) != m.model_id) {
    return Error("{}: model {} is not the model {} was planned for ({})", *model_path,
                 ModelIdHex(id), manifest_path, m.model_id);
  }
  return m;
}

Result<ManifestRank> ManifestRankFor(const std::string& manifest_path, int rank, Manifest* manifest,
                                     bool* usage_error) {
  *usage_error = false;
  KV_ASSIGN_OR_RETURN(*manifest, LoadManifest(manifest_path));
  if (rank < 0 || rank >= static_cast<int>(manifest->ranks.size())) {
    *usage_error = true;
    return Error("--rank {} is not a rank of {} (0..{})", rank, manifest_path,
                 manifest->ranks.size() - 1);
  }
  return manifest->ranks[rank];
}

Status ApplyLogLevel(const std::string& text) {
  if (text == "debug") {
    SetLogLevel(LogLevel::kDebug);
  } else if (text == "info") {
    SetLogLevel(LogLevel::kInfo);
  } else if (text == "warn") {
    SetLogLevel(LogLevel::kWarn);
  } else if (text == "error") {
    SetLogLevel(LogLevel::kError);
  } else {
    return Error("--log-level '{}' is not one of debug, info, warn, error", text);
  }
  return Status::Ok();
}

}  // namespace kvasir::cli
