// The compute seam of a stage: a backend owns its memory (a window's weights, each sequence's
// state, the activations of a batch) and runs every op of a layer on tensors in that memory. Model
// code (src/model) sees only this header and backend/registry.h; each backend lives in its own
// folder (backend/cpu/, backend/opencl/, backend/cuda/) and is listed once in backend/registry.cpp.
// docs/BACKENDS.md tells how a backend plugs in.
//
// Memory. The host reaches a backend's memory only through Upload and Download: a window uploads
// its input rows (token ids or hidden states), downloads its boundary rows or, at the tail, the
// logits it samples from; everything in between stays where the backend keeps it. Weights are
// uploaded once, at load, in whatever layout the backend's kernels want (the CPU backend keeps the
// file's mapped bytes; a GPU backend may repack them).
//
// Threading and errors. A backend is used from one thread at a time. Buffers and matrices it hands
// out belong to the caller and must be destroyed before the backend. Ops run in call order and may
// run asynchronously (a GPU's queue), so they return nothing: a failure (a kernel that could not be
// launched, a lost device) is kept and returned by the next Download() or Finish(). Shapes are the
// caller's promise: ops check them only with KV_CHECK; the window validates everything from
// outside before it calls an op.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "kernels/kernels.h"      // MatrixView, TensorType
#include "kernels/rope_angles.h"  // RopeAngleParams, RopeType

namespace kvasir {

class Backend;

// A block of a backend's memory: host memory for the CPU backend, device memory for a GPU. It
// holds 4-byte elements (f32 values or int32 ids). Only its backend reads or writes it.
class DeviceBuffer {
 public:
  virtual ~DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  const Backend* owner() const { return owner_; }
  int64_t size() const { return size_; }  // elements

 protected:
  DeviceBuffer(const Backend* owner, int64_t size) : owner_(owner), size_(size) {}

 private:
  const Backend* owner_;
  int64_t size_;
};

// A place in a DeviceBuffer, in 4-byte elements. `p + n` is n elements further on, so model code
// addresses rows and heads as it would with a pointer, without ever holding one.
struct DevPtr {
  DeviceBuffer* buf = nullptr;
  int64_t offset = 0;

  DevPtr operator+(int64_t n) const { return {buf, offset + n}; }
};

// A weight matrix as the file holds it (ggml layout, mapped bytes): `count` matrices of
// view.rows x view.cols (a stack of experts when count > 1), matrix e at view.data + e * stride.
struct HostMatrix {
  std::string name;  // the tensor's name, for messages
  MatrixView view;
  int64_t count = 1;
  size_t stride = 0;  // bytes from one matrix of the stack to the next
};

// A weight matrix (or stack of experts) uploaded to a backend, in the backend's layout.
class DeviceMatrix {
 public:
  virtual ~DeviceMatrix() = default;
  DeviceMatrix(const DeviceMatrix&) = delete;
  DeviceMatrix& operator=(const DeviceMatrix&) = delete;

  const Backend* owner() const { return owner_; }
  const std::string& name() const { return name_; }
  TensorType type() const { return type_; }
  int64_t rows() const { return rows_; }
  int64_t cols() const { return cols_; }
  int64_t count() const { return count_; }
  // Bytes of the backend's memory it takes (0 when the backend reads the mapped file in place).
  uint64_t device_bytes() const { return device_bytes_; }

 protected:
  DeviceMatrix(const Backend* owner, const HostMatrix& m, uint64_t device_bytes)
      : owner_(owner),
        name_(m.name),
        type_(m.view.type),
        rows_(m.view.rows),
        cols_(m.view.cols),
        count_(m.count),
        device_bytes_(device_bytes) {}

 private:
  const Backend* owner_;
  std::string name_;
  TensorType type_;
  int64_t rows_, cols_, count_;
  uint64_t device_bytes_;
};

// The operands of the CPU backend's attention dot products (--attn-type): f32, or bf16 with f32
// sums (kernels/attention_bf16.h: keys, values, queries and weights rounded to bf16; CPUs with
// AVX512-BF16 only).
enum class AttnType : uint8_t { kF32, kBf16 };

// The options of Backend::Attention.
struct AttentionParams {
  int n_head = 0;
  int n_head_kv = 0;  // query head h reads KV head h / (n_head / n_head_kv)
  int head_dim = 0;
  float scale = 0.0f;    // multiplies q·k (1 / sqrt(head_dim) for most models)
  float softcap = 0.0f;  // > 0: s = softcap * tanh(s / softcap), after the scale
  int window = 0;        // > 0: a query at position p sees keys at p - window + 1 .. p only
};

// Every op a window may ask of a backend, for SupportsOp and the op-by-op tests.
enum class Op : uint8_t {
  kGetRows,
  kMatMul,
  kRmsNorm,
  kRopeAngles,
  kRope,
  kSplitQGate,
  kAppendKv,
  kAttention,
  kSiluMul,
  kAdd,
  kAddBias,
  kSigmoidMul,
  kSigmoid,
  kScaleRows,
  kCausalConvSilu,
  kGatedDeltaRule,
  kMoeRoute,
  kMoeFfn,
  kCount,  // not an op
};

// "mat_mul", "gated_delta_rule", ...: names in messages, tests and docs/BACKENDS.md.
inline const char* OpName(Op op) {
  static constexpr const char* kNames[] = {
      "get_rows",         "mat_mul",     "rms_norm",  "rope_angles", "rope",
      "split_q_gate",     "append_kv",   "attention", "silu_mul",    "add",
      "add_bias",         "sigmoid_mul", "sigmoid",   "scale_rows",  "causal_conv_silu",
      "gated_delta_rule", "moe_route",   "moe_ffn"};
  static_assert(sizeof(kNames) / sizeof(kNames[0]) == static_cast<size_t>(Op::kCount));
  return kNames[static_cast<size_t>(op)];
}

// One device a backend can run on, as `kvasir devices` lists it.
struct DeviceInfo {
  std::string address;            // what --backend takes for it: "cpu", "opencl:0:1", "cuda:0"
  std::string name;               // "Intel Xeon Platinum 8481C (AVX3_SPR)", "NVIDIA H200"
  uint64_t memory_bytes = 0;      // the device's memory
  uint64_t free_bytes = 0;        // of it, free now (0 = unknown)
  std::vector<TensorType> types;  // weight types its matrix products take
};

class Backend {
 public:
  virtual ~Backend() = default;

  // The device this backend runs on.
  virtual const DeviceInfo& device() const = 0;
  // Host threads it computes with (1 for a GPU backend that only drives its queue).
  virtual int n_threads() const = 0;

  // What it can run. A window asks before it loads, and refuses what is missing, naming the
  // tensor or layer, the type or op, and the backend.
  virtual bool SupportsType(TensorType type) const = 0;
  virtual bool SupportsOp(Op op) const = 0;
  virtual bool SupportsAttention(const AttentionParams& p) const = 0;

  // ---- Memory ---------------------------------------------------------------------------------
  // A buffer of n elements (contents undefined). `what` names it in the error when the device
  // has no room: "backend cuda:0 (NVIDIA H200): cannot allocate 1.2 GiB for <what> (0.3 GiB free)".
  virtual Result<std::unique_ptr<DeviceBuffer>> Alloc(int64_t n, std::string_view what) = 0;
  // Uploads a weight matrix (or expert stack) once. Refuses a type it cannot multiply, naming the
  // tensor, and a matrix that does not fit, naming the sizes.
  virtual Result<std::unique_ptr<DeviceMatrix>> UploadMatrix(const HostMatrix& m) = 0;
  // dst[0, n) = src[0, n); src may be reused as soon as it returns.
  virtual void Upload(DevPtr dst, const void* src, int64_t n) = 0;
  // dst[0, n) = src[0, n) once every op before it has run; the first error of those ops, if any.
  virtual Status Download(void* dst, DevPtr src, int64_t n) = 0;
  // dst[0, n) = src[0, n) (no overlap).
  virtual void Copy(DevPtr dst, DevPtr src, int64_t n) = 0;
  // dst[0, n) = value.
  virtual void Fill(DevPtr dst, int64_t n, float value) = 0;
  // Waits for every op so far; the first error of those ops, if any.
  virtual Status Finish() = 0;

  // ---- Ops: f32 tensors, row-major, shapes in brackets ----------------------------------------
  // out[i, :] = row ids[i] of w, dequantized. ids: [n] int32, each in [0, w.rows). out: [n, cols].
  virtual void GetRows(const DeviceMatrix& w, DevPtr ids, int n, DevPtr out) = 0;
  // y[n, w.rows] = x[n, w.cols] · Wᵀ (w.count() == 1). A row's result does not depend on n.
  virtual void MatMul(const DeviceMatrix& w, DevPtr x, int n, DevPtr y) = 0;
  // y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w for n_rows rows of `width`; w: [width];
  // y may be x.
  virtual void RmsNorm(DevPtr x, DevPtr w, int n_rows, int width, float eps, DevPtr y) = 0;
  // out[i] = the cos/sin of every rotated pair of positions[i] (kernels/rope_angles.h: plain,
  // linear, YaRN, frequency factors, IMROPE). out: [positions.size(), n_rot / 2, 2].
  virtual void RopeAngles(const RopeAngleParams& p, std::span<const int32_t> positions,
                          DevPtr out) = 0;
  // Rotates the first n_rot dims of each head of x [n_rows, n_heads * head_dim] in place by its
  // row's angles cos_sin [n_rows, n_rot / 2, 2]: kNormal pairs (2i, 2i+1), kNeox (i, i + n_rot/2).
  virtual void Rope(DevPtr x, int n_rows, int n_heads, int head_dim, int n_rot, RopeType type,
                    DevPtr cos_sin) = 0;
  // q_full [n_rows, n_head, 2, head_dim] (per head the query, then its gate) into q and gate, each
  // [n_rows, n_head * head_dim].
  virtual void SplitQGate(DevPtr q_full, int n_rows, int n_head, int head_dim, DevPtr q,
                          DevPtr gate) = 0;
  // Appends n rows of k and v [n, kv_dim] to one sequence's cache at positions pos0 .. pos0+n-1:
  // k_cache, v_cache [capacity >= pos0 + n, kv_dim].
  virtual void AppendKv(DevPtr k, DevPtr v, int n, int kv_dim, DevPtr k_cache, DevPtr v_cache,
                        int pos0) = 0;
  // Causal attention of n query rows at positions pos0 .. pos0+n-1 over one sequence's cache
  // (positions 0 .. pos0+n-1 filled). q, out: [n, n_head * head_dim]; caches [.., n_head_kv *
  // head_dim]. Per query row and head: s_j = options(q·k_j), softmax over the visible j, sum of
  // s_j v_j.
  virtual void Attention(DevPtr q, int n, int pos0, DevPtr k_cache, DevPtr v_cache,
                         const AttentionParams& p, DevPtr out) = 0;
  // out[i] = silu(gate[i]) * up[i] over n values; out may be gate or up.
  virtual void SiluMul(DevPtr gate, DevPtr up, int64_t n, DevPtr out) = 0;
  // y[i] += x[i] over n values.
  virtual void Add(DevPtr y, DevPtr x, int64_t n) = 0;
  // y[r, :] += b for n_rows rows of `width`; b: [width].
  virtual void AddBias(DevPtr y, DevPtr b, int n_rows, int width) = 0;
  // y[i] *= sigmoid(gate[i]) over n values.
  virtual void SigmoidMul(DevPtr y, DevPtr gate, int64_t n) = 0;
  // x[i] = sigmoid(x[i]) = 1 / (1 + exp(-x[i])) over n values.
  virtual void Sigmoid(DevPtr x, int64_t n) = 0;
  // y[r, :] *= s[r] for n_rows rows of `width`; s: [n_rows].
  virtual void ScaleRows(DevPtr y, DevPtr s, int n_rows, int width) = 0;

  // Gated DeltaNet, one sequence. Short convolution over n rows of `channels`:
  //   out[t, c] = silu(sum_j w[c, j] * in(t - kernel + 1 + j, c))
  // where in(t) is x[t] for t >= 0 and the saved inputs before it. w: [channels, kernel] (last tap
  // is the current row). state: [kernel - 1, channels], the sequence's last inputs, oldest first;
  // updated to the last kernel - 1 inputs. x, out: [n, channels]; out may not alias x.
  virtual void CausalConvSilu(DevPtr x, int n, int channels, int kernel, DevPtr w, DevPtr state,
                              DevPtr out) = 0;
  // Gated delta rule, one sequence of n rows. qkv: [n, row_stride], each row [q | k | v] with q and
  // k of n_k_heads * dim and v of n_v_heads * dim; alpha, beta: [n, n_v_heads] raw projections;
  // dt_bias, a: [n_v_heads] (a = -exp(A_log)). Per row and value head h (key head h % n_k_heads):
  //   q, k L2-normalised (x / max(|x|, eps)), q scaled by 1/sqrt(dim),
  //   g = softplus(alpha + dt_bias) * a, b = sigmoid(beta),
  //   S <- exp(g) S;  d = b (v - S^T k);  S <- S + k d^T;  o = S^T q.
  // Rows run strictly in order. state: [n_v_heads, dim (value j), dim (key i)], updated.
  // out: [n, n_v_heads * dim].
  virtual void GatedDeltaRule(DevPtr qkv, int64_t row_stride, DevPtr alpha, DevPtr beta,
                              DevPtr dt_bias, DevPtr a, int n, int n_k_heads, int n_v_heads,
                              int dim, float eps, DevPtr state, DevPtr out) = 0;

  // Mixture-of-experts routing: p = softmax(logits[r, :]) over n_expert; ids[r, :] are the k
  // largest (the lower id first on ties), weights[r, j] = p[ids[r, j]] / max(sum of the k,
  // 2^-14 (the smallest normal f16, as llama.cpp)). logits: [n, n_expert], overwritten.
  // ids: [n, k] int32. weights: [n, k].
  virtual void MoeRoute(DevPtr logits, int n, int n_expert, int k, DevPtr ids, DevPtr weights) = 0;
  // Routed experts: out[r] = sum over j in order of weights[r, j] * down_e(silu(gate_e x_r) *
  // up_e x_r), e = ids[r, j]. gate, up: stacks of [n_ff, n_embd]; down: a stack of [n_embd, n_ff]
  // (count = n_expert). in, out: [n, n_embd]. Each expert runs once over all rows routed to it, so
  // a batch reads each expert's weights once.
  virtual void MoeFfn(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down,
                      DevPtr in, int n, DevPtr ids, DevPtr weights, int k, DevPtr out) = 0;
};

}  // namespace kvasir
