#include "model/tensor_binder.h"

namespace kvasir {

Result<const GgufTensorInfo*> TensorBinder::Find(const std::string& name) {
  const GgufTensorInfo* t = file_.FindTensor(name);
  if (t == nullptr) return Error("{}: tensor {} is missing", file_.path(), name);
  return t;
}

Status TensorBinder::CheckType(const std::string& name, const GgufTensorInfo& t, bool for_backend) {
  const auto type = static_cast<TensorType>(t.type);
  if (!KernelsSupport(type)) {
    return Error("{}: tensor {} has type {}, which this build cannot compute yet (supported: {})",
                 file_.path(), name, TensorTypeName(t.type), SupportedTypesList());
  }
  if (for_backend && !backend_.SupportsType(type)) {
    std::string types;
    for (TensorType s : backend_.device().types) {
      types += (types.empty() ? "" : ", ") + TensorTypeName(static_cast<uint32_t>(s));
    }
    return Error("{}: tensor {} has type {}, which backend {} cannot run (it runs: {})",
                 file_.path(), name, TensorTypeName(t.type), backend_.device().address, types);
  }
  return Status::Ok();
}

Result<const DeviceMatrix*> TensorBinder::Upload(HostMatrix m) {
  auto up = backend_.UploadMatrix(m);
  if (!up.ok()) return up.status().WithContext(file_.path());
  out_->device_bytes += (*up)->device_bytes();
  out_->matrices.push_back(std::move(up).value());
  return out_->matrices.back().get();
}

Result<const DeviceMatrix*> TensorBinder::Matrix(const std::string& name, int64_t cols,
                                                 int64_t rows) {
  KV_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Find(name));
  const bool as_vector = rows == 1 && t->n_dims == 1;
  if ((t->n_dims != 2 && !as_vector) || t->ne[0] != static_cast<uint64_t>(cols) ||
      t->ne[1] != static_cast<uint64_t>(rows)) {
    return Error("{}: tensor {} has shape [{}, {}], expected [{}, {}]", file_.path(), name,
                 t->ne[0], t->ne[1], cols, rows);
  }
  KV_RETURN_IF_ERROR(CheckType(name, *t, true));
  const auto type = static_cast<TensorType>(t->type);
  auto data = file_.TensorData(*t);
  *bytes_ += data.size();
  const size_t row_bytes = RowBytes(type, cols);
  return Upload({name, MatrixView{type, data.data(), rows, cols, row_bytes}, 1, rows * row_bytes});
}

Result<const DeviceMatrix*> TensorBinder::Experts(const std::string& name, int64_t cols,
                                                  int64_t rows, int64_t n_expert) {
  KV_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Find(name));
  if (t->n_dims != 3 || t->ne[0] != static_cast<uint64_t>(cols) ||
      t->ne[1] != static_cast<uint64_t>(rows) || t->ne[2] != static_cast<uint64_t>(n_expert)) {
    return Error("{}: tensor {} has shape [{}, {}, {}], expected [{}, {}, {}]", file_.path(), name,
                 t->ne[0], t->ne[1], t->ne[2], cols, rows, n_expert);
  }
  KV_RETURN_IF_ERROR(CheckType(name, *t, true));
  const auto type = static_cast<TensorType>(t->type);
  auto data = file_.TensorData(*t);
  *bytes_ += data.size();
  const size_t row_bytes = RowBytes(type, cols);
  return Upload(
      {name, MatrixView{type, data.data(), rows, cols, row_bytes}, n_expert, rows * row_bytes});
}

Result<const float*> TensorBinder::AsF32(const std::string& name, const GgufTensorInfo& t,
                                         int64_t n) {
  KV_RETURN_IF_ERROR(CheckType(name, t, false));
  const auto type = static_cast<TensorType>(t.type);
  auto data = file_.TensorData(t);
  *bytes_ += data.size();
  if (type == TensorType::kF32 && reinterpret_cast<uintptr_t>(data.data()) % 4 == 0) {
    return reinterpret_cast<const float*>(data.data());
  }
  if (n % BlockValues(type) != 0) {
    return Error("{}: tensor {} of type {} has {} values, not whole blocks", file_.path(), name,
                 TensorTypeName(t.type), n);
  }
  out_->host.emplace_back(n);
  DequantizeRow(type, data.data(), n, out_->host.back().data());
  return static_cast<const float*>(out_->host.back().data());
}

Result<DevPtr> TensorBinder::UploadF32(const std::string& name, const float* values, int64_t n) {
  auto buf = backend_.Alloc(n, name);
  if (!buf.ok()) return buf.status().WithContext(file_.path());
  const DevPtr p{buf->get(), 0};
  backend_.Upload(p, values, n);
  out_->device_bytes += static_cast<uint64_t>(n) * sizeof(float);
  out_->vectors.push_back(std::move(buf).value());
  return p;
}

Result<const float*> TensorBinder::HostVector(const std::string& name, int64_t n) {
  KV_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Find(name));
  if (t->n_elements() != static_cast<uint64_t>(n) || t->ne[0] != static_cast<uint64_t>(n)) {
    return Error("{}: tensor {} has {} elements, expected {}", file_.path(), name, t->n_elements(),
                 n);
  }
  return AsF32(name, *t, n);
}

Result<DevPtr> TensorBinder::Vector(const std::string& name, int64_t n) {
  KV_ASSIGN_OR_RETURN(const float* values, HostVector(name, n));
  return UploadF32(name, values, n);
}

Result<DevPtr> TensorBinder::Array2d(const std::string& name, int64_t cols, int64_t rows) {
  KV_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Find(name));
  if (t->n_dims != 2 || t->ne[0] != static_cast<uint64_t>(cols) ||
      t->ne[1] != static_cast<uint64_t>(rows)) {
    return Error("{}: tensor {} has shape [{}, {}], expected [{}, {}]", file_.path(), name,
                 t->ne[0], t->ne[1], cols, rows);
  }
  const auto type = static_cast<TensorType>(t->type);
  if (type != TensorType::kF32 && type != TensorType::kF16 && type != TensorType::kBF16) {
    return Error("{}: tensor {} has type {}; f32, f16 or bf16 expected", file_.path(), name,
                 TensorTypeName(t->type));
  }
  KV_ASSIGN_OR_RETURN(const float* values, AsF32(name, *t, cols * rows));
  return UploadF32(name, values, cols * rows);
}

}  // namespace kvasir
