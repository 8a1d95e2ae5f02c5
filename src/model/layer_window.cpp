#include "model/layer_window.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "base/check.h"
#include "base/log.h"
#include "model/arch/registry.h"
#include "model/backend.h"
#include "model/rope.h"
#include "model/tensor_binder.h"
#include "model/window_layers.h"

namespace kvasir {
namespace {

struct Sequence {
  int length = 0;
  std::vector<LayerState> layers;  // per window layer: KV cache or DeltaNet state
};

// A window of a llama-family or hybrid (qwen35) model. Layers differ by kind (cfg.layer_kind):
// attention layers keep a KV cache per sequence, DeltaNet layers a fixed-size recurrent state.
class LayerStackWindow final : public LayerWindow {
 public:
  LayerStackWindow(std::shared_ptr<const GgufFile> file, ModelConfig cfg, WindowSpec spec,
                    WindowOptions options)
      : file_(std::move(file)),
        cfg_(std::move(cfg)),
        spec_(spec),
        options_(options),
        backend_(MakeCpuBackend(options.n_threads)) {}

  Status Bind() {
    TensorBinder b(*file_, &weight_bytes_);
    const int64_t e = cfg_.n_embd;
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
      LayerWeights w;
      KV_RETURN_IF_ERROR(BindLayer(b, cfg_, il, &w));
      layers_.push_back(std::move(w));
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
    uint64_t bytes = 0;
    for (const LayerWeights& w : layers_) {
      bytes += w.kind == LayerKind::kAttention
                   ? 2ull * static_cast<uint64_t>(options_.n_ctx) * cfg_.kv_dim() * sizeof(float)
                   : static_cast<uint64_t>(cfg_.ssm_state_floats()) * sizeof(float);
    }
    return bytes;
  }

  Status OpenSequence(int seq_id) override {
    if (seqs_.count(seq_id) != 0) return Error("sequence {} is already open", seq_id);
    if (static_cast<int>(seqs_.size()) >= options_.max_sequences) {
      return Error("sequence {}: {} sequences are open, the limit is {}", seq_id, seqs_.size(),
                   options_.max_sequences);
    }
    Sequence s;
    s.layers.reserve(layers_.size());
    for (const LayerWeights& w : layers_) s.layers.push_back(NewLayerState(cfg_, w.kind));
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
    if (n_keep == s.length) return Status::Ok();
    // A recurrent state holds every position folded together: it can only start over.
    if (n_keep != 0) {
      for (size_t l = 0; l < layers_.size(); ++l) {
        if (layers_[l].kind == LayerKind::kDeltaNet) {
          return Error(
              "sequence {}: cannot keep {} of {} positions: layer {} keeps a recurrent state, "
              "which can only be cleared",
              seq_id, n_keep, s.length, spec_.first + static_cast<int>(l));
        }
      }
    }
    s.length = n_keep;
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (layers_[l].kind == LayerKind::kDeltaNet) {
        s.layers[l] = NewLayerState(cfg_, LayerKind::kDeltaNet);
      } else {
        s.layers[l].k.resize(static_cast<size_t>(n_keep) * cfg_.kv_dim());
        s.layers[l].v.resize(static_cast<size_t>(n_keep) * cfg_.kv_dim());
      }
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
  std::vector<float> cur_;      // [n_out_rows, n_embd] normed rows for the head
  std::vector<float> cos_sin_;  // [n_rows, n_rot / 2, 2]
  std::vector<ChunkState> chunk_states_;  // one per chunk, for the layer being run
  LayerScratch scratch_;
};

Status LayerStackWindow::Validate(const ForwardInput& in, int* n_rows) const {
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

void LayerStackWindow::ComputeRope(const ForwardInput& in, int n_rows) {
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

void LayerStackWindow::RunLayer(size_t l, const ForwardInput& in, int n_rows) {
  const LayerWeights& w = layers_[l];
  chunk_states_.clear();
  int row = 0;
  for (const SeqChunk& ch : in.chunks) {
    chunk_states_.push_back({&seqs_.at(ch.seq_id).layers[l], row, ch.n_tokens, ch.pos0});
    row += ch.n_tokens;
  }
  if (w.kind == LayerKind::kAttention) {
    RunAttention(cfg_, w, options_.n_ctx, chunk_states_, n_rows, cos_sin_.data(), x_.data(),
                 *backend_, scratch_);
  } else {
    RunDeltaNet(cfg_, w, chunk_states_, n_rows, x_.data(), *backend_, scratch_);
  }
  RunFfn(cfg_, w, n_rows, x_.data(), *backend_, scratch_);
}

Status LayerStackWindow::Forward(const ForwardInput& in, ForwardOutput* out) {
  int n_rows = 0;
  KV_RETURN_IF_ERROR(Validate(in, &n_rows));
  const size_t rows = static_cast<size_t>(n_rows);
  const int e = cfg_.n_embd;
  x_.resize(rows * e);
  cur_.resize(rows * e);

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
  auto w = std::make_unique<LayerStackWindow>(std::move(file), std::move(cfg), spec, opt);
  KV_RETURN_IF_ERROR(w->Bind());
  return std::unique_ptr<LayerWindow>(std::move(w));
}

}  // namespace kvasir
