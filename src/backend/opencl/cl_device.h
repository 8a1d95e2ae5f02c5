// OpenCL platforms and devices as the backend sees them: enumeration (`kvasir devices`,
// `--backend opencl:PLATFORM:DEVICE`), what a device offers, and which kernel path suits it.
#pragma once

// OpenCL 1.2 host API: what PoCL and phone drivers offer.
#ifndef CL_TARGET_OPENCL_VERSION
#define CL_TARGET_OPENCL_VERSION 120
#endif
#include <CL/cl.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"

namespace kvasir::opencl {

// "CL_OUT_OF_RESOURCES (-5)".
std::string ClErrorName(cl_int code);

// Which kernels a device gets. Only kGeneric exists today and every device runs it; the others
// name the fast paths a device would get when they are written (docs/BACKENDS.md, "Adreno and
// Mali"): detection is in place so that they plug in behind it.
enum class DeviceFamily {
  kGeneric,  // any OpenCL 1.2 device (PoCL, desktop GPUs)
  kAdreno,   // Qualcomm Adreno: image1d_buffer weights, subgroup reductions (not written yet)
  kMali,     // Arm Mali (not written yet)
};
const char* DeviceFamilyName(DeviceFamily f);

struct ClDevice {
  int platform_index = 0, device_index = 0;
  cl_platform_id platform = nullptr;
  cl_device_id device = nullptr;
  std::string address;  // "opencl:0:0"
  std::string name;     // CL_DEVICE_NAME
  std::string vendor, driver_version, device_version, c_version, platform_name, extensions;
  cl_device_type type = 0;
  uint64_t global_mem = 0;  // CL_DEVICE_GLOBAL_MEM_SIZE
  uint64_t max_alloc = 0;   // CL_DEVICE_MAX_MEM_ALLOC_SIZE: the largest buffer
  uint64_t local_mem = 0;
  size_t max_work_group = 0;
  bool correct_div_sqrt = false;  // CL_FP_CORRECTLY_ROUNDED_DIVIDE_SQRT
  bool subgroups = false;         // cl_khr_subgroups, cl_intel_subgroups or cl_qcom_subgroup*
  DeviceFamily family = DeviceFamily::kGeneric;

  bool HasExtension(std::string_view ext) const;
  // "NAME (PLATFORM DRIVER)", as `kvasir devices` and the stage log show it.
  std::string Label() const;
};

// Every device of every platform; an error when no platform answers (no ICD installed).
Result<std::vector<ClDevice>> ListClDevices();
// The device at PLATFORM:DEVICE, or an error naming what the machine has.
Result<ClDevice> FindClDevice(int platform, int device);

// The bytes the backend may allocate on a device: its global memory, or less when
// KVASIR_OPENCL_MEMORY_LIMIT (a byte count) says so (tests; sharing a device).
Result<uint64_t> MemoryLimit(const ClDevice& d);

// The weight types the kernels multiply: f32, f16, q8_0, q4_0, q4_k, q5_k, q6_k.
bool ClSupportsType(TensorType t);
std::vector<TensorType> ClTypes();

// What `kvasir devices` lists for d.
DeviceInfo ToDeviceInfo(const ClDevice& d, uint64_t memory);

}  // namespace kvasir::opencl
