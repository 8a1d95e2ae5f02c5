#include "backend/opencl/opencl_backend.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/opencl/opencl_backend_impl.h"
#include "base/check.h"
#include "base/human.h"
#include "base/log.h"
#include "gguf/tensor_type.h"

namespace kvasir::opencl {
namespace {

// The largest power of two <= min(cap, what the kernel allows on the device).
size_t GroupSize(cl_kernel k, cl_device_id d, size_t cap) {
  size_t most = 0;
  if (clGetKernelWorkGroupInfo(k, d, CL_KERNEL_WORK_GROUP_SIZE, sizeof(most), &most, nullptr) !=
          CL_SUCCESS ||
      most == 0) {
    most = 1;
  }
  size_t p = 1;
  while (p * 2 <= std::min(cap, most)) p *= 2;
  return p;
}

const char* TypeSuffix(TensorType t) {
  switch (t) {
    case TensorType::kF32:
      return "f32";
    case TensorType::kF16:
      return "f16";
    case TensorType::kQ8_0:
      return "q8_0";
    case TensorType::kQ4_0:
      return "q4_0";
    case TensorType::kQ4_K:
      return "q4_k";
    case TensorType::kQ5_K:
      return "q5_k";
    case TensorType::kQ6_K:
      return "q6_k";
    default:
      return nullptr;
  }
}

}  // namespace

// ---- Buffers, matrices, kernel calls ----------------------------------------------------------

ClBuffer::ClBuffer(ClBackend* owner, int64_t n, cl_mem mem, uint64_t bytes)
    : DeviceBuffer(owner, n), be_(owner), mem_(mem), bytes_(bytes) {}

ClBuffer::~ClBuffer() {
  clReleaseMemObject(mem_);  // the driver keeps it until the ops that use it have run
  be_->Released(bytes_);
}

ClMatrix::ClMatrix(ClBackend* owner, const HostMatrix& m, cl_mem mem_in, uint64_t bytes,
                   const TypeKernels* k)
    : DeviceMatrix(owner, m, bytes),
      mem(mem_in),
      row_bytes(static_cast<int>(m.view.row_bytes)),
      expert_bytes(static_cast<uint64_t>(m.view.rows) * m.view.row_bytes),
      kernels(k),
      be_(owner),
      bytes_(bytes) {}

ClMatrix::~ClMatrix() {
  clReleaseMemObject(mem);
  be_->Released(bytes_);
}

KernelCall& KernelCall::Ptr(DevPtr p) {
  Mem(static_cast<ClBuffer*>(p.buf)->mem());
  return Long(p.offset);
}

KernelCall& KernelCall::Int(int64_t v) {
  KV_CHECK(v >= std::numeric_limits<cl_int>::min() && v <= std::numeric_limits<cl_int>::max(),
           "OpenCL kernel argument {} does not fit an int", v);
  return Set(static_cast<cl_int>(v));
}

KernelCall& KernelCall::Local(size_t bytes) {
  if (err_ == CL_SUCCESS) err_ = clSetKernelArg(k_, index_, bytes, nullptr);
  ++index_;
  return *this;
}

void KernelCall::Run(std::array<size_t, 3> global, int dims, size_t local) {
  for (int i = 0; i < dims; ++i) {
    if (global[i] == 0) return;
  }
  std::array<size_t, 3> group = {local, 1, 1};
  if (err_ == CL_SUCCESS) {
    err_ =
        clEnqueueNDRangeKernel(be_.queue(), k_, static_cast<cl_uint>(dims), nullptr, global.data(),
                               local == 0 ? nullptr : group.data(), 0, nullptr, nullptr);
  }
  if (err_ != CL_SUCCESS) {
    char name[128] = {};
    clGetKernelInfo(k_, CL_KERNEL_FUNCTION_NAME, sizeof(name) - 1, name, nullptr);
    be_.Fail(err_, fmt::format("kernel {}", name));
  }
}

// ---- The backend --------------------------------------------------------------------------------

ClBackend::ClBackend(const DeviceRuntime* rt, uint64_t limit, DecodePath path)
    : rt_(rt), info_(ToDeviceInfo(rt->device, limit)), limit_(limit), path_(path) {}

ClBackend::~ClBackend() {
  if (queue_ != nullptr) clFinish(queue_);
  for (Scratch* s : {&acts_q_, &acts_d_, &acts_s_, &moe_order_, &moe_pos_, &moe_start_, &moe_gate_,
                     &moe_up_, &moe_out_}) {
    if (s->mem != nullptr) clReleaseMemObject(s->mem);
  }
  for (auto& [name, k] : kernels_) clReleaseKernel(k);
  if (queue_ != nullptr) clReleaseCommandQueue(queue_);
}

Status ClBackend::Init() {
  const ClDevice& d = rt_->device;
  cl_int err = CL_SUCCESS;
  queue_ = clCreateCommandQueue(rt_->context, d.device, 0, &err);
  if (err != CL_SUCCESS) {
    return Error("backend {} ({}): cannot create a command queue: {}", d.address, d.Label(),
                 ClErrorName(err));
  }
  for (cl_program p : rt_->programs) {
    cl_uint n = 0;
    if ((err = clCreateKernelsInProgram(p, 0, nullptr, &n)) != CL_SUCCESS) break;
    std::vector<cl_kernel> ks(n);
    if ((err = clCreateKernelsInProgram(p, n, ks.data(), nullptr)) != CL_SUCCESS) break;
    for (cl_kernel k : ks) {
      char name[128] = {};
      clGetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof(name) - 1, name, nullptr);
      kernels_[name] = k;
    }
  }
  if (err != CL_SUCCESS) {
    return Error("backend {} ({}): cannot create its kernels: {}", d.address, d.Label(),
                 ClErrorName(err));
  }
  for (TensorType t : ClTypes()) {
    const std::string s = TypeSuffix(t);
    TypeKernels& tk = types_[t];
    tk.quantized = t != TensorType::kF32 && t != TensorType::kF16;
    tk.x1 = K(("mat_mul_" + s + "_x1").c_str());
    tk.x8 = K(("mat_mul_" + s + "_x8").c_str());
    tk.s1 = K(("mat_mul_" + s + "_s1").c_str());
    tk.s8 = K(("mat_mul_" + s + "_s8").c_str());
    tk.id = K(("mat_mul_id_" + s).c_str());
    tk.get_rows = K(("get_rows_" + s).c_str());
  }
  split_local_ = 64;
  for (const auto& [t, tk] : types_) {
    split_local_ =
        std::min({split_local_, GroupSize(tk.s1, d.device, 64), GroupSize(tk.s8, d.device, 64)});
  }
  rows_local_ = GroupSize(K("rms_norm"), d.device, 64);
  attention_local_ = GroupSize(K("attention"), d.device, 64);
  delta_local_ = GroupSize(K("gated_delta_rule"), d.device, 64);
  return Status::Ok();
}

cl_kernel ClBackend::K(const char* name) const {
  auto it = kernels_.find(name);
  KV_CHECK(it != kernels_.end(), "OpenCL backend: no kernel {} in its programs", name);
  return it->second;
}

bool ClBackend::SupportsType(TensorType type) const { return ClSupportsType(type); }

bool ClBackend::SupportsAttention(const AttentionParams& p) const {
  constexpr int kTile = 256, kDimsPerItem = 8;  // ATT_TILE, ATT_DIMS of attention.cl
  const uint64_t local_bytes = (static_cast<uint64_t>(p.head_dim) + kTile + attention_local_) * 4;
  return p.n_head > 0 && p.n_head_kv > 0 && p.n_head % p.n_head_kv == 0 && p.head_dim > 0 &&
         p.head_dim <= kDimsPerItem * static_cast<int>(attention_local_) &&
         local_bytes <= rt_->device.local_mem && p.softcap >= 0 && p.window >= 0;
}

void ClBackend::Fail(cl_int err, std::string_view what) {
  if (status_.ok()) {
    status_ =
        Error("backend {} ({}): {}: {}", info_.address, rt_->device.name, what, ClErrorName(err));
  }
}

void ClBackend::Fail(Status s) {
  if (status_.ok()) status_ = std::move(s);
}

// ---- Memory -------------------------------------------------------------------------------------

Result<cl_mem> ClBackend::NewMem(uint64_t bytes, std::string_view what) {
  const ClDevice& d = rt_->device;
  if (bytes > d.max_alloc) {
    return Error(StatusCode::kTooLarge,
                 "backend {} ({}): cannot allocate {} for {}: the device's largest buffer is {}",
                 info_.address, d.name, HumanBytes(bytes), what, HumanBytes(d.max_alloc));
  }
  if (bytes > limit_ - allocated_) {
    return Error(StatusCode::kTooLarge,
                 "backend {} ({}): cannot allocate {} for {} ({} free of {})", info_.address,
                 d.name, HumanBytes(bytes), what, HumanBytes(limit_ - allocated_),
                 HumanBytes(limit_));
  }
  cl_int err = CL_SUCCESS;
  cl_mem m = clCreateBuffer(rt_->context, CL_MEM_READ_WRITE, bytes, nullptr, &err);
  if (err != CL_SUCCESS) {
    return Error(StatusCode::kTooLarge,
                 "backend {} ({}): cannot allocate {} for {} ({} free of {}): {}", info_.address,
                 d.name, HumanBytes(bytes), what, HumanBytes(limit_ - allocated_),
                 HumanBytes(limit_), ClErrorName(err));
  }
  allocated_ += bytes;
  return m;
}

bool ClBackend::Grow(Scratch& s, uint64_t bytes, const char* what) {
  if (s.bytes >= bytes) return true;
  if (s.mem != nullptr) {
    clReleaseMemObject(s.mem);
    Released(s.bytes);
    s = Scratch{};
  }
  const uint64_t want = std::max<uint64_t>(bytes, 64);
  auto m = NewMem(want, what);
  if (!m.ok()) {
    Fail(m.status());
    return false;
  }
  s.mem = *m;
  s.bytes = want;
  return true;
}

Result<std::unique_ptr<DeviceBuffer>> ClBackend::Alloc(int64_t n, std::string_view what) {
  constexpr int64_t kMaxElements = int64_t{1} << 40;
  if (n < 0 || n > kMaxElements) {
    return Error("backend {}: {}: {} values is not a size", info_.address, what, n);
  }
  const uint64_t bytes = static_cast<uint64_t>(std::max<int64_t>(n, 1)) * 4;
  KV_ASSIGN_OR_RETURN(cl_mem m, NewMem(bytes, what));
  return std::unique_ptr<DeviceBuffer>(new ClBuffer(this, n, m, bytes));
}

Result<std::unique_ptr<DeviceMatrix>> ClBackend::UploadMatrix(const HostMatrix& m) {
  if (!SupportsType(m.view.type)) {
    return Error("tensor {} has type {}, which backend {} cannot run (it runs: {})", m.name,
                 TensorTypeName(static_cast<uint32_t>(m.view.type)), info_.address, ClTypeNames());
  }
  // Rows are packed on the device (no padding between them), so that f32 and f16 rows are
  // aligned for the kernels' loads: [count, rows, packed] bytes.
  const size_t packed = RowBytes(m.view.type, m.view.cols);
  const size_t one = static_cast<size_t>(m.view.rows) * packed;
  const uint64_t bytes = std::max<uint64_t>(static_cast<uint64_t>(one) * m.count, 1);
  KV_CHECK(m.count >= 1 && packed <= static_cast<size_t>(INT32_MAX) && m.view.row_bytes >= packed &&
               (m.count == 1 || m.stride >= m.view.rows * m.view.row_bytes),
           "UploadMatrix {}: {} matrices of {} rows of {} bytes, {} apart", m.name, m.count,
           m.view.rows, m.view.row_bytes, m.stride);
  KV_ASSIGN_OR_RETURN(cl_mem mem, NewMem(bytes, "tensor " + m.name));
  HostMatrix packed_view = m;
  packed_view.view.row_bytes = packed;
  auto out = std::make_unique<ClMatrix>(this, packed_view, mem, bytes, &types_[m.view.type]);
  std::vector<uint8_t> staging;
  for (int64_t e = 0; e < m.count && one > 0; ++e) {
    const auto* src = static_cast<const uint8_t*>(m.view.data) + e * m.stride;
    if (m.view.row_bytes != packed) {
      staging.resize(one);
      for (int64_t r = 0; r < m.view.rows; ++r) {
        std::memcpy(staging.data() + r * packed, src + r * m.view.row_bytes, packed);
      }
      src = staging.data();
    }
    const cl_int err =
        clEnqueueWriteBuffer(queue_, mem, CL_TRUE, e * one, one, src, 0, nullptr, nullptr);
    if (err != CL_SUCCESS) {
      return Error(StatusCode::kTooLarge, "backend {} ({}): cannot upload tensor {} ({}): {}",
                   info_.address, rt_->device.name, m.name, HumanBytes(bytes), ClErrorName(err));
    }
  }
  return std::unique_ptr<DeviceMatrix>(std::move(out));
}

ClBuffer& ClBackend::B(DevPtr p, int64_t n) const {
  KV_CHECK(p.buf != nullptr && p.buf->owner() == this,
           "backend opencl: a buffer of another backend");
  KV_CHECK(p.offset >= 0 && n >= 0 && p.offset + n <= p.buf->size(),
           "backend opencl: elements [{}, {}) outside a buffer of {}", p.offset, p.offset + n,
           p.buf->size());
  return *static_cast<ClBuffer*>(p.buf);
}

const ClMatrix& ClBackend::M(const DeviceMatrix& w) const {
  KV_CHECK(w.owner() == this, "backend opencl: matrix {} belongs to another backend", w.name());
  return static_cast<const ClMatrix&>(w);
}

void ClBackend::Upload(DevPtr dst, const void* src, int64_t n) {
  if (n == 0) return;
  const cl_int err = clEnqueueWriteBuffer(queue_, B(dst, n).mem(), CL_TRUE, dst.offset * 4, n * 4,
                                          src, 0, nullptr, nullptr);
  if (err != CL_SUCCESS) Fail(err, "upload");
}

Status ClBackend::Download(void* dst, DevPtr src, int64_t n) {
  if (n > 0) {
    const cl_int err = clEnqueueReadBuffer(queue_, B(src, n).mem(), CL_TRUE, src.offset * 4, n * 4,
                                           dst, 0, nullptr, nullptr);
    if (err != CL_SUCCESS) Fail(err, "download");
  }
  return Finish();
}

void ClBackend::Copy(DevPtr dst, DevPtr src, int64_t n) {
  if (n == 0) return;
  const cl_int err = clEnqueueCopyBuffer(queue_, B(src, n).mem(), B(dst, n).mem(), src.offset * 4,
                                         dst.offset * 4, n * 4, 0, nullptr, nullptr);
  if (err != CL_SUCCESS) Fail(err, "copy");
}

void ClBackend::Fill(DevPtr dst, int64_t n, float value) {
  if (n == 0) return;
  const cl_int err = clEnqueueFillBuffer(queue_, B(dst, n).mem(), &value, sizeof(value),
                                         dst.offset * 4, n * 4, 0, nullptr, nullptr);
  if (err != CL_SUCCESS) Fail(err, "fill");
}

Status ClBackend::Finish() {
  if (const cl_int err = clFinish(queue_); err != CL_SUCCESS) Fail(err, "finish");
  Status s = std::move(status_);
  status_ = Status::Ok();
  return s;
}

// ---- Registration -------------------------------------------------------------------------------
namespace {

Result<std::vector<DeviceInfo>> Devices() {
  KV_ASSIGN_OR_RETURN(std::vector<ClDevice> all, ListClDevices());
  std::vector<DeviceInfo> out;
  for (const ClDevice& d : all) {
    KV_ASSIGN_OR_RETURN(uint64_t memory, MemoryLimit(d));
    out.push_back(ToDeviceInfo(d, memory));
  }
  return out;
}

Result<std::unique_ptr<Backend>> Open(const BackendSpec& spec, const BackendOptions& options) {
  KV_CHECK(spec.index.size() == 2, "opencl spec with {} device numbers", spec.index.size());
  KV_ASSIGN_OR_RETURN(ClDevice d, FindClDevice(spec.index[0], spec.index[1]));
  KV_ASSIGN_OR_RETURN(uint64_t limit, MemoryLimit(d));
  KV_ASSIGN_OR_RETURN(const DecodePath path, ChooseDecodePath(d));
  KV_ASSIGN_OR_RETURN(const DeviceRuntime* rt,
                      GetDeviceRuntime(d, d.subgroups && path == DecodePath::kSplit));
  KV_LOG_DEBUG("{}: {} decode path, {} family, subgroup reductions {}", d.address,
               DecodePathName(path), DeviceFamilyName(d.family), rt->subgroups ? "on" : "off");
  auto be = std::make_unique<ClBackend>(rt, limit, path);
  KV_RETURN_IF_ERROR(be->Init());
  return std::unique_ptr<Backend>(std::move(be));
}

}  // namespace

const BackendRegistration* Registration() {
  static const BackendRegistration kRegistration{"opencl", &Devices, &Open};
  return &kRegistration;
}

}  // namespace kvasir::opencl
