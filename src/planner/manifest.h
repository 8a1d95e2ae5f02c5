// The rank manifest: the plan a ring is started from. It names the model (identity, where to get
// it), the context the KV caches were sized for, and for each rank its device, its window of layers
// and the tensors that window needs. Written by `kvasir plan`; read by whoever starts or fetches a
// rank, which validates it before use. JSON schema in docs/MANIFEST.md.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "planner/model_cost.h"
#include "planner/solver.h"

namespace kvasir {

inline constexpr int kManifestVersion = 1;

struct ManifestTensor {
  std::string name;
  // SHA-256 of the tensor's bytes, 64 hex digits (kvasir plan writes lower case; absent with
  // --no-hash). See planner/tensor_hash.h.
  std::optional<std::string> sha256;
};

struct ManifestRank {
  int rank = 0;
  std::string device;
  // Where the rank's stage runs, as --backend takes it (absent in a manifest: "cpu").
  std::string backend = "cpu";
  int first = 0, last = 0;  // layers [first, last)
  bool has_embed = false, has_head = false;
  uint64_t weight_bytes = 0;
  uint64_t kv_bytes = 0;  // at the manifest's ctx
  double ms_per_token = 0;
  std::vector<ManifestTensor> tensors;
  // The Ed25519 public key (64 hex digits) of the node that serves this rank; its neighbours
  // accept only that node on their links. Absent: the ring secret authenticates the rank.
  std::optional<std::string> node_key;
};

struct Manifest {
  int version = kManifestVersion;
  std::string model_id;  // 32 hex digits (ComputeModelId)
  std::string model;     // path or URL of the GGUF file
  int n_layer = 0;
  int ctx = 0;
  std::vector<std::string> ring;  // device names in ring order (== ranks[i].device)
  std::vector<ManifestRank> ranks;
  double ms_per_token = 0;  // estimated, whole ring
};

// A manifest for `plan` of the model whose cost is `cost`.
Manifest BuildManifest(const ModelCost &cost, const Plan &plan, std::string model_id_hex,
                       std::string model);

// Checks every constraint a ring relies on: version, 32-hex model id, n_layer and ctx positive,
// ranks numbered 0..n-1 in order, windows non-empty, contiguous and covering [0, n_layer),
// has_embed exactly on the rank with layer 0 and has_head on the one ending at n_layer, ring
// matching the ranks' devices, device names unique, backends in --backend syntax, sha256 and
// node_key (when present) 64 hex digits.
Status ValidateManifest(const Manifest &m);

// Sets node_key of each rank whose device `keys` (device name -> 64 hex digits) names; devices
// without a rank are skipped. Errors name a key that is not 64 hex digits.
Status SetManifestKeys(Manifest *m, const nlohmann::json &keys, const std::string &name);

nlohmann::json ManifestToJson(const Manifest &m);
// Parses and validates. Errors start with `name`: "manifest.json: rank 2: layers [5, 9) overlap
// rank 1's [3, 6)".
Result<Manifest> ManifestFromJson(const nlohmann::json &j, const std::string &name);
Result<Manifest> ParseManifest(std::string_view text, const std::string &name);
// Reads and validates a manifest file; errors name the path.
Result<Manifest> LoadManifest(const std::string &path);

}  // namespace kvasir
