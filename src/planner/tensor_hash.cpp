#include "planner/tensor_hash.h"

#include <algorithm>
#include <set>
#include <vector>

#include "base/sha256.h"

namespace kvasir {

Result<std::map<std::string, std::string>> HashTensors(const GgufFile &file,
                                                       std::span<const std::string> names,
                                                       const HashProgressFn &progress) {
  // Resolve every name first, so a missing tensor is reported before any bytes are read.
  std::vector<const GgufTensorInfo *> todo;
  std::set<std::string_view> seen;
  uint64_t total = 0;
  for (const std::string &name : names) {
    if (!seen.insert(name).second) continue;
    const GgufTensorInfo *t = file.FindTensor(name);
    if (t == nullptr) return Error("{}: tensor '{}' is not in the file", file.path(), name);
    todo.push_back(t);
    total += t->n_bytes;
  }
  std::map<std::string, std::string> out;
  Sha256 hasher;
  uint64_t done = 0;
  for (const GgufTensorInfo *t : todo) {
    std::span<const uint8_t> bytes = file.TensorData(*t);
    for (uint64_t at = 0; at < bytes.size(); at += kHashPieceBytes) {
      const uint64_t n = std::min<uint64_t>(kHashPieceBytes, bytes.size() - at);
      hasher.Update(bytes.subspan(at, n));
      done += n;
      if (progress && done < total) progress(done, total);
    }
    out[t->name] = Sha256Hex(hasher.Finish());
  }
  if (progress) progress(total, total);
  return out;
}

std::vector<std::string> ManifestTensorNames(const Manifest &m) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  for (const ManifestRank &r : m.ranks) {
    for (const ManifestTensor &t : r.tensors) {
      if (seen.insert(t.name).second) names.push_back(t.name);
    }
  }
  return names;
}

Status SetManifestHashes(Manifest *m, const std::map<std::string, std::string> &hashes) {
  for (ManifestRank &r : m->ranks) {
    for (ManifestTensor &t : r.tensors) {
      auto it = hashes.find(t.name);
      if (it == hashes.end()) return Error("rank {}: tensor {} has no sha256", r.rank, t.name);
      t.sha256 = it->second;
    }
  }
  return Status::Ok();
}

}  // namespace kvasir
