// Choosing a backend: the --backend syntax (`cpu`, `opencl[:PLATFORM:DEVICE]`, `cuda[:N]`), the
// backends this build holds, their devices, and opening one. The table of backends is in
// registry.cpp: a backend joins it with one line.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "backend/backend.h"
#include "base/status.h"

namespace kvasir {

// A backend and which of its devices: "opencl:1:0" is {"opencl", {1, 0}}. Without numbers the
// backend's first device ({0, 0} for OpenCL, {0} for CUDA).
struct BackendSpec {
  std::string name;
  std::vector<int> index;

  std::string ToString() const;  // "cpu", "opencl:1:0"
};

// Parses --backend text. Knows every backend the engine has, built into this binary or not, so a
// plan can name devices this machine lacks; errors quote the text and give the syntax.
Result<BackendSpec> ParseBackendSpec(std::string_view text);
// "cpu, opencl[:PLATFORM:DEVICE], cuda[:N]": the syntax, for help texts and messages.
std::string BackendSyntax();

struct BackendOptions {
  int n_threads = 1;  // host threads (the CPU backend computes with them)
  AttnType attn_type = AttnType::kF32;  // kBf16: the CPU backend only, refused elsewhere
};

// One backend built into this binary (a row of registry.cpp's table).
struct BackendRegistration {
  const char* name;  // "cpu", "opencl", "cuda"
  // Every device of this backend on this machine; an error when the runtime cannot be asked (no
  // driver), an empty list when it has none.
  Result<std::vector<DeviceInfo>> (*devices)();
  // The backend on spec's device. Errors name the device ("opencl:0:3: platform 0 has 1 device").
  Result<std::unique_ptr<Backend>> (*open)(const BackendSpec& spec, const BackendOptions& options);
};

// The backends built into this binary, in table order (the CPU backend first).
std::vector<const BackendRegistration*> BuiltBackends();
// Whether spec's backend is built in; else an error saying so and naming the ones that are, and
// how to build the missing one.
Status CheckBackendBuilt(const BackendSpec& spec);
// Opens spec's backend (CheckBackendBuilt first).
Result<std::unique_ptr<Backend>> OpenBackend(const BackendSpec& spec,
                                             const BackendOptions& options);
// ParseBackendSpec + OpenBackend.
Result<std::unique_ptr<Backend>> OpenBackend(std::string_view text, const BackendOptions& options);

// What `kvasir devices` shows for one backend: its devices, or why it cannot list them.
struct BackendDevices {
  std::string backend;
  bool built = false;
  Status status;  // why no devices could be listed (built but no driver), else Ok
  std::vector<DeviceInfo> devices;
};
// Every backend the engine knows, built or not.
std::vector<BackendDevices> ListAllDevices();

// "f32, f16, q4_0, ...": for messages and listings.
std::string TypeList(const std::vector<TensorType>& types);

}  // namespace kvasir
