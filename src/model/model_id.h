// Model identity: 16 bytes that name a model independent of how it is stored, so a full GGUF and a
// stage slice cut from it agree. Stages compare identities in HELLO before linking.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "gguf/gguf_file.h"

namespace kvasir {

using ModelId = std::array<uint8_t, 16>;

// The first 16 bytes of SHA-256 over a canonical serialization of the metadata (every key except
// those under "kvasir.", with type and value) and the full tensor index (name, type and shape of
// each tensor, in file order; offsets excluded). A file that carries "kvasir.model_id" (a stage
// slice: 32 hex digits of its parent's identity) returns that instead.
Result<ModelId> ComputeModelId(const GgufHeader& header, const std::string& name);

std::string ModelIdHex(const ModelId& id);

}  // namespace kvasir
