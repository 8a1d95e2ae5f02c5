#include "model/quant_mix.h"

#include <algorithm>
#include <cctype>

#include "model/arch/registry.h"

namespace kvasir {
namespace {

using T = TensorType;

constexpr FileMixInfo kMixes[] = {
    {FileMix::kF32, "f32", 0, T::kF32},        {FileMix::kF16, "f16", 1, T::kF16},
    {FileMix::kBF16, "bf16", 32, T::kBF16},    {FileMix::kQ8_0, "q8_0", 7, T::kQ8_0},
    {FileMix::kQ4_0, "q4_0", 2, T::kQ4_0},     {FileMix::kQ4_1, "q4_1", 3, T::kQ4_1},
    {FileMix::kQ5_0, "q5_0", 8, T::kQ5_0},     {FileMix::kQ5_1, "q5_1", 9, T::kQ5_1},
    {FileMix::kQ2_K, "q2_k", 10, T::kQ2_K},    {FileMix::kQ3_K_S, "q3_k_s", 11, T::kQ3_K},
    {FileMix::kQ3_K_M, "q3_k_m", 12, T::kQ3_K}, {FileMix::kQ3_K_L, "q3_k_l", 13, T::kQ3_K},
    {FileMix::kQ4_K_S, "q4_k_s", 14, T::kQ4_K}, {FileMix::kQ4_K_M, "q4_k_m", 15, T::kQ4_K},
    {FileMix::kQ5_K_S, "q5_k_s", 16, T::kQ5_K}, {FileMix::kQ5_K_M, "q5_k_m", 17, T::kQ5_K},
    {FileMix::kQ6_K, "q6_k", 18, T::kQ6_K},
};

enum class Role { kOther, kTokenEmbd, kOutput, kAttnQ, kAttnK, kAttnV, kAttnOut, kAttnQkv, kFfnDown };

Role RoleOf(std::string_view name) {
  if (name == "token_embd.weight") return Role::kTokenEmbd;
  if (name == "output.weight") return Role::kOutput;
  auto ends = [&](std::string_view suffix) {
    return name.size() >= suffix.size() && name.substr(name.size() - suffix.size()) == suffix;
  };
  if (ends(".attn_q.weight")) return Role::kAttnQ;
  if (ends(".attn_k.weight")) return Role::kAttnK;
  if (ends(".attn_v.weight")) return Role::kAttnV;
  if (ends(".attn_output.weight")) return Role::kAttnOut;
  if (ends(".attn_qkv.weight")) return Role::kAttnQkv;
  // The experts' and the shared expert's down projections count as ffn_down, as llama.cpp's
  // quantizer matches them by name.
  if (ends(".ffn_down.weight") || ends(".ffn_down_exps.weight") || ends(".ffn_down_shexp.weight")) {
    return Role::kFfnDown;
  }
  return Role::kOther;
}

bool IsQuantized(T t) { return t != T::kF32 && t != T::kF16 && t != T::kBF16; }

// The layers that get more bits in the K mixes: the first and last eighth, and every third layer
// in between.
bool UseMoreBits(int i, int n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

uint32_t BlockElems(T t) {
  auto info = GetTensorTypeInfo(static_cast<uint32_t>(t));
  return info ? info->block_elems : 1;
}

T Fallback(T chosen, uint64_t row_len) {
  if (row_len % BlockElems(chosen) == 0) return chosen;
  T next = T::kF16;
  switch (chosen) {
    case T::kQ2_K:
    case T::kQ3_K:
      next = T::kQ4_0;
      break;
    case T::kQ4_K:
      next = T::kQ5_0;
      break;
    case T::kQ5_K:
      next = T::kQ5_1;
      break;
    case T::kQ6_K:
      next = T::kQ8_0;
      break;
    default:
      break;
  }
  return row_len % BlockElems(next) == 0 ? next : T::kF16;
}

}  // namespace

std::optional<FileMixInfo> FileMixFromName(std::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  for (const FileMixInfo& m : kMixes) {
    if (m.name == lower) return m;
  }
  return std::nullopt;
}

const FileMixInfo& GetFileMixInfo(FileMix mix) {
  for (const FileMixInfo& m : kMixes) {
    if (m.mix == mix) return m;
  }
  return kMixes[0];
}

std::string FileMixNames() {
  std::string out;
  for (const FileMixInfo& m : kMixes) {
    if (!out.empty()) out += ", ";
    out += m.name;
  }
  return out;
}

TensorType ChooseTensorType(FileMix mix, const MixTensor& t) {
  const FileMixInfo& info = GetFileMixInfo(mix);
  if (t.n_dims < 2) return T::kF32;
  T type = info.base;
  if (!IsQuantized(type)) return type;
  const Role role = RoleOf(t.name);
  const int layer = LayerOfTensorName(t.name);
  const int n = t.n_layer;
  using M = FileMix;
  if (role == Role::kOutput || (role == Role::kTokenEmbd && t.tied)) {
    // The output matrix gets q6_k in every quantized mix but q8_0.
    if (t.row_len % BlockElems(type) != 0) return Fallback(T::kQ8_0, t.row_len);
    return Fallback(type == T::kQ8_0 ? T::kQ8_0 : T::kQ6_K, t.row_len);
  }
  if (role == Role::kAttnV && layer >= 0) {
    if (mix == M::kQ2_K) {
      type = t.n_gqa >= 4 ? T::kQ4_K : T::kQ3_K;
    } else if (mix == M::kQ3_K_M) {
      type = layer < 2 ? T::kQ5_K : T::kQ4_K;
    } else if (mix == M::kQ3_K_L) {
      type = T::kQ5_K;
    } else if ((mix == M::kQ4_K_M || mix == M::kQ5_K_M) && UseMoreBits(layer, n)) {
      type = T::kQ6_K;
    } else if (mix == M::kQ4_K_S && layer < 4) {
      type = T::kQ5_K;
    }
    // Its attn_v is 8x smaller than attn_q (8 query heads per KV head): more bits cost little.
    if (t.class_70b && (type == T::kQ3_K || type == T::kQ4_K)) type = T::kQ5_K;
  } else if (role == Role::kFfnDown && layer >= 0) {
    if (mix == M::kQ2_K) {
      type = T::kQ3_K;
    } else if (mix == M::kQ3_K_M) {
      type = layer < n / 16 ? T::kQ5_K : T::kQ4_K;
    } else if (mix == M::kQ3_K_L) {
      type = T::kQ5_K;
    } else if ((mix == M::kQ4_K_M || mix == M::kQ5_K_M) && UseMoreBits(layer, n)) {
      type = T::kQ6_K;
    } else if (mix == M::kQ4_K_S && layer < n / 8) {
      type = T::kQ5_K;
    }
  } else if (role == Role::kAttnQkv) {
    if (mix == M::kQ3_K_M || mix == M::kQ3_K_L) {
      type = T::kQ4_K;
    } else if (mix == M::kQ4_K_M) {
      type = T::kQ5_K;
    } else if (mix == M::kQ5_K_M) {
      type = T::kQ6_K;
    }
  } else if (role == Role::kAttnOut) {
    if (mix == M::kQ2_K) {
      type = T::kQ3_K;
    } else if (mix == M::kQ3_K_M) {
      type = T::kQ4_K;
    } else if (mix == M::kQ3_K_L) {
      type = T::kQ5_K;
    }
  }
  return Fallback(type, t.row_len);
}

}  // namespace kvasir
