#include "tiny_model.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

#include "gguf/gguf_writer.h"
#include "kernels/kernels.h"

namespace kvasir::testing {

Status WriteTinyModel(const std::string& path, const TinyModelShape& shape) {
  TinyModelShape s = shape;
  GgufWriter w;
  if (!s.vocab_from.empty()) {
    KV_ASSIGN_OR_RETURN(GgufFile vocab, GgufFile::Open(s.vocab_from));
    for (const GgufKv& kv : vocab.kvs()) {
      if (kv.key.rfind("tokenizer.", 0) == 0) w.SetKv(kv.key, kv.value);
    }
    const GgufArray* tokens = vocab.GetArray("tokenizer.ggml.tokens");
    if (tokens == nullptr) return Error("{}: no tokenizer.ggml.tokens", s.vocab_from);
    s.n_vocab = static_cast<int>(tokens->size());
  }
  const std::string a = s.arch;
  w.SetKv("general.architecture", GgufValue::String(a));
  w.SetKv("general.name", GgufValue::String("tiny-test"));
  w.SetKv(a + ".block_count", GgufValue::Uint32(s.n_layer));
  w.SetKv(a + ".embedding_length", GgufValue::Uint32(s.n_embd));
  w.SetKv(a + ".feed_forward_length", GgufValue::Uint32(s.n_ff));
  w.SetKv(a + ".attention.head_count", GgufValue::Uint32(s.n_head));
  w.SetKv(a + ".attention.head_count_kv", GgufValue::Uint32(s.n_head_kv));
  w.SetKv(a + ".context_length", GgufValue::Uint32(s.n_ctx));
  w.SetKv(a + ".attention.layer_norm_rms_epsilon", GgufValue::Float32(1e-5f));
  for (const auto& [key, value] : s.extra_kvs) w.SetKv(key, value);

  std::mt19937_64 rng(s.seed);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  auto add = [&](const std::string& name, int64_t cols, int64_t rows, bool matrix) -> Status {
    std::vector<float> v(static_cast<size_t>(cols * rows));
    for (float& x : v) x = matrix ? normal(rng) : 1.0f + normal(rng);
    const TensorType type = matrix ? s.type : TensorType::kF32;
    std::vector<uint8_t> bytes(RowBytes(type, cols) * rows);
    for (int64_t r = 0; r < rows; ++r) {
      QuantizeRow(type, v.data() + r * cols, cols, bytes.data() + r * RowBytes(type, cols));
    }
    std::vector<uint64_t> ne = {static_cast<uint64_t>(cols)};
    if (matrix) ne.push_back(static_cast<uint64_t>(rows));
    return w.AddTensor(name, type, ne, bytes);
  };
  const int hd = s.n_embd / s.n_head, kvd = hd * s.n_head_kv;
  KV_RETURN_IF_ERROR(add("token_embd.weight", s.n_embd, s.n_vocab, true));
  if (!s.rope_freqs.empty()) {
    std::vector<uint8_t> bytes(s.rope_freqs.size() * sizeof(float));
    std::memcpy(bytes.data(), s.rope_freqs.data(), bytes.size());
    const std::vector<uint64_t> ne = {static_cast<uint64_t>(s.rope_freqs.size())};
    KV_RETURN_IF_ERROR(w.AddTensor("rope_freqs.weight", TensorType::kF32, ne, bytes));
  }
  for (int il = 0; il < s.n_layer; ++il) {
    auto n = [il](const char* t) { return fmt::format("blk.{}.{}", il, t); };
    KV_RETURN_IF_ERROR(add(n("attn_norm.weight"), s.n_embd, 1, false));
    KV_RETURN_IF_ERROR(add(n("attn_q.weight"), s.n_embd, s.n_embd, true));
    KV_RETURN_IF_ERROR(add(n("attn_k.weight"), s.n_embd, kvd, true));
    KV_RETURN_IF_ERROR(add(n("attn_v.weight"), s.n_embd, kvd, true));
    KV_RETURN_IF_ERROR(add(n("attn_output.weight"), s.n_embd, s.n_embd, true));
    KV_RETURN_IF_ERROR(add(n("ffn_norm.weight"), s.n_embd, 1, false));
    KV_RETURN_IF_ERROR(add(n("ffn_gate.weight"), s.n_embd, s.n_ff, true));
    KV_RETURN_IF_ERROR(add(n("ffn_up.weight"), s.n_embd, s.n_ff, true));
    KV_RETURN_IF_ERROR(add(n("ffn_down.weight"), s.n_ff, s.n_embd, true));
  }
  KV_RETURN_IF_ERROR(add("output_norm.weight", s.n_embd, 1, false));
  if (!s.tied) KV_RETURN_IF_ERROR(add("output.weight", s.n_embd, s.n_vocab, true));
  return w.Write(path);
}

std::shared_ptr<const GgufFile> OpenShared(const std::string& path) {
  auto f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status().message();
  if (!f.ok()) return nullptr;
  return std::make_shared<const GgufFile>(std::move(f).value());
}

std::unique_ptr<LayerWindow> LoadWindow(std::shared_ptr<const GgufFile> file, WindowSpec spec,
                                        int n_ctx, int n_threads) {
  WindowOptions opt;
  opt.n_ctx = n_ctx;
  opt.n_threads = n_threads;
  auto w = LayerWindow::Load(std::move(file), spec, opt);
  EXPECT_TRUE(w.ok()) << w.status().message();
  return w.ok() ? std::move(w).value() : nullptr;
}

}  // namespace kvasir::testing
