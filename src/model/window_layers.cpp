#include "model/window_layers.h"

#include <fmt/format.h>

namespace kvasir {
namespace {

Status BindAttention(TensorBinder& b, const ModelConfig& cfg, int il, AttentionWeights* w) {
  auto n = [il](const char* what) { return fmt::format("blk.{}.{}", il, what); };
  const int64_t e = cfg.n_embd, qd = cfg.q_dim(), kvd = cfg.kv_dim();
  KV_ASSIGN_OR_RETURN(w->wq, b.Matrix(n("attn_q.weight"), e, cfg.attn_output_gate ? 2 * qd : qd));
  KV_ASSIGN_OR_RETURN(w->wk, b.Matrix(n("attn_k.weight"), e, kvd));
  KV_ASSIGN_OR_RETURN(w->wv, b.Matrix(n("attn_v.weight"), e, kvd));
  KV_ASSIGN_OR_RETURN(w->wo, b.Matrix(n("attn_output.weight"), qd, e));
  if (cfg.qkv_bias) {
    KV_ASSIGN_OR_RETURN(w->bq, b.Vector(n("attn_q.bias"), qd));
    KV_ASSIGN_OR_RETURN(w->bk, b.Vector(n("attn_k.bias"), kvd));
    KV_ASSIGN_OR_RETURN(w->bv, b.Vector(n("attn_v.bias"), kvd));
  }
  if (cfg.qk_norm) {
    KV_ASSIGN_OR_RETURN(w->q_norm, b.Vector(n("attn_q_norm.weight"), cfg.head_dim));
    KV_ASSIGN_OR_RETURN(w->k_norm, b.Vector(n("attn_k_norm.weight"), cfg.head_dim));
  }
  return Status::Ok();
}

Status BindDeltaNet(TensorBinder& b, const ModelConfig& cfg, int il, DeltaNetWeights* w) {
  auto n = [il](const char* what) { return fmt::format("blk.{}.{}", il, what); };
  const int64_t e = cfg.n_embd, conv = cfg.ssm_conv_dim(), inner = cfg.ssm_inner;
  const int64_t nv = cfg.ssm_n_v_heads;
  KV_ASSIGN_OR_RETURN(w->qkv, b.Matrix(n("attn_qkv.weight"), e, conv));
  KV_ASSIGN_OR_RETURN(w->z, b.Matrix(n("attn_gate.weight"), e, inner));
  KV_ASSIGN_OR_RETURN(w->beta, b.Matrix(n("ssm_beta.weight"), e, nv));
  KV_ASSIGN_OR_RETURN(w->alpha, b.Matrix(n("ssm_alpha.weight"), e, nv));
  KV_ASSIGN_OR_RETURN(w->out, b.Matrix(n("ssm_out.weight"), inner, e));
  KV_ASSIGN_OR_RETURN(w->conv, b.Array2d(n("ssm_conv1d.weight"), cfg.ssm_conv_kernel, conv));
  KV_ASSIGN_OR_RETURN(w->dt_bias, b.Vector(n("ssm_dt.bias"), nv));
  KV_ASSIGN_OR_RETURN(w->a, b.Vector(n("ssm_a"), nv));
  KV_ASSIGN_OR_RETURN(w->norm, b.Vector(n("ssm_norm.weight"), cfg.ssm_state));
  return Status::Ok();
}

Status BindFfn(TensorBinder& b, int il, const char* suffix, int64_t e, int64_t ff, FfnWeights* w) {
  auto n = [il, suffix](const char* what) {
    return fmt::format("blk.{}.{}{}.weight", il, what, suffix);
  };
  KV_ASSIGN_OR_RETURN(w->gate, b.Matrix(n("ffn_gate"), e, ff));
  KV_ASSIGN_OR_RETURN(w->up, b.Matrix(n("ffn_up"), e, ff));
  KV_ASSIGN_OR_RETURN(w->down, b.Matrix(n("ffn_down"), ff, e));
  return Status::Ok();
}

Status BindMoe(TensorBinder& b, const ModelConfig& cfg, int il, MoeWeights* w) {
  auto n = [il](const char* what) { return fmt::format("blk.{}.{}.weight", il, what); };
  const int64_t e = cfg.n_embd, ff = cfg.n_ff_exp, ne = cfg.n_expert;
  KV_ASSIGN_OR_RETURN(w->router, b.Matrix(n("ffn_gate_inp"), e, ne));
  KV_ASSIGN_OR_RETURN(w->gate, b.Experts(n("ffn_gate_exps"), e, ff, ne));
  KV_ASSIGN_OR_RETURN(w->up, b.Experts(n("ffn_up_exps"), e, ff, ne));
  KV_ASSIGN_OR_RETURN(w->down, b.Experts(n("ffn_down_exps"), ff, e, ne));
  w->has_shared = cfg.n_ff_shexp > 0;
  if (w->has_shared) {
    KV_ASSIGN_OR_RETURN(w->shared_gate, b.Matrix(n("ffn_gate_inp_shexp"), e, 1));
    KV_RETURN_IF_ERROR(BindFfn(b, il, "_shexp", e, cfg.n_ff_shexp, &w->shared));
  }
  return Status::Ok();
}

}  // namespace

Status BindLayer(TensorBinder& b, const ModelConfig& cfg, int il, LayerWeights* w) {
  const int64_t e = cfg.n_embd;
  w->kind = cfg.layer_kind(il);
  KV_ASSIGN_OR_RETURN(w->attn_norm, b.Vector(fmt::format("blk.{}.attn_norm.weight", il), e));
  if (w->kind == LayerKind::kAttention) {
    KV_RETURN_IF_ERROR(BindAttention(b, cfg, il, &w->attn));
  } else {
    KV_RETURN_IF_ERROR(BindDeltaNet(b, cfg, il, &w->delta));
  }
  KV_ASSIGN_OR_RETURN(w->ffn_norm,
                      b.Vector(fmt::format("blk.{}.{}.weight", il, cfg.ffn_norm_tensor), e));
  if (cfg.n_expert > 0) return BindMoe(b, cfg, il, &w->moe);
  return BindFfn(b, il, "", e, cfg.n_ff, &w->ffn);
}

void RunAttention(const ModelConfig& cfg, const LayerWeights& lw, std::span<ChunkState> chunks,
                  int n_rows, DevPtr cos_sin, DevPtr x, Backend& be, LayerScratch& s) {
  const AttentionWeights& w = lw.attn;
  const int e = cfg.n_embd, qd = cfg.q_dim(), kvd = cfg.kv_dim(), hd = cfg.head_dim;
  const int64_t rows = n_rows;

  be.RmsNorm(x, lw.attn_norm, n_rows, e, cfg.rms_eps, s.cur);
  if (cfg.attn_output_gate) {
    // attn_q gives, per head, the query then the gate: [n_rows, n_head, 2, head_dim].
    be.MatMul(*w.wq, s.cur, n_rows, s.q_full);
    be.SplitQGate(s.q_full, n_rows, cfg.n_head, hd, s.q, s.gate);
  } else {
    be.MatMul(*w.wq, s.cur, n_rows, s.q);
  }
  be.MatMul(*w.wk, s.cur, n_rows, s.k);
  be.MatMul(*w.wv, s.cur, n_rows, s.v);
  if (cfg.qkv_bias) {
    be.AddBias(s.q, w.bq, n_rows, qd);
    be.AddBias(s.k, w.bk, n_rows, kvd);
    be.AddBias(s.v, w.bv, n_rows, kvd);
  }
  if (cfg.qk_norm) {
    be.RmsNorm(s.q, w.q_norm, n_rows * cfg.n_head, hd, cfg.rms_eps, s.q);
    be.RmsNorm(s.k, w.k_norm, n_rows * cfg.n_head_kv, hd, cfg.rms_eps, s.k);
  }
  be.Rope(s.q, n_rows, cfg.n_head, hd, cfg.n_rot, cfg.rope_type, cos_sin);
  be.Rope(s.k, n_rows, cfg.n_head_kv, hd, cfg.n_rot, cfg.rope_type, cos_sin);

  const AttentionParams options = AttentionOptions(cfg);
  for (ChunkState& ch : chunks) {
    const DevPtr k_cache{ch.state->k.get(), 0}, v_cache{ch.state->v.get(), 0};
    const int64_t row0 = ch.row0;
    be.AppendKv(s.k + row0 * kvd, s.v + row0 * kvd, ch.n, kvd, k_cache, v_cache, ch.pos0);
    be.Attention(s.q + row0 * qd, ch.n, ch.pos0, k_cache, v_cache, options, s.attn + row0 * qd);
  }
  if (cfg.attn_output_gate) be.SigmoidMul(s.attn, s.gate, rows * qd);
  be.MatMul(*w.wo, s.attn, n_rows, s.proj);
  be.Add(x, s.proj, rows * e);
}

void RunDeltaNet(const ModelConfig& cfg, const LayerWeights& lw, std::span<ChunkState> chunks,
                 int n_rows, DevPtr x, Backend& be, LayerScratch& s) {
  const DeltaNetWeights& w = lw.delta;
  const int e = cfg.n_embd, conv = cfg.ssm_conv_dim(), inner = cfg.ssm_inner;
  const int nv = cfg.ssm_n_v_heads;
  const int64_t rows = n_rows;

  // qkv [n_rows, conv_dim] before the convolution, conv the same after it.
  be.RmsNorm(x, lw.attn_norm, n_rows, e, cfg.rms_eps, s.cur);
  be.MatMul(*w.qkv, s.cur, n_rows, s.qkv);
  be.MatMul(*w.z, s.cur, n_rows, s.z);
  be.MatMul(*w.beta, s.cur, n_rows, s.beta);
  be.MatMul(*w.alpha, s.cur, n_rows, s.alpha);
  // Rows [row0, row0 + n) of one chunk through the recurrence, the state carried over.
  auto recur = [&](LayerState* st, int64_t row0, int n) {
    be.CausalConvSilu(s.qkv + row0 * conv, n, conv, cfg.ssm_conv_kernel, w.conv,
                      DevPtr{st->conv.get(), 0}, s.conv + row0 * conv);
    be.GatedDeltaRule(s.conv + row0 * conv, conv, s.alpha + row0 * nv, s.beta + row0 * nv,
                      w.dt_bias, w.a, n, cfg.ssm_n_k_heads, nv, cfg.ssm_state, cfg.rms_eps,
                      DevPtr{st->ssm.get(), 0}, s.dn_out + row0 * inner);
  };
  for (ChunkState& ch : chunks) {
    // Rows run strictly in order in both ops, so running the saved rows one at a time gives the
    // same bits as one call over the chunk.
    const int head = ch.n - ch.n_save;
    if (head > 0) recur(ch.state, ch.row0, head);
    const int slots = static_cast<int>(ch.state->saved_conv.size());
    for (int t = head; t < ch.n; ++t) {
      SaveLayerState(be, (ch.pos0 + t) % slots, ch.state);
      recur(ch.state, ch.row0 + t, 1);
    }
  }
  // Gated RMSNorm per value head: norm(o) * silu(z).
  be.RmsNorm(s.dn_out, w.norm, n_rows * nv, cfg.ssm_state, cfg.rms_eps, s.dn_out);
  be.SiluMul(s.z, s.dn_out, rows * inner, s.dn_out);
  be.MatMul(*w.out, s.dn_out, n_rows, s.proj);
  be.Add(x, s.proj, rows * e);
}

void RunDenseFfn(const FfnWeights& w, int n_ff, DevPtr in, int n_rows, DevPtr out, Backend& be,
                 LayerScratch& s) {
  be.MatMul(*w.gate, in, n_rows, s.ffn_gate);
  be.MatMul(*w.up, in, n_rows, s.ffn_up);
  be.SiluMul(s.ffn_gate, s.ffn_up, static_cast<int64_t>(n_rows) * n_ff, s.ffn_gate);
  be.MatMul(*w.down, s.ffn_gate, n_rows, out);
}

void RunFfn(const ModelConfig& cfg, const LayerWeights& w, int n_rows, DevPtr x, Backend& be,
            LayerScratch& s) {
  const int e = cfg.n_embd;
  be.RmsNorm(x, w.ffn_norm, n_rows, e, cfg.rms_eps, s.cur);
  if (cfg.n_expert > 0) {
    RunMoe(cfg, w.moe, s.cur, n_rows, s.proj, be, s);
  } else {
    RunDenseFfn(w.ffn, cfg.n_ff, s.cur, n_rows, s.proj, be, s);
  }
  be.Add(x, s.proj, static_cast<int64_t>(n_rows) * e);
}

}  // namespace kvasir
