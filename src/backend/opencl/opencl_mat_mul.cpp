// The OpenCL backend's weight ops: row lookups, matrix products (decode and prefill kernels) and
// the routed experts, over mat_mul.cl and moe.cl.
#include "backend/opencl/opencl_backend_impl.h"
#include "base/check.h"

namespace kvasir::opencl {
namespace {

constexpr int kTile = 8;  // tokens (or row-slots) per work-item of the prefill and expert kernels

size_t Tiles(int64_t n) { return static_cast<size_t>((n + kTile - 1) / kTile); }

}  // namespace

void ClBackend::GetRows(const DeviceMatrix& w, DevPtr ids, int n, DevPtr out) {
  const ClMatrix& m = M(w);
  B(ids, n), B(out, n * w.cols());
  const size_t across = m.kernels->quantized ? w.cols() / 32 : w.cols();
  KernelCall(*this, m.kernels->get_rows)
      .Mem(m.mem)
      .Int(m.row_bytes)
      .Int(w.cols())
      .Ptr(ids)
      .Ptr(out)
      .Run({across, static_cast<size_t>(n), 1}, 2);
}

bool ClBackend::QuantizeActs(cl_mem x, int64_t x_off, int n, int64_t cols) {
  const int64_t nb = cols / 32;
  if (!Grow(acts_q_, n * cols, "quantized activations") ||
      !Grow(acts_d_, n * nb * 4, "quantized activations") ||
      !Grow(acts_s_, n * nb * 8, "quantized activations")) {
    return false;
  }
  KernelCall(*this, K("quantize_q8"))
      .Mem(x)
      .Long(x_off)
      .Int(cols)
      .Mem(acts_q_.mem)
      .Mem(acts_d_.mem)
      .Mem(acts_s_.mem)
      .Run({static_cast<size_t>(nb), static_cast<size_t>(n), 1}, 2);
  return true;
}

// y[n, rows] (at y_off) = x[n, cols] (at x_off) · Wᵀ, on the device's path (DecodePath): its
// decode kernel for one token, its prefill kernel (8 tokens per work-item or work-group, each
// weight block decoded once for them) otherwise; both give a (row, token) the same bits.
void ClBackend::MatMulTo(const ClMatrix& m, cl_mem x, int64_t x_off, int n, cl_mem y,
                         int64_t y_off) {
  const TypeKernels& tk = *m.kernels;
  const size_t tiles = n == 1 ? 1 : Tiles(n);
  if (tk.quantized && !QuantizeActs(x, x_off, n, m.cols())) return;
  if (path_ == DecodePath::kSplit) {
    const size_t L = split_local_;
    KernelCall call(*this, n == 1 ? tk.s1 : tk.s8);
    call.Mem(m.mem).Int(tk.quantized ? m.cols() / 32 : m.cols()).Int(m.row_bytes).Int(n);
    if (tk.quantized) {
      call.Mem(acts_q_.mem).Mem(acts_d_.mem).Mem(acts_s_.mem);
    } else {
      call.Mem(x).Long(x_off);
    }
    call.Mem(y).Long(y_off).Int(m.rows()).Local(L * sizeof(float));
    call.Run({m.rows() * L, tiles, 1}, 2, L);
    return;
  }
  KernelCall call(*this, n == 1 ? tk.x1 : tk.x8);
  call.Mem(m.mem)
      .Int(m.rows())
      .Int(tk.quantized ? m.cols() / 32 : m.cols())
      .Int(m.row_bytes)
      .Int(n);
  if (tk.quantized) {
    call.Mem(acts_q_.mem).Mem(acts_d_.mem).Mem(acts_s_.mem);
  } else {
    call.Mem(x).Long(x_off);
  }
  call.Mem(y).Long(y_off).Run({static_cast<size_t>(m.rows()), tiles, 1}, 2);
}

void ClBackend::MatMul(const DeviceMatrix& w, DevPtr x, int n, DevPtr y) {
  const ClMatrix& m = M(w);
  KV_CHECK(w.count() == 1, "MatMul of {}: a stack of {} matrices", w.name(), w.count());
  MatMulTo(m, B(x, n * w.cols()).mem(), x.offset, n, B(y, n * w.rows()).mem(), y.offset);
}

// y [picks, m.rows] in grouped order = each row-slot's activations through its expert's matrix.
// Activations: row order[j] / k of x (gather: the experts' input) or row j (their hidden rows);
// quantized ones come from the activation scratch, which the caller filled.
void ClBackend::ExpertProduct(const ClMatrix& m, bool gather, int picks, int k, DevPtr ids,
                              cl_mem x, int64_t x_off, cl_mem y) {
  const TypeKernels& tk = *m.kernels;
  KernelCall call(*this, tk.id);
  call.Mem(m.mem).Ulong(m.expert_bytes).Int(m.rows());
  call.Int(tk.quantized ? m.cols() / 32 : m.cols());
  call.Int(m.row_bytes).Int(picks).Mem(moe_order_.mem).Ptr(ids).Int(k).Int(gather ? 1 : 0);
  if (tk.quantized) {
    call.Mem(acts_q_.mem).Mem(acts_d_.mem).Mem(acts_s_.mem);
  } else {
    call.Mem(x).Long(x_off);
  }
  call.Mem(y).Run({static_cast<size_t>(m.rows()), Tiles(picks), 1}, 2);
}

void ClBackend::MoeFfn(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                       DevPtr in, int n, DevPtr ids, DevPtr weights, int k, DevPtr out) {
  const ClMatrix &g = M(gate), &u = M(up), &d = M(down);
  const int64_t picks = static_cast<int64_t>(n) * k, e = d.rows(), ff = g.rows();
  const int n_expert = static_cast<int>(g.count());
  B(in, n * e), B(ids, picks), B(weights, picks), B(out, n * e);
  if (picks == 0) return;
  if (!Grow(moe_order_, picks * 4, "expert routing") ||
      !Grow(moe_pos_, picks * 4, "expert routing") ||
      !Grow(moe_start_, (n_expert + 1) * 4, "expert routing") ||
      !Grow(moe_gate_, picks * ff * 4, "expert activations") ||
      !Grow(moe_up_, picks * ff * 4, "expert activations") ||
      !Grow(moe_out_, picks * e * 4, "expert outputs")) {
    return;
  }
  // Row-slots grouped by expert, so that a run of slots reads its expert's weights once.
  KernelCall(*this, K("moe_group"))
      .Ptr(ids)
      .Int(picks)
      .Int(n_expert)
      .Mem(moe_order_.mem)
      .Mem(moe_pos_.mem)
      .Mem(moe_start_.mem)
      .Run({1, 1, 1}, 1);
  const cl_mem in_mem = B(in, n * e).mem();
  // gate and up read the same input rows: quantized once when both are quantized.
  const bool shared = g.kernels->quantized && u.kernels->quantized;
  if (shared && !QuantizeActs(in_mem, in.offset, n, e)) return;
  for (const ClMatrix* m : {&g, &u}) {
    if (m->kernels->quantized && !shared && !QuantizeActs(in_mem, in.offset, n, e)) return;
    ExpertProduct(*m, true, static_cast<int>(picks), k, ids, in_mem, in.offset,
                  m == &g ? moe_gate_.mem : moe_up_.mem);
  }
  KernelCall(*this, K("silu_mul"))
      .Mem(moe_gate_.mem)
      .Long(0)
      .Mem(moe_up_.mem)
      .Long(0)
      .Mem(moe_gate_.mem)
      .Long(0)
      .Run({static_cast<size_t>(picks * ff), 1, 1}, 1);
  if (d.kernels->quantized && !QuantizeActs(moe_gate_.mem, 0, static_cast<int>(picks), ff)) return;
  ExpertProduct(d, false, static_cast<int>(picks), k, ids, moe_gate_.mem, 0, moe_out_.mem);
  KernelCall(*this, K("moe_combine"))
      .Mem(moe_out_.mem)
      .Mem(moe_pos_.mem)
      .Ptr(weights)
      .Int(k)
      .Int(e)
      .Ptr(out)
      .Run({static_cast<size_t>(e), static_cast<size_t>(n), 1}, 2);
}

}  // namespace kvasir::opencl
