#include "backend/reference_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "base/check.h"
#include "base/human.h"
#include "kernels/kernels_ref.h"

namespace kvasir::testing {
namespace {

class RefBuffer final : public DeviceBuffer {
 public:
  RefBuffer(const Backend* owner, int64_t n, uint64_t* used)
      : DeviceBuffer(owner, n), data(static_cast<size_t>(n)), used_(used) {}
  ~RefBuffer() override { *used_ -= static_cast<uint64_t>(size()) * 4; }
  std::vector<float> data;

 private:
  uint64_t* used_;
};

class RefMatrix final : public DeviceMatrix {
 public:
  RefMatrix(const Backend* owner, const HostMatrix& m, uint64_t* used)
      : DeviceMatrix(owner, m, static_cast<uint64_t>(m.count) * m.stride), used_(used) {
    bytes.resize(static_cast<size_t>(m.count) * m.stride);
    for (int64_t e = 0; e < m.count; ++e) {
      std::memcpy(bytes.data() + e * m.stride,
                  static_cast<const uint8_t*>(m.view.data) + e * m.stride,
                  static_cast<size_t>(m.view.rows) * m.view.row_bytes);
      MatrixView v = m.view;
      v.data = bytes.data() + e * m.stride;
      views.push_back(v);
    }
  }
  ~RefMatrix() override { *used_ -= device_bytes(); }
  std::vector<uint8_t> bytes;
  std::vector<MatrixView> views;

 private:
  uint64_t* used_;
};

double SigmoidD(double x) { return 1.0 / (1.0 + std::exp(-x)); }
double SiluD(double x) { return x * SigmoidD(x); }

class ReferenceBackend final : public Backend {
 public:
  ReferenceBackend(const ReferenceOptions& o, TransferCounts* counts) : o_(o), counts_(counts) {
    device_.address = "ref";
    device_.name = "scalar reference (tests)";
    device_.memory_bytes = o.memory_bytes;
    for (uint32_t id = 0; id < 64; ++id) {
      const auto t = static_cast<TensorType>(id);
      if (KernelsSupport(t) && o.refuse_types.count(t) == 0) device_.types.push_back(t);
    }
  }

  const DeviceInfo& device() const override { return device_; }
  int n_threads() const override { return 1; }
  bool SupportsType(TensorType t) const override {
    return KernelsSupport(t) && o_.refuse_types.count(t) == 0;
  }
  bool SupportsOp(Op op) const override { return o_.refuse_ops.count(op) == 0; }
  bool SupportsAttention(const AttentionParams& p) const override { return true; }

  Result<std::unique_ptr<DeviceBuffer>> Alloc(int64_t n, std::string_view what) override {
    KV_RETURN_IF_ERROR(Take(static_cast<uint64_t>(n) * 4, what));
    return std::unique_ptr<DeviceBuffer>(new RefBuffer(this, n, &used_));
  }
  Result<std::unique_ptr<DeviceMatrix>> UploadMatrix(const HostMatrix& m) override {
    if (!SupportsType(m.view.type)) return Error("tensor {}: type refused", m.name);
    KV_RETURN_IF_ERROR(Take(static_cast<uint64_t>(m.count) * m.stride, "tensor " + m.name));
    return std::unique_ptr<DeviceMatrix>(new RefMatrix(this, m, &used_));
  }
  void Upload(DevPtr dst, const void* src, int64_t n) override {
    std::memcpy(F(dst, n), src, static_cast<size_t>(n) * 4);
    if (counts_ != nullptr) counts_->uploaded += n;
  }
  Status Download(void* dst, DevPtr src, int64_t n) override {
    std::memcpy(dst, F(src, n), static_cast<size_t>(n) * 4);
    if (counts_ != nullptr) counts_->downloaded += n;
    return Status::Ok();
  }
  void Copy(DevPtr dst, DevPtr src, int64_t n) override {
    std::memmove(F(dst, n), F(src, n), static_cast<size_t>(n) * 4);
  }
  void Fill(DevPtr dst, int64_t n, float value) override { std::fill_n(F(dst, n), n, value); }
  Status Finish() override { return Status::Ok(); }

  void GetRows(const DeviceMatrix& w, DevPtr ids, int n, DevPtr out) override {
    const MatrixView& m = M(w).views[0];
    for (int i = 0; i < n; ++i) {
      const int32_t r = I(ids + i, 1)[0];
      ref::DequantizeRow(m.type, static_cast<const uint8_t*>(m.data) + r * m.row_bytes, m.cols,
                         F(out + int64_t{i} * m.cols, m.cols));
    }
  }
  void MatMul(const DeviceMatrix& w, DevPtr x, int n, DevPtr y) override {
    ref::MatMul(M(w).views[0], F(x, n * w.cols()), n, F(y, n * w.rows()));
  }
  void RmsNorm(DevPtr x, DevPtr w, int n_rows, int width, float eps, DevPtr y) override {
    for (int r = 0; r < n_rows; ++r) {
      const int64_t off = int64_t{r} * width;
      ref::RmsNorm(F(x + off, width), F(w, width), width, eps, F(y + off, width));
    }
  }
  void RopeAngles(const RopeAngleParams& p, std::span<const int32_t> positions,
                  DevPtr out) override;
  void Rope(DevPtr x, int n_rows, int n_heads, int head_dim, int n_rot, RopeType type,
            DevPtr cos_sin) override {
    const int half = n_rot / 2;
    for (int r = 0; r < n_rows; ++r) {
      const float* cs = F(cos_sin + int64_t{r} * half * 2, half * 2);
      for (int h = 0; h < n_heads; ++h) {
        float* v = F(x + (int64_t{r} * n_heads + h) * head_dim, head_dim);
        for (int i = 0; i < half; ++i) {
          const int a = type == RopeType::kNormal ? 2 * i : i;
          const int b = type == RopeType::kNormal ? 2 * i + 1 : i + half;
          const double x0 = v[a], x1 = v[b];
          v[a] = static_cast<float>(x0 * cs[2 * i] - x1 * cs[2 * i + 1]);
          v[b] = static_cast<float>(x0 * cs[2 * i + 1] + x1 * cs[2 * i]);
        }
      }
    }
  }
  void SplitQGate(DevPtr q_full, int n_rows, int n_head, int head_dim, DevPtr q,
                  DevPtr gate) override {
    for (int64_t h = 0; h < int64_t{n_rows} * n_head; ++h) {
      for (int d = 0; d < head_dim; ++d) {
        F(q + h * head_dim, head_dim)[d] = F(q_full + h * 2 * head_dim, 2 * head_dim)[d];
        F(gate + h * head_dim, head_dim)
        [d] = F(q_full + h * 2 * head_dim, 2 * head_dim)[head_dim + d];
      }
    }
  }
  void AppendKv(DevPtr k, DevPtr v, int n, int kv_dim, DevPtr k_cache, DevPtr v_cache,
                int pos0) override {
    Copy(k_cache + int64_t{pos0} * kv_dim, k, int64_t{n} * kv_dim);
    Copy(v_cache + int64_t{pos0} * kv_dim, v, int64_t{n} * kv_dim);
  }
  void Attention(DevPtr q, int n, int pos0, DevPtr k_cache, DevPtr v_cache,
                 const AttentionParams& p, DevPtr out) override;
  void SiluMul(DevPtr gate, DevPtr up, int64_t n, DevPtr out) override {
    for (int64_t i = 0; i < n; ++i) {
      F(out, n)[i] = static_cast<float>(SiluD(F(gate, n)[i]) * F(up, n)[i]);
    }
  }
  void Add(DevPtr y, DevPtr x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) F(y, n)[i] += F(x, n)[i];
  }
  void AddBias(DevPtr y, DevPtr b, int n_rows, int width) override {
    for (int r = 0; r < n_rows; ++r) Add(y + int64_t{r} * width, b, width);
  }
  void SigmoidMul(DevPtr y, DevPtr gate, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      F(y, n)[i] = static_cast<float>(F(y, n)[i] * SigmoidD(F(gate, n)[i]));
    }
  }
  void Sigmoid(DevPtr x, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) F(x, n)[i] = static_cast<float>(SigmoidD(F(x, n)[i]));
  }
  void ScaleRows(DevPtr y, DevPtr s, int n_rows, int width) override {
    for (int r = 0; r < n_rows; ++r) {
      for (int i = 0; i < width; ++i) F(y + int64_t{r} * width, width)[i] *= F(s, n_rows)[r];
    }
  }
  void CausalConvSilu(DevPtr x, int n, int channels, int kernel, DevPtr w, DevPtr state,
                      DevPtr out) override;
  void GatedDeltaRule(DevPtr qkv, int64_t row_stride, DevPtr alpha, DevPtr beta, DevPtr dt_bias,
                      DevPtr a, int n, int n_k_heads, int n_v_heads, int dim, float eps,
                      DevPtr state, DevPtr out) override;
  void MoeRoute(DevPtr logits, int n, int n_expert, int k, DevPtr ids, DevPtr weights) override;
  void MoeFfn(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down, DevPtr in,
              int n, DevPtr ids, DevPtr weights, int k, DevPtr out) override;

 private:
  Status Take(uint64_t bytes, std::string_view what) {
    if (used_ + bytes > o_.memory_bytes) {
      return Error("backend ref: cannot allocate {} for {} ({} free of {})", HumanBytes(bytes),
                   what, HumanBytes(o_.memory_bytes - used_), HumanBytes(o_.memory_bytes));
    }
    used_ += bytes;
    return Status::Ok();
  }
  float* F(DevPtr p, int64_t n) const {
    KV_CHECK(p.buf != nullptr && p.buf->owner() == this, "backend ref: a foreign buffer");
    KV_CHECK(p.offset >= 0 && p.offset + n <= p.buf->size(), "backend ref: [{}, {}) outside {}",
             p.offset, p.offset + n, p.buf->size());
    return static_cast<RefBuffer*>(p.buf)->data.data() + p.offset;
  }
  int32_t* I(DevPtr p, int64_t n) const { return reinterpret_cast<int32_t*>(F(p, n)); }
  const RefMatrix& M(const DeviceMatrix& w) const {
    KV_CHECK(w.owner() == this, "backend ref: a foreign matrix");
    return static_cast<const RefMatrix&>(w);
  }

  ReferenceOptions o_;
  TransferCounts* counts_;
  DeviceInfo device_;
  uint64_t used_ = 0;
};

void ReferenceBackend::RopeAngles(const RopeAngleParams& p, std::span<const int32_t> positions,
                                  DevPtr out) {
  const int half = p.n_rot / 2;
  const double mscale =
      p.attn_factor * (p.ext_factor != 0 ? 1.0 + 0.1 * std::log(1.0 / p.freq_scale) : 1.0);
  const int sect = p.sections[0] + p.sections[1] + p.sections[2] + p.sections[3];
  for (size_t r = 0; r < positions.size(); ++r) {
    float* o = F(out + static_cast<int64_t>(r) * half * 2, half * 2);
    for (int i = 0; i < half; ++i) {
      double pos = positions[r];
      if (p.imrope) {
        const int s = i % sect, c = s % 3;
        if (s >= 3 * p.sections[c]) pos = 0;  // the fourth (zero) component of a text token
      }
      double inv_freq = std::pow(static_cast<double>(p.base), -2.0 * i / p.n_rot);
      if (!p.freq_factors.empty()) inv_freq /= p.freq_factors[i];
      const double extrap = pos * inv_freq, interp = p.freq_scale * extrap;
      double theta = interp;
      if (p.ext_factor != 0) {
        const double lo = p.corr_dims[0], hi = p.corr_dims[1];
        const double ramp = (1.0 - std::clamp((i - lo) / std::max(0.001, hi - lo), 0.0, 1.0));
        theta = interp * (1 - ramp * p.ext_factor) + extrap * ramp * p.ext_factor;
      }
      o[2 * i] = static_cast<float>(std::cos(theta) * mscale);
      o[2 * i + 1] = static_cast<float>(std::sin(theta) * mscale);
    }
  }
}

void ReferenceBackend::Attention(DevPtr q, int n, int pos0, DevPtr k_cache, DevPtr v_cache,
                                 const AttentionParams& p, DevPtr out) {
  const int hd = p.head_dim, group = p.n_head / p.n_head_kv;
  const int64_t kv_stride = int64_t{p.n_head_kv} * hd, q_stride = int64_t{p.n_head} * hd;
  for (int t = 0; t < n; ++t) {
    const int pos = pos0 + t;
    for (int h = 0; h < p.n_head; ++h) {
      const float* qh = F(q + t * q_stride + h * hd, hd);
      const int64_t kv_off = int64_t{h / group} * hd;
      std::vector<double> s;
      std::vector<int> keys;
      for (int j = 0; j <= pos; ++j) {
        if (p.window > 0 && pos - j >= p.window) continue;
        const float* kj = F(k_cache + j * kv_stride + kv_off, hd);
        double dot = 0;
        for (int d = 0; d < hd; ++d) dot += static_cast<double>(qh[d]) * kj[d];
        double score = dot * p.scale;
        if (p.softcap > 0) score = p.softcap * std::tanh(score / p.softcap);
        s.push_back(score);
        keys.push_back(j);
      }
      const double mx = *std::max_element(s.begin(), s.end());
      double sum = 0;
      for (double& v : s) sum += (v = std::exp(v - mx));
      float* oh = F(out + t * q_stride + h * hd, hd);
      for (int d = 0; d < hd; ++d) {
        double acc = 0;
        for (size_t i = 0; i < keys.size(); ++i) {
          acc += s[i] / sum * F(v_cache + keys[i] * kv_stride + kv_off, hd)[d];
        }
        oh[d] = static_cast<float>(acc);
      }
    }
  }
}

void ReferenceBackend::CausalConvSilu(DevPtr x, int n, int channels, int kernel, DevPtr w,
                                      DevPtr state, DevPtr out) {
  const int hist = kernel - 1;
  float* st = F(state, int64_t{hist} * channels);
  for (int c = 0; c < channels; ++c) {
    // Inputs oldest first: the saved ones, then this batch's.
    std::vector<double> in;
    for (int j = 0; j < hist; ++j) in.push_back(st[int64_t{j} * channels + c]);
    for (int t = 0; t < n; ++t) in.push_back(F(x + int64_t{t} * channels + c, 1)[0]);
    const float* wc = F(w + int64_t{c} * kernel, kernel);
    for (int t = 0; t < n; ++t) {
      double sum = 0;
      for (int j = 0; j < kernel; ++j) sum += wc[j] * in[t + j];
      F(out + int64_t{t} * channels + c, 1)[0] = static_cast<float>(SiluD(sum));
    }
    for (int j = 0; j < hist; ++j) st[int64_t{j} * channels + c] = static_cast<float>(in[n + j]);
  }
}

void ReferenceBackend::GatedDeltaRule(DevPtr qkv, int64_t row_stride, DevPtr alpha, DevPtr beta,
                                      DevPtr dt_bias, DevPtr a, int n, int n_k_heads, int n_v_heads,
                                      int dim, float eps, DevPtr state, DevPtr out) {
  auto l2 = [&](const float* v, double extra) {
    double ss = 0;
    for (int i = 0; i < dim; ++i) ss += static_cast<double>(v[i]) * v[i];
    const double s = 1.0 / std::max(std::sqrt(ss), static_cast<double>(eps)) * extra;
    std::vector<double> r(dim);
    for (int i = 0; i < dim; ++i) r[i] = v[i] * s;
    return r;
  };
  for (int h = 0; h < n_v_heads; ++h) {
    const int kh = h % n_k_heads;
    float* S = F(state + int64_t{h} * dim * dim, int64_t{dim} * dim);  // S[j * dim + i]
    for (int t = 0; t < n; ++t) {
      const float* row = F(qkv + t * row_stride, row_stride);
      const std::vector<double> qv = l2(row + kh * dim, 1.0 / std::sqrt(double(dim)));
      const std::vector<double> kv = l2(row + int64_t{n_k_heads} * dim + kh * dim, 1.0);
      const float* v = row + int64_t{2} * n_k_heads * dim + int64_t{h} * dim;
      const int64_t gi = int64_t{t} * n_v_heads + h;
      const double x = F(alpha, gi + 1)[gi] + F(dt_bias, n_v_heads)[h];
      const double softplus = x > 20 ? x : std::log1p(std::exp(x));
      const double decay = std::exp(softplus * F(a, n_v_heads)[h]);
      const double b = SigmoidD(F(beta, gi + 1)[gi]);
      float* o = F(out + gi * dim, dim);
      for (int j = 0; j < dim; ++j) {
        double sk = 0;
        for (int i = 0; i < dim; ++i) sk += decay * S[j * dim + i] * kv[i];
        const double d = b * (v[j] - sk);
        double oq = 0;
        for (int i = 0; i < dim; ++i) {
          S[j * dim + i] = static_cast<float>(decay * S[j * dim + i] + kv[i] * d);
          oq += static_cast<double>(S[j * dim + i]) * qv[i];
        }
        o[j] = static_cast<float>(oq);
      }
    }
  }
}

void ReferenceBackend::MoeRoute(DevPtr logits, int n, int n_expert, int k, DevPtr ids,
                                DevPtr weights) {
  for (int r = 0; r < n; ++r) {
    float* l = F(logits + int64_t{r} * n_expert, n_expert);
    const double mx = *std::max_element(l, l + n_expert);
    std::vector<double> p(n_expert);
    double sum = 0;
    for (int e = 0; e < n_expert; ++e) sum += (p[e] = std::exp(l[e] - mx));
    for (double& v : p) v /= sum;
    std::vector<int> order(n_expert);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return p[x] > p[y]; });
    double top = 0;
    for (int j = 0; j < k; ++j) top += p[order[j]];
    top = std::max(top, 6.103515625e-5);
    for (int j = 0; j < k; ++j) {
      I(ids + int64_t{r} * k + j, 1)[0] = order[j];
      F(weights + int64_t{r} * k + j, 1)[0] = static_cast<float>(p[order[j]] / top);
    }
  }
}

void ReferenceBackend::MoeFfn(const DeviceMatrix& gate, const DeviceMatrix& up,
                              const DeviceMatrix& down, DevPtr in, int n, DevPtr ids,
                              DevPtr weights, int k, DevPtr out) {
  const int64_t e = down.rows(), ff = gate.rows();
  std::vector<float> g(ff), u(ff), y(e);
  for (int r = 0; r < n; ++r) {
    float* o = F(out + r * e, e);
    for (int j = 0; j < k; ++j) {
      const int x = I(ids + int64_t{r} * k + j, 1)[0];
      const float* row = F(in + r * e, e);
      ref::MatMul(M(gate).views[x], row, 1, g.data());
      ref::MatMul(M(up).views[x], row, 1, u.data());
      ref::SiluMul(g.data(), u.data(), ff, g.data());
      ref::MatMul(M(down).views[x], g.data(), 1, y.data());
      const float wt = F(weights + int64_t{r} * k + j, 1)[0];
      for (int64_t i = 0; i < e; ++i) o[i] = (j == 0 ? 0.0f : o[i]) + wt * y[i];
    }
  }
}

}  // namespace

std::unique_ptr<Backend> MakeReferenceBackend(const ReferenceOptions& options,
                                              TransferCounts* counts) {
  return std::make_unique<ReferenceBackend>(options, counts);
}

}  // namespace kvasir::testing
