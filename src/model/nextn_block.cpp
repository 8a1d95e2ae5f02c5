#include "model/nextn_block.h"

#include <fmt/format.h>

#include "base/check.h"

namespace kvasir {

Result<std::unique_ptr<NextnBlock>> NextnBlock::Bind(TensorBinder& b, const ModelConfig& cfg,
                                                     const DeviceMatrix* tok_embd,
                                                     const DeviceMatrix* output,
                                                     const RopeAngleParams& rope, int n_ctx,
                                                     Backend& be) {
  KV_CHECK(cfg.n_layer_nextn > 0 && output != nullptr);
  for (Op op : {Op::kGetRows, Op::kMatMul, Op::kRmsNorm, Op::kRopeAngles}) {
    if (!be.SupportsOp(op)) {
      return Error("the nextn block needs op {}, which backend {} does not run", OpName(op),
                   be.device().address);
    }
  }
  auto block = std::make_unique<NextnBlock>(cfg, rope, n_ctx, be);
  const ModelConfig& c = block->cfg_;
  const int il = cfg.n_layer;
  for (Op op : LayerOps(c, LayerKind::kAttention)) {
    if (!be.SupportsOp(op)) {
      return Error("the nextn block (layer {}) needs op {}, which backend {} does not run", il,
                   OpName(op), be.device().address);
    }
  }
  if (!be.SupportsAttention(AttentionOptions(c))) {
    return Error("the nextn block (layer {}): backend {} does not run its attention", il,
                 be.device().address);
  }
  NextnWeights& w = block->w_;
  KV_RETURN_IF_ERROR(BindLayer(b, c, il, &w.layer));
  auto n = [il](const char* what) { return fmt::format("blk.{}.nextn.{}.weight", il, what); };
  const int64_t e = cfg.n_embd;
  KV_ASSIGN_OR_RETURN(w.eh_proj, b.Matrix(n("eh_proj"), 2 * e, e));
  KV_ASSIGN_OR_RETURN(w.enorm, b.Vector(n("enorm"), e));
  KV_ASSIGN_OR_RETURN(w.hnorm, b.Vector(n("hnorm"), e));
  KV_ASSIGN_OR_RETURN(w.head_norm, b.Vector(n("shared_head_norm"), e));
  w.tok_embd = tok_embd;
  if (w.tok_embd == nullptr) {
    KV_ASSIGN_OR_RETURN(w.tok_embd, b.Matrix("token_embd.weight", e, cfg.n_vocab));
  }
  w.output = output;
  return block;
}

NextnBlock::NextnBlock(const ModelConfig& cfg, const RopeAngleParams& rope, int n_ctx, Backend& be)
    : cfg_(cfg), rope_(rope), n_ctx_(n_ctx), be_(be) {
  // The block is one gated full-attention layer after the stack.
  if (!cfg_.layer_kinds.empty()) cfg_.layer_kinds.resize(cfg_.n_layer + 1, LayerKind::kAttention);
}

void NextnBlock::Rename(int from, int to) {
  auto it = seqs_.find(from);
  if (it == seqs_.end()) return;
  auto node = seqs_.extract(it);
  node.key() = to;
  seqs_.insert(std::move(node));
}

int NextnBlock::Length(int seq_id) const {
  auto it = seqs_.find(seq_id);
  return it == seqs_.end() ? -1 : it->second.length;
}

Status NextnBlock::Truncate(int seq_id, int n_keep) {
  auto it = seqs_.find(seq_id);
  if (it == seqs_.end()) return Error("sequence {} is not open", seq_id);
  if (n_keep < 0 || n_keep > it->second.length) {
    return Error("sequence {}: cannot keep {} of {} nextn positions", seq_id, n_keep,
                 it->second.length);
  }
  // An attention cache keeps its rows: positions past the length are overwritten.
  it->second.length = n_keep;
  return Status::Ok();
}

Status NextnBlock::Validate(const NextnInput& in) const {
  auto it = seqs_.find(in.seq_id);
  if (it == seqs_.end()) return Error("sequence {} is not open", in.seq_id);
  const int64_t n = static_cast<int64_t>(in.tokens.size());
  if (n == 0 || n > (1 << 20)) return Error("sequence {}: nextn run of {} rows", in.seq_id, n);
  if (in.pos0 != it->second.length) {
    return Error("sequence {}: nextn run starts at position {} but the block holds {}", in.seq_id,
                 in.pos0, it->second.length);
  }
  if (in.pos0 + n > n_ctx_) {
    return Error("sequence {}: {} nextn positions exceed the context of {}", in.seq_id, in.pos0 + n,
                 n_ctx_);
  }
  if (in.hidden.size() != static_cast<size_t>(n) * cfg_.n_embd) {
    return Error("nextn run has {} rows of width {} but {} hidden values", n, cfg_.n_embd,
                 in.hidden.size());
  }
  for (int32_t id : in.tokens) {
    if (id < 0 || id >= cfg_.n_vocab) {
      return Error("token id {} is outside the vocabulary (0..{})", id, cfg_.n_vocab - 1);
    }
  }
  return Status::Ok();
}

Status NextnBlock::Forward(const NextnInput& in, NextnOutput* out) {
  KV_RETURN_IF_ERROR(Validate(in));
  Sequence& s = seqs_.at(in.seq_id);
  const int n = static_cast<int>(in.tokens.size());
  const int64_t e = cfg_.n_embd, rows = n;
  const int n_out = in.all_logits ? n : 1;
  KV_RETURN_IF_ERROR(ids_.Reserve(be_, rows, "the nextn token ids"));
  KV_RETURN_IF_ERROR(emb_.Reserve(be_, rows * e, "the nextn embeddings"));
  KV_RETURN_IF_ERROR(hid_.Reserve(be_, rows * e, "the nextn hidden rows"));
  KV_RETURN_IF_ERROR(cat_.Reserve(be_, rows * 2 * e, "the nextn projection input"));
  KV_RETURN_IF_ERROR(x_.Reserve(be_, rows * e, "the nextn residual stream"));
  KV_RETURN_IF_ERROR(normed_.Reserve(be_, rows * e, "the nextn head rows"));
  KV_RETURN_IF_ERROR(cos_sin_.Reserve(be_, rows * (cfg_.n_rot / 2) * 2, "the nextn rope angles"));
  KV_RETURN_IF_ERROR(logits_.Reserve(be_, int64_t{n_out} * cfg_.n_vocab, "the nextn logits"));
  KV_RETURN_IF_ERROR(scratch_.Reserve(be_, cfg_, true, false, n));
  KV_RETURN_IF_ERROR(GrowKv(cfg_, n_ctx_, in.pos0 + n, s.length, be_, &s.attn)
                         .WithContext(fmt::format("sequence {}: nextn", in.seq_id)));

  be_.Upload(ids_, in.tokens.data(), rows);
  be_.GetRows(*w_.tok_embd, ids_, n, emb_);
  be_.Upload(hid_, in.hidden.data(), rows * e);
  // cat: [n, 2 * n_embd], per row the normed embedding, then the normed hidden state.
  for (int64_t r = 0; r < rows; ++r) {
    be_.RmsNorm(emb_ + r * e, w_.enorm, 1, e, cfg_.rms_eps, cat_ + r * 2 * e);
    be_.RmsNorm(hid_ + r * e, w_.hnorm, 1, e, cfg_.rms_eps, cat_ + r * 2 * e + e);
  }
  be_.MatMul(*w_.eh_proj, cat_, n, x_);

  positions_.clear();
  for (int t = 0; t < n; ++t) positions_.push_back(in.pos0 + t);
  be_.RopeAngles(rope_, positions_, cos_sin_);
  ChunkState chunk{&s.attn, 0, n, in.pos0, 0};
  RunAttention(cfg_, w_.layer, std::span<ChunkState>(&chunk, 1), n, cos_sin_, x_, be_, scratch_);
  RunFfn(cfg_, w_.layer, n, x_, be_, scratch_);
  s.length += n;

  be_.RmsNorm(x_, w_.head_norm, n, e, cfg_.rms_eps, normed_);
  be_.MatMul(*w_.output, normed_ + (rows - n_out) * e, n_out, logits_);
  out->hidden.resize(rows * e);
  KV_RETURN_IF_ERROR(
      be_.Download(out->hidden.data(), cfg_.nextn_normed_hidden ? normed_ : x_, rows * e));
  out->logits.resize(static_cast<size_t>(n_out) * cfg_.n_vocab);
  return be_.Download(out->logits.data(), logits_, int64_t{n_out} * cfg_.n_vocab);
}

}  // namespace kvasir
