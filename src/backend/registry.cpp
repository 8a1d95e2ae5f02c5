#include "backend/registry.h"

#include <fmt/format.h>

#include "backend/cpu/cpu_backend.h"
#include "gguf/tensor_type.h"

// A backend folder that CMake built defines KVASIR_HAVE_<NAME> (src/backend/CMakeLists.txt).
#if KVASIR_HAVE_OPENCL
#include "backend/opencl/opencl_backend.h"
#define KVASIR_OPENCL_REGISTRATION &opencl::Registration
#else
#define KVASIR_OPENCL_REGISTRATION nullptr
#endif
#if KVASIR_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#define KVASIR_CUDA_REGISTRATION &cuda::Registration
#else
#define KVASIR_CUDA_REGISTRATION nullptr
#endif

namespace kvasir {
namespace {

struct KnownBackend {
  const char* name;
  int n_index;         // numbers after the name: opencl:PLATFORM:DEVICE has two
  const char* syntax;  // as --backend takes it
  const char* build;   // how to build it in, for the message when it is not
  const BackendRegistration* (*registration)();  // null when this binary does not have it
};

// The backends: one row each.
constexpr KnownBackend kBackends[] = {
    {"cpu", 0, "cpu", "", &cpu::Registration},
    {"opencl", 2, "opencl[:PLATFORM:DEVICE]",
     "install an OpenCL ICD loader and headers (ocl-icd-opencl-dev, opencl-c-headers) and "
     "configure with -DKVASIR_OPENCL=ON",
     KVASIR_OPENCL_REGISTRATION},
    {"cuda", 1, "cuda[:N]", "install the CUDA toolkit (nvcc) and configure with -DKVASIR_CUDA=ON",
     KVASIR_CUDA_REGISTRATION},
};

const KnownBackend* FindKnown(std::string_view name) {
  for (const KnownBackend& k : kBackends) {
    if (name == k.name) return &k;
  }
  return nullptr;
}

// A device number: 1 to 3 digits.
bool ParseIndex(std::string_view s, int* out) {
  if (s.empty() || s.size() > 3) return false;
  int v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    v = v * 10 + (c - '0');
  }
  *out = v;
  return true;
}

std::string BuiltNames() {
  std::string out;
  for (const KnownBackend& k : kBackends) {
    if (k.registration == nullptr) continue;
    out += (out.empty() ? "" : ", ") + std::string(k.name);
  }
  return out;
}

}  // namespace

std::string BackendSyntax() {
  std::string out;
  for (const KnownBackend& k : kBackends) out += (out.empty() ? "" : ", ") + std::string(k.syntax);
  return out;
}

Result<BackendSpec> ParseBackendSpec(std::string_view text) {
  const size_t colon = text.find(':');
  const std::string_view name = text.substr(0, colon);
  const KnownBackend* k = FindKnown(name);
  if (k == nullptr) {
    return Error("backend '{}' is not one of {}", text, BackendSyntax());
  }
  BackendSpec spec{std::string(name), std::vector<int>(k->n_index, 0)};
  if (colon == std::string_view::npos) return spec;
  std::string_view rest = text.substr(colon + 1);
  for (int i = 0; i < k->n_index; ++i) {
    const size_t next = rest.find(':');
    if (!ParseIndex(rest.substr(0, next), &spec.index[i]) ||
        (next == std::string_view::npos) != (i == k->n_index - 1)) {
      return Error("backend '{}' is not {} (device numbers of 0 to 999)", text, k->syntax);
    }
    rest = next == std::string_view::npos ? std::string_view() : rest.substr(next + 1);
  }
  if (k->n_index == 0) return Error("backend '{}': {} takes no device number", text, k->name);
  return spec;
}

std::vector<const BackendRegistration*> BuiltBackends() {
  std::vector<const BackendRegistration*> out;
  for (const KnownBackend& k : kBackends) {
    if (k.registration != nullptr) out.push_back(k.registration());
  }
  return out;
}

Status CheckBackendBuilt(const BackendSpec& spec) {
  const KnownBackend* k = FindKnown(spec.name);
  if (k == nullptr) return Error("backend '{}' is not one of {}", spec.name, BackendSyntax());
  if (k->registration == nullptr) {
    return Error("backend {}: this kvasir was built without it (built: {}); to have it, {}",
                 spec.ToString(), BuiltNames(), k->build);
  }
  return Status::Ok();
}

Result<std::unique_ptr<Backend>> OpenBackend(const BackendSpec& spec,
                                             const BackendOptions& options) {
  KV_RETURN_IF_ERROR(CheckBackendBuilt(spec));
  if (options.n_threads < 1) return Error("thread count {} must be at least 1", options.n_threads);
  if (options.attn_type != AttnType::kF32 && spec.name != "cpu") {
    return Error("backend {}: attention in bf16 (--attn-type bf16) is an option of the cpu backend",
                 spec.ToString());
  }
  return FindKnown(spec.name)->registration()->open(spec, options);
}

Result<std::unique_ptr<Backend>> OpenBackend(std::string_view text, const BackendOptions& options) {
  KV_ASSIGN_OR_RETURN(BackendSpec spec, ParseBackendSpec(text));
  return OpenBackend(spec, options);
}

std::vector<BackendDevices> ListAllDevices() {
  std::vector<BackendDevices> out;
  for (const KnownBackend& k : kBackends) {
    BackendDevices d;
    d.backend = k.name;
    d.built = k.registration != nullptr;
    if (!d.built) {
      d.status = Error("not built into this kvasir; to have it, {}", k.build);
    } else if (auto devices = k.registration()->devices(); devices.ok()) {
      d.devices = std::move(devices).value();
    } else {
      d.status = devices.status();
    }
    out.push_back(std::move(d));
  }
  return out;
}

}  // namespace kvasir
