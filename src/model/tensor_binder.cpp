#include "model/tensor_binder.h"

namespace kvasir {

Result<const GgufTensorInfo*> TensorBinder::Find(const std::string& name) {
  const GgufTensorInfo* t = file_.FindTensor(name);
  if (t == nullptr) return Error("{}: tensor {} is missing", file_.path(), name);
  return t;
}

Status TensorBinder::CheckType(const std::string& name, const GgufTensorInfo& t) {
  const auto type = static_cast<TensorType>(t.type);
  if (!KernelsSupport(type)) {
    return Error("{}: tensor {} has type {}, which this build cannot compute yet (supported: {})",
                 file_.path(), name, TensorTypeName(t.type), SupportedTypesList());
  }
  return Status::Ok();
}

Result<MatrixView> TensorBinder::Matrix(const std::string& name, int64_t cols, int64_t rows) {
  KV_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Find(name));
  const bool as_vector = rows == 1 && t->n_dims == 1;
  if ((t->n_dims != 2 && !as_vector) || t->ne[0] != static_cast<uint64_t>(cols) ||
      t->ne[1] != static_cast<uint64_t>(rows)) {
    return Error("{}: tensor {} has shape [{}, {}], expected [{}, {}]", file_.path(), name,
                 t->ne[0], t->ne[1], cols, rows);
  }
  KV_RETURN_IF_ERROR(CheckType(name, *t));
  const auto type = static_cast<TensorType>(t->type);
  auto data = file_.TensorData(*t);
  *bytes_ += data.size();
  return MatrixView{type, data.data(), rows, cols, RowBytes(type, cols)};
}

Result<std::vector<MatrixView>> TensorBinder::Experts(const std::string& name, int64_t cols,
                                                      int64_t rows, int64_t n_expert) {
  KV_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Find(name));
  if (t->n_dims != 3 || t->ne[0] != static_cast<uint64_t>(cols) ||
      t->ne[1] != static_cast<uint64_t>(rows) || t->ne[2] != static_cast<uint64_t>(n_expert)) {
    return Error("{}: tensor {} has shape [{}, {}, {}], expected [{}, {}, {}]", file_.path(), name,
                 t->ne[0], t->ne[1], t->ne[2], cols, rows, n_expert);
  }
  KV_RETURN_IF_ERROR(CheckType(name, *t));
  const auto type = static_cast<TensorType>(t->type);
  auto data = file_.TensorData(*t);
  *bytes_ += data.size();
  const size_t row_bytes = RowBytes(type, cols);
  std::vector<MatrixView> out;
  out.reserve(n_expert);
  for (int64_t e = 0; e < n_expert; ++e) {
    out.push_back(MatrixView{type, data.data() + e * rows * row_bytes, rows, cols, row_bytes});
  }
  return out;
}

Result<const float*> TensorBinder::AsF32(const std::string& name, const GgufTensorInfo& t,
                                         int64_t n) {
  KV_RETURN_IF_ERROR(CheckType(name, t));
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
  owned_.emplace_back(n);
  DequantizeRow(type, data.data(), n, owned_.back().data());
  return static_cast<const float*>(owned_.back().data());
}

Result<const float*> TensorBinder::Vector(const std::string& name, int64_t n) {
  KV_ASSIGN_OR_RETURN(const GgufTensorInfo* t, Find(name));
  if (t->n_elements() != static_cast<uint64_t>(n) || t->ne[0] != static_cast<uint64_t>(n)) {
    return Error("{}: tensor {} has {} elements, expected {}", file_.path(), name,
                 t->n_elements(), n);
  }
  return AsF32(name, *t, n);
}

Result<const float*> TensorBinder::Array2d(const std::string& name, int64_t cols, int64_t rows) {
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
  return AsF32(name, *t, cols * rows);
}

}  // namespace kvasir
