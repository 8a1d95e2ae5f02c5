// kvasir synth: writes a random-weight GGUF model of a given shape, with the tokenizer of another
// GGUF file. Weights are generated row by row from a seed (the same seed gives the same bytes, for
// any thread count), quantized on a thread pool and streamed to the file, so memory stays at a few
// chunks whatever the model size.
#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <future>
#include <optional>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/thread_pool.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "gguf/gguf_writer.h"
#include "kernels/kernels.h"
#include "model/quant_mix.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "synth";
constexpr float kWeightStd = 0.02f;
// Bytes of quantized rows generated before each write.
constexpr uint64_t kChunkBytes = uint64_t{8} << 20;

// What distinguishes one architecture's file from another's, as data: key prefix, defaults, and
// which optional tensors each layer carries.
struct SynthArch {
  const char* name;
  float rope_base;
  float rms_eps;
  bool qkv_bias;  // attn_q/k/v.bias [q_dim], [kv_dim], [kv_dim]
  bool qk_norm;   // attn_q_norm/attn_k_norm.weight [head_dim]
  bool hybrid;    // qwen35: gated DeltaNet layers, gated attention every --attn-interval-th layer
  bool moe;       // routed experts plus a gated shared expert instead of the dense FFN
};

constexpr SynthArch kArchs[] = {
    {"llama", 10000.0f, 1e-5f, false, false, false, false},
    {"qwen2", 1000000.0f, 1e-6f, true, false, false, false},
    {"qwen3", 1000000.0f, 1e-6f, false, true, false, false},
    {"qwen35", 10000000.0f, 1e-6f, false, true, true, false},
    {"qwen35moe", 10000000.0f, 1e-6f, false, true, true, true},
};

struct SynthOptions {
  std::string arch = "llama";
  int n_layer = 0;
  int n_embd = 0;
  int n_head = 0;
  int n_head_kv = 0;  // 0: same as n_head
  int n_ff = 0;
  int head_dim = 0;  // attention.key_length; 0: n_embd / n_head
  int n_ctx = 2048;
  // qwen35 / qwen35moe.
  int n_rot = 0;  // rope.dimension_count; 0: the head size (a quarter of it for qwen35)
  std::vector<int> rope_sections;  // rope.dimension_sections; empty: [11, 11, 10, 0]
  int attn_interval = 4;           // full_attention_interval
  int ssm_conv = 4;                // ssm.conv_kernel
  int ssm_state = 0;               // ssm.state_size (key and value head size); 0: 128
  int ssm_groups = 0;              // ssm.group_count (key heads); 0: 16
  int ssm_v_heads = 0;             // ssm.time_step_rank (value heads); 0: 2 x key heads
  int n_expert = 0;                // expert_count
  int n_expert_used = 0;           // expert_used_count
  int expert_ff = 0;               // expert_feed_forward_length
  int shared_ff = 0;               // expert_shared_feed_forward_length; 0: --expert-ff
  int n_nextn = 0;           // nextn_predict_layers: multi-token-prediction blocks after the stack
  bool header_only = false;  // tensor data left as a hole (sparse zeros)
  std::optional<float> rope_base;
  std::string vocab_path;
  std::string type_name = "f16";  // a file mix: every matrix's type follows llama.cpp's rules
  bool pure = false;              // every matrix gets the mix's base type
  std::string rope_scaling;       // rope.scaling.type to write, or empty
  float rope_factor = 0.0f;       // rope.scaling.factor (and the llama3 factor)
  int rope_orig_ctx = 0;          // rope.scaling.original_context_length (and llama3's)
  std::string rope_freqs;         // "llama3": write rope_freqs.weight
  float rope_low_freq = 1.0f;     // llama3 low_freq_factor
  float rope_high_freq = 4.0f;    // llama3 high_freq_factor
  uint64_t seed = 42;
  bool tied = false;
  std::string name;
  std::string out_path;
  int n_threads = 1;
};

enum class Init { kNormal, kOnes, kRopeFreqs, kMinusOnes };

struct SynthTensor {
  std::string name;
  std::vector<uint64_t> ne;  // ggml order: ne[0] is the row length (the input dimension)
  TensorType type;
  Init init;
};

uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Fills one row with N(0, kWeightStd) approximated by the Irwin-Hall sum of four 16-bit uniforms
// (one 64-bit draw per value): fast, and ample for random weights. Each row has its own stream, so
// rows can be generated in any order on any thread.
void FillNormalRow(uint64_t seed, uint64_t tensor_index, uint64_t row, float* out, int64_t n) {
  uint64_t state = seed;
  state = SplitMix64(state) ^ (tensor_index * 0xD1B54A32D192ED03ULL);
  state = SplitMix64(state) ^ (row * 0xABC98388FB8FAC03ULL);
  SplitMix64(state);
  // Sum of 4 uniforms on [0, 65535]: mean 131070, variance 4 * (65536^2 - 1) / 12.
  const float scale = kWeightStd * std::sqrt(3.0f) / 65536.0f;
  for (int64_t i = 0; i < n; ++i) {
    uint64_t r = SplitMix64(state);
    int64_t sum = static_cast<int64_t>(r & 0xFFFF) + static_cast<int64_t>((r >> 16) & 0xFFFF) +
                  static_cast<int64_t>((r >> 32) & 0xFFFF) + static_cast<int64_t>(r >> 48);
    out[i] = static_cast<float>(sum - 131070) * scale;
  }
}

// Llama 3.1's rope scaling as convert_hf_to_gguf.py bakes it into rope_freqs.weight: pair i of
// wavelength w = 2 pi / base^(-2i / n_rot) keeps its angle when w < orig / high, is slowed by the
// factor when w > orig / low, and in between by 1 / ((1 - s) / factor + s) with
// s = (orig / w - low) / (high - low). Computed in float, as the converter does.
std::vector<float> Llama3RopeFreqs(const SynthOptions& o, float base, int n_rot) {
  const float factor = o.rope_factor > 0 ? o.rope_factor : 8.0f;
  const float orig = static_cast<float>(o.rope_orig_ctx > 0 ? o.rope_orig_ctx : 8192);
  const float low_wavelen = orig / o.rope_low_freq;
  const float high_wavelen = orig / o.rope_high_freq;
  std::vector<float> out;
  for (int i = 0; i < n_rot / 2; ++i) {
    const float freq = 1.0f / std::pow(base, static_cast<float>(2 * i) / static_cast<float>(n_rot));
    const float wavelen = 2.0f * static_cast<float>(M_PI) / freq;
    if (wavelen < high_wavelen) {
      out.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      out.push_back(factor);
    } else {
      const float smooth =
          (orig / wavelen - o.rope_low_freq) / (o.rope_high_freq - o.rope_low_freq);
      out.push_back(1.0f / ((1.0f - smooth) / factor + smooth));
    }
  }
  return out;
}

// The matrix type: the mix's choice for this tensor (or its base type with --pure), falling back
// as llama.cpp's quantizer does when the row is not a whole number of blocks.
TensorType MatrixType(const SynthOptions& o, FileMix mix, const std::string& name,
                      uint64_t row_len) {
  const TensorType base = GetFileMixInfo(mix).base;
  MixTensor t{name, row_len, 2, o.n_layer, o.n_head / o.n_head_kv, o.tied};
  // llama.cpp's "70B" class: 80 layers of a llama with grouped KV heads, or of a qwen2.
  t.class_70b =
      o.n_layer == 80 && (o.arch == "qwen2" || (o.arch == "llama" && o.n_head_kv < o.n_head));
  TensorType chosen = o.pure ? base : ChooseTensorType(mix, t);
  t.row_len = 0;  // fits every block size: the choice before any fallback
  const TensorType ideal = o.pure ? base : ChooseTensorType(mix, t);
  if (o.pure) {
    auto info = GetTensorTypeInfo(static_cast<uint32_t>(base));
    if (!info || row_len % info->block_elems != 0) chosen = TensorType::kF16;
  }
  if (chosen != ideal) {
    auto info = GetTensorTypeInfo(static_cast<uint32_t>(ideal));
    KV_LOG_INFO("synth: {}: row length {} is not a multiple of the {} block size {}; using {}",
                name, row_len, info ? info->name : "?", info ? info->block_elems : 0,
                TensorTypeName(static_cast<uint32_t>(chosen)));
  }
  return chosen;
}

int HeadDim(const SynthOptions& o) { return o.head_dim > 0 ? o.head_dim : o.n_embd / o.n_head; }

bool IsAttentionLayer(const SynthArch& arch, const SynthOptions& o, int il) {
  return !arch.hybrid || (il + 1) % o.attn_interval == 0;
}

std::vector<SynthTensor> PlanTensors(const SynthArch& arch, const SynthOptions& o, uint64_t n_vocab,
                                     FileMix mix) {
  const uint64_t E = o.n_embd, F = o.n_ff, V = n_vocab;
  const uint64_t hd = HeadDim(o);
  const uint64_t q_dim = o.n_head * hd, kv_dim = o.n_head_kv * hd;
  std::vector<SynthTensor> out;
  auto matrix = [&](std::string name, uint64_t cols, uint64_t rows) {
    TensorType t = MatrixType(o, mix, name, cols);
    out.push_back({std::move(name), {cols, rows}, t, Init::kNormal});
  };
  // Matrices llama.cpp's quantizer leaves in f32 (router, convolution taps, 1-row gates).
  auto f32_matrix = [&](std::string name, uint64_t cols, uint64_t rows) {
    out.push_back({std::move(name), {cols, rows}, TensorType::kF32, Init::kNormal});
  };
  auto experts = [&](std::string name, uint64_t cols, uint64_t rows) {
    TensorType t = MatrixType(o, mix, name, cols);
    out.push_back(
        {std::move(name), {cols, rows, static_cast<uint64_t>(o.n_expert)}, t, Init::kNormal});
  };
  auto vector = [&](std::string name, uint64_t n, Init init) {
    out.push_back({std::move(name), {n}, TensorType::kF32, init});
  };
  matrix("token_embd.weight", E, V);
  if (o.rope_freqs == "llama3") vector("rope_freqs.weight", hd / 2, Init::kRopeFreqs);
  vector("output_norm.weight", E, Init::kOnes);
  if (!o.tied) matrix("output.weight", E, V);
  // Gated full attention of a hybrid layer (also the attention of a nextn block).
  auto hybrid_attention = [&](const std::string& p) {
    matrix(p + "attn_q.weight", E, 2 * q_dim);  // per head: query, then gate
    matrix(p + "attn_k.weight", E, kv_dim);
    matrix(p + "attn_v.weight", E, kv_dim);
    matrix(p + "attn_output.weight", q_dim, E);
    vector(p + "attn_q_norm.weight", hd, Init::kOnes);
    vector(p + "attn_k_norm.weight", hd, Init::kOnes);
  };
  auto hybrid_ffn = [&](const std::string& p) {
    vector(p + "post_attention_norm.weight", E, Init::kOnes);
    if (arch.moe) {
      const uint64_t XF = o.expert_ff, SF = o.shared_ff;
      f32_matrix(p + "ffn_gate_inp.weight", E, o.n_expert);
      experts(p + "ffn_gate_exps.weight", E, XF);
      experts(p + "ffn_up_exps.weight", E, XF);
      experts(p + "ffn_down_exps.weight", XF, E);
      f32_matrix(p + "ffn_gate_inp_shexp.weight", E, 1);
      matrix(p + "ffn_gate_shexp.weight", E, SF);
      matrix(p + "ffn_up_shexp.weight", E, SF);
      matrix(p + "ffn_down_shexp.weight", SF, E);
    } else {
      matrix(p + "ffn_gate.weight", E, F);
      matrix(p + "ffn_up.weight", E, F);
      matrix(p + "ffn_down.weight", F, E);
    }
  };
  for (int il = 0; il < o.n_layer; ++il) {
    const std::string p = fmt::format("blk.{}.", il);
    vector(p + "attn_norm.weight", E, Init::kOnes);
    if (arch.hybrid) {
      if (!IsAttentionLayer(arch, o, il)) {
        const uint64_t S = o.ssm_state, key = uint64_t(o.ssm_groups) * S;
        const uint64_t inner = uint64_t(o.ssm_v_heads) * S, nv = o.ssm_v_heads;
        matrix(p + "attn_qkv.weight", E, 2 * key + inner);
        matrix(p + "attn_gate.weight", E, inner);
        f32_matrix(p + "ssm_conv1d.weight", o.ssm_conv, 2 * key + inner);
        vector(p + "ssm_dt.bias", nv, Init::kOnes);
        vector(p + "ssm_a", nv, Init::kMinusOnes);
        matrix(p + "ssm_beta.weight", E, nv);
        matrix(p + "ssm_alpha.weight", E, nv);
        vector(p + "ssm_norm.weight", S, Init::kOnes);
        matrix(p + "ssm_out.weight", inner, E);
      } else {
        hybrid_attention(p);
      }
      hybrid_ffn(p);
      continue;
    }
    matrix(p + "attn_q.weight", E, q_dim);
    matrix(p + "attn_k.weight", E, kv_dim);
    matrix(p + "attn_v.weight", E, kv_dim);
    if (arch.qkv_bias) {
      vector(p + "attn_q.bias", q_dim, Init::kNormal);
      vector(p + "attn_k.bias", kv_dim, Init::kNormal);
      vector(p + "attn_v.bias", kv_dim, Init::kNormal);
    }
    if (arch.qk_norm) {
      vector(p + "attn_q_norm.weight", hd, Init::kOnes);
      vector(p + "attn_k_norm.weight", hd, Init::kOnes);
    }
    matrix(p + "attn_output.weight", q_dim, E);
    vector(p + "ffn_norm.weight", E, Init::kOnes);
    matrix(p + "ffn_gate.weight", E, F);
    matrix(p + "ffn_up.weight", E, F);
    matrix(p + "ffn_down.weight", F, E);
  }
  // Multi-token-prediction (nextn) blocks after the stack, as Qwen3.5 ships them: a full-attention
  // layer with its FFN, fed eh_proj([enorm(embedding); hnorm(hidden)]), with its own head norm.
  // They come last, so the stack's tensors hold the same bytes with or without them.
  for (int i = 0; i < o.n_nextn; ++i) {
    const std::string p = fmt::format("blk.{}.", o.n_layer + i);
    vector(p + "attn_norm.weight", E, Init::kOnes);
    hybrid_attention(p);
    hybrid_ffn(p);
    matrix(p + "nextn.eh_proj.weight", 2 * E, E);
    vector(p + "nextn.enorm.weight", E, Init::kOnes);
    vector(p + "nextn.hnorm.weight", E, Init::kOnes);
    vector(p + "nextn.shared_head_norm.weight", E, Init::kOnes);
  }
  return out;
}

// Defaults of the qwen35 family's shape flags left at 0 (the Qwen3.5 layout: a quarter of the head
// rotated, 16 key heads and twice as many value heads of 128).
void ApplyArchDefaults(const SynthArch& arch, SynthOptions* o) {
  if (!arch.hybrid) return;
  if (o->n_rot == 0) o->n_rot = std::max(2, HeadDim(*o) / 4 / 2 * 2);
  if (o->rope_sections.empty()) o->rope_sections = {11, 11, 10, 0};
  if (o->ssm_state == 0) o->ssm_state = 128;
  if (o->ssm_groups == 0) o->ssm_groups = 16;
  if (o->ssm_v_heads == 0) o->ssm_v_heads = 2 * o->ssm_groups;
  if (arch.moe && o->shared_ff == 0) o->shared_ff = o->expert_ff;
}

// Flag checks that need no file: a broken constraint is a usage error.
std::optional<std::string> CheckOptions(const SynthArch& arch, const SynthOptions& o) {
  auto positive = [](const char* flag, int v) -> std::optional<std::string> {
    if (v <= 0) return fmt::format("{} must be > 0 (got {})", flag, v);
    return std::nullopt;
  };
  for (auto [flag, v] : {std::pair{"--layers", o.n_layer},
                         {"--embd", o.n_embd},
                         {"--heads", o.n_head},
                         {"--kv-heads", o.n_head_kv},
                         {"--ctx", o.n_ctx},
                         {"-t/--threads", o.n_threads}}) {
    if (auto e = positive(flag, v)) return e;
  }
  if (!arch.moe) {
    if (auto e = positive("--ff", o.n_ff)) return e;
  }
  if (o.head_dim < 0) return fmt::format("--head-dim must be > 0 (got {})", o.head_dim);
  if (o.head_dim == 0 && o.n_embd % o.n_head != 0) {
    return fmt::format("--embd {} must be a multiple of --heads {} (or give --head-dim)", o.n_embd,
                       o.n_head);
  }
  if (o.n_head % o.n_head_kv != 0) {
    return fmt::format("--heads {} must be a multiple of --kv-heads {}", o.n_head, o.n_head_kv);
  }
  if (HeadDim(o) % 2 != 0) {
    return fmt::format("head size {} must be even for RoPE", HeadDim(o));
  }
  if (o.n_rot < 0 || o.n_rot % 2 != 0 || o.n_rot > HeadDim(o)) {
    return fmt::format("--rope-dims {} must be even and at most the head size {}", o.n_rot,
                       HeadDim(o));
  }
  if (o.n_nextn < 0 || o.n_nextn > 8) {
    return fmt::format("--nextn must be in 0..8 (got {})", o.n_nextn);
  }
  if (o.n_nextn > 0 && !arch.hybrid) {
    return fmt::format(
        "--nextn writes Qwen3.5 multi-token-prediction blocks: --arch qwen35 or "
        "qwen35moe (got {})",
        o.arch);
  }
  if (arch.hybrid) {
    for (auto [flag, v] : {std::pair{"--attn-interval", o.attn_interval},
                           {"--ssm-conv", o.ssm_conv},
                           {"--ssm-state", o.ssm_state},
                           {"--ssm-groups", o.ssm_groups},
                           {"--ssm-v-heads", o.ssm_v_heads}}) {
      if (auto e = positive(flag, v)) return e;
    }
    if (o.ssm_v_heads % o.ssm_groups != 0) {
      return fmt::format("--ssm-v-heads {} must be a multiple of --ssm-groups {}", o.ssm_v_heads,
                         o.ssm_groups);
    }
    if (o.ssm_conv > 64 || o.ssm_state > 1024) {
      return fmt::format("--ssm-conv {} (at most 64) or --ssm-state {} (at most 1024) is too large",
                         o.ssm_conv, o.ssm_state);
    }
    if (o.rope_sections.empty() || o.rope_sections.size() > 4) {
      return fmt::format("--rope-sections takes 1 to 4 values (got {})", o.rope_sections.size());
    }
    for (int v : o.rope_sections) {
      if (v < 0) return fmt::format("--rope-sections values must be >= 0 (got {})", v);
    }
  }
  if (arch.moe) {
    for (auto [flag, v] : {std::pair{"--experts", o.n_expert},
                           {"--experts-used", o.n_expert_used},
                           {"--expert-ff", o.expert_ff},
                           {"--shared-ff", o.shared_ff}}) {
      if (auto e = positive(flag, v)) return e;
    }
    if (o.n_expert_used > o.n_expert || o.n_expert > 4096) {
      return fmt::format("--experts-used {} must be at most --experts {} (at most 4096)",
                         o.n_expert_used, o.n_expert);
    }
  }
  if (o.rope_base && !(*o.rope_base > 0.0f)) {
    return fmt::format("--rope-base must be > 0 (got {})", *o.rope_base);
  }
  if (!o.rope_scaling.empty() && o.rope_scaling != "none" && o.rope_scaling != "linear" &&
      o.rope_scaling != "yarn") {
    return fmt::format("--rope-scaling '{}' is not supported (supported: none, linear, yarn)",
                       o.rope_scaling);
  }
  if (!o.rope_freqs.empty() && o.rope_freqs != "llama3") {
    return fmt::format("--rope-freqs '{}' is not supported (supported: llama3)", o.rope_freqs);
  }
  if (o.rope_factor < 0 || !std::isfinite(o.rope_factor)) {
    return fmt::format("--rope-factor must be > 0 (got {})", o.rope_factor);
  }
  if (o.rope_orig_ctx < 0) {
    return fmt::format("--rope-orig-ctx must be > 0 (got {})", o.rope_orig_ctx);
  }
  if (!(o.rope_low_freq > 0 && o.rope_high_freq > o.rope_low_freq)) {
    return fmt::format("--rope-low-freq {} and --rope-high-freq {} need 0 < low < high",
                       o.rope_low_freq, o.rope_high_freq);
  }
  return std::nullopt;
}

// Rows of ne[0] values: ne[1] * ne[2] (experts are stacked along ne[2]).
uint64_t TensorRows(const SynthTensor& t) {
  uint64_t rows = 1;
  for (size_t d = 1; d < t.ne.size(); ++d) rows *= t.ne[d];
  return rows;
}

// Streams the tensors' bytes: rows generated and quantized in parallel, chunk by chunk.
Status WriteTensors(const std::vector<SynthTensor>& tensors, const SynthOptions& o, float rope_base,
                    GgufStreamWriter& out) {
  ThreadPool pool(o.n_threads);
  const bool tty = isatty(STDERR_FILENO) != 0;
  uint64_t total_bytes = 0, done_bytes = 0;
  for (const auto& t : tensors) {
    total_bytes += RowBytes(t.type, static_cast<int64_t>(t.ne[0])) * TensorRows(t);
  }
  // Double buffering: one chunk is written on a helper thread while the next is generated.
  std::vector<uint8_t> buffers[2];
  int current = 0;
  std::future<Status> pending;
  auto wait_pending = [&]() { return pending.valid() ? pending.get() : Status::Ok(); };
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const SynthTensor& t = tensors[ti];
    const int64_t cols = static_cast<int64_t>(t.ne[0]);
    const int64_t rows = static_cast<int64_t>(TensorRows(t));
    const size_t row_bytes = RowBytes(t.type, cols);
    const int64_t rows_per_chunk =
        std::max<int64_t>(1, static_cast<int64_t>(kChunkBytes / row_bytes));
    for (int64_t r0 = 0; r0 < rows; r0 += rows_per_chunk) {
      const int64_t n_rows = std::min(rows_per_chunk, rows - r0);
      std::vector<uint8_t>& chunk = buffers[current];
      chunk.resize(static_cast<size_t>(n_rows) * row_bytes);
      pool.ParallelFor(n_rows, 1, [&](int64_t begin, int64_t end) {
        std::vector<float> row(static_cast<size_t>(cols));  // [cols] f32
        for (int64_t r = begin; r < end; ++r) {
          if (t.init == Init::kOnes || t.init == Init::kMinusOnes) {
            std::fill(row.begin(), row.end(), t.init == Init::kOnes ? 1.0f : -1.0f);
          } else if (t.init == Init::kRopeFreqs) {
            row = Llama3RopeFreqs(o, rope_base, static_cast<int>(2 * cols));
          } else {
            FillNormalRow(o.seed, ti, static_cast<uint64_t>(r0 + r), row.data(), cols);
          }
          uint8_t* dst = chunk.data() + static_cast<size_t>(r) * row_bytes;
          if (t.type == TensorType::kF32) {
            std::memcpy(dst, row.data(), row_bytes);
          } else {
            QuantizeRow(t.type, row.data(), cols, dst);
          }
        }
      });
      KV_RETURN_IF_ERROR(wait_pending());
      pending = std::async(std::launch::async, [&out, &chunk]() { return out.Append(chunk); });
      current ^= 1;
      done_bytes += chunk.size();
    }
    std::string line =
        fmt::format("synth: tensor {}/{} {} {} {} ({} of {})", ti + 1, tensors.size(), t.name,
                    TensorTypeName(static_cast<uint32_t>(t.type)),
                    HumanBytes(static_cast<uint64_t>(rows) * row_bytes), HumanBytes(done_bytes),
                    HumanBytes(total_bytes));
    if (tty) {
      // One line, rewritten in place.
      std::fprintf(stderr, "\r\033[K%s%s", line.c_str(), ti + 1 == tensors.size() ? "\n" : "");
      std::fflush(stderr);
    } else {
      KV_LOG_INFO("{}", line);
    }
  }
  return wait_pending();
}

// The header and tensor index, then the file extended to its full size without writing the data:
// a sparse file whose tensors read as zeros, for planning (kvasir plan, inspect) without weights.
Status WriteHeaderOnly(const GgufWriter& writer, const std::string& path) {
  const std::vector<uint8_t> header = writer.SerializeHeader();
  uint64_t data = 0;
  for (const GgufTensorInfo& t : writer.TensorInfos()) data = std::max(data, t.offset + t.n_bytes);
  const std::string tmp = path + ".part";
  const int fd = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_WRONLY | O_CLOEXEC, 0644);
  if (fd < 0) return Error("{}: cannot create: {}", tmp, std::strerror(errno));
  size_t done = 0;
  while (done < header.size()) {
    const ssize_t n = ::write(fd, header.data() + done, header.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Error("{}: write failed: {}", tmp, std::strerror(err));
    }
    done += static_cast<size_t>(n);
  }
  if (::ftruncate(fd, static_cast<off_t>(header.size() + data)) != 0 || ::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return Error("{}: cannot extend to {} bytes: {}", tmp, header.size() + data,
                 std::strerror(err));
  }
  ::close(fd);
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp.c_str());
    return Error("{}: cannot rename to {}: {}", tmp, path, std::strerror(err));
  }
  return Status::Ok();
}

int RunSynth(SynthOptions o) {
  const SynthArch* arch = nullptr;
  std::string arch_names;
  for (const auto& a : kArchs) {
    arch_names += (arch_names.empty() ? "" : ", ") + std::string(a.name);
    if (o.arch == a.name) arch = &a;
  }
  if (arch == nullptr) {
    return UsageError(
        kCmd, fmt::format("--arch '{}' is not supported (supported: {})", o.arch, arch_names));
  }
  const std::optional<FileMixInfo> mix = FileMixFromName(o.type_name);
  if (!mix) {
    return UsageError(kCmd, fmt::format("--type '{}' is not supported (supported: {})", o.type_name,
                                        FileMixNames()));
  }
  ApplyArchDefaults(*arch, &o);
  if (auto e = CheckOptions(*arch, o)) return UsageError(kCmd, *e);

  if (Status st = CheckWritable(o.out_path); !st.ok()) return Fail(kCmd, st);
  auto vocab = OpenGguf(o.vocab_path);
  if (!vocab.ok()) return Fail(kCmd, vocab.status());
  const GgufArray* tokens = (*vocab)->GetArray("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->size() == 0) {
    return Fail(kCmd,
                fmt::format("{}: no tokenizer.ggml.tokens array: not a vocabulary", o.vocab_path));
  }
  const uint64_t n_vocab = tokens->size();

  const std::string prefix = std::string(arch->name) + ".";
  const uint32_t head_dim = static_cast<uint32_t>(HeadDim(o));
  GgufWriter writer;
  writer.SetKv("general.architecture", GgufValue::String(arch->name));
  writer.SetKv("general.name",
               GgufValue::String(!o.name.empty() ? o.name
                                                 : fmt::format("synth-{}-{}L-{}E", arch->name,
                                                               o.n_layer, o.n_embd)));
  writer.SetKv("general.file_type", GgufValue::Uint32(mix->file_type));
  writer.SetKv(prefix + "block_count", GgufValue::Uint32(o.n_layer + o.n_nextn));
  if (o.n_nextn > 0) writer.SetKv(prefix + "nextn_predict_layers", GgufValue::Uint32(o.n_nextn));
  writer.SetKv(prefix + "context_length", GgufValue::Uint32(o.n_ctx));
  writer.SetKv(prefix + "embedding_length", GgufValue::Uint32(o.n_embd));
  if (!arch->moe) writer.SetKv(prefix + "feed_forward_length", GgufValue::Uint32(o.n_ff));
  writer.SetKv(prefix + "attention.head_count", GgufValue::Uint32(o.n_head));
  writer.SetKv(prefix + "attention.head_count_kv", GgufValue::Uint32(o.n_head_kv));
  writer.SetKv(prefix + "attention.layer_norm_rms_epsilon", GgufValue::Float32(arch->rms_eps));
  writer.SetKv(prefix + "rope.freq_base",
               GgufValue::Float32(o.rope_base.value_or(arch->rope_base)));
  writer.SetKv(prefix + "rope.dimension_count",
               GgufValue::Uint32(o.n_rot > 0 ? static_cast<uint32_t>(o.n_rot) : head_dim));
  if (o.head_dim > 0) {
    writer.SetKv(prefix + "attention.key_length", GgufValue::Uint32(head_dim));
    writer.SetKv(prefix + "attention.value_length", GgufValue::Uint32(head_dim));
  }
  if (arch->hybrid) {
    std::vector<int32_t> sections(o.rope_sections.begin(), o.rope_sections.end());
    sections.resize(4, 0);
    writer.SetKv(prefix + "rope.dimension_sections",
                 GgufValue::Array(GgufArray::Of(std::move(sections))));
    writer.SetKv(prefix + "full_attention_interval", GgufValue::Uint32(o.attn_interval));
    writer.SetKv(prefix + "ssm.conv_kernel", GgufValue::Uint32(o.ssm_conv));
    writer.SetKv(prefix + "ssm.state_size", GgufValue::Uint32(o.ssm_state));
    writer.SetKv(prefix + "ssm.group_count", GgufValue::Uint32(o.ssm_groups));
    writer.SetKv(prefix + "ssm.time_step_rank", GgufValue::Uint32(o.ssm_v_heads));
    writer.SetKv(prefix + "ssm.inner_size", GgufValue::Uint32(o.ssm_v_heads * o.ssm_state));
  }
  if (arch->moe) {
    writer.SetKv(prefix + "expert_count", GgufValue::Uint32(o.n_expert));
    writer.SetKv(prefix + "expert_used_count", GgufValue::Uint32(o.n_expert_used));
    writer.SetKv(prefix + "expert_feed_forward_length", GgufValue::Uint32(o.expert_ff));
    writer.SetKv(prefix + "expert_shared_feed_forward_length", GgufValue::Uint32(o.shared_ff));
  }
  if (!o.rope_scaling.empty()) {
    writer.SetKv(prefix + "rope.scaling.type", GgufValue::String(o.rope_scaling));
  }
  if (!o.rope_scaling.empty() && o.rope_factor > 0) {
    writer.SetKv(prefix + "rope.scaling.factor", GgufValue::Float32(o.rope_factor));
  }
  if (!o.rope_scaling.empty() && o.rope_orig_ctx > 0) {
    writer.SetKv(prefix + "rope.scaling.original_context_length",
                 GgufValue::Uint32(static_cast<uint32_t>(o.rope_orig_ctx)));
  }
  for (const auto& kv : (*vocab)->kvs()) {
    if (kv.key.rfind("tokenizer.", 0) == 0) writer.SetKv(kv.key, kv.value);
  }

  std::vector<SynthTensor> tensors = PlanTensors(*arch, o, n_vocab, mix->mix);
  uint64_t n_params = 0;
  for (const auto& t : tensors) {
    if (!KernelsSupport(t.type)) {
      return Fail(
          kCmd, fmt::format("{}: type {} cannot be quantized by this build (supported: {})", t.name,
                            TensorTypeName(static_cast<uint32_t>(t.type)), SupportedTypesList()));
    }
    if (Status st = writer.DeclareTensor(t.name, t.type, t.ne); !st.ok()) return Fail(kCmd, st);
    uint64_t n = 1;
    for (uint64_t d : t.ne) n *= d;
    n_params += n;
  }

  Stopwatch clock;
  if (o.header_only) {
    if (Status st = WriteHeaderOnly(writer, o.out_path); !st.ok()) return Fail(kCmd, st);
    KV_LOG_INFO(
        "synth: wrote {}: {} {} layers, {} params, {} tensors, vocab {}; header only (the "
        "tensor data is a hole of zeros)",
        o.out_path, arch->name, o.n_layer, HumanCount(n_params), tensors.size(), n_vocab);
    return kExitOk;
  }
  auto out = GgufStreamWriter::Create(writer, o.out_path);
  if (!out.ok()) return Fail(kCmd, out.status());
  if (Status st = WriteTensors(tensors, o, o.rope_base.value_or(arch->rope_base), **out); !st.ok())
    return Fail(kCmd, WithPath(st, o.out_path));
  if (Status st = (*out)->Finish(); !st.ok()) return Fail(kCmd, st);
  KV_LOG_INFO("synth: wrote {}: {} {} layers, {} params, {} tensors, vocab {}, {:.2f} s",
              o.out_path, arch->name, o.n_layer, HumanCount(n_params), tensors.size(), n_vocab,
              clock.Seconds());
  return kExitOk;
}

}  // namespace

int SynthMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{
        "Write a random-weight GGUF model of a given shape (weights ~ N(0, 0.02), norms 1).",
        "kvasir synth"};
    SynthOptions o;
    o.n_threads = DefaultThreads();
    app.add_option("--arch", o.arch, "architecture: llama, qwen2, qwen3, qwen35 or qwen35moe")
        ->capture_default_str();
    app.add_option("--layers", o.n_layer, "number of layers")->required();
    app.add_option("--embd", o.n_embd, "embedding width")->required();
    app.add_option("--heads", o.n_head, "attention heads")->required();
    app.add_option("--kv-heads", o.n_head_kv, "key/value heads (default: --heads)");
    app.add_option("--ff", o.n_ff, "feed-forward width (dense FFN; not for qwen35moe)");
    app.add_option("--head-dim", o.head_dim, "attention head size (default: --embd / --heads)");
    auto* hybrid = app.add_option_group("qwen35 / qwen35moe");
    hybrid->add_option("--rope-dims", o.n_rot,
                       "rope.dimension_count (default: a quarter of the head)");
    hybrid
        ->add_option("--rope-sections", o.rope_sections,
                     "rope.dimension_sections, comma-separated (default 11,11,10,0)")
        ->delimiter(',');
    hybrid
        ->add_option("--attn-interval", o.attn_interval,
                     "every N-th layer is full attention, the others gated DeltaNet")
        ->capture_default_str();
    hybrid->add_option("--ssm-conv", o.ssm_conv, "DeltaNet convolution taps")
        ->capture_default_str();
    hybrid->add_option("--ssm-state", o.ssm_state, "DeltaNet head size (default 128)");
    hybrid->add_option("--ssm-groups", o.ssm_groups, "DeltaNet key heads (default 16)");
    hybrid->add_option("--ssm-v-heads", o.ssm_v_heads,
                       "DeltaNet value heads (default 2 x key heads)");
    hybrid->add_option("--experts", o.n_expert, "routed experts per layer (qwen35moe)");
    hybrid->add_option("--experts-used", o.n_expert_used, "experts each token is routed to");
    hybrid->add_option("--expert-ff", o.expert_ff, "feed-forward width of each expert");
    hybrid->add_option("--shared-ff", o.shared_ff, "shared expert width (default: --expert-ff)");
    hybrid
        ->add_option("--nextn", o.n_nextn,
                     "multi-token-prediction blocks written after the layers "
                     "(nextn_predict_layers)")
        ->capture_default_str();
    app.add_flag("--header-only", o.header_only,
                 "write the header and tensor index only; the data is a hole of zeros (a sparse "
                 "file of the full size), enough to plan a model without its weights");
    app.add_option("--vocab-from", o.vocab_path, "GGUF file whose tokenizer.* keys are copied")
        ->required();
    app.add_option("--type", o.type_name,
                   "file type, with the per-tensor mix llama.cpp's quantizer gives it: f32, f16, "
                   "bf16, q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k_s/m/l, q4_k_s/m, q5_k_s/m, q6_k")
        ->capture_default_str();
    app.add_flag("--pure", o.pure, "every matrix gets the file type's base type (no mix)");
    app.add_option("--rope-scaling", o.rope_scaling,
                   "rope.scaling.type to write: none, linear, yarn");
    app.add_option("--rope-factor", o.rope_factor,
                   "rope.scaling.factor (with --rope-scaling), or the llama3 factor (default 8)");
    app.add_option("--rope-orig-ctx", o.rope_orig_ctx,
                   "rope.scaling.original_context_length, or llama3's (default 8192)");
    app.add_option("--rope-freqs", o.rope_freqs,
                   "llama3: write rope_freqs.weight as Llama 3.1 files carry it");
    app.add_option("--rope-low-freq", o.rope_low_freq, "llama3 low_freq_factor")
        ->capture_default_str();
    app.add_option("--rope-high-freq", o.rope_high_freq, "llama3 high_freq_factor")
        ->capture_default_str();
    app.add_option("--seed", o.seed, "random seed")->capture_default_str();
    app.add_option("--ctx", o.n_ctx, "context_length key")->capture_default_str();
    app.add_option("--rope-base", o.rope_base, "rope.freq_base (default: per architecture)");
    app.add_flag("--tied", o.tied, "no output.weight: the head reuses token_embd");
    app.add_option("--name", o.name, "general.name");
    app.add_option("-t,--threads", o.n_threads, "threads")->capture_default_str();
    app.add_option("-o,--output", o.out_path, "output GGUF file")->required();
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (o.n_head_kv == 0 && app.count("--kv-heads") == 0) o.n_head_kv = o.n_head;
    return RunSynth(o);
  });
}

}  // namespace kvasir::cli
