// Per-tensor SHA-256 for the rank manifest: a fetcher checks each tensor it downloads against the
// digest the planner wrote. Reads tensor bytes through the file's mapping, so hashing a model
// makes its pages resident in the page cache (not in the process's anonymous memory).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "planner/manifest.h"

namespace kvasir {

// Called with the bytes hashed so far and the bytes to hash in all, after every piece of at most
// kHashPieceBytes (so it runs often even inside one huge tensor), and once at the end with done ==
// total. Runs on the calling thread.
using HashProgressFn = std::function<void(uint64_t done_bytes, uint64_t total_bytes)>;
inline constexpr uint64_t kHashPieceBytes = uint64_t{16} << 20;

// SHA-256 of the bytes of each named tensor of `file`, as 64 lower-case hex digits, keyed by name.
// A name listed twice is hashed once. Errors name the file and the tensor ("m.gguf: tensor
// 'blk.9.attn_q.weight' is not in the file").
Result<std::map<std::string, std::string>> HashTensors(const GgufFile &file,
                                                       std::span<const std::string> names,
                                                       const HashProgressFn &progress = {});

// The names of every tensor of every rank of `m`, each once, in rank order.
std::vector<std::string> ManifestTensorNames(const Manifest &m);

// Sets sha256 of every tensor of `m` from `hashes`. Errors name a tensor that has no hash.
Status SetManifestHashes(Manifest *m, const std::map<std::string, std::string> &hashes);

}  // namespace kvasir
