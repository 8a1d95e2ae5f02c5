#include "model/layer_window.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "base/check.h"
#include "base/log.h"
#include "model/arch/registry.h"
#include "model/backend.h"
#include "model/rope.h"

namespace kvasir {
namespace {

struct LayerWeights {
  const float* attn_norm = nullptr;  // [n_embd]
  MatrixView wq, wk, wv, wo;         // [q_dim, n_embd], [kv_dim, n_embd] x2, [n_embd, q_dim]
  const float* bq = nullptr;         // [q_dim] (qkv_bias)
  const float* bk = nullptr;         // [kv_dim]
  const float* bv = nullptr;         // [kv_dim]
  const float* q_norm = nullptr;     // [head_dim] (qk_norm)
  const float* k_norm = nullptr;     // [head_dim]
  const float* ffn_norm = nullptr;   // [n_embd]
  MatrixView gate, up, down;         // [n_ff, n_embd] x2, [n_embd, n_ff]
};

struct Sequence {
  int length = 0;
  std::vector<std::vector<float>> k, v;  // per window layer: [length, kv_dim] f32
};

// Binds the window's tensors, checking presence, type and shape. Holds f32 copies of vectors that
// are stored in other types.
class TensorBinder {
 public:
  TensorBinder(const GgufFile& file, uint64_t* bytes) : file_(file), bytes_(bytes) {}

  Result<MatrixView> Matrix(const std::string& name, int64_t cols, int64_t rows) {
    KV_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Find(name));
    if (t->n_dims != 2 || t->ne[0] != static_cast<uint64_t>(cols) ||
        t->ne[1] != static_cast<uint64_t>(rows)) {
      return Error("{}: tensor {} has shape [{}, {}], expected [{}, {}]", file_.path(), name,
                   t->ne[0], t->ne[1], cols, rows);
    }
    const auto type = static_cast<TensorType>(t->type);
    if (!KernelsSupport(type)) {
      return Error("{}: tensor {} has type {}, which this build cannot compute yet (supported: {})",
                   file_.path(), name, TensorTypeName(t->type), SupportedTypesList());
    }
    auto data = file_.TensorData(*t);
    *bytes_ += data.size();
    return MatrixView{type, data.data(), rows, cols, RowBytes(type, cols)};
  }

  Result<const float*> Vector(const std::string& name, int64_t n) {
    KV_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Find(name));
    if (t->n_elements() != static_cast<uint64_t>(n) || t->ne[0] != static_cast<uint64_t>(n)) {
      return Error("{}: tensor {} has {} elements, expected {}", file_.path(), name,
                   t->n_elements(), n);
    }
    const auto type = static_cast<TensorType>(t->type);
    if (!KernelsSupport(type)) {
      return Error("{}: tensor {} has type {}, which this build cannot compute yet (supported: {})",
                   file_.path(), name, TensorTypeName(t->type), SupportedTypesList());
    }
    auto data = file_.TensorData(*t);
    *bytes_ += data.size();
    if (type == TensorType::kF32 && reinterpret_cast<uintptr_t>(data.data()) % 4 == 0) {
      return reinterpret_cast<const float*>(data.data());
    }
    owned_.emplace_back(n);
    DequantizeRow(type, data.data(), n, owned_.back().data());
    return static_cast<const float*>(owned_.back().data());
  }

  std::vector<std::vector<float>> TakeOwned() { return std::move(owned_); }

 private:
  Result<const GgufTensorInfo*> Find(const std::string& name) {
    const GgufTensorInfo* t = file_.FindTensor(name);
    if (t == nullptr) return Error("{}: tensor {} is missing", file_.path(), name);
    return t;
  }

  const GgufFile& file_;
  uint64_t* bytes_;
  std::vector<std::vector<float>> owned_;
};

class LlamaFamilyWindow final : public LayerWindow {
 public:
  LlamaFamilyWindow(std::shared_ptr<const GgufFile> file, ModelConfig cfg, WindowSpec spec,
                    WindowOptions options)
      : file_(std::move(file)),
        cfg_(std::move(cfg)),
        spec_(spec),
        options_(options),
        backend_(MakeCpuBackend(options.n_threads)) {}

  Status Bind() {
    TensorBinder b(*file_, &weight_bytes_);
    const int64_t e = cfg_.n_embd, qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), ff = cfg_.n_ff;
    if (spec_.has_embed) {
      KV_ASSIGN_OR_RETURN(tok_embd_, b.Matrix("token_embd.weight", e, cfg_.n_vocab));
    }
    if (cfg_.rope_freq_factors && spec_.last > spec_.first) {
      KV_ASSIGN_OR_RETURN(rope_freqs_, b.Vector("rope_freqs.weight", cfg_.n_rot / 2));
      for (int i = 0; i < cfg_.n_rot / 2; ++i) {
        if (!(rope_freqs_[i] > 0 && std::isfinite(rope_freqs_[i]))) {
          return Error("{}: tensor rope_freqs.weight: factor {} is {}, not a positive number",
                       file_->path(), i, rope_freqs_[i]);
        }
      }
    }
    for (int il = spec_.first; il < spec_.last; ++il) {
      const LayerTensorNames n = LlamaFamilyLayerNames(il);
      LayerWeights w;
      KV_ASSIGN_OR_RETURN(w.attn_norm, b.Vector(n.attn_norm, e));
      KV_ASSIGN_OR_RETURN(w.wq, b.Matrix(n.wq, e, qd));
      KV_ASSIGN_OR_RETURN(w.wk, b.Matrix(n.wk, e, kvd));
      KV_ASSIGN_OR_RETURN(w.wv, b.Matrix(n.wv, e, kvd));
      KV_ASSIGN_OR_RETURN(w.wo, b.Matrix(n.wo, qd, e));
      if (cfg_.qkv_bias) {
        KV_ASSIGN_OR_RETURN(w.bq, b.Vector(n.bq, qd));
        KV_ASSIGN_OR_RETURN(w.bk, b.Vector(n.bk, kvd));
        KV_ASSIGN_OR_RETURN(w.bv, b.Vector(n.bv, kvd));
      }
      if (cfg_.qk_norm) {
        KV_ASSIGN_OR_RETURN(w.q_norm, b.Vector(n.q_norm, cfg_.head_dim));
        KV_ASSIGN_OR_RETURN(w.k_norm, b.Vector(n.k_norm, cfg_.head_dim));
      }
      KV_ASSIGN_OR_RETURN(w.ffn_norm, b.Vector(n.ffn_norm, e));
      KV_ASSIGN_OR_RETURN(w.gate, b.Matrix(n.ffn_gate, e, ff));
      KV_ASSIGN_OR_RETURN(w.up, b.Matrix(n.ffn_up, e, ff));
      KV_ASSIGN_OR_RETURN(w.down, b.Matrix(n.ffn_down, ff, e));
      layers_.push_back(w);
    }
    if (spec_.has_head) {
      KV_ASSIGN_OR_RETURN(out_norm_, b.Vector("output_norm.weight", e));
      const bool has_output = file_->FindTensor("output.weight") != nullptr;
      if (has_output) {
        KV_ASSIGN_OR_RETURN(output_, b.Matrix("output.weight", e, cfg_.n_vocab));
      } else if (spec_.has_embed) {
        output_ = tok_embd_;  // tied: already counted
      } else {
        KV_ASSIGN_OR_RETURN(output_, b.Matrix("token_embd.weight", e, cfg_.n_vocab));
      }
    }
    owned_ = b.TakeOwned();
    return Status::Ok();
  }

  const ModelConfig& config() const override { return cfg_; }
  const WindowSpec& spec() const override { return spec_; }
  int n_ctx() const override { return options_.n_ctx; }
  uint64_t weight_bytes() const override { return weight_bytes_; }
  uint64_t kv_bytes_per_sequence() const override {
    return 2ull * layers_.size() * static_cast<uint64_t>(options_.n_ctx) * cfg_.kv_dim() *
           sizeof(float);
  }

  Status OpenSequence(int seq_id) override {
    if (seqs_.count(seq_id) != 0) return Error("sequence {} is already open", seq_id);
    if (static_cast<int>(seqs_.size()) >= options_.max_sequences) {
      return Error("sequence {}: {} sequences are open, the limit is {}", seq_id, seqs_.size(),
                   options_.max_sequences);
    }
    Sequence s;
    s.k.resize(layers_.size());
    s.v.resize(layers_.size());
    seqs_.emplace(seq_id, std::move(s));
    return Status::Ok();
  }

  void CloseSequence(int seq_id) override { seqs_.erase(seq_id); }

  int SequenceLength(int seq_id) const override {
    auto it = seqs_.find(seq_id);
    return it == seqs_.end() ? -1 : it->second.length;
  }

  Status TruncateSequence(int seq_id, int n_keep) override {
    auto it = seqs_.find(seq_id);
    if (it == seqs_.end()) return Error("sequence {} is not open", seq_id);
    if (n_keep < 0 || n_keep > it->second.length) {
      return Error("sequence {}: cannot keep {} of {} positions", seq_id, n_keep,
                   it->second.length);
    }
    Sequence& s = it->second;
    s.length = n_keep;
    for (size_t l = 0; l < layers_.size(); ++l) {
      s.k[l].resize(static_cast<size_t>(n_keep) * cfg_.kv_dim());
      s.v[l].resize(static_cast<size_t>(n_keep) * cfg_.kv_dim());
    }
    return Status::Ok();
  }

  Status Forward(const ForwardInput& in, ForwardOutput* out) override;

 private:
  Status Validate(const ForwardInput& in, int* n_rows) const;
  void ComputeRope(const ForwardInput& in, int n_rows);
  void RunLayer(size_t l, const ForwardInput& in, int n_rows);

  std::shared_ptr<const GgufFile> file_;
  ModelConfig cfg_;
  WindowSpec spec_;
  WindowOptions options_;
  std::unique_ptr<Backend> backend_;
  uint64_t weight_bytes_ = 0;

  MatrixView tok_embd_;           // [n_vocab, n_embd]
  std::vector<LayerWeights> layers_;
  const float* rope_freqs_ = nullptr;  // [n_rot / 2] angle divisors, or null
  const float* out_norm_ = nullptr;  // [n_embd]
  MatrixView output_;             // [n_vocab, n_embd]
  std::vector<std::vector<float>> owned_;

  std::unordered_map<int, Sequence> seqs_;

  // Scratch, reused across calls.
  std::vector<float> x_;        // [n_rows, n_embd] residual stream
  std::vector<float> cur_;      // [n_rows, n_embd] normed input
  std::vector<float> q_;        // [n_rows, q_dim]
  std::vector<float> k_;        // [n_rows, kv_dim]
  std::vector<float> v_;        // [n_rows, kv_dim]
  std::vector<float> attn_;     // [n_rows, q_dim]
  std::vector<float> proj_;     // [n_rows, n_embd]
  std::vector<float> gate_;     // [n_rows, n_ff]
  std::vector<float> up_;       // [n_rows, n_ff]
  std::vector<float> cos_sin_;  // [n_rows, n_rot / 2, 2]
};

Status LlamaFamilyWindow::Validate(const ForwardInput& in, int* n_rows) const {
  int64_t rows = 0;
  if (in.chunks.empty()) return Error("empty batch");
  for (size_t c = 0; c < in.chunks.size(); ++c) {
    const SeqChunk& ch = in.chunks[c];
    auto it = seqs_.find(ch.seq_id);
    if (it == seqs_.end()) return Error("sequence {} is not open", ch.seq_id);
    for (size_t d = 0; d < c; ++d) {
      if (in.chunks[d].seq_id == ch.seq_id) {
        return Error("sequence {} appears twice in one batch", ch.seq_id);
      }
    }
    if (ch.n_tokens <= 0) return Error("sequence {}: chunk of {} tokens", ch.seq_id, ch.n_tokens);
    if (ch.pos0 != it->second.length) {
      return Error("sequence {}: batch starts at position {} but the sequence has {} tokens",
                   ch.seq_id, ch.pos0, it->second.length);
    }
    if (static_cast<int64_t>(ch.pos0) + ch.n_tokens > options_.n_ctx) {
      return Error("sequence {}: {} tokens exceed the context of {}", ch.seq_id,
                   static_cast<int64_t>(ch.pos0) + ch.n_tokens, options_.n_ctx);
    }
    rows += ch.n_tokens;
  }
  if (rows > (1 << 20)) return Error("batch of {} rows is too large", rows);
  if (spec_.has_embed) {
    if (in.tokens.size() != static_cast<size_t>(rows)) {
      return Error("batch has {} rows but {} token ids", rows, in.tokens.size());
    }
    for (int32_t id : in.tokens) {
      if (id < 0 || id >= cfg_.n_vocab) {
        return Error("token id {} is outside the vocabulary (0..{})", id, cfg_.n_vocab - 1);
      }
    }
  } else if (in.hidden.size() != static_cast<size_t>(rows) * cfg_.n_embd) {
    return Error("batch has {} rows of width {} but {} hidden values", rows, cfg_.n_embd,
                 in.hidden.size());
  }
  *n_rows = static_cast<int>(rows);
  return Status::Ok();
}

void LlamaFamilyWindow::ComputeRope(const ForwardInput& in, int n_rows) {
  const int half = cfg_.n_rot / 2;
  cos_sin_.resize(static_cast<size_t>(n_rows) * half * 2);
  const std::span<const float> factors =
      rope_freqs_ != nullptr ? std::span<const float>(rope_freqs_, half) : std::span<const float>();
  int r = 0;
  for (const SeqChunk& ch : in.chunks) {
    for (int t = 0; t < ch.n_tokens; ++t, ++r) {
      RopeCosSin(cfg_, factors, ch.pos0 + t, cos_sin_.data() + static_cast<size_t>(r) * half * 2);
    }
  }
}

void LlamaFamilyWindow::RunLayer(size_t l, const ForwardInput& in, int n_rows) {
  const LayerWeights& w = layers_[l];
  const int e = cfg_.n_embd, qd = cfg_.q_dim(), kvd = cfg_.kv_dim(), hd = cfg_.head_dim;
  Backend& be = *backend_;

  // Attention block.
  be.RmsNorm(x_.data(), w.attn_norm, n_rows, e, cfg_.rms_eps, cur_.data());
  be.MatMul(w.wq, cur_.data(), n_rows, q_.data());
  be.MatMul(w.wk, cur_.data(), n_rows, k_.data());
  be.MatMul(w.wv, cur_.data(), n_rows, v_.data());
  if (cfg_.qkv_bias) {
    be.AddBias(q_.data(), w.bq, n_rows, qd);
    be.AddBias(k_.data(), w.bk, n_rows, kvd);
    be.AddBias(v_.data(), w.bv, n_rows, kvd);
  }
  if (cfg_.qk_norm) {
    be.RmsNorm(q_.data(), w.q_norm, n_rows * cfg_.n_head, hd, cfg_.rms_eps, q_.data());
    be.RmsNorm(k_.data(), w.k_norm, n_rows * cfg_.n_head_kv, hd, cfg_.rms_eps, k_.data());
  }
  be.Rope(q_.data(), n_rows, cfg_.n_head, hd, cfg_.n_rot, cfg_.rope_type, cos_sin_.data());
  be.Rope(k_.data(), n_rows, cfg_.n_head_kv, hd, cfg_.n_rot, cfg_.rope_type, cos_sin_.data());

  int row = 0;
  for (const SeqChunk& ch : in.chunks) {
    Sequence& s = seqs_.at(ch.seq_id);
    std::vector<float>& kc = s.k[l];
    std::vector<float>& vc = s.v[l];
    const size_t end = static_cast<size_t>(ch.pos0 + ch.n_tokens) * kvd;
    if (kc.capacity() < end) {
      // Grow geometrically up to the context so long generations do not copy every step.
      const size_t cap = std::min(std::max(end, kc.capacity() * 2),
                                  static_cast<size_t>(options_.n_ctx) * kvd);
      kc.reserve(cap);
      vc.reserve(cap);
    }
    kc.resize(end);
    vc.resize(end);
    std::copy_n(k_.data() + static_cast<size_t>(row) * kvd, static_cast<size_t>(ch.n_tokens) * kvd,
                kc.data() + static_cast<size_t>(ch.pos0) * kvd);
    std::copy_n(v_.data() + static_cast<size_t>(row) * kvd, static_cast<size_t>(ch.n_tokens) * kvd,
                vc.data() + static_cast<size_t>(ch.pos0) * kvd);
    be.Attention(q_.data() + static_cast<size_t>(row) * qd, ch.n_tokens, ch.pos0, kc.data(),
                 vc.data(), cfg_.n_head, cfg_.n_head_kv, hd,
                 attn_.data() + static_cast<size_t>(row) * qd);
    row += ch.n_tokens;
  }
  be.MatMul(w.wo, attn_.data(), n_rows, proj_.data());
  be.Add(x_.data(), proj_.data(), static_cast<int64_t>(n_rows) * e);

  // Feed-forward block: down(silu(gate(x)) * up(x)).
  be.RmsNorm(x_.data(), w.ffn_norm, n_rows, e, cfg_.rms_eps, cur_.data());
  be.MatMul(w.gate, cur_.data(), n_rows, gate_.data());
  be.MatMul(w.up, cur_.data(), n_rows, up_.data());
  be.SiluMul(gate_.data(), up_.data(), static_cast<int64_t>(n_rows) * cfg_.n_ff, gate_.data());
  be.MatMul(w.down, gate_.data(), n_rows, proj_.data());
  be.Add(x_.data(), proj_.data(), static_cast<int64_t>(n_rows) * e);
}

Status LlamaFamilyWindow::Forward(const ForwardInput& in, ForwardOutput* out) {
  int n_rows = 0;
  KV_RETURN_IF_ERROR(Validate(in, &n_rows));
  const size_t rows = static_cast<size_t>(n_rows);
  const int e = cfg_.n_embd;
  x_.resize(rows * e);
  cur_.resize(rows * e);
  q_.resize(rows * cfg_.q_dim());
  k_.resize(rows * cfg_.kv_dim());
  v_.resize(rows * cfg_.kv_dim());
  attn_.resize(rows * cfg_.q_dim());
  proj_.resize(rows * e);
  gate_.resize(rows * cfg_.n_ff);
  up_.resize(rows * cfg_.n_ff);

  if (spec_.has_embed) {
    backend_->GetRows(tok_embd_, in.tokens.data(), n_rows, x_.data());
  } else {
    std::copy(in.hidden.begin(), in.hidden.end(), x_.begin());
  }
  ComputeRope(in, n_rows);
  for (size_t l = 0; l < layers_.size(); ++l) RunLayer(l, in, n_rows);
  for (const SeqChunk& ch : in.chunks) seqs_.at(ch.seq_id).length += ch.n_tokens;

  out->hidden.clear();
  out->logits.clear();
  if (!spec_.has_head) {
    out->hidden.assign(x_.begin(), x_.end());
    return Status::Ok();
  }
  // Rows that need logits: all of them, or each chunk's last.
  std::vector<int> pick;
  int row = 0;
  for (const SeqChunk& ch : in.chunks) {
    for (int t = 0; t < ch.n_tokens; ++t, ++row) {
      if (in.all_logits || (ch.want_logits && t == ch.n_tokens - 1)) pick.push_back(row);
    }
  }
  const int n_out = static_cast<int>(pick.size());
  if (n_out == 0) return Status::Ok();
  for (int i = 0; i < n_out; ++i) {
    backend_->RmsNorm(x_.data() + static_cast<size_t>(pick[i]) * e, out_norm_, 1, e, cfg_.rms_eps,
                      cur_.data() + static_cast<size_t>(i) * e);
  }
  out->logits.resize(static_cast<size_t>(n_out) * cfg_.n_vocab);
  backend_->MatMul(output_, cur_.data(), n_out, out->logits.data());
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<LayerWindow>> LayerWindow::Load(std::shared_ptr<const GgufFile> file,
                                                       const WindowSpec& spec,
                                                       const WindowOptions& options) {
  KV_CHECK(file != nullptr);
  KV_ASSIGN_OR_RETURN(ModelConfig cfg, LoadModelConfig(*file));
  if (spec.first < 0 || spec.last > cfg.n_layer || spec.first > spec.last) {
    return Error("{}: layers {}:{} are not a window of the model's {} layers", file->path(),
                 spec.first, spec.last, cfg.n_layer);
  }
  // A stage slice holds only its own window (kvasir.window.first/last).
  if (file->Find("kvasir.window.first") != nullptr || file->Find("kvasir.window.last") != nullptr) {
    KV_ASSIGN_OR_RETURN(uint64_t held_first, file->GetUint("kvasir.window.first"));
    KV_ASSIGN_OR_RETURN(uint64_t held_last, file->GetUint("kvasir.window.last"));
    if (static_cast<uint64_t>(spec.first) < held_first ||
        static_cast<uint64_t>(spec.last) > held_last) {
      return Error("{}: holds layers {}:{} (a stage slice); layers {}:{} are not in it",
                   file->path(), held_first, held_last, spec.first, spec.last);
    }
  }
  if (spec.first == spec.last && !spec.has_embed && !spec.has_head) {
    return Error("{}: empty window {}:{} holds nothing", file->path(), spec.first, spec.last);
  }
  WindowOptions opt = options;
  if (opt.n_ctx <= 0) opt.n_ctx = std::min(cfg.n_ctx_train, 4096);
  if (opt.n_ctx > cfg.n_ctx_train) {
    KV_LOG_WARN("{}: context {} exceeds the trained context {}", file->path(), opt.n_ctx,
                cfg.n_ctx_train);
  }
  if (opt.n_ctx > (1 << 22)) return Error("context {} is too large", opt.n_ctx);
  if (opt.n_threads < 1) return Error("thread count {} must be at least 1", opt.n_threads);
  auto w = std::make_unique<LlamaFamilyWindow>(std::move(file), std::move(cfg), spec, opt);
  KV_RETURN_IF_ERROR(w->Bind());
  return std::unique_ptr<LayerWindow>(std::move(w));
}

}  // namespace kvasir
