// The text of backend.h's and registry.h's values that backends name in their messages
// (BackendSpec::ToString, TypeList). Its own library, kvasir_backend_text, so that a backend's
// library can use it without linking the registry, which links every backend.
#include <fmt/format.h>

#include "backend/registry.h"
#include "gguf/tensor_type.h"

namespace kvasir {

std::string BackendSpec::ToString() const {
  std::string out = name;
  for (int i : index) out += fmt::format(":{}", i);
  return out;
}

std::string TypeList(const std::vector<TensorType>& types) {
  std::string out;
  for (TensorType t : types) {
    out += (out.empty() ? "" : ", ") + TensorTypeName(static_cast<uint32_t>(t));
  }
  return out;
}

}  // namespace kvasir
