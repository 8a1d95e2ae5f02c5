#include "backend/cpu/cpu_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "backend/cpu/cpu_attention.h"
#include "kernels/attention_bf16.h"
#include "backend/cpu/cpu_delta_net.h"
#include "backend/cpu/cpu_moe.h"
#include "base/check.h"
#include "base/human.h"
#include "base/thread_pool.h"

namespace kvasir::cpu {
namespace {

// Host memory, 64-byte aligned. Untouched pages are never made resident (a KV cache reserved for a
// long context costs only what is written).
class CpuBuffer final : public DeviceBuffer {
 public:
  CpuBuffer(const Backend* owner, int64_t n, float* data) : DeviceBuffer(owner, n), data_(data) {}
  ~CpuBuffer() override { std::free(data_); }
  float* data() const { return data_; }

 private:
  float* data_;
};

// The file's bytes, read in place: one view per matrix of the stack.
class CpuMatrix final : public DeviceMatrix {
 public:
  CpuMatrix(const Backend* owner, const HostMatrix& m) : DeviceMatrix(owner, m, 0) {
    views.reserve(m.count);
    for (int64_t e = 0; e < m.count; ++e) {
      MatrixView v = m.view;
      v.data = static_cast<const uint8_t*>(m.view.data) + e * m.stride;
      views.push_back(v);
    }
  }
  std::vector<MatrixView> views;
};

std::vector<TensorType> KernelTypes() {
  std::vector<TensorType> out;
  for (uint32_t id = 0; id < 64; ++id) {
    if (KernelsSupport(static_cast<TensorType>(id))) out.push_back(static_cast<TensorType>(id));
  }
  return out;
}

// MemTotal and MemAvailable of /proc/meminfo, in bytes (0 when unknown).
void HostMemory(uint64_t* total, uint64_t* available) {
  *total = *available = 0;
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  uint64_t kb = 0;
  while (in >> key >> kb >> unit) {
    if (key == "MemTotal:") *total = kb * 1024;
    if (key == "MemAvailable:") *available = kb * 1024;
  }
}

std::string CpuModelName() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    const size_t colon = line.find(':');
    if (line.rfind("model name", 0) == 0 && colon != std::string::npos) {
      const size_t start = line.find_first_not_of(" \t", colon + 1);
      if (start != std::string::npos) return line.substr(start);
    }
  }
  return "unknown CPU";
}

DeviceInfo HostDevice() {
  DeviceInfo d;
  d.address = "cpu";
  d.name = fmt::format("{} ({})", CpuModelName(), SimdTargetName());
  HostMemory(&d.memory_bytes, &d.free_bytes);
  d.types = KernelTypes();
  return d;
}

class CpuBackend final : public Backend {
 public:
  CpuBackend(int n_threads, AttnType attn_type)
      : pool_(n_threads), device_(HostDevice()), attn_type_(attn_type) {}

  const DeviceInfo& device() const override { return device_; }
  int n_threads() const override { return pool_.size(); }
  bool SupportsType(TensorType type) const override { return KernelsSupport(type); }
  bool SupportsOp(Op op) const override { return op < Op::kCount; }
  bool SupportsAttention(const AttentionParams& p) const override {
    return p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0 && p.head_dim > 0 &&
           p.softcap >= 0 && p.window >= 0;
  }

  // ---- Memory ---------------------------------------------------------------------------------
  Result<std::unique_ptr<DeviceBuffer>> Alloc(int64_t n, std::string_view what) override {
    constexpr int64_t kMaxElements = int64_t{1} << 40;
    if (n < 0 || n > kMaxElements)
      return Error("backend cpu: {}: {} values is not a size", what, n);
    const size_t bytes = (static_cast<size_t>(std::max<int64_t>(n, 1)) * 4 + 63) / 64 * 64;
    void* p = std::aligned_alloc(64, bytes);
    if (p == nullptr) {
      return Error(StatusCode::kTooLarge, "backend cpu: cannot allocate {} for {}",
                   HumanBytes(bytes), what);
    }
    return std::unique_ptr<DeviceBuffer>(new CpuBuffer(this, n, static_cast<float*>(p)));
  }

  Result<std::unique_ptr<DeviceMatrix>> UploadMatrix(const HostMatrix& m) override {
    if (!SupportsType(m.view.type)) {
      return Error("tensor {} has type {}, which backend cpu cannot run (it runs: {})", m.name,
                   TensorTypeName(static_cast<uint32_t>(m.view.type)), SupportedTypesList());
    }
    return std::unique_ptr<DeviceMatrix>(new CpuMatrix(this, m));
  }

  void Upload(DevPtr dst, const void* src, int64_t n) override {
    std::memcpy(F(dst, n), src, static_cast<size_t>(n) * 4);
  }
  Status Download(void* dst, DevPtr src, int64_t n) override {
    std::memcpy(dst, F(src, n), static_cast<size_t>(n) * 4);
    return Status::Ok();
  }
  void Copy(DevPtr dst, DevPtr src, int64_t n) override {
    std::memcpy(F(dst, n), F(src, n), static_cast<size_t>(n) * 4);
  }
  void Fill(DevPtr dst, int64_t n, float value) override { std::fill_n(F(dst, n), n, value); }
  Status Finish() override { return Status::Ok(); }

  // ---- Ops ------------------------------------------------------------------------------------
  void GetRows(const DeviceMatrix& w, DevPtr ids, int n, DevPtr out) override {
    const MatrixView& m = M(w).views.front();
    const int32_t* id = I(ids, n);
    float* o = F(out, n * m.cols);
    for (int i = 0; i < n; ++i) GetRow(m, id[i], o + static_cast<int64_t>(i) * m.cols);
  }

  void MatMul(const DeviceMatrix& w, DevPtr x, int n, DevPtr y) override {
    const CpuMatrix& m = M(w);
    KV_CHECK(m.views.size() == 1, "MatMul of {}: a stack of {} matrices", w.name(), w.count());
    kvasir::MatMul(m.views.front(), F(x, n * w.cols()), n, F(y, n * w.rows()), pool_);
  }

  void RmsNorm(DevPtr x, DevPtr w, int n_rows, int width, float eps, DevPtr y) override {
    const int64_t n = static_cast<int64_t>(n_rows) * width;
    const float *xp = F(x, n), *wp = F(w, width);
    float* yp = F(y, n);
    for (int r = 0; r < n_rows; ++r) {
      const int64_t off = static_cast<int64_t>(r) * width;
      kvasir::RmsNorm(xp + off, wp, width, eps, yp + off);
    }
  }

  void RopeAngles(const RopeAngleParams& p, std::span<const int32_t> positions,
                  DevPtr out) override {
    const int64_t row = p.n_rot / 2 * 2;
    float* o = F(out, static_cast<int64_t>(positions.size()) * row);
    for (size_t i = 0; i < positions.size(); ++i) kvasir::RopeAngles(p, positions[i], o + i * row);
  }

  void Rope(DevPtr x, int n_rows, int n_heads, int head_dim, int n_rot, RopeType type,
            DevPtr cos_sin) override {
    const int half = n_rot / 2;
    float* xp = F(x, static_cast<int64_t>(n_rows) * n_heads * head_dim);
    const float* cs_all = F(cos_sin, static_cast<int64_t>(n_rows) * half * 2);
    for (int r = 0; r < n_rows; ++r) {
      const float* cs = cs_all + static_cast<int64_t>(r) * half * 2;
      for (int h = 0; h < n_heads; ++h) {
        float* v = xp + (static_cast<int64_t>(r) * n_heads + h) * head_dim;
        for (int i = 0; i < half; ++i) {
          const float c = cs[2 * i], s = cs[2 * i + 1];
          // kNormal rotates adjacent pairs; kNeox rotates element i with element i + n_rot/2.
          const int a = type == RopeType::kNormal ? 2 * i : i;
          const int b = type == RopeType::kNormal ? 2 * i + 1 : i + half;
          const float x0 = v[a], x1 = v[b];
          v[a] = x0 * c - x1 * s;
          v[b] = x0 * s + x1 * c;
        }
      }
    }
  }

  void SplitQGate(DevPtr q_full, int n_rows, int n_head, int head_dim, DevPtr q,
                  DevPtr gate) override {
    const int64_t heads = static_cast<int64_t>(n_rows) * n_head;
    const float* src = F(q_full, heads * 2 * head_dim);
    float *qp = F(q, heads * head_dim), *gp = F(gate, heads * head_dim);
    for (int64_t r = 0; r < heads; ++r) {
      std::copy_n(src + r * 2 * head_dim, head_dim, qp + r * head_dim);
      std::copy_n(src + r * 2 * head_dim + head_dim, head_dim, gp + r * head_dim);
    }
  }

  void AppendKv(DevPtr k, DevPtr v, int n, int kv_dim, DevPtr k_cache, DevPtr v_cache,
                int pos0) override {
    const int64_t count = static_cast<int64_t>(n) * kv_dim;
    const int64_t at = static_cast<int64_t>(pos0) * kv_dim;
    std::copy_n(F(k, count), count, F(k_cache + at, count));
    std::copy_n(F(v, count), count, F(v_cache + at, count));
  }

  void Attention(DevPtr q, int n, int pos0, DevPtr k_cache, DevPtr v_cache,
                 const AttentionParams& p, DevPtr out) override {
    const int64_t q_n = static_cast<int64_t>(n) * p.n_head * p.head_dim;
    const int64_t kv_n = static_cast<int64_t>(pos0 + n) * p.n_head_kv * p.head_dim;
    if (attn_type_ == AttnType::kBf16) {
      CpuAttentionBf16(F(q, q_n), n, pos0, F(k_cache, kv_n), F(v_cache, kv_n), p, F(out, q_n),
                       pool_);
    } else {
      CpuAttention(F(q, q_n), n, pos0, F(k_cache, kv_n), F(v_cache, kv_n), p, F(out, q_n), pool_);
    }
  }

  void SiluMul(DevPtr gate, DevPtr up, int64_t n, DevPtr out) override {
    kvasir::SiluMul(F(gate, n), F(up, n), n, F(out, n));
  }

  void Add(DevPtr y, DevPtr x, int64_t n) override { AddInPlace(F(y, n), F(x, n), n); }

  void AddBias(DevPtr y, DevPtr b, int n_rows, int width) override {
    float* yp = F(y, static_cast<int64_t>(n_rows) * width);
    const float* bp = F(b, width);
    for (int r = 0; r < n_rows; ++r) AddInPlace(yp + static_cast<int64_t>(r) * width, bp, width);
  }

  void SigmoidMul(DevPtr y, DevPtr gate, int64_t n) override {
    float* yp = F(y, n);
    const float* g = F(gate, n);
    for (int64_t i = 0; i < n; ++i) yp[i] *= 1.0f / (1.0f + std::exp(-g[i]));
  }

  void Sigmoid(DevPtr x, int64_t n) override {
    float* xp = F(x, n);
    for (int64_t i = 0; i < n; ++i) xp[i] = 1.0f / (1.0f + std::exp(-xp[i]));
  }

  void ScaleRows(DevPtr y, DevPtr s, int n_rows, int width) override {
    float* yp = F(y, static_cast<int64_t>(n_rows) * width);
    const float* sp = F(s, n_rows);
    for (int r = 0; r < n_rows; ++r) {
      float* row = yp + static_cast<int64_t>(r) * width;
      for (int i = 0; i < width; ++i) row[i] *= sp[r];
    }
  }

  void CausalConvSilu(DevPtr x, int n, int channels, int kernel, DevPtr w, DevPtr state,
                      DevPtr out) override {
    const int64_t rows = static_cast<int64_t>(n) * channels;
    CpuCausalConvSilu(F(x, rows), n, channels, kernel, F(w, int64_t{channels} * kernel),
                      F(state, int64_t{kernel - 1} * channels), F(out, rows), pool_);
  }

  void GatedDeltaRule(DevPtr qkv, int64_t row_stride, DevPtr alpha, DevPtr beta, DevPtr dt_bias,
                      DevPtr a, int n, int n_k_heads, int n_v_heads, int dim, float eps,
                      DevPtr state, DevPtr out) override {
    const int64_t gates = static_cast<int64_t>(n) * n_v_heads;
    CpuGatedDeltaRule(F(qkv, n * row_stride), row_stride, F(alpha, gates), F(beta, gates),
                      F(dt_bias, n_v_heads), F(a, n_v_heads), n, n_k_heads, n_v_heads, dim, eps,
                      F(state, int64_t{n_v_heads} * dim * dim), F(out, gates * dim), pool_);
  }

  void MoeRoute(DevPtr logits, int n, int n_expert, int k, DevPtr ids, DevPtr weights) override {
    const int64_t picks = static_cast<int64_t>(n) * k;
    CpuMoeRoute(F(logits, static_cast<int64_t>(n) * n_expert), n, n_expert, k, I(ids, picks),
                F(weights, picks));
  }

  void MoeFfn(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down, DevPtr in,
              int n, DevPtr ids, DevPtr weights, int k, DevPtr out) override {
    const int64_t picks = static_cast<int64_t>(n) * k;
    const int64_t rows = static_cast<int64_t>(n) * down.rows();
    CpuMoeFfn(M(gate).views, M(up).views, M(down).views, F(in, rows), n, I(ids, picks),
              F(weights, picks), k, F(out, rows), pool_, moe_);
  }

 private:
  // The host address of p, which must be a buffer of this backend with room for n elements there.
  float* F(DevPtr p, int64_t n) const {
    KV_CHECK(p.buf != nullptr && p.buf->owner() == this,
             "backend cpu: a buffer of another backend");
    KV_CHECK(p.offset >= 0 && n >= 0 && p.offset + n <= p.buf->size(),
             "backend cpu: elements [{}, {}) outside a buffer of {}", p.offset, p.offset + n,
             p.buf->size());
    return static_cast<CpuBuffer*>(p.buf)->data() + p.offset;
  }
  int32_t* I(DevPtr p, int64_t n) const { return reinterpret_cast<int32_t*>(F(p, n)); }
  const CpuMatrix& M(const DeviceMatrix& w) const {
    KV_CHECK(w.owner() == this, "backend cpu: matrix {} belongs to another backend", w.name());
    return static_cast<const CpuMatrix&>(w);
  }

  ThreadPool pool_;
  DeviceInfo device_;
  AttnType attn_type_;
  MoeScratch moe_;
};

Result<std::vector<DeviceInfo>> Devices() { return std::vector<DeviceInfo>{HostDevice()}; }

Result<std::unique_ptr<Backend>> Open(const BackendSpec& spec, const BackendOptions& options) {
  if (options.attn_type == AttnType::kBf16 && !HaveBf16Attention()) {
    return Error("backend cpu: attention in bf16 (--attn-type bf16) needs AVX512-BF16, which {} "
                 "lacks",
                 HostDevice().name);
  }
  return std::unique_ptr<Backend>(new CpuBackend(options.n_threads, options.attn_type));
}

}  // namespace

const BackendRegistration* Registration() {
  static const BackendRegistration kRegistration{"cpu", &Devices, &Open};
  return &kRegistration;
}

}  // namespace kvasir::cpu
