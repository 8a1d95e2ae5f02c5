// Per-tensor type choice of a GGUF file type (general.file_type): a Q4_K_M file is not all Q4_K.
// The rules are the ones llama.cpp's quantizer applies to dense llama-family models, so a file
// written with a mix has the tensor types a user would download.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "gguf/tensor_type.h"

namespace kvasir {

enum class FileMix {
  kF32, kF16, kBF16, kQ8_0, kQ4_0, kQ4_1, kQ5_0, kQ5_1,
  kQ2_K, kQ3_K_S, kQ3_K_M, kQ3_K_L, kQ4_K_S, kQ4_K_M, kQ5_K_S, kQ5_K_M, kQ6_K,
};

struct FileMixInfo {
  FileMix mix;
  std::string_view name;  // "q4_k_m", as llama-quantize spells it
  uint32_t file_type;     // general.file_type (llama_ftype)
  TensorType base;        // the type of every matrix no rule changes
};

// Looks a mix up by name, case-insensitive ("Q4_K_M", "q8_0", "f16").
std::optional<FileMixInfo> FileMixFromName(std::string_view name);
const FileMixInfo& GetFileMixInfo(FileMix mix);
// "f32, f16, bf16, q8_0, ..." for messages.
std::string FileMixNames();

// What the rules look at for one tensor.
struct MixTensor {
  std::string_view name;  // GGUF tensor name, e.g. "blk.3.attn_v.weight"
  uint64_t row_len = 0;   // ne[0]
  int n_dims = 2;         // vectors (norms, biases) keep f32
  int n_layer = 0;        // layers of the model
  int n_gqa = 1;          // head_count / head_count_kv
  bool tied = false;      // token_embd.weight doubles as the output matrix
  bool class_70b = false;  // llama.cpp's "70B" model class: attn_v gets q5_k over q3_k/q4_k
};

// The type `tensor` gets in a file of `mix`. Rows that are not a whole number of the chosen type's
// blocks fall back as llama.cpp does (q4_k -> q5_0, q5_k -> q5_1, q6_k -> q8_0, q2_k/q3_k -> q4_0,
// then f16).
TensorType ChooseTensorType(FileMix mix, const MixTensor& tensor);

}  // namespace kvasir
