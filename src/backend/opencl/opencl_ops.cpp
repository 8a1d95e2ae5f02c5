// The OpenCL backend's row, attention, DeltaNet and routing ops: one kernel each (rows.cl,
// attention.cl, delta_net.cl, moe.cl), shapes as backend/backend.h.
#include <vector>

#include "backend/opencl/opencl_backend_impl.h"
#include "base/check.h"

namespace kvasir::opencl {

void ClBackend::RmsNorm(DevPtr x, DevPtr w, int n_rows, int width, float eps, DevPtr y) {
  const int64_t n = static_cast<int64_t>(n_rows) * width;
  B(x, n), B(w, width), B(y, n);
  KernelCall(*this, K("rms_norm"))
      .Ptr(x)
      .Ptr(w)
      .Int(width)
      .Float(eps)
      .Ptr(y)
      .Local(rows_local_ * sizeof(float))
      .Run({n_rows * rows_local_, 1, 1}, 1, rows_local_);
}

void ClBackend::RopeAngles(const RopeAngleParams& p, std::span<const int32_t> positions,
                           DevPtr out) {
  // The table is small and its positions are the host's: computed there in double precision, as
  // the CPU backend does (kernels/rope_angles.h), and written once.
  const int64_t row = p.n_rot / 2 * 2;
  const int64_t n = static_cast<int64_t>(positions.size()) * row;
  if (n == 0) return;
  std::vector<float> table(static_cast<size_t>(n));  // [positions, n_rot / 2, 2]
  for (size_t i = 0; i < positions.size(); ++i) {
    kvasir::RopeAngles(p, positions[i], table.data() + i * row);
  }
  Upload(out, table.data(), n);
}

void ClBackend::Rope(DevPtr x, int n_rows, int n_heads, int head_dim, int n_rot, RopeType type,
                     DevPtr cos_sin) {
  B(x, static_cast<int64_t>(n_rows) * n_heads * head_dim);
  B(cos_sin, static_cast<int64_t>(n_rows) * (n_rot / 2) * 2);
  KernelCall(*this, K("rope"))
      .Ptr(x)
      .Int(n_heads)
      .Int(head_dim)
      .Int(n_rot)
      .Int(type == RopeType::kNeox ? 1 : 0)
      .Ptr(cos_sin)
      .Run({static_cast<size_t>(n_rot / 2), static_cast<size_t>(n_heads),
            static_cast<size_t>(n_rows)},
           3);
}

void ClBackend::SplitQGate(DevPtr q_full, int n_rows, int n_head, int head_dim, DevPtr q,
                           DevPtr gate) {
  const int64_t heads = static_cast<int64_t>(n_rows) * n_head;
  B(q_full, heads * 2 * head_dim), B(q, heads * head_dim), B(gate, heads * head_dim);
  KernelCall(*this, K("split_q_gate"))
      .Ptr(q_full)
      .Int(head_dim)
      .Ptr(q)
      .Ptr(gate)
      .Run({static_cast<size_t>(head_dim), static_cast<size_t>(heads), 1}, 2);
}

void ClBackend::AppendKv(DevPtr k, DevPtr v, int n, int kv_dim, DevPtr k_cache, DevPtr v_cache,
                         int pos0) {
  const int64_t count = static_cast<int64_t>(n) * kv_dim;
  const int64_t at = static_cast<int64_t>(pos0) * kv_dim;
  Copy(k_cache + at, k, count);
  Copy(v_cache + at, v, count);
}

void ClBackend::Attention(DevPtr q, int n, int pos0, DevPtr k_cache, DevPtr v_cache,
                          const AttentionParams& p, DevPtr out) {
  KV_CHECK(SupportsAttention(p), "backend opencl: attention with head_dim {}", p.head_dim);
  const int64_t q_n = static_cast<int64_t>(n) * p.n_head * p.head_dim;
  const int64_t kv_n = static_cast<int64_t>(pos0 + n) * p.n_head_kv * p.head_dim;
  B(q, q_n), B(k_cache, kv_n), B(v_cache, kv_n), B(out, q_n);
  const size_t L = attention_local_;
  KernelCall(*this, K("attention"))
      .Ptr(q)
      .Int(pos0)
      .Ptr(k_cache)
      .Ptr(v_cache)
      .Int(p.n_head)
      .Int(p.n_head_kv)
      .Int(p.head_dim)
      .Float(p.scale)
      .Float(p.softcap)
      .Int(p.window)
      .Ptr(out)
      .Local(p.head_dim * sizeof(float))
      .Local(256 * sizeof(float))
      .Local(L * sizeof(float))
      .Run({p.n_head * L, static_cast<size_t>(n), 1}, 2, L);
}

void ClBackend::SiluMul(DevPtr gate, DevPtr up, int64_t n, DevPtr out) {
  B(gate, n), B(up, n), B(out, n);
  KernelCall(*this, K("silu_mul")).Ptr(gate).Ptr(up).Ptr(out).Run({size_t(n), 1, 1}, 1);
}

void ClBackend::Add(DevPtr y, DevPtr x, int64_t n) {
  B(y, n), B(x, n);
  KernelCall(*this, K("add")).Ptr(y).Ptr(x).Run({size_t(n), 1, 1}, 1);
}

void ClBackend::AddBias(DevPtr y, DevPtr b, int n_rows, int width) {
  B(y, static_cast<int64_t>(n_rows) * width), B(b, width);
  KernelCall(*this, K("add_bias"))
      .Ptr(y)
      .Ptr(b)
      .Int(width)
      .Run({static_cast<size_t>(width), static_cast<size_t>(n_rows), 1}, 2);
}

void ClBackend::SigmoidMul(DevPtr y, DevPtr gate, int64_t n) {
  B(y, n), B(gate, n);
  KernelCall(*this, K("sigmoid_mul")).Ptr(y).Ptr(gate).Run({size_t(n), 1, 1}, 1);
}

void ClBackend::Sigmoid(DevPtr x, int64_t n) {
  B(x, n);
  KernelCall(*this, K("sigmoid")).Ptr(x).Run({size_t(n), 1, 1}, 1);
}

void ClBackend::ScaleRows(DevPtr y, DevPtr s, int n_rows, int width) {
  B(y, static_cast<int64_t>(n_rows) * width), B(s, n_rows);
  KernelCall(*this, K("scale_rows"))
      .Ptr(y)
      .Ptr(s)
      .Int(width)
      .Run({static_cast<size_t>(width), static_cast<size_t>(n_rows), 1}, 2);
}

void ClBackend::CausalConvSilu(DevPtr x, int n, int channels, int kernel, DevPtr w, DevPtr state,
                               DevPtr out) {
  const int64_t rows = static_cast<int64_t>(n) * channels;
  B(x, rows), B(w, int64_t{channels} * kernel), B(state, int64_t{kernel - 1} * channels);
  B(out, rows);
  KernelCall(*this, K("causal_conv_silu"))
      .Ptr(x)
      .Int(n)
      .Int(channels)
      .Int(kernel)
      .Ptr(w)
      .Ptr(state)
      .Ptr(out)
      .Run({static_cast<size_t>(channels), 1, 1}, 1);
}

void ClBackend::GatedDeltaRule(DevPtr qkv, int64_t row_stride, DevPtr alpha, DevPtr beta,
                               DevPtr dt_bias, DevPtr a, int n, int n_k_heads, int n_v_heads,
                               int dim, float eps, DevPtr state, DevPtr out) {
  const int64_t gates = static_cast<int64_t>(n) * n_v_heads;
  B(qkv, n * row_stride), B(alpha, gates), B(beta, gates), B(dt_bias, n_v_heads);
  B(a, n_v_heads), B(state, int64_t{n_v_heads} * dim * dim), B(out, gates * dim);
  const size_t L = delta_local_;
  KernelCall(*this, K("gated_delta_rule"))
      .Ptr(qkv)
      .Long(row_stride)
      .Ptr(alpha)
      .Ptr(beta)
      .Ptr(dt_bias)
      .Ptr(a)
      .Int(n)
      .Int(n_k_heads)
      .Int(n_v_heads)
      .Int(dim)
      .Float(eps)
      .Ptr(state)
      .Ptr(out)
      .Local(dim * sizeof(float))
      .Local(dim * sizeof(float))
      .Local(L * sizeof(float))
      .Run({n_v_heads * L, 1, 1}, 1, L);
}

void ClBackend::MoeRoute(DevPtr logits, int n, int n_expert, int k, DevPtr ids, DevPtr weights) {
  const int64_t picks = static_cast<int64_t>(n) * k;
  B(logits, static_cast<int64_t>(n) * n_expert), B(ids, picks), B(weights, picks);
  KernelCall(*this, K("moe_route"))
      .Ptr(logits)
      .Int(n_expert)
      .Int(k)
      .Ptr(ids)
      .Ptr(weights)
      .Run({static_cast<size_t>(n), 1, 1}, 1);
}

}  // namespace kvasir::opencl
