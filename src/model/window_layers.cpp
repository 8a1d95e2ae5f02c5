#include "model/window_layers.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/check.h"

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

Status BindFfn(TensorBinder& b, int il, const char* suffix, int64_t e, int64_t ff,
               FfnWeights* w) {
  auto n = [il, suffix](const char* what) { return fmt::format("blk.{}.{}{}.weight", il, what, suffix); };
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

LayerState NewLayerState(const ModelConfig& cfg, LayerKind kind) {
  LayerState s;
  if (kind == LayerKind::kDeltaNet) {
    s.conv.assign(static_cast<size_t>(cfg.ssm_conv_kernel - 1) * cfg.ssm_conv_dim(), 0.0f);
    s.ssm.assign(static_cast<size_t>(cfg.ssm_n_v_heads) * cfg.ssm_state * cfg.ssm_state, 0.0f);
  }
  return s;
}

void RunAttention(const ModelConfig& cfg, const LayerWeights& lw, int n_ctx,
                  std::span<ChunkState> chunks, int n_rows, const float* cos_sin, float* x,
                  Backend& be, LayerScratch& s) {
  const AttentionWeights& w = lw.attn;
  const int e = cfg.n_embd, qd = cfg.q_dim(), kvd = cfg.kv_dim(), hd = cfg.head_dim;
  const size_t rows = static_cast<size_t>(n_rows);
  GrowScratch(s.cur, rows * e);
  GrowScratch(s.q, rows * qd);
  GrowScratch(s.k, rows * kvd);
  GrowScratch(s.v, rows * kvd);
  GrowScratch(s.attn, rows * qd);
  GrowScratch(s.proj, rows * e);

  be.RmsNorm(x, lw.attn_norm, n_rows, e, cfg.rms_eps, s.cur.data());
  if (cfg.attn_output_gate) {
    // attn_q gives, per head, the query then the gate: [n_rows, n_head, 2, head_dim].
    GrowScratch(s.q_full, rows * 2 * qd);
    GrowScratch(s.gate, rows * qd);
    be.MatMul(w.wq, s.cur.data(), n_rows, s.q_full.data());
    for (size_t r = 0; r < rows * cfg.n_head; ++r) {
      const float* src = s.q_full.data() + r * 2 * hd;
      std::copy_n(src, hd, s.q.data() + r * hd);
      std::copy_n(src + hd, hd, s.gate.data() + r * hd);
    }
  } else {
    be.MatMul(w.wq, s.cur.data(), n_rows, s.q.data());
  }
  be.MatMul(w.wk, s.cur.data(), n_rows, s.k.data());
  be.MatMul(w.wv, s.cur.data(), n_rows, s.v.data());
  if (cfg.qkv_bias) {
    be.AddBias(s.q.data(), w.bq, n_rows, qd);
    be.AddBias(s.k.data(), w.bk, n_rows, kvd);
    be.AddBias(s.v.data(), w.bv, n_rows, kvd);
  }
  if (cfg.qk_norm) {
    be.RmsNorm(s.q.data(), w.q_norm, n_rows * cfg.n_head, hd, cfg.rms_eps, s.q.data());
    be.RmsNorm(s.k.data(), w.k_norm, n_rows * cfg.n_head_kv, hd, cfg.rms_eps, s.k.data());
  }
  be.Rope(s.q.data(), n_rows, cfg.n_head, hd, cfg.n_rot, cfg.rope_type, cos_sin);
  be.Rope(s.k.data(), n_rows, cfg.n_head_kv, hd, cfg.n_rot, cfg.rope_type, cos_sin);

  for (ChunkState& ch : chunks) {
    std::vector<float>& kc = ch.state->k;
    std::vector<float>& vc = ch.state->v;
    const size_t end = static_cast<size_t>(ch.pos0 + ch.n) * kvd;
    if (kc.capacity() < end) {
      // Grow geometrically up to the context so long generations do not copy every step.
      const size_t cap =
          std::min(std::max(end, kc.capacity() * 2), static_cast<size_t>(n_ctx) * kvd);
      kc.reserve(cap);
      vc.reserve(cap);
    }
    kc.resize(end);
    vc.resize(end);
    const size_t row0 = static_cast<size_t>(ch.row0);
    std::copy_n(s.k.data() + row0 * kvd, static_cast<size_t>(ch.n) * kvd,
                kc.data() + static_cast<size_t>(ch.pos0) * kvd);
    std::copy_n(s.v.data() + row0 * kvd, static_cast<size_t>(ch.n) * kvd,
                vc.data() + static_cast<size_t>(ch.pos0) * kvd);
    be.Attention(s.q.data() + row0 * qd, ch.n, ch.pos0, kc.data(), vc.data(), cfg.n_head,
                 cfg.n_head_kv, hd, s.attn.data() + row0 * qd);
  }
  if (cfg.attn_output_gate) be.SigmoidMul(s.attn.data(), s.gate.data(), rows * qd);
  be.MatMul(w.wo, s.attn.data(), n_rows, s.proj.data());
  be.Add(x, s.proj.data(), static_cast<int64_t>(rows) * e);
}

void RunDeltaNet(const ModelConfig& cfg, const LayerWeights& lw, std::span<ChunkState> chunks,
                 int n_rows, float* x, Backend& be, LayerScratch& s) {
  const DeltaNetWeights& w = lw.delta;
  const int e = cfg.n_embd, conv = cfg.ssm_conv_dim(), inner = cfg.ssm_inner;
  const int nv = cfg.ssm_n_v_heads;
  const size_t rows = static_cast<size_t>(n_rows);
  GrowScratch(s.cur, rows * e);
  GrowScratch(s.qkv, rows * conv);   // [n_rows, conv_dim] before the convolution
  GrowScratch(s.conv, rows * conv);  // [n_rows, conv_dim] after it
  GrowScratch(s.z, rows * inner);
  GrowScratch(s.alpha, rows * nv);
  GrowScratch(s.beta, rows * nv);
  GrowScratch(s.dn_out, rows * inner);
  GrowScratch(s.proj, rows * e);

  be.RmsNorm(x, lw.attn_norm, n_rows, e, cfg.rms_eps, s.cur.data());
  be.MatMul(w.qkv, s.cur.data(), n_rows, s.qkv.data());
  be.MatMul(w.z, s.cur.data(), n_rows, s.z.data());
  be.MatMul(w.beta, s.cur.data(), n_rows, s.beta.data());
  be.MatMul(w.alpha, s.cur.data(), n_rows, s.alpha.data());
  for (ChunkState& ch : chunks) {
    const size_t row0 = static_cast<size_t>(ch.row0);
    be.CausalConvSilu(s.qkv.data() + row0 * conv, ch.n, conv, cfg.ssm_conv_kernel, w.conv,
                      ch.state->conv.data(), s.conv.data() + row0 * conv);
    be.GatedDeltaRule(s.conv.data() + row0 * conv, conv, s.alpha.data() + row0 * nv,
                      s.beta.data() + row0 * nv, w.dt_bias, w.a, ch.n, cfg.ssm_n_k_heads, nv,
                      cfg.ssm_state, cfg.rms_eps, ch.state->ssm.data(),
                      s.dn_out.data() + row0 * inner);
  }
  // Gated RMSNorm per value head: norm(o) * silu(z).
  be.RmsNorm(s.dn_out.data(), w.norm, n_rows * nv, cfg.ssm_state, cfg.rms_eps, s.dn_out.data());
  be.SiluMul(s.z.data(), s.dn_out.data(), static_cast<int64_t>(rows) * inner, s.dn_out.data());
  be.MatMul(w.out, s.dn_out.data(), n_rows, s.proj.data());
  be.Add(x, s.proj.data(), static_cast<int64_t>(rows) * e);
}

void RunDenseFfn(const FfnWeights& w, int n_ff, const float* in, int n_rows, float* out,
                 Backend& be, LayerScratch& s) {
  const size_t rows = static_cast<size_t>(n_rows);
  GrowScratch(s.ffn_gate, rows * n_ff);
  GrowScratch(s.ffn_up, rows * n_ff);
  be.MatMul(w.gate, in, n_rows, s.ffn_gate.data());
  be.MatMul(w.up, in, n_rows, s.ffn_up.data());
  be.SiluMul(s.ffn_gate.data(), s.ffn_up.data(), static_cast<int64_t>(rows) * n_ff,
             s.ffn_gate.data());
  be.MatMul(w.down, s.ffn_gate.data(), n_rows, out);
}

void RunFfn(const ModelConfig& cfg, const LayerWeights& w, int n_rows, float* x, Backend& be,
            LayerScratch& s) {
  const int e = cfg.n_embd;
  const size_t rows = static_cast<size_t>(n_rows);
  GrowScratch(s.cur, rows * e);
  GrowScratch(s.proj, rows * e);
  be.RmsNorm(x, w.ffn_norm, n_rows, e, cfg.rms_eps, s.cur.data());
  if (cfg.n_expert > 0) {
    RunMoe(cfg, w.moe, s.cur.data(), n_rows, s.proj.data(), be, s);
  } else {
    RunDenseFfn(w.ffn, cfg.n_ff, s.cur.data(), n_rows, s.proj.data(), be, s);
  }
  be.Add(x, s.proj.data(), static_cast<int64_t>(rows) * e);
}

}  // namespace kvasir
