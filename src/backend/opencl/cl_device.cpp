#include "backend/opencl/cl_device.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "base/human.h"
#include "gguf/tensor_type.h"

namespace kvasir::opencl {
namespace {

std::string PlatformString(cl_platform_id p, cl_platform_info what) {
  size_t size = 0;
  if (clGetPlatformInfo(p, what, 0, nullptr, &size) != CL_SUCCESS || size == 0) return "";
  std::string s(size, '\0');
  if (clGetPlatformInfo(p, what, size, s.data(), nullptr) != CL_SUCCESS) return "";
  while (!s.empty() && (s.back() == '\0' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string DeviceString(cl_device_id d, cl_device_info what) {
  size_t size = 0;
  if (clGetDeviceInfo(d, what, 0, nullptr, &size) != CL_SUCCESS || size == 0) return "";
  std::string s(size, '\0');
  if (clGetDeviceInfo(d, what, size, s.data(), nullptr) != CL_SUCCESS) return "";
  while (!s.empty() && (s.back() == '\0' || s.back() == ' ')) s.pop_back();
  return s;
}

template <class T>
T DeviceValue(cl_device_id d, cl_device_info what) {
  T v{};
  if (clGetDeviceInfo(d, what, sizeof(v), &v, nullptr) != CL_SUCCESS) return T{};
  return v;
}

bool Contains(std::string_view haystack, std::string_view needle) {
  return haystack.find(needle) != std::string_view::npos;
}

DeviceFamily FamilyOf(const ClDevice& d) {
  if (Contains(d.name, "Adreno") || Contains(d.vendor, "QUALCOMM")) return DeviceFamily::kAdreno;
  if (Contains(d.name, "Mali") || Contains(d.vendor, "ARM")) return DeviceFamily::kMali;
  return DeviceFamily::kGeneric;
}

ClDevice Describe(int pi, int di, cl_platform_id p, cl_device_id id) {
  ClDevice d;
  d.platform_index = pi;
  d.device_index = di;
  d.platform = p;
  d.device = id;
  d.address = fmt::format("opencl:{}:{}", pi, di);
  d.name = DeviceString(id, CL_DEVICE_NAME);
  d.vendor = DeviceString(id, CL_DEVICE_VENDOR);
  d.driver_version = DeviceString(id, CL_DRIVER_VERSION);
  d.device_version = DeviceString(id, CL_DEVICE_VERSION);
  d.c_version = DeviceString(id, CL_DEVICE_OPENCL_C_VERSION);
  d.extensions = DeviceString(id, CL_DEVICE_EXTENSIONS);
  d.platform_name = PlatformString(p, CL_PLATFORM_NAME);
  d.type = DeviceValue<cl_device_type>(id, CL_DEVICE_TYPE);
  d.global_mem = DeviceValue<cl_ulong>(id, CL_DEVICE_GLOBAL_MEM_SIZE);
  d.max_alloc = DeviceValue<cl_ulong>(id, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
  d.local_mem = DeviceValue<cl_ulong>(id, CL_DEVICE_LOCAL_MEM_SIZE);
  d.max_work_group = DeviceValue<size_t>(id, CL_DEVICE_MAX_WORK_GROUP_SIZE);
  d.correct_div_sqrt = (DeviceValue<cl_device_fp_config>(id, CL_DEVICE_SINGLE_FP_CONFIG) &
                        CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT) != 0;
  d.subgroups = d.HasExtension("cl_khr_subgroups");
  d.family = FamilyOf(d);
  return d;
}

constexpr TensorType kTypes[] = {TensorType::kF32,  TensorType::kF16,  TensorType::kQ8_0,
                                 TensorType::kQ4_0, TensorType::kQ4_K, TensorType::kQ5_K,
                                 TensorType::kQ6_K};

}  // namespace

std::string ClErrorName(cl_int code) {
  const char* name = "an OpenCL error";
  switch (code) {
#define KV_CL_NAME(c) \
  case c:             \
    name = #c;        \
    break;
    KV_CL_NAME(CL_DEVICE_NOT_FOUND)
    KV_CL_NAME(CL_DEVICE_NOT_AVAILABLE)
    KV_CL_NAME(CL_COMPILER_NOT_AVAILABLE)
    KV_CL_NAME(CL_MEM_OBJECT_ALLOCATION_FAILURE)
    KV_CL_NAME(CL_OUT_OF_RESOURCES)
    KV_CL_NAME(CL_OUT_OF_HOST_MEMORY)
    KV_CL_NAME(CL_BUILD_PROGRAM_FAILURE)
    KV_CL_NAME(CL_INVALID_VALUE)
    KV_CL_NAME(CL_INVALID_DEVICE)
    KV_CL_NAME(CL_INVALID_BINARY)
    KV_CL_NAME(CL_INVALID_BUILD_OPTIONS)
    KV_CL_NAME(CL_INVALID_PROGRAM_EXECUTABLE)
    KV_CL_NAME(CL_INVALID_KERNEL_NAME)
    KV_CL_NAME(CL_INVALID_KERNEL)
    KV_CL_NAME(CL_INVALID_ARG_INDEX)
    KV_CL_NAME(CL_INVALID_ARG_VALUE)
    KV_CL_NAME(CL_INVALID_ARG_SIZE)
    KV_CL_NAME(CL_INVALID_KERNEL_ARGS)
    KV_CL_NAME(CL_INVALID_WORK_DIMENSION)
    KV_CL_NAME(CL_INVALID_WORK_GROUP_SIZE)
    KV_CL_NAME(CL_INVALID_WORK_ITEM_SIZE)
    KV_CL_NAME(CL_INVALID_GLOBAL_OFFSET)
    KV_CL_NAME(CL_INVALID_MEM_OBJECT)
    KV_CL_NAME(CL_INVALID_BUFFER_SIZE)
    KV_CL_NAME(CL_INVALID_COMMAND_QUEUE)
    KV_CL_NAME(CL_INVALID_CONTEXT)
    KV_CL_NAME(CL_INVALID_OPERATION)
    KV_CL_NAME(CL_INVALID_GLOBAL_WORK_SIZE)
    KV_CL_NAME(CL_MEM_COPY_OVERLAP)
    KV_CL_NAME(CL_MISALIGNED_SUB_BUFFER_OFFSET)
    KV_CL_NAME(CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST)
#undef KV_CL_NAME
    case -1001:
      name = "CL_PLATFORM_NOT_FOUND_KHR";
      break;
    default:
      break;
  }
  return fmt::format("{} ({})", name, code);
}

const char* DeviceFamilyName(DeviceFamily f) {
  switch (f) {
    case DeviceFamily::kAdreno:
      return "adreno";
    case DeviceFamily::kMali:
      return "mali";
    default:
      return "generic";
  }
}

const char* DecodePathName(DecodePath p) { return p == DecodePath::kSplit ? "split" : "rows"; }

Result<DecodePath> ChooseDecodePath(const ClDevice& d) {
  if (const char* env = std::getenv("KVASIR_OPENCL_DECODE"); env != nullptr && *env != '\0') {
    if (std::string_view(env) == "rows") return DecodePath::kRows;
    if (std::string_view(env) == "split") return DecodePath::kSplit;
    return Error("KVASIR_OPENCL_DECODE '{}' is not rows or split", env);
  }
  return (d.type & (CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_ACCELERATOR)) != 0 ? DecodePath::kSplit
                                                                           : DecodePath::kRows;
}

bool ClDevice::HasExtension(std::string_view ext) const {
  size_t at = 0;
  while ((at = extensions.find(ext, at)) != std::string::npos) {
    const size_t end = at + ext.size();
    if ((at == 0 || extensions[at - 1] == ' ') &&
        (end == extensions.size() || extensions[end] == ' '))
      return true;
    at = end;
  }
  return false;
}

std::string ClDevice::Label() const {
  return fmt::format("{} ({} {})", name, platform_name, driver_version);
}

Result<std::vector<ClDevice>> ListClDevices() {
  cl_uint n_platforms = 0;
  const cl_int err = clGetPlatformIDs(0, nullptr, &n_platforms);
  if (err != CL_SUCCESS || n_platforms == 0) {
    return Error(StatusCode::kUnavailable,
                 "no OpenCL platform on this machine ({}): install an OpenCL driver (for a test "
                 "device, pocl-opencl-icd)",
                 err != CL_SUCCESS ? ClErrorName(err) : "the ICD loader lists none");
  }
  std::vector<cl_platform_id> platforms(n_platforms);
  if (cl_int e = clGetPlatformIDs(n_platforms, platforms.data(), nullptr); e != CL_SUCCESS) {
    return Error(StatusCode::kUnavailable, "OpenCL platforms: {}", ClErrorName(e));
  }
  std::vector<ClDevice> out;
  for (cl_uint pi = 0; pi < n_platforms; ++pi) {
    cl_uint n = 0;
    if (clGetDeviceIDs(platforms[pi], CL_DEVICE_TYPE_ALL, 0, nullptr, &n) != CL_SUCCESS) continue;
    std::vector<cl_device_id> ids(n);
    if (clGetDeviceIDs(platforms[pi], CL_DEVICE_TYPE_ALL, n, ids.data(), nullptr) != CL_SUCCESS) {
      continue;
    }
    for (cl_uint di = 0; di < n; ++di) {
      out.push_back(Describe(static_cast<int>(pi), static_cast<int>(di), platforms[pi], ids[di]));
    }
  }
  return out;
}

Result<ClDevice> FindClDevice(int platform, int device) {
  KV_ASSIGN_OR_RETURN(std::vector<ClDevice> all, ListClDevices());
  int platforms = 0, on_platform = 0;
  for (const ClDevice& d : all) {
    platforms = std::max(platforms, d.platform_index + 1);
    if (d.platform_index != platform) continue;
    ++on_platform;
    if (d.device_index == device) return d;
  }
  if (on_platform == 0) {
    return Error(StatusCode::kNotFound,
                 "opencl:{}:{}: there is no platform {} with a device ({} "
                 "platform(s) with devices here; `kvasir devices` lists them)",
                 platform, device, platform, platforms);
  }
  return Error(StatusCode::kNotFound, "opencl:{}:{}: platform {} has {} device(s)", platform,
               device, platform, on_platform);
}

Result<uint64_t> MemoryLimit(const ClDevice& d) {
  const char* env = std::getenv("KVASIR_OPENCL_MEMORY_LIMIT");
  if (env == nullptr || *env == '\0') return d.global_mem;
  uint64_t v = 0;
  for (const char* c = env; *c != '\0'; ++c) {
    if (*c < '0' || *c > '9' || v > (UINT64_MAX - 9) / 10) {
      return Error("KVASIR_OPENCL_MEMORY_LIMIT '{}' is not a byte count", env);
    }
    v = v * 10 + static_cast<uint64_t>(*c - '0');
  }
  return std::min(v, d.global_mem);
}

bool ClSupportsType(TensorType t) {
  return std::find(std::begin(kTypes), std::end(kTypes), t) != std::end(kTypes);
}

std::vector<TensorType> ClTypes() { return {std::begin(kTypes), std::end(kTypes)}; }

std::string ClTypeNames() {
  std::string out;
  for (TensorType t : kTypes) {
    out += (out.empty() ? "" : ", ") + TensorTypeName(static_cast<uint32_t>(t));
  }
  return out;
}

DeviceInfo ToDeviceInfo(const ClDevice& d, uint64_t memory) {
  DeviceInfo info;
  info.address = d.address;
  info.name = d.Label();
  info.memory_bytes = memory;
  info.free_bytes = 0;  // OpenCL does not say; the backend counts its own allocations
  info.types = ClTypes();
  return info;
}

}  // namespace kvasir::opencl
