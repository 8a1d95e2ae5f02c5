// The backend's programs built for one device: from the embedded kernel sources, or from a binary
// that an earlier build on the same device, driver and source left in the cache folder (PoCL takes
// seconds per program), and shared by every backend on that device in this process.
//
// The cache folder is $KVASIR_OPENCL_CACHE, else $XDG_CACHE_HOME/kvasir/opencl, else
// ~/.cache/kvasir/opencl; KVASIR_OPENCL_CACHE=off turns it off. A cached binary the driver refuses
// is rebuilt from source. KVASIR_OPENCL_BREAK_KERNEL=NAME (a test hook) puts an error into kernel
// NAME's source, to show how a kernel that fails to build is reported.
#pragma once

#include <string>
#include <vector>

#include "backend/opencl/cl_device.h"
#include "base/status.h"

namespace kvasir::opencl {

// A device's context and built programs. Made once per device and source in a process, shared by
// every backend on it, and never destroyed (they live as long as the process).
struct DeviceRuntime {
  ClDevice device;
  cl_context context = nullptr;
  std::vector<cl_program> programs;  // one per BackendPrograms() entry
  bool subgroups = false;            // built with KVASIR_SUBGROUPS (split reductions by subgroup)
};

// The runtime of device d, building its programs on the first call. With `subgroups` (a device
// with cl_khr_subgroups on the split path) the split products reduce through subgroups; a build
// that fails so falls back to local memory (the subgroup path is unverified, docs/BACKENDS.md).
// Errors name the device and, for a program that does not build, the kernel the build log points
// at, with the log.
Result<const DeviceRuntime*> GetDeviceRuntime(const ClDevice& d, bool subgroups);

// The options every program is built with on d.
std::string BuildOptions(const ClDevice& d, bool subgroups);

// The first kernel a build log's first error points at in `source` ("rms_norm (rows.cl, line
// 12)"), or "" when the log names no line of a kernel. Exposed for tests.
struct ProgramSource;
std::string KernelAtLogError(const ProgramSource& source, const std::string& log);

}  // namespace kvasir::opencl
