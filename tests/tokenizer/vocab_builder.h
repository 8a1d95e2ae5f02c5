// Builds in-memory GGUF headers holding tokenizer metadata, for tokenizer tests.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_value.h"

namespace kvasir::testing {

template <typename T>
GgufValue ArrayValue(GgufType elem_type, std::vector<T> items) {
  GgufArray a;
  a.elem_type = elem_type;
  a.items = std::move(items);
  return GgufValue::Array(std::move(a));
}

// Sets `key` (replacing an existing value) in `header`.
inline void SetKv(GgufHeader* header, const std::string& key, GgufValue value) {
  for (GgufKv& kv : header->kvs) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  header->kvs.push_back({key, std::move(value)});
}

inline void RemoveKv(GgufHeader* header, const std::string& key) {
  std::erase_if(header->kvs, [&](const GgufKv& kv) { return kv.key == key; });
}

struct VocabEntry {
  std::string text;
  float score = 0.0f;
  int32_t type = 1;  // TokenAttr::kNormal
};

// An SPM vocabulary: <unk> <s> </s>, then (optionally) the 256 byte tokens <0x00>..<0xFF>, then
// `extra`. Ids: unk 0, bos 1, eos 2, bytes 3..258.
inline std::vector<VocabEntry> SpmBaseVocab(bool with_bytes) {
  std::vector<VocabEntry> v = {{"<unk>", 0.0f, 2}, {"<s>", 0.0f, 3}, {"</s>", 0.0f, 3}};
  if (with_bytes) {
    static const char kHex[] = "0123456789ABCDEF";
    for (int b = 0; b < 256; ++b) {
      v.push_back({std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">", 0.0f, 6});
    }
  }
  return v;
}

inline GgufHeader MakeVocabHeader(const std::vector<VocabEntry>& entries,
                                  const std::string& model = "llama") {
  std::vector<std::string> tokens;
  std::vector<float> scores;
  std::vector<int32_t> types;
  for (const VocabEntry& e : entries) {
    tokens.push_back(e.text);
    scores.push_back(e.score);
    types.push_back(e.type);
  }
  GgufHeader h;
  SetKv(&h, "general.architecture", GgufValue::String("llama"));
  SetKv(&h, "tokenizer.ggml.model", GgufValue::String(model));
  SetKv(&h, "tokenizer.ggml.tokens", ArrayValue(GgufType::kString, std::move(tokens)));
  SetKv(&h, "tokenizer.ggml.scores", ArrayValue(GgufType::kFloat32, std::move(scores)));
  SetKv(&h, "tokenizer.ggml.token_type", ArrayValue(GgufType::kInt32, std::move(types)));
  return h;
}

}  // namespace kvasir::testing
