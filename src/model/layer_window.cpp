#include "model/layer_window.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>

#include "backend/registry.h"
#include "base/check.h"
#include "base/log.h"
#include "model/arch/registry.h"
#include "model/nextn_block.h"
#include "model/rope.h"
#include "model/tensor_binder.h"
#include "model/window_layers.h"

namespace kvasir {
namespace {

struct Sequence {
  int length = 0;
  std::vector<LayerState> layers;  // per window layer: KV cache or DeltaNet state
  // Rollback span: the DeltaNet states at lengths [span_first, length) are in the layers'
  // checkpoint slots (empty when span_first == length).
  int span_first = 0;
};

// A window of a llama-family or hybrid (qwen35) model. Layers differ by kind (cfg.layer_kind):
// attention layers keep a KV cache per sequence, DeltaNet layers a fixed-size recurrent state.
class LayerStackWindow final : public LayerWindow {
 public:
  LayerStackWindow(std::shared_ptr<const GgufFile> file, ModelConfig cfg, WindowSpec spec,
                   WindowOptions options, std::unique_ptr<Backend> backend)
      : backend_(std::move(backend)),
        file_(std::move(file)),
        cfg_(std::move(cfg)),
        spec_(spec),
        options_(std::move(options)) {
    for (int il = spec_.first; il < spec_.last; ++il) {
      (cfg_.layer_kind(il) == LayerKind::kAttention ? has_attention_ : has_delta_net_) = true;
    }
  }

  Status CheckOps() const;
  Status Bind();

  const ModelConfig& config() const override { return cfg_; }
  const WindowSpec& spec() const override { return spec_; }
  int n_ctx() const override { return options_.n_ctx; }
  int max_checkpoints() const override { return options_.max_checkpoints; }
  uint64_t weight_bytes() const override { return weight_bytes_; }
  const DeviceInfo& device() const override { return backend_->device(); }
  uint64_t device_weight_bytes() const override { return weights_.device_bytes; }
  uint64_t kv_bytes_per_sequence() const override {
    uint64_t bytes = 0;
    for (const LayerWeights& w : layers_) {
      bytes += w.kind == LayerKind::kAttention
                   ? 2ull * static_cast<uint64_t>(options_.n_ctx) * cfg_.kv_dim() * sizeof(float)
                   : static_cast<uint64_t>(cfg_.ssm_state_floats()) * sizeof(float);
    }
    return bytes;
  }

  uint64_t SequenceBytes(int seq_id) const override {
    auto it = seqs_.find(seq_id);
    if (it == seqs_.end()) return 0;
    uint64_t elems = 0;
    for (const LayerState& l : it->second.layers) {
      for (const auto* b : {l.k.get(), l.v.get(), l.conv.get(), l.ssm.get()}) {
        if (b != nullptr) elems += static_cast<uint64_t>(b->size());
      }
    }
    return elems * sizeof(float);
  }

  Status OpenSequence(int seq_id) override;
  void CloseSequence(int seq_id) override {
    seqs_.erase(seq_id);
    if (nextn_ != nullptr) nextn_->Close(seq_id);
  }
  int SequenceLength(int seq_id) const override {
    auto it = seqs_.find(seq_id);
    return it == seqs_.end() ? -1 : it->second.length;
  }
  Status TruncateSequence(int seq_id, int n_keep) override;
  Status RenameSequence(int from, int to) override;
  int RollbackFloor(int seq_id) const override {
    auto it = seqs_.find(seq_id);
    if (it == seqs_.end()) return -1;
    return has_delta_net_ ? it->second.span_first : 0;
  }
  Status Forward(const ForwardInput& in, ForwardOutput* out) override;

  bool has_nextn() const override { return nextn_ != nullptr; }
  int NextnLength(int seq_id) const override {
    return nextn_ == nullptr ? -1 : nextn_->Length(seq_id);
  }
  Status TruncateNextn(int seq_id, int n_keep) override {
    if (nextn_ == nullptr) return Error("{}: no nextn block is loaded", file_->path());
    return nextn_->Truncate(seq_id, n_keep);
  }
  Status ForwardNextn(const NextnInput& in, NextnOutput* out) override {
    if (nextn_ == nullptr) return Error("{}: no nextn block is loaded", file_->path());
    return nextn_->Forward(in, out);
  }

 private:
  Status Validate(const ForwardInput& in, int* n_rows) const;
  Status Reserve(const ForwardInput& in, int n_rows);
  void RunLayer(size_t l, const ForwardInput& in, int n_rows);
  Status Head(const ForwardInput& in, ForwardOutput* out);

  // First, so that it is destroyed last: everything below may hold its memory.
  std::unique_ptr<Backend> backend_;
  std::shared_ptr<const GgufFile> file_;
  ModelConfig cfg_;
  WindowSpec spec_;
  WindowOptions options_;
  bool has_attention_ = false, has_delta_net_ = false;
  uint64_t weight_bytes_ = 0;

  WindowWeights weights_;                   // owns every upload below
  const DeviceMatrix* tok_embd_ = nullptr;  // [n_vocab, n_embd]
  std::vector<LayerWeights> layers_;
  std::span<const float> rope_freqs_;  // [n_rot / 2] angle divisors (host), or empty
  RopeAngleParams rope_;
  DevPtr out_norm_;                       // [n_embd]
  const DeviceMatrix* output_ = nullptr;  // [n_vocab, n_embd]
  std::unique_ptr<NextnBlock> nextn_;     // the first nextn block, or null

  std::unordered_map<int, Sequence> seqs_;

  // The batch, in the backend; grown as needed and reused across calls.
  Scratch x_;                             // [n_rows, n_embd] residual stream
  Scratch ids_;                           // [n_rows] int32 token ids
  Scratch cos_sin_;                       // [n_rows, n_rot / 2, 2]
  Scratch head_in_;                       // [n_out_rows, n_embd] normed rows for the head
  Scratch logits_;                        // [n_out_rows, n_vocab]
  std::vector<int32_t> positions_;        // [n_rows], host
  std::vector<ChunkState> chunk_states_;  // one per chunk, for the layer being run
  LayerScratch scratch_;
};

Status LayerStackWindow::CheckOps() const {
  const std::string& be = backend_->device().address;
  auto need = [&](Op op, const std::string& what) -> Status {
    if (backend_->SupportsOp(op)) return Status::Ok();
    return Error("{}: {} needs op {}, which backend {} does not run", file_->path(), what,
                 OpName(op), be);
  };
  if (spec_.has_embed) KV_RETURN_IF_ERROR(need(Op::kGetRows, "the token embeddings"));
  if (spec_.has_head) {
    KV_RETURN_IF_ERROR(need(Op::kRmsNorm, "the output head"));
    KV_RETURN_IF_ERROR(need(Op::kMatMul, "the output head"));
  }
  const AttentionParams attn = AttentionOptions(cfg_);
  for (int il = spec_.first; il < spec_.last; ++il) {
    const LayerKind kind = cfg_.layer_kind(il);
    for (Op op : LayerOps(cfg_, kind)) KV_RETURN_IF_ERROR(need(op, fmt::format("layer {}", il)));
    if (kind == LayerKind::kAttention && !backend_->SupportsAttention(attn)) {
      return Error(
          "{}: layer {}: backend {} does not run attention with {} heads, {} KV heads of "
          "{}, soft-cap {} and window {}",
          file_->path(), il, be, attn.n_head, attn.n_head_kv, attn.head_dim, attn.softcap,
          attn.window);
    }
  }
  return Status::Ok();
}

Status LayerStackWindow::Bind() {
  TensorBinder b(*file_, *backend_, &weight_bytes_, &weights_);
  const int64_t e = cfg_.n_embd;
  if (spec_.has_embed) {
    KV_ASSIGN_OR_RETURN(tok_embd_, b.Matrix("token_embd.weight", e, cfg_.n_vocab));
  }
  if (cfg_.rope_freq_factors && spec_.last > spec_.first) {
    KV_ASSIGN_OR_RETURN(const float* f, b.HostVector("rope_freqs.weight", cfg_.n_rot / 2));
    for (int i = 0; i < cfg_.n_rot / 2; ++i) {
      if (!(f[i] > 0 && std::isfinite(f[i]))) {
        return Error("{}: tensor rope_freqs.weight: factor {} is {}, not a positive number",
                     file_->path(), i, f[i]);
      }
    }
    rope_freqs_ = std::span<const float>(f, cfg_.n_rot / 2);
  }
  rope_ = MakeRopeParams(cfg_, rope_freqs_);
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
      output_ = tok_embd_;  // tied: already uploaded and counted
    } else {
      KV_ASSIGN_OR_RETURN(output_, b.Matrix("token_embd.weight", e, cfg_.n_vocab));
    }
    // The nextn block drafts next to the head; a file (or slice) without its tensors runs without.
    if (cfg_.n_layer_nextn > 0 && spec_.last == cfg_.n_layer &&
        file_->FindTensor(fmt::format("blk.{}.nextn.eh_proj.weight", cfg_.n_layer)) != nullptr) {
      const DeviceMatrix* embd = tok_embd_ != nullptr ? tok_embd_ : has_output ? nullptr : output_;
      KV_ASSIGN_OR_RETURN(
          nextn_, NextnBlock::Bind(b, cfg_, embd, output_, rope_, options_.n_ctx, *backend_));
    }
  }
  return backend_->Finish().WithContext(file_->path());
}

Status LayerStackWindow::OpenSequence(int seq_id) {
  if (seqs_.count(seq_id) != 0) return Error("sequence {} is already open", seq_id);
  if (static_cast<int>(seqs_.size()) >= options_.max_sequences) {
    return Error("sequence {}: {} sequences are open, the limit is {}", seq_id, seqs_.size(),
                 options_.max_sequences);
  }
  Sequence s;
  s.layers.resize(layers_.size());
  for (size_t l = 0; l < layers_.size(); ++l) {
    KV_RETURN_IF_ERROR(NewLayerState(cfg_, layers_[l].kind, *backend_, &s.layers[l])
                           .WithContext(fmt::format("sequence {}", seq_id)));
  }
  seqs_.emplace(seq_id, std::move(s));
  if (nextn_ != nullptr) nextn_->Open(seq_id);
  return Status::Ok();
}

Status LayerStackWindow::RenameSequence(int from, int to) {
  auto it = seqs_.find(from);
  if (it == seqs_.end()) return Error("sequence {} is not open", from);
  if (seqs_.count(to) != 0) return Error("sequence {} is already open", to);
  auto node = seqs_.extract(it);
  node.key() = to;
  seqs_.insert(std::move(node));
  if (nextn_ != nullptr) nextn_->Rename(from, to);
  return Status::Ok();
}

Status LayerStackWindow::TruncateSequence(int seq_id, int n_keep) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return Error("sequence {} is not open", seq_id);
  Sequence& s = it->second;
  if (n_keep < 0 || n_keep > s.length) {
    return Error("sequence {}: cannot keep {} of {} positions", seq_id, n_keep, s.length);
  }
  if (n_keep == s.length) return Status::Ok();
  if (!has_delta_net_) {
    // A KV cache keeps its rows: positions past the length are overwritten as they come again.
    s.length = n_keep;
    return Status::Ok();
  }
  if (n_keep == 0) {
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (layers_[l].kind == LayerKind::kDeltaNet) ClearLayerState(cfg_, *backend_, &s.layers[l]);
    }
    s.length = s.span_first = 0;
    return Status::Ok();
  }
  // A recurrent state folds every position in: it goes back only to a checkpoint.
  if (n_keep < s.span_first) {
    size_t l = 0;
    while (layers_[l].kind != LayerKind::kDeltaNet) ++l;
    return Error(
        "sequence {}: cannot keep {} of {} positions: layer {} keeps a recurrent state, which "
        "goes back only to a length in its rollback span {}..{} (a chunk asks for checkpoints "
        "with n_checkpoints)",
        seq_id, n_keep, s.length, spec_.first + static_cast<int>(l), s.span_first, s.length);
  }
  for (size_t l = 0; l < layers_.size(); ++l) {
    LayerState& ls = s.layers[l];
    if (layers_[l].kind != LayerKind::kDeltaNet) continue;
    RestoreLayerState(*backend_, n_keep % static_cast<int>(ls.saved_conv.size()), &ls);
  }
  s.length = n_keep;
  return Status::Ok();
}

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
    if (ch.n_checkpoints < 0 || ch.n_checkpoints > ch.n_tokens ||
        ch.n_checkpoints > options_.max_checkpoints) {
      return Error(
          "sequence {}: {} checkpoints asked for a chunk of {} tokens (at most the chunk's tokens "
          "and {}, the window's max_checkpoints)",
          ch.seq_id, ch.n_checkpoints, ch.n_tokens, options_.max_checkpoints);
    }
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

// Room in the backend for the batch: its buffers, the layers' scratch, and every attention cache
// its chunks grow into. Changes no sequence's contents.
Status LayerStackWindow::Reserve(const ForwardInput& in, int n_rows) {
  Backend& be = *backend_;
  const int64_t rows = n_rows;
  KV_RETURN_IF_ERROR(x_.Reserve(be, rows * cfg_.n_embd, "the residual stream"));
  if (spec_.has_embed) KV_RETURN_IF_ERROR(ids_.Reserve(be, rows, "the token ids"));
  if (has_attention_) {
    KV_RETURN_IF_ERROR(cos_sin_.Reserve(be, rows * (cfg_.n_rot / 2) * 2, "the rope angles"));
  }
  KV_RETURN_IF_ERROR(scratch_.Reserve(be, cfg_, has_attention_, has_delta_net_, n_rows));
  for (const SeqChunk& ch : in.chunks) {
    Sequence& s = seqs_.at(ch.seq_id);
    for (size_t l = 0; l < layers_.size(); ++l) {
      if (layers_[l].kind == LayerKind::kDeltaNet && ch.n_checkpoints > 0) {
        KV_RETURN_IF_ERROR(ReserveSavedStates(be, options_.max_checkpoints, &s.layers[l])
                               .WithContext(fmt::format("sequence {}", ch.seq_id)));
      }
      if (layers_[l].kind != LayerKind::kAttention) continue;
      KV_RETURN_IF_ERROR(
          GrowKv(cfg_, options_.n_ctx, ch.pos0 + ch.n_tokens, s.length, be, &s.layers[l])
              .WithContext(fmt::format("sequence {}", ch.seq_id)));
    }
  }
  return Status::Ok();
}

void LayerStackWindow::RunLayer(size_t l, const ForwardInput& in, int n_rows) {
  const LayerWeights& w = layers_[l];
  chunk_states_.clear();
  int row = 0;
  for (const SeqChunk& ch : in.chunks) {
    chunk_states_.push_back(
        {&seqs_.at(ch.seq_id).layers[l], row, ch.n_tokens, ch.pos0, ch.n_checkpoints});
    row += ch.n_tokens;
  }
  if (w.kind == LayerKind::kAttention) {
    RunAttention(cfg_, w, chunk_states_, n_rows, cos_sin_, x_, *backend_, scratch_);
  } else {
    RunDeltaNet(cfg_, w, chunk_states_, n_rows, x_, *backend_, scratch_);
  }
  RunFfn(cfg_, w, n_rows, x_, *backend_, scratch_);
}

Status LayerStackWindow::Forward(const ForwardInput& in, ForwardOutput* out) {
  int n_rows = 0;
  KV_RETURN_IF_ERROR(Validate(in, &n_rows));
  if (Status s = Reserve(in, n_rows); !s.ok()) {
    // A batch the device cannot hold: the scratch goes back, so that smaller batches (the ring
    // retries a refused batch item by item) still fit.
    for (Scratch* b : {&x_, &ids_, &cos_sin_, &head_in_, &logits_}) b->Release();
    scratch_.Release();
    return s;
  }
  Backend& be = *backend_;
  const int64_t rows = n_rows, e = cfg_.n_embd;

  if (spec_.has_embed) {
    be.Upload(ids_, in.tokens.data(), rows);
    be.GetRows(*tok_embd_, ids_, n_rows, x_);
  } else {
    be.Upload(x_, in.hidden.data(), rows * e);
  }
  if (has_attention_) {
    positions_.clear();
    for (const SeqChunk& ch : in.chunks) {
      for (int t = 0; t < ch.n_tokens; ++t) positions_.push_back(ch.pos0 + t);
    }
    be.RopeAngles(rope_, positions_, cos_sin_);
  }
  for (size_t l = 0; l < layers_.size(); ++l) RunLayer(l, in, n_rows);
  for (const SeqChunk& ch : in.chunks) {
    Sequence& s = seqs_.at(ch.seq_id);
    const bool extends = ch.n_checkpoints == ch.n_tokens && s.span_first < s.length;
    s.length += ch.n_tokens;
    const int first = extends ? s.span_first : s.length - ch.n_checkpoints;
    s.span_first = std::max(first, s.length - options_.max_checkpoints);
  }

  out->hidden.clear();
  out->logits.clear();
  if (!spec_.has_head) {
    out->hidden.resize(rows * e);
    return be.Download(out->hidden.data(), x_, rows * e);
  }
  if (in.want_hidden) {
    // The form the nextn block reads: head_in_ is free until Head reserves it again.
    DevPtr src = x_;
    if (cfg_.nextn_normed_hidden) {
      KV_RETURN_IF_ERROR(head_in_.Reserve(be, rows * e, "the hidden rows"));
      be.RmsNorm(x_, out_norm_, n_rows, e, cfg_.rms_eps, head_in_);
      src = head_in_;
    }
    out->hidden.resize(rows * e);
    KV_RETURN_IF_ERROR(be.Download(out->hidden.data(), src, rows * e));
  }
  return Head(in, out);
}

// The logits of the rows that need them: all of them, or each chunk's last.
Status LayerStackWindow::Head(const ForwardInput& in, ForwardOutput* out) {
  Backend& be = *backend_;
  const int64_t e = cfg_.n_embd;
  std::vector<int> pick;
  int row = 0;
  for (const SeqChunk& ch : in.chunks) {
    for (int t = 0; t < ch.n_tokens; ++t, ++row) {
      if (in.all_logits || ch.every_logits || (ch.want_logits && t == ch.n_tokens - 1)) {
        pick.push_back(row);
      }
    }
  }
  const int n_out = static_cast<int>(pick.size());
  if (n_out == 0) return be.Finish();
  KV_RETURN_IF_ERROR(head_in_.Reserve(be, n_out * e, "the head's rows"));
  KV_RETURN_IF_ERROR(logits_.Reserve(be, int64_t{n_out} * cfg_.n_vocab, "the logits"));
  // Normed rows, one op per run of consecutive rows.
  for (int i = 0; i < n_out;) {
    int j = i + 1;
    while (j < n_out && pick[j] == pick[j - 1] + 1) ++j;
    be.RmsNorm(x_ + pick[i] * e, out_norm_, j - i, e, cfg_.rms_eps, head_in_ + i * e);
    i = j;
  }
  be.MatMul(*output_, head_in_, n_out, logits_);
  out->logits.resize(static_cast<size_t>(n_out) * cfg_.n_vocab);
  return be.Download(out->logits.data(), logits_, int64_t{n_out} * cfg_.n_vocab);
}

}  // namespace

Result<std::unique_ptr<LayerWindow>> LayerWindow::Load(std::shared_ptr<const GgufFile> file,
                                                       const WindowSpec& spec,
                                                       const WindowOptions& options) {
  KV_CHECK(file != nullptr);
  BackendOptions bo;
  bo.n_threads = options.n_threads;
  bo.attn_type = options.attn_type;
  if (options.n_threads < 1) return Error("thread count {} must be at least 1", options.n_threads);
  KV_ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, OpenBackend(options.backend, bo));
  return Load(std::move(file), spec, options, std::move(backend));
}

Result<std::unique_ptr<LayerWindow>> LayerWindow::Load(std::shared_ptr<const GgufFile> file,
                                                       const WindowSpec& spec,
                                                       const WindowOptions& options,
                                                       std::unique_ptr<Backend> backend) {
  KV_CHECK(file != nullptr && backend != nullptr);
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
  opt.backend = backend->device().address;
  if (opt.n_ctx <= 0) opt.n_ctx = std::min(cfg.n_ctx_train, 4096);
  if (opt.n_ctx > cfg.n_ctx_train) {
    KV_LOG_WARN("{}: context {} exceeds the trained context {}", file->path(), opt.n_ctx,
                cfg.n_ctx_train);
  }
  if (opt.n_ctx > (1 << 22)) return Error("context {} is too large", opt.n_ctx);
  if (opt.n_threads < 1) return Error("thread count {} must be at least 1", opt.n_threads);
  if (opt.max_checkpoints < 0 || opt.max_checkpoints > 4096) {
    return Error("max_checkpoints {} is outside 0..4096", opt.max_checkpoints);
  }
  auto w = std::make_unique<LayerStackWindow>(std::move(file), std::move(cfg), spec, opt,
                                              std::move(backend));
  KV_RETURN_IF_ERROR(w->CheckOps());
  KV_RETURN_IF_ERROR(w->Bind());
  return std::unique_ptr<LayerWindow>(std::move(w));
}

}  // namespace kvasir
