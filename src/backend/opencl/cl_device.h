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

// The vendor family of a device, for the fast paths that are specific to one (docs/BACKENDS.md,
// "Adreno and Mali"): none is written yet, so every family runs the kernels of its DecodePath.
enum class DeviceFamily {
  kGeneric,  // any OpenCL 1.2 device (PoCL, desktop GPUs)
  kAdreno,   // Qualcomm Adreno
  kMali,     // Arm Mali
};
const char* DeviceFamilyName(DeviceFamily f);

// How a one-token product is computed (mat_mul.cl): kRows, one work-item per output row and the
// CPU's sum order (CPU devices such as PoCL, where a work-group runs on one core); kSplit, a
// work-group per output row whose items read adjacent blocks and reduce (GPUs, where one item per
// row leaves the memory reads uncoalesced). KVASIR_OPENCL_DECODE=rows|split overrides the choice.
enum class DecodePath { kRows, kSplit };
const char* DecodePathName(DecodePath p);

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
  bool subgroups = false;         // cl_khr_subgroups: reductions without local memory
  DeviceFamily family = DeviceFamily::kGeneric;

  bool HasExtension(std::string_view ext) const;
  // "NAME (PLATFORM DRIVER)", as `kvasir devices` and the stage log show it.
  std::string Label() const;
};

// The path for d, or an error when KVASIR_OPENCL_DECODE names none.
Result<DecodePath> ChooseDecodePath(const ClDevice& d);

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
// "f32, f16, q8_0, ...": for messages. (The library uses only backend.h's inline parts, so not
// the registry's TypeList.)
std::string ClTypeNames();

// What `kvasir devices` lists for d.
DeviceInfo ToDeviceInfo(const ClDevice& d, uint64_t memory);

}  // namespace kvasir::opencl
