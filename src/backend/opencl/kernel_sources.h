// The OpenCL C sources of the backend's kernels (kernels/*.cl), embedded in the binary at build
// time, and the programs built from them: each program is common.cl, the files it needs, then its
// own file, so that a kernel that fails to build is found in one program.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvasir::opencl {

struct KernelSource {
  const char* name;  // "rows.cl"
  const char* text;
};

// Every kernels/*.cl file, in build order (kernel_sources.cpp, generated).
std::span<const KernelSource> KernelSources();

// One program: its name (the file that defines its kernels) and its source, with where each file
// starts in it, to map a build log's line numbers back to a file.
struct ProgramSource {
  std::string name;
  std::string text;
  struct Part {
    std::string file;
    int first_line;  // 1-based line of `text` where the file starts
  };
  std::vector<Part> parts;
};

// The backend's programs: mat_mul.cl (with blocks.cl), rows.cl, attention.cl, delta_net.cl, moe.cl.
std::vector<ProgramSource> BackendPrograms();

// The names of the kernels `text` defines ("__kernel void NAME("), in order.
std::vector<std::string> KernelNames(std::string_view text);

}  // namespace kvasir::opencl
