#include "backend/cuda/cuda_backend.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "backend/cuda/cuda_device.h"
#include "backend/cuda/cuda_kernels.h"
#include "backend/cuda/cuda_queue.h"
#include "backend/cuda/cuda_weights.h"
#include "base/check.h"
#include "base/human.h"

namespace kvasir::cuda {
namespace {

class CudaBackend;

// Device memory of n 4-byte elements.
class CudaBuffer final : public DeviceBuffer {
 public:
  CudaBuffer(CudaBackend* be, int64_t n, float* data);
  ~CudaBuffer() override;
  float* data() const { return data_; }

 private:
  CudaBackend* be_;
  float* data_;
};

// A weight matrix (or expert stack) in device layout.
class CudaMatrix final : public DeviceMatrix {
 public:
  CudaMatrix(CudaBackend* be, const HostMatrix& m, uint64_t bytes, const DevMatrix& dev);
  ~CudaMatrix() override;
  DevMatrix dev;

 private:
  CudaBackend* be_;
};

bool Quantized(TensorType t) { return !IsFloatType(static_cast<int>(t)); }

size_t Align256(size_t n) { return (n + 255) / 256 * 256; }

// "f32, f16, q4_0, ...": the types this backend multiplies, for messages.
std::string TypeNames() {
  std::string out;
  for (TensorType t : CudaTypes()) {
    out += (out.empty() ? "" : ", ") + TensorTypeName(static_cast<uint32_t>(t));
  }
  return out;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(DeviceInfo info, std::unique_ptr<CudaQueue> queue)
      : device_(std::move(info)), q_(std::move(queue)) {}
  ~CudaBackend() override {
    for (Scratch* s : {&acts_, &moe_, &positions_}) q_->Free(s->ptr);
  }

  const DeviceInfo& device() const override { return device_; }
  int n_threads() const override { return 1; }
  bool SupportsType(TensorType type) const override { return CudaSupportsType(type); }
  bool SupportsOp(Op op) const override { return op < Op::kCount; }
  bool SupportsAttention(const AttentionParams& p) const override {
    return p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0 && p.head_dim > 0 &&
           p.head_dim <= kMaxHeadDim && p.softcap >= 0 && p.window >= 0;
  }

  // ---- Memory ---------------------------------------------------------------------------------
  Result<std::unique_ptr<DeviceBuffer>> Alloc(int64_t n, std::string_view what) override {
    constexpr int64_t kMaxElements = int64_t{1} << 40;
    if (n < 0 || n > kMaxElements) {
      return Error("backend {}: {}: {} values is not a size", device_.address, what, n);
    }
    KV_ASSIGN_OR_RETURN(void* p,
                        q_->Alloc(static_cast<uint64_t>(std::max<int64_t>(n, 1)) * 4, what));
    return std::unique_ptr<DeviceBuffer>(new CudaBuffer(this, n, static_cast<float*>(p)));
  }

  Result<std::unique_ptr<DeviceMatrix>> UploadMatrix(const HostMatrix& m) override {
    const MatrixView& v = m.view;
    if (!SupportsType(v.type)) {
      return Error("tensor {} has type {}, which backend {} cannot run (it runs: {})", m.name,
                   TensorTypeName(static_cast<uint32_t>(v.type)), device_.address, TypeNames());
    }
    if (v.rows <= 0 || v.cols <= 0 || v.cols % BlockValues(v.type) != 0 || m.count < 1) {
      return Error("tensor {}: {} x {} ({} of them) is not a matrix of {}", m.name, v.rows, v.cols,
                   m.count, TensorTypeName(static_cast<uint32_t>(v.type)));
    }
    const DeviceLayout layout = LayoutOf(v.type, v.rows, v.cols);
    const uint64_t bytes = static_cast<uint64_t>(layout.bytes) * m.count;
    KV_ASSIGN_OR_RETURN(void* p, q_->Alloc(bytes, "tensor " + m.name));
    std::vector<uint8_t> staging(static_cast<size_t>(layout.bytes));
    for (int64_t i = 0; i < m.count; ++i) {
      MatrixView one = v;
      one.data = static_cast<const uint8_t*>(v.data) + i * m.stride;
      Repack(one, layout, staging.data());
      q_->CopyInNow(static_cast<uint8_t*>(p) + i * layout.bytes, staging.data(), staging.size(),
                    "uploading tensor " + m.name);
    }
    if (Status s = q_->Finish(); !s.ok()) {
      q_->Free(p);
      return s;
    }
    DevMatrix dev;
    dev.data = static_cast<const uint8_t*>(p);
    dev.type = static_cast<int>(v.type);
    dev.rows = v.rows;
    dev.cols = v.cols;
    dev.row_bytes = layout.row_bytes;
    dev.heads = layout.heads;
    dev.stride = layout.bytes;
    return std::unique_ptr<DeviceMatrix>(new CudaMatrix(this, m, bytes, dev));
  }

  void Upload(DevPtr dst, const void* src, int64_t n) override {
    float* d = F(dst, n);
    if (n == 0 || !Begin()) return;
    q_->CopyIn(d, src, static_cast<size_t>(n) * 4, "upload");
  }

  Status Download(void* dst, DevPtr src, int64_t n) override {
    const float* s = F(src, n);
    if (n > 0 && Begin()) {
      q_->Record(
          cudaMemcpyAsync(dst, s, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToHost, stream()),
          "download");
    }
    return q_->Finish();
  }

  void Copy(DevPtr dst, DevPtr src, int64_t n) override {
    float* d = F(dst, n);
    const float* s = F(src, n);
    if (n == 0 || !Begin()) return;
    q_->Record(
        cudaMemcpyAsync(d, s, static_cast<size_t>(n) * 4, cudaMemcpyDeviceToDevice, stream()),
        "copy");
  }

  void Fill(DevPtr dst, int64_t n, float value) override {
    float* d = F(dst, n);
    if (n == 0 || !Begin()) return;
    q_->Record(cuda::Fill(d, n, value, stream()), "fill");
  }

  Status Finish() override { return q_->Finish(); }

  // ---- Ops ------------------------------------------------------------------------------------
  void GetRows(const DeviceMatrix& w, DevPtr ids, int n, DevPtr out) override {
    const CudaMatrix& m = M(w);
    const int32_t* id = I(ids, n);
    float* o = F(out, n * w.cols());
    if (n <= 0 || !Begin()) return;
    Record(cuda::GetRows(m.dev, id, n, o, stream()), "get_rows");
  }

  void MatMul(const DeviceMatrix& w, DevPtr x, int n, DevPtr y) override;

  void RmsNorm(DevPtr x, DevPtr w, int n_rows, int width, float eps, DevPtr y) override {
    const int64_t n = static_cast<int64_t>(n_rows) * width;
    const float *xp = F(x, n), *wp = F(w, width);
    float* yp = F(y, n);
    if (n == 0 || !Begin()) return;
    Record(cuda::RmsNorm(xp, wp, n_rows, width, eps, yp, stream()), "rms_norm");
  }

  void RopeAngles(const RopeAngleParams& p, std::span<const int32_t> positions,
                  DevPtr out) override;

  void Rope(DevPtr x, int n_rows, int n_heads, int head_dim, int n_rot, RopeType type,
            DevPtr cos_sin) override {
    float* xp = F(x, static_cast<int64_t>(n_rows) * n_heads * head_dim);
    const float* cs = F(cos_sin, static_cast<int64_t>(n_rows) * (n_rot / 2) * 2);
    if (n_rows == 0 || n_rot < 2 || !Begin()) return;
    Record(cuda::Rope(xp, n_rows, n_heads, head_dim, n_rot, type == RopeType::kNeox, cs, stream()),
           "rope");
  }

  void SplitQGate(DevPtr q_full, int n_rows, int n_head, int head_dim, DevPtr q,
                  DevPtr gate) override {
    const int64_t heads = static_cast<int64_t>(n_rows) * n_head;
    const float* src = F(q_full, heads * 2 * head_dim);
    float *qp = F(q, heads * head_dim), *gp = F(gate, heads * head_dim);
    if (heads == 0 || !Begin()) return;
    // Per head [query | gate]: two strided copies.
    const size_t row = static_cast<size_t>(head_dim) * 4;
    Record(cudaMemcpy2DAsync(qp, row, src, 2 * row, row, heads, cudaMemcpyDeviceToDevice, stream()),
           "split_q_gate");
    Record(cudaMemcpy2DAsync(gp, row, src + head_dim, 2 * row, row, heads, cudaMemcpyDeviceToDevice,
                             stream()),
           "split_q_gate");
  }

  void AppendKv(DevPtr k, DevPtr v, int n, int kv_dim, DevPtr k_cache, DevPtr v_cache,
                int pos0) override {
    const int64_t count = static_cast<int64_t>(n) * kv_dim;
    const int64_t at = static_cast<int64_t>(pos0) * kv_dim;
    const float *kp = F(k, count), *vp = F(v, count);
    float *kc = F(k_cache + at, count), *vc = F(v_cache + at, count);
    if (count == 0 || !Begin()) return;
    const size_t bytes = static_cast<size_t>(count) * 4;
    Record(cudaMemcpyAsync(kc, kp, bytes, cudaMemcpyDeviceToDevice, stream()), "append_kv");
    Record(cudaMemcpyAsync(vc, vp, bytes, cudaMemcpyDeviceToDevice, stream()), "append_kv");
  }

  void Attention(DevPtr q, int n, int pos0, DevPtr k_cache, DevPtr v_cache,
                 const AttentionParams& p, DevPtr out) override {
    KV_CHECK(SupportsAttention(p), "backend {}: attention with these options", device_.address);
    const int64_t q_n = static_cast<int64_t>(n) * p.n_head * p.head_dim;
    const int64_t kv_n = static_cast<int64_t>(pos0 + n) * p.n_head_kv * p.head_dim;
    const float *qp = F(q, q_n), *kc = F(k_cache, kv_n), *vc = F(v_cache, kv_n);
    float* o = F(out, q_n);
    if (n <= 0 || !Begin()) return;
    const AttentionArgs a{p.n_head, p.n_head_kv, p.head_dim, p.scale, p.softcap, p.window};
    Record(cuda::Attention(qp, n, pos0, kc, vc, a, o, stream()), "attention");
  }

  void SiluMul(DevPtr gate, DevPtr up, int64_t n, DevPtr out) override {
    const float *g = F(gate, n), *u = F(up, n);
    float* o = F(out, n);
    if (n == 0 || !Begin()) return;
    Record(cuda::SiluMul(g, u, n, o, stream()), "silu_mul");
  }

  void Add(DevPtr y, DevPtr x, int64_t n) override {
    float* yp = F(y, n);
    const float* xp = F(x, n);
    if (n == 0 || !Begin()) return;
    Record(cuda::Add(yp, xp, n, stream()), "add");
  }

  void AddBias(DevPtr y, DevPtr b, int n_rows, int width) override {
    float* yp = F(y, static_cast<int64_t>(n_rows) * width);
    const float* bp = F(b, width);
    if (n_rows == 0 || width == 0 || !Begin()) return;
    Record(cuda::AddBias(yp, bp, n_rows, width, stream()), "add_bias");
  }

  void SigmoidMul(DevPtr y, DevPtr gate, int64_t n) override {
    float* yp = F(y, n);
    const float* g = F(gate, n);
    if (n == 0 || !Begin()) return;
    Record(cuda::SigmoidMul(yp, g, n, stream()), "sigmoid_mul");
  }

  void Sigmoid(DevPtr x, int64_t n) override {
    float* xp = F(x, n);
    if (n == 0 || !Begin()) return;
    Record(cuda::Sigmoid(xp, n, stream()), "sigmoid");
  }

  void ScaleRows(DevPtr y, DevPtr s, int n_rows, int width) override {
    float* yp = F(y, static_cast<int64_t>(n_rows) * width);
    const float* sp = F(s, n_rows);
    if (n_rows == 0 || width == 0 || !Begin()) return;
    Record(cuda::ScaleRows(yp, sp, n_rows, width, stream()), "scale_rows");
  }

  void CausalConvSilu(DevPtr x, int n, int channels, int kernel, DevPtr w, DevPtr state,
                      DevPtr out) override {
    const int64_t rows = static_cast<int64_t>(n) * channels;
    const float *xp = F(x, rows), *wp = F(w, int64_t{channels} * kernel);
    float *st = F(state, int64_t{kernel - 1} * channels), *o = F(out, rows);
    if (rows == 0 || !Begin()) return;
    Record(cuda::CausalConvSilu(xp, n, channels, kernel, wp, st, o, stream()), "causal_conv_silu");
  }

  void GatedDeltaRule(DevPtr qkv, int64_t row_stride, DevPtr alpha, DevPtr beta, DevPtr dt_bias,
                      DevPtr a, int n, int n_k_heads, int n_v_heads, int dim, float eps,
                      DevPtr state, DevPtr out) override {
    const int64_t gates = static_cast<int64_t>(n) * n_v_heads;
    const float* q = F(qkv, n * row_stride);
    const float *al = F(alpha, gates), *be = F(beta, gates);
    const float *dt = F(dt_bias, n_v_heads), *ap = F(a, n_v_heads);
    float *st = F(state, int64_t{n_v_heads} * dim * dim), *o = F(out, gates * dim);
    if (gates == 0 || !Begin()) return;
    Record(cuda::GatedDeltaRule(q, row_stride, al, be, dt, ap, n, n_k_heads, n_v_heads, dim, eps,
                                st, o, stream()),
           "gated_delta_rule");
  }

  void MoeRoute(DevPtr logits, int n, int n_expert, int k, DevPtr ids, DevPtr weights) override {
    const int64_t picks = static_cast<int64_t>(n) * k;
    float* l = F(logits, static_cast<int64_t>(n) * n_expert);
    int32_t* id = I(ids, picks);
    float* w = F(weights, picks);
    if (picks == 0 || !Begin()) return;
    Record(cuda::MoeRoute(l, n, n_expert, k, id, w, stream()), "moe_route");
  }

  void MoeFfn(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down, DevPtr in,
              int n, DevPtr ids, DevPtr weights, int k, DevPtr out) override;

  // For buffers and matrices: frees p once the queued ops are done.
  void FreeBytes(void* p) {
    acts_valid_ = false;  // the quantized activations may have been made from p
    q_->Free(p);
  }

 private:
  cudaStream_t stream() const { return q_->stream(); }

  // Before an op: the device is current and the quantized activations are stale (unless the op
  // keeps them). False when an earlier op failed: nothing more is queued until it is reported.
  bool Begin(bool keep_acts = false) {
    q_->Use();
    if (!keep_acts) acts_valid_ = false;
    return !q_->failed();
  }

  void Record(cudaError_t e, std::string_view what) { q_->Record(e, what); }

  // QuantActs of x [rows, cols] in acts_ (reused while no other op ran since they were made).
  bool QuantizeFor(const float* x, int64_t rows, int64_t cols, QuantActs* out);

  // The device address of p, which must be a buffer of this backend with room for n elements.
  float* F(DevPtr p, int64_t n) const {
    KV_CHECK(p.buf != nullptr && p.buf->owner() == this, "backend {}: a buffer of another backend",
             device_.address);
    KV_CHECK(p.offset >= 0 && n >= 0 && p.offset + n <= p.buf->size(),
             "backend {}: elements [{}, {}) outside a buffer of {}", device_.address, p.offset,
             p.offset + n, p.buf->size());
    return static_cast<CudaBuffer*>(p.buf)->data() + p.offset;
  }
  int32_t* I(DevPtr p, int64_t n) const { return reinterpret_cast<int32_t*>(F(p, n)); }
  const CudaMatrix& M(const DeviceMatrix& w) const {
    KV_CHECK(w.owner() == this, "backend {}: matrix {} belongs to another backend", device_.address,
             w.name());
    return static_cast<const CudaMatrix&>(w);
  }

  DeviceInfo device_;
  std::unique_ptr<CudaQueue> q_;

  Scratch acts_;  // QuantActs: qs [rows, cols] int8, d and sum_d [rows, cols / 32] f32
  bool acts_valid_ = false;
  const float* acts_x_ = nullptr;
  int64_t acts_rows_ = 0, acts_cols_ = 0;
  Scratch moe_;                   // MoeFfn: grouping, expert activations and outputs
  Scratch positions_;             // RopeAngles: positions and frequency factors
  std::vector<int32_t> staging_;  // the same, on the host
};

CudaBuffer::CudaBuffer(CudaBackend* be, int64_t n, float* data)
    : DeviceBuffer(be, n), be_(be), data_(data) {}
CudaBuffer::~CudaBuffer() { be_->FreeBytes(data_); }

CudaMatrix::CudaMatrix(CudaBackend* be, const HostMatrix& m, uint64_t bytes, const DevMatrix& d)
    : DeviceMatrix(be, m, bytes), dev(d), be_(be) {}
CudaMatrix::~CudaMatrix() { be_->FreeBytes(const_cast<uint8_t*>(dev.data)); }

bool CudaBackend::QuantizeFor(const float* x, int64_t rows, int64_t cols, QuantActs* out) {
  const size_t qs = Align256(static_cast<size_t>(rows * cols));
  const size_t scales = Align256(static_cast<size_t>(rows * (cols / 32)) * 4);
  // Growing the scratch drops what it held.
  const bool cached = acts_valid_ && acts_x_ == x && acts_rows_ == rows && acts_cols_ == cols &&
                      acts_.bytes >= qs + 2 * scales;
  uint8_t* base = q_->Grow(acts_, qs + 2 * scales, "the quantized activations");
  if (base == nullptr) return false;
  out->qs = reinterpret_cast<int8_t*>(base);
  out->d = reinterpret_cast<float*>(base + qs);
  out->sum_d = reinterpret_cast<float*>(base + qs + scales);
  if (cached) return true;
  Record(QuantizeActs(x, rows, cols, *out, stream()), "quantizing activations");
  acts_valid_ = !q_->failed();
  acts_x_ = x, acts_rows_ = rows, acts_cols_ = cols;
  return acts_valid_;
}

void CudaBackend::MatMul(const DeviceMatrix& w, DevPtr x, int n, DevPtr y) {
  const CudaMatrix& m = M(w);
  KV_CHECK(w.count() == 1, "MatMul of {}: a stack of {} matrices", w.name(), w.count());
  const int64_t cols = w.cols(), rows = w.rows();
  const float* xp = F(x, n * cols);
  float* yp = F(y, n * rows);
  if (n <= 0 || !Begin(/*keep_acts=*/true)) return;
  if (Quantized(w.type())) {
    QuantActs acts;
    if (!QuantizeFor(xp, n, cols, &acts)) return;
    Record(MatMulQuant(m.dev, acts, n, TokenMap{}, yp, stream()), "mat_mul");
    // Consecutive products of the same rows (q, k, v; gate, up) reuse the quantized rows, unless
    // this one wrote over them.
    const auto* y0 = reinterpret_cast<const char*>(yp);
    const auto* x0 = reinterpret_cast<const char*>(xp);
    if (y0 < x0 + n * cols * 4 && x0 < y0 + n * rows * 4) acts_valid_ = false;
  } else {
    acts_valid_ = false;
    Record(MatMulFloat(m.dev, xp, n, TokenMap{}, yp, stream()), "mat_mul");
  }
}

void CudaBackend::RopeAngles(const RopeAngleParams& p, std::span<const int32_t> positions,
                             DevPtr out) {
  const int64_t n = static_cast<int64_t>(positions.size());
  const int half = p.n_rot / 2;
  KV_CHECK(p.freq_factors.empty() || static_cast<int>(p.freq_factors.size()) == half,
           "RopeAngles: {} frequency factors for {} pairs", p.freq_factors.size(), half);
  float* o = F(out, n * half * 2);
  if (n == 0 || half == 0 || !Begin()) return;
  // [positions | factors] in one upload.
  staging_.assign(positions.begin(), positions.end());
  for (float f : p.freq_factors) {
    int32_t bits;
    std::memcpy(&bits, &f, 4);
    staging_.push_back(bits);
  }
  uint8_t* dev = q_->Grow(positions_, staging_.size() * 4, "the rope positions");
  if (dev == nullptr) return;
  q_->CopyIn(dev, staging_.data(), staging_.size() * 4, "rope_angles");
  RopeArgs a;
  a.n_rot = p.n_rot;
  a.base = p.base, a.freq_scale = p.freq_scale, a.ext_factor = p.ext_factor;
  a.attn_factor = p.attn_factor, a.corr_lo = p.corr_dims[0], a.corr_hi = p.corr_dims[1];
  a.imrope = p.imrope;
  std::copy(p.sections, p.sections + 4, a.sections);
  const auto* pos = reinterpret_cast<const int32_t*>(dev);
  a.factors = p.freq_factors.empty() ? nullptr : reinterpret_cast<const float*>(pos + n);
  Record(cuda::RopeAngles(a, pos, n, o, stream()), "rope_angles");
}

void CudaBackend::MoeFfn(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                         DevPtr in, int n, DevPtr ids, DevPtr weights, int k, DevPtr out) {
  const CudaMatrix &g = M(gate), &u = M(up), &d = M(down);
  const int64_t slots = static_cast<int64_t>(n) * k;
  const int64_t e = down.rows(), ff = gate.rows();
  const int n_exp = static_cast<int>(gate.count());
  const float* x = F(in, n * e);
  const int32_t* id = I(ids, slots);
  const float* wt = F(weights, slots);
  float* o = F(out, n * e);
  if (slots == 0 || !Begin()) return;
  // moe_: counts [n_exp], sorted [slots], slot_pos [slots], tiles [3 max_tiles + 1] (int32);
  // hg, hu [slots, ff] and ys [slots, e] (f32).
  const int64_t max_tiles = MoeMaxTiles(slots, n_exp);
  const size_t a_counts = Align256(static_cast<size_t>(n_exp) * 4);
  const size_t a_slots = Align256(static_cast<size_t>(slots) * 4);
  const size_t a_tiles = Align256(static_cast<size_t>(3 * max_tiles + 1) * 4);
  const size_t a_h = Align256(static_cast<size_t>(slots * ff) * 4);
  const size_t a_y = Align256(static_cast<size_t>(slots * e) * 4);
  uint8_t* base = q_->Grow(moe_, a_counts + 2 * a_slots + a_tiles + 2 * a_h + a_y, "the experts");
  if (base == nullptr) return;
  auto* counts = reinterpret_cast<int32_t*>(base);
  auto* sorted = reinterpret_cast<int32_t*>(base + a_counts);
  auto* slot_pos = reinterpret_cast<int32_t*>(base + a_counts + a_slots);
  auto* tiles = reinterpret_cast<int32_t*>(base + a_counts + 2 * a_slots);
  auto* hg = reinterpret_cast<float*>(base + a_counts + 2 * a_slots + a_tiles);
  auto* hu = hg + a_h / 4;
  auto* ys = hu + a_h / 4;
  Record(MoeGroup(id, slots, n_exp, counts, sorted, slot_pos, tiles, stream()), "moe_ffn");
  const TokenMap rows_of_in{tiles, max_tiles, sorted, k};  // position p reads row sorted[p] / k
  const TokenMap own_rows{tiles, max_tiles, nullptr, 1};   // position p reads row p
  // Each used expert's gate and up over the rows routed to it, then its down over those rows.
  QuantActs acts;
  for (const auto& [m, h] : {std::pair{&g, hg}, std::pair{&u, hu}}) {
    if (Quantized(m->type())) {
      if (!QuantizeFor(x, n, e, &acts)) return;
      Record(MatMulQuant(m->dev, acts, slots, rows_of_in, h, stream()), "moe_ffn");
    } else {
      Record(MatMulFloat(m->dev, x, slots, rows_of_in, h, stream()), "moe_ffn");
    }
  }
  acts_valid_ = false;
  Record(cuda::SiluMul(hg, hu, slots * ff, hg, stream()), "moe_ffn");
  if (Quantized(d.type())) {
    if (!QuantizeFor(hg, slots, ff, &acts)) return;
    Record(MatMulQuant(d.dev, acts, slots, own_rows, ys, stream()), "moe_ffn");
  } else {
    Record(MatMulFloat(d.dev, hg, slots, own_rows, ys, stream()), "moe_ffn");
  }
  acts_valid_ = false;
  Record(MoeCombine(ys, slot_pos, wt, n, k, static_cast<int>(e), o, stream()), "moe_ffn");
}

Result<std::vector<DeviceInfo>> Devices() { return ListDevices(); }

Result<std::unique_ptr<Backend>> Open(const BackendSpec& spec, const BackendOptions& options) {
  const int index = spec.index.empty() ? 0 : spec.index[0];
  KV_ASSIGN_OR_RETURN(DeviceInfo info, CheckDevice(index));
  KV_ASSIGN_OR_RETURN(CudaQueue * queue, CudaQueue::Open(index, info));
  return std::unique_ptr<Backend>(
      new CudaBackend(std::move(info), std::unique_ptr<CudaQueue>(queue)));
}

}  // namespace

const BackendRegistration* Registration() {
  static const BackendRegistration kRegistration{"cuda", &Devices, &Open};
  return &kRegistration;
}

}  // namespace kvasir::cuda
