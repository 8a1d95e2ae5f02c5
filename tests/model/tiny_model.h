// Writes small random-weight llama GGUFs for model tests (no tokenizer; n_vocab from token_embd),
// and opens files and windows for them.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_value.h"
#include "gguf/tensor_type.h"
#include "model/layer_window.h"

namespace kvasir::testing {

struct TinyModelShape {
  int n_layer = 2;
  int n_embd = 64;
  int n_head = 4;
  int n_head_kv = 2;
  int n_ff = 128;
  int n_vocab = 96;
  int n_ctx = 64;
  TensorType type = TensorType::kF32;  // matrices; norms stay f32
  std::string arch = "llama";
  bool tied = false;
  uint64_t seed = 1;
  std::string vocab_from;  // copy tokenizer.* keys from this GGUF (n_vocab becomes its size)
  std::vector<std::pair<std::string, GgufValue>> extra_kvs;  // e.g. llama.rope.scaling.type
  std::vector<float> rope_freqs;  // written as rope_freqs.weight (f32) when not empty
};

// Writes the model to `path`.
Status WriteTinyModel(const std::string& path, const TinyModelShape& shape);

// The file at `path`, shared for windows; a failed open fails the test (and returns null).
std::shared_ptr<const GgufFile> OpenShared(const std::string& path);
// A window of `file` with a context of n_ctx; a refused load fails the test (and returns null).
std::unique_ptr<LayerWindow> LoadWindow(std::shared_ptr<const GgufFile> file, WindowSpec spec,
                                        int n_ctx, int n_threads);

}  // namespace kvasir::testing
