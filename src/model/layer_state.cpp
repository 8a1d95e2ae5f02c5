// What the layers need from their backend besides weights: the ops to check at load, the
// per-sequence state (KV caches, DeltaNet state) and the scratch of a batch.
#include <algorithm>
#include <cmath>

#include "model/window_layers.h"

namespace kvasir {

std::vector<Op> LayerOps(const ModelConfig& cfg, LayerKind kind) {
  std::vector<Op> ops = {Op::kRmsNorm, Op::kMatMul, Op::kAdd, Op::kSiluMul};
  if (kind == LayerKind::kAttention) {
    ops.insert(ops.end(), {Op::kRopeAngles, Op::kRope, Op::kAppendKv, Op::kAttention});
    if (cfg.qkv_bias) ops.push_back(Op::kAddBias);
    if (cfg.attn_output_gate) ops.insert(ops.end(), {Op::kSplitQGate, Op::kSigmoidMul});
  } else {
    ops.insert(ops.end(), {Op::kCausalConvSilu, Op::kGatedDeltaRule});
  }
  if (cfg.n_expert > 0) {
    ops.insert(ops.end(), {Op::kMoeRoute, Op::kMoeFfn});
    if (cfg.n_ff_shexp > 0) ops.insert(ops.end(), {Op::kSigmoid, Op::kScaleRows});
  }
  return ops;
}

AttentionParams AttentionOptions(const ModelConfig& cfg) {
  AttentionParams p;
  p.n_head = cfg.n_head;
  p.n_head_kv = cfg.n_head_kv;
  p.head_dim = cfg.head_dim;
  p.scale =
      cfg.attn_scale != 0.0f ? cfg.attn_scale : 1.0f / std::sqrt(static_cast<float>(cfg.head_dim));
  p.softcap = cfg.attn_softcap;
  p.window = cfg.attn_window;
  return p;
}

Status NewLayerState(const ModelConfig& cfg, LayerKind kind, Backend& be, LayerState* s) {
  *s = LayerState();
  if (kind != LayerKind::kDeltaNet) return Status::Ok();
  const int64_t conv = static_cast<int64_t>(cfg.ssm_conv_kernel - 1) * cfg.ssm_conv_dim();
  const int64_t ssm = static_cast<int64_t>(cfg.ssm_n_v_heads) * cfg.ssm_state * cfg.ssm_state;
  KV_ASSIGN_OR_RETURN(s->conv, be.Alloc(conv, "a sequence's convolution state"));
  KV_ASSIGN_OR_RETURN(s->ssm, be.Alloc(ssm, "a sequence's delta-rule state"));
  ClearLayerState(cfg, be, s);
  return Status::Ok();
}

void ClearLayerState(const ModelConfig& cfg, Backend& be, LayerState* s) {
  if (s->conv != nullptr) be.Fill(DevPtr{s->conv.get(), 0}, s->conv->size(), 0.0f);
  if (s->ssm != nullptr) be.Fill(DevPtr{s->ssm.get(), 0}, s->ssm->size(), 0.0f);
}

Status ReserveSavedStates(Backend& be, int slots, LayerState* s) {
  if (s->conv == nullptr || static_cast<int>(s->saved_conv.size()) >= slots) return Status::Ok();
  s->saved_conv.clear();
  s->saved_ssm.clear();
  for (int i = 0; i < slots; ++i) {
    KV_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> conv,
                        be.Alloc(s->conv->size(), "a checkpoint of a convolution state"));
    KV_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> ssm,
                        be.Alloc(s->ssm->size(), "a checkpoint of a delta-rule state"));
    s->saved_conv.push_back(std::move(conv));
    s->saved_ssm.push_back(std::move(ssm));
  }
  return Status::Ok();
}

void SaveLayerState(Backend& be, int slot, LayerState* s) {
  be.Copy(DevPtr{s->saved_conv[slot].get(), 0}, DevPtr{s->conv.get(), 0}, s->conv->size());
  be.Copy(DevPtr{s->saved_ssm[slot].get(), 0}, DevPtr{s->ssm.get(), 0}, s->ssm->size());
}

void RestoreLayerState(Backend& be, int slot, LayerState* s) {
  be.Copy(DevPtr{s->conv.get(), 0}, DevPtr{s->saved_conv[slot].get(), 0}, s->conv->size());
  be.Copy(DevPtr{s->ssm.get(), 0}, DevPtr{s->saved_ssm[slot].get(), 0}, s->ssm->size());
}

Status GrowKv(const ModelConfig& cfg, int n_ctx, int need, int length, Backend& be, LayerState* s) {
  if (s->capacity >= need) return Status::Ok();
  const int64_t kvd = cfg.kv_dim();
  const int cap = std::min(std::max(need, s->capacity * 2), n_ctx);
  KV_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> k, be.Alloc(cap * kvd, "a KV cache (keys)"));
  KV_ASSIGN_OR_RETURN(std::unique_ptr<DeviceBuffer> v, be.Alloc(cap * kvd, "a KV cache (values)"));
  if (length > 0) {
    be.Copy(DevPtr{k.get(), 0}, DevPtr{s->k.get(), 0}, length * kvd);
    be.Copy(DevPtr{v.get(), 0}, DevPtr{s->v.get(), 0}, length * kvd);
  }
  s->k = std::move(k);
  s->v = std::move(v);
  s->capacity = cap;
  return Status::Ok();
}

Status Scratch::Reserve(Backend& be, int64_t n, std::string_view what) {
  if (n <= 0 || (buf_ != nullptr && buf_->size() >= n)) return Status::Ok();
  buf_.reset();  // free the old one first: its contents are not kept
  KV_ASSIGN_OR_RETURN(buf_, be.Alloc(n, what));
  return Status::Ok();
}

Status LayerScratch::Reserve(Backend& be, const ModelConfig& cfg, bool has_attention,
                             bool has_delta_net, int n_rows) {
  const int64_t rows = n_rows, e = cfg.n_embd;
  const bool moe = cfg.n_expert > 0;
  const int64_t ff = moe ? cfg.n_ff_shexp : cfg.n_ff;
  const int64_t picks = rows * cfg.n_expert_used;
  const struct {
    Scratch* s;
    int64_t n;
  } want[] = {
      {&cur, rows * e},
      {&proj, rows * e},
      {&q, has_attention ? rows * cfg.q_dim() : 0},
      {&k, has_attention ? rows * cfg.kv_dim() : 0},
      {&v, has_attention ? rows * cfg.kv_dim() : 0},
      {&attn, has_attention ? rows * cfg.q_dim() : 0},
      {&q_full, has_attention && cfg.attn_output_gate ? rows * 2 * cfg.q_dim() : 0},
      {&gate, has_attention && cfg.attn_output_gate ? rows * cfg.q_dim() : 0},
      {&qkv, has_delta_net ? rows * cfg.ssm_conv_dim() : 0},
      {&conv, has_delta_net ? rows * cfg.ssm_conv_dim() : 0},
      {&z, has_delta_net ? rows * cfg.ssm_inner : 0},
      {&alpha, has_delta_net ? rows * cfg.ssm_n_v_heads : 0},
      {&beta, has_delta_net ? rows * cfg.ssm_n_v_heads : 0},
      {&dn_out, has_delta_net ? rows * cfg.ssm_inner : 0},
      {&ffn_gate, rows * ff},
      {&ffn_up, rows * ff},
      {&ffn_sum, moe && cfg.n_ff_shexp > 0 ? rows * e : 0},
      {&router, moe ? rows * cfg.n_expert : 0},
      {&route_ids, moe ? picks : 0},
      {&route_weights, moe ? picks : 0},
      {&shared_scale, moe && cfg.n_ff_shexp > 0 ? rows : 0},
  };
  for (const auto& w : want) KV_RETURN_IF_ERROR(w.s->Reserve(be, w.n, "the layers' scratch"));
  return Status::Ok();
}

void LayerScratch::Release() {
  for (Scratch* s :
       {&cur,      &q_full, &q,       &k,      &v,         &gate,          &attn,
        &proj,     &qkv,    &conv,    &z,      &alpha,     &beta,          &dn_out,
        &ffn_gate, &ffn_up, &ffn_sum, &router, &route_ids, &route_weights, &shared_scale}) {
    s->Release();
  }
}

}  // namespace kvasir
