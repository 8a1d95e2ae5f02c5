// The OpenCL backend's class, shared by its files: memory (opencl_backend.cpp), matrix products
// and experts (opencl_mat_mul.cpp), the other ops (opencl_ops.cpp). Internal to this folder.
//
// Every op is one or a few kernels enqueued on an in-order queue, so ops run in call order without
// waits; Upload, Download and RopeAngles' table write block. The first failure of an enqueue is
// kept and returned by the next Download or Finish. Memory is counted: the backend never holds
// more than its limit (the device's global memory, or KVASIR_OPENCL_MEMORY_LIMIT), so a full
// device is refused with the sizes named instead of failing inside the driver.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>

#include "backend/backend.h"
#include "backend/opencl/cl_programs.h"

namespace kvasir::opencl {

class ClBackend;

// Device memory of the backend, counted against its limit.
class ClBuffer final : public DeviceBuffer {
 public:
  ClBuffer(ClBackend* owner, int64_t n, cl_mem mem, uint64_t bytes);
  ~ClBuffer() override;
  cl_mem mem() const { return mem_; }

 private:
  ClBackend* be_;
  cl_mem mem_;
  uint64_t bytes_;
};

// The kernels of one weight type (mat_mul.cl).
struct TypeKernels {
  bool quantized = false;
  cl_kernel x1 = nullptr;        // rows path, decode: one token
  cl_kernel x8 = nullptr;        // rows path, prefill: 8 tokens per work-item
  cl_kernel s1 = nullptr;        // split path, decode: a work-group per row
  cl_kernel s8 = nullptr;        // split path, prefill: a work-group per row and 8 tokens
  cl_kernel id = nullptr;        // experts over grouped row-slots
  cl_kernel get_rows = nullptr;  // row lookup
};

// A weight matrix (or expert stack) in the file's block layout: [count, rows, row_bytes] bytes.
class ClMatrix final : public DeviceMatrix {
 public:
  ClMatrix(ClBackend* owner, const HostMatrix& m, cl_mem mem, uint64_t bytes,
           const TypeKernels* kernels);
  ~ClMatrix() override;

  cl_mem mem = nullptr;
  int row_bytes = 0;
  uint64_t expert_bytes = 0;  // rows * row_bytes
  const TypeKernels* kernels;

 private:
  ClBackend* be_;
  uint64_t bytes_;
};

// Sets a kernel's arguments in order and enqueues it; a failure is kept by the backend.
class KernelCall {
 public:
  KernelCall(ClBackend& be, cl_kernel k) : be_(be), k_(k) {}
  KernelCall& Mem(cl_mem m) { return Set(m); }
  KernelCall& Ptr(DevPtr p);   // p's buffer, then its offset (a long)
  KernelCall& Int(int64_t v);  // an int argument: v must fit
  KernelCall& Long(int64_t v) { return Set(static_cast<cl_long>(v)); }
  KernelCall& Ulong(uint64_t v) { return Set(static_cast<cl_ulong>(v)); }
  KernelCall& Float(float v) { return Set(v); }
  KernelCall& Local(size_t bytes);
  // Enqueues over `global` (dims 1 to 3; any size 0 enqueues nothing). `local`: null lets the
  // driver choose; else the work-group size of dimension 0 (global[0] must be a multiple).
  void Run(std::array<size_t, 3> global, int dims, size_t local = 0);

 private:
  template <class T>
  KernelCall& Set(const T& v) {
    if (err_ == CL_SUCCESS) err_ = clSetKernelArg(k_, index_, sizeof(T), &v);
    ++index_;
    return *this;
  }
  ClBackend& be_;
  cl_kernel k_;
  cl_uint index_ = 0;
  cl_int err_ = CL_SUCCESS;
};

class ClBackend final : public Backend {
 public:
  ClBackend(const DeviceRuntime* rt, uint64_t limit, DecodePath path);
  ~ClBackend() override;
  // The queue and kernels; an error naming the device when they cannot be made.
  Status Init();

  const DeviceInfo& device() const override { return info_; }
  int n_threads() const override { return 1; }
  bool SupportsType(TensorType type) const override;
  bool SupportsOp(Op op) const override { return op < Op::kCount; }
  bool SupportsAttention(const AttentionParams& p) const override;

  Result<std::unique_ptr<DeviceBuffer>> Alloc(int64_t n, std::string_view what) override;
  Result<std::unique_ptr<DeviceMatrix>> UploadMatrix(const HostMatrix& m) override;
  void Upload(DevPtr dst, const void* src, int64_t n) override;
  Status Download(void* dst, DevPtr src, int64_t n) override;
  void Copy(DevPtr dst, DevPtr src, int64_t n) override;
  void Fill(DevPtr dst, int64_t n, float value) override;
  Status Finish() override;

  void GetRows(const DeviceMatrix& w, DevPtr ids, int n, DevPtr out) override;
  void MatMul(const DeviceMatrix& w, DevPtr x, int n, DevPtr y) override;
  void RmsNorm(DevPtr x, DevPtr w, int n_rows, int width, float eps, DevPtr y) override;
  void RopeAngles(const RopeAngleParams& p, std::span<const int32_t> positions,
                  DevPtr out) override;
  void Rope(DevPtr x, int n_rows, int n_heads, int head_dim, int n_rot, RopeType type,
            DevPtr cos_sin) override;
  void SplitQGate(DevPtr q_full, int n_rows, int n_head, int head_dim, DevPtr q,
                  DevPtr gate) override;
  void AppendKv(DevPtr k, DevPtr v, int n, int kv_dim, DevPtr k_cache, DevPtr v_cache,
                int pos0) override;
  void Attention(DevPtr q, int n, int pos0, DevPtr k_cache, DevPtr v_cache,
                 const AttentionParams& p, DevPtr out) override;
  void SiluMul(DevPtr gate, DevPtr up, int64_t n, DevPtr out) override;
  void Add(DevPtr y, DevPtr x, int64_t n) override;
  void AddBias(DevPtr y, DevPtr b, int n_rows, int width) override;
  void SigmoidMul(DevPtr y, DevPtr gate, int64_t n) override;
  void Sigmoid(DevPtr x, int64_t n) override;
  void ScaleRows(DevPtr y, DevPtr s, int n_rows, int width) override;
  void CausalConvSilu(DevPtr x, int n, int channels, int kernel, DevPtr w, DevPtr state,
                      DevPtr out) override;
  void GatedDeltaRule(DevPtr qkv, int64_t row_stride, DevPtr alpha, DevPtr beta, DevPtr dt_bias,
                      DevPtr a, int n, int n_k_heads, int n_v_heads, int dim, float eps,
                      DevPtr state, DevPtr out) override;
  void MoeRoute(DevPtr logits, int n, int n_expert, int k, DevPtr ids, DevPtr weights) override;
  void MoeFfn(const DeviceMatrix& gate, const DeviceMatrix& up, const DeviceMatrix& down, DevPtr in,
              int n, DevPtr ids, DevPtr weights, int k, DevPtr out) override;

  // ---- For the parts of the backend -----------------------------------------------------------
  // A buffer of `bytes` counted against the limit, or an error naming `what` and the sizes.
  Result<cl_mem> NewMem(uint64_t bytes, std::string_view what);
  // Gives back what NewMem counted.
  void Released(uint64_t bytes) { allocated_ -= bytes; }
  // Keeps the first failure, for the next Download or Finish.
  void Fail(cl_int err, std::string_view what);
  void Fail(Status s);
  cl_command_queue queue() const { return queue_; }

 private:
  // Internal buffers the ops need (quantized activations, expert bookkeeping), grown on demand.
  struct Scratch {
    cl_mem mem = nullptr;
    uint64_t bytes = 0;
  };
  // False (and the failure kept) when the device has no room.
  bool Grow(Scratch& s, uint64_t bytes, const char* what);
  cl_kernel K(const char* name) const;
  ClBuffer& B(DevPtr p, int64_t n) const;  // p's buffer, with room for n elements at p
  const ClMatrix& M(const DeviceMatrix& w) const;
  // x [n, cols] as Q8_0 blocks into the activation scratch (mat_mul.cl's quantize_q8).
  bool QuantizeActs(cl_mem x, int64_t x_off, int n, int64_t cols);
  void MatMulTo(const ClMatrix& m, cl_mem x, int64_t x_off, int n, cl_mem y, int64_t y_off);
  void ExpertProduct(const ClMatrix& m, bool gather, int picks, int k, DevPtr ids, cl_mem x,
                     int64_t x_off, cl_mem y);

  const DeviceRuntime* rt_;
  DeviceInfo info_;
  uint64_t limit_;
  uint64_t allocated_ = 0;
  cl_command_queue queue_ = nullptr;
  std::unordered_map<std::string, cl_kernel> kernels_;
  std::map<TensorType, TypeKernels> types_;
  DecodePath path_;
  size_t rows_local_ = 1, attention_local_ = 1, delta_local_ = 1;  // powers of two
  size_t split_local_ = 1;  // the split products' work-group (the least any of them allows)
  Status status_;
  Scratch acts_q_, acts_d_, acts_s_;         // [n, cols] int8, [n, nb] f32, [n, nb, 2] int
  Scratch moe_order_, moe_pos_, moe_start_;  // [picks], [picks], [n_expert + 1] int
  Scratch moe_gate_, moe_up_, moe_out_;      // [picks, n_ff] x2, [picks, n_embd] f32
};

}  // namespace kvasir::opencl
