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

// GPT-2's byte-level character for byte `b`, as UTF-8 (written out here rather than taken from
// the code under test): printable Latin-1 bytes stand for themselves, the other 68 take U+0100..
// in byte order.
inline std::string ByteLevelChar(uint8_t b) {
  const auto itself = [](uint32_t c) {
    return (c >= 0x21 && c <= 0x7E) || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
  };
  uint32_t cp = b;
  if (!itself(b)) {
    cp = 0x100;
    for (uint32_t c = 0; c < b; ++c) cp += itself(c) ? 0 : 1;
  }
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  return {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
}

// `text` with every byte replaced by its byte-level character (" ab" -> "Ġab").
inline std::string ByteLevel(const std::string& text) {
  std::string out;
  for (char c : text) out += ByteLevelChar(static_cast<uint8_t>(c));
  return out;
}

// A byte-level BPE vocabulary: the 256 byte characters (id = byte), then `extra`.
inline std::vector<VocabEntry> BpeByteVocab(const std::vector<VocabEntry>& extra = {}) {
  std::vector<VocabEntry> v;
  for (int b = 0; b < 256; ++b) v.push_back({ByteLevelChar(static_cast<uint8_t>(b))});
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

// A `gpt2` vocabulary header with `merges` ("A B", byte-level text) and tokenizer.ggml.pre =
// `pre` (none when empty).
inline GgufHeader MakeBpeHeader(const std::vector<VocabEntry>& entries,
                                std::vector<std::string> merges, const std::string& pre = "gpt-2") {
  GgufHeader h = MakeVocabHeader(entries, "gpt2");
  RemoveKv(&h, "tokenizer.ggml.scores");
  SetKv(&h, "tokenizer.ggml.merges", ArrayValue(GgufType::kString, std::move(merges)));
  if (!pre.empty()) SetKv(&h, "tokenizer.ggml.pre", GgufValue::String(pre));
  return h;
}

}  // namespace kvasir::testing
