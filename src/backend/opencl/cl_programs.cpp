#include "backend/opencl/cl_programs.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>

#include "backend/opencl/kernel_sources.h"
#include "base/log.h"
#include "base/sha256.h"

namespace kvasir::opencl {
namespace {

// Each program: the files it is made of, common.cl first, its own file last.
struct ProgramParts {
  const char* name;
  std::vector<const char*> files;
};
const ProgramParts kPrograms[] = {
    {"mat_mul.cl", {"common.cl", "blocks.cl", "mat_mul.cl"}},
    {"rows.cl", {"common.cl", "rows.cl"}},
    {"attention.cl", {"common.cl", "attention.cl"}},
    {"delta_net.cl", {"common.cl", "delta_net.cl"}},
    {"moe.cl", {"common.cl", "moe.cl"}},
};

const char* SourceText(const char* file) {
  for (const KernelSource& s : KernelSources()) {
    if (std::string_view(s.name) == file) return s.text;
  }
  return nullptr;
}

int CountLines(std::string_view s) {
  return static_cast<int>(std::count(s.begin(), s.end(), '\n'));
}

// The test hook: an undeclared identifier at the start of kernel `name`'s body, on the same line
// (line numbers stay true). False when no program defines the kernel.
bool BreakKernel(std::vector<ProgramSource>& programs, const std::string& name) {
  const std::string head = "__kernel void " + name + "(";
  for (ProgramSource& p : programs) {
    const size_t at = p.text.find(head);
    if (at == std::string::npos) continue;
    const size_t brace = p.text.find('{', at);
    if (brace == std::string::npos) return false;
    p.text.insert(brace + 1, " kvasir_test_hook_breaks_this_kernel = 1;");
    return true;
  }
  return false;
}

std::string CacheDir() {
  if (const char* env = std::getenv("KVASIR_OPENCL_CACHE"); env != nullptr) {
    return std::string_view(env) == "off" ? "" : env;
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && *xdg != '\0') {
    return std::string(xdg) + "/kvasir/opencl";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && *home != '\0') {
    return std::string(home) + "/.cache/kvasir/opencl";
  }
  return "";
}

std::string BuildLog(cl_program p, cl_device_id d) {
  size_t size = 0;
  if (clGetProgramBuildInfo(p, d, CL_PROGRAM_BUILD_LOG, 0, nullptr, &size) != CL_SUCCESS) return "";
  std::string log(size, '\0');
  if (clGetProgramBuildInfo(p, d, CL_PROGRAM_BUILD_LOG, size, log.data(), nullptr) != CL_SUCCESS) {
    return "";
  }
  while (!log.empty() && (log.back() == '\0' || log.back() == '\n')) log.pop_back();
  constexpr size_t kMaxLog = 4000;
  if (log.size() > kMaxLog) log = log.substr(0, kMaxLog) + "\n[... build log cut]";
  return log;
}

// A program from a cached binary, or null when there is none or the driver refuses it.
cl_program FromCache(const ClDevice& d, cl_context ctx, const std::string& path,
                     const std::string& options) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return nullptr;
  const std::string bin((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bin.empty()) return nullptr;
  const size_t size = bin.size();
  const auto* bytes = reinterpret_cast<const unsigned char*>(bin.data());
  cl_int status = CL_SUCCESS, err = CL_SUCCESS;
  cl_program p = clCreateProgramWithBinary(ctx, 1, &d.device, &size, &bytes, &status, &err);
  if (err != CL_SUCCESS || status != CL_SUCCESS) {
    if (p != nullptr) clReleaseProgram(p);
    KV_LOG_DEBUG("{}: cached program {} refused ({}), rebuilding it", d.address, path,
                 ClErrorName(err != CL_SUCCESS ? err : status));
    return nullptr;
  }
  if (cl_int e = clBuildProgram(p, 1, &d.device, options.c_str(), nullptr, nullptr);
      e != CL_SUCCESS) {
    clReleaseProgram(p);
    KV_LOG_DEBUG("{}: cached program {} does not build ({}), rebuilding it", d.address, path,
                 ClErrorName(e));
    return nullptr;
  }
  return p;
}

// Writes p's binary to `path` (through a temporary file, so a reader never sees half of one).
void ToCache(const ClDevice& d, cl_program p, const std::string& path) {
  size_t size = 0;
  if (clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof(size), &size, nullptr) != CL_SUCCESS ||
      size == 0) {
    return;
  }
  std::string bin(size, '\0');
  unsigned char* ptr = reinterpret_cast<unsigned char*>(bin.data());
  if (clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof(ptr), &ptr, nullptr) != CL_SUCCESS) return;
  std::error_code ec;
  const std::filesystem::path target(path);
  std::filesystem::create_directories(target.parent_path(), ec);
  const std::string tmp = fmt::format("{}.{}.tmp", path, static_cast<long>(getpid()));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out.write(bin.data(), static_cast<std::streamsize>(bin.size()));
    if (!out) {
      KV_LOG_DEBUG("{}: cannot write the program cache {}", d.address, tmp);
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, target, ec);
  if (ec) std::filesystem::remove(tmp, ec);
}

// The program of `src` for d: from the cache when it holds it, else built from source.
Result<cl_program> BuildProgram(const ClDevice& d, cl_context ctx, const ProgramSource& src,
                                const std::string& options, const std::string& cache_dir,
                                bool* from_cache) {
  std::string path;
  int lock_fd = -1;
  struct Unlock {
    int& fd;
    ~Unlock() {
      if (fd >= 0) close(fd);  // releases the lock
    }
  } unlock{lock_fd};
  if (!cache_dir.empty()) {
    Sha256 h;
    for (const std::string& part : {d.name, d.vendor, d.driver_version, d.device_version,
                                    d.platform_name, options, src.text}) {
      h.Update({reinterpret_cast<const uint8_t*>(part.data()), part.size() + 1});
    }
    path = fmt::format("{}/{}.bin", cache_dir, Sha256Hex(h.Finish()));
    // One process builds a program while the others wait for its binary (tests start many).
    std::error_code ec;
    std::filesystem::create_directories(cache_dir, ec);
    lock_fd = open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock_fd >= 0) flock(lock_fd, LOCK_EX);
    if (cl_program p = FromCache(d, ctx, path, options); p != nullptr) {
      *from_cache = true;
      return p;
    }
  }
  *from_cache = false;
  const char* text = src.text.c_str();
  const size_t len = src.text.size();
  cl_int err = CL_SUCCESS;
  cl_program p = clCreateProgramWithSource(ctx, 1, &text, &len, &err);
  if (err != CL_SUCCESS) {
    return Error("backend {} ({}): program {}: {}", d.address, d.Label(), src.name,
                 ClErrorName(err));
  }
  err = clBuildProgram(p, 1, &d.device, options.c_str(), nullptr, nullptr);
  if (err != CL_SUCCESS) {
    const std::string log = BuildLog(p, d.device);
    clReleaseProgram(p);
    std::string what = KernelAtLogError(src, log);
    if (what.empty()) {
      std::string names;
      for (const std::string& n : KernelNames(src.text)) {
        if (n.find('#') == std::string::npos) names += (names.empty() ? "" : ", ") + n;
      }
      what = names.empty() ? "a kernel of " + src.name
                           : fmt::format("a kernel of {} ({})", src.name, names);
    } else {
      what = "kernel " + what;
    }
    return Error("backend {} ({}): {} does not build: {}; build log:\n{}", d.address, d.Label(),
                 what, ClErrorName(err), log);
  }
  if (!path.empty()) ToCache(d, p, path);
  return p;
}

}  // namespace

std::vector<ProgramSource> BackendPrograms() {
  std::vector<ProgramSource> out;
  for (const ProgramParts& pp : kPrograms) {
    ProgramSource p;
    p.name = pp.name;
    for (const char* file : pp.files) {
      const char* text = SourceText(file);
      if (text == nullptr) continue;  // the table and kernels/ disagree: the build will say so
      p.parts.push_back({file, CountLines(p.text) + 1});
      p.text += text;
      if (!p.text.empty() && p.text.back() != '\n') p.text += '\n';
    }
    out.push_back(std::move(p));
  }
  return out;
}

std::vector<std::string> KernelNames(std::string_view text) {
  std::vector<std::string> out;
  constexpr std::string_view kHead = "__kernel void ";
  for (size_t at = text.find(kHead); at != std::string_view::npos; at = text.find(kHead, at + 1)) {
    const size_t start = at + kHead.size();
    const size_t end = text.find('(', start);
    if (end == std::string_view::npos) break;
    out.emplace_back(text.substr(start, end - start));
  }
  return out;
}

std::string KernelAtLogError(const ProgramSource& source, const std::string& log) {
  // The first line of the log that says "error" and holds ":LINE:COL:" (clang's "FILE:12:5: error:
  // ..." and PoCL's "error: FILE:12:5: ..." alike).
  int line = 0;
  std::istringstream lines(log);
  for (std::string l; line == 0 && std::getline(lines, l);) {
    if (l.find("error") == std::string::npos) continue;
    for (size_t at = l.find(':'); at != std::string::npos && line == 0; at = l.find(':', at + 1)) {
      size_t i = at + 1, j;
      for (j = i; j < l.size() && j - i < 8 && l[j] >= '0' && l[j] <= '9'; ++j) {
      }
      if (j == i || j >= l.size() || l[j] != ':') continue;
      size_t k;
      for (k = j + 1; k < l.size() && l[k] >= '0' && l[k] <= '9'; ++k) {
      }
      if (k == j + 1 || k >= l.size() || l[k] != ':') continue;
      line = std::stoi(l.substr(i, j - i));
    }
  }
  if (line <= 0) return "";
  // The last kernel that starts at or before that line, if the line is inside its body.
  std::vector<std::string> lines_of;
  std::istringstream text(source.text);
  for (std::string l; std::getline(text, l);) lines_of.push_back(l);
  if (line > static_cast<int>(lines_of.size())) return "";
  auto is_head = [](const std::string& l) {
    return l.find("__kernel void ") != std::string::npos && l.rfind("#define", 0) != 0 &&
           l.find('\\') == std::string::npos;
  };
  int head = 0;
  for (int n = 1; n <= line; ++n) {
    if (is_head(lines_of[n - 1])) head = n;
  }
  if (head == 0) return "";
  int depth = 0;
  bool opened = false;
  for (int n = head; n < line; ++n) {
    for (char c : lines_of[n - 1]) {
      if (c == '{') ++depth, opened = true;
      if (c == '}') --depth;
    }
    if (opened && depth == 0) return "";  // the kernel ended before the error
  }
  const std::vector<std::string> names = KernelNames(lines_of[head - 1]);
  if (names.empty()) return "";
  std::string file = source.name;
  int first = 1;
  for (const ProgramSource::Part& p : source.parts) {
    if (p.first_line <= line) file = p.file, first = p.first_line;
  }
  return fmt::format("{} ({}, line {})", names.front(), file, line - first + 1);
}

std::string BuildOptions(const ClDevice& d, bool subgroups) {
  // Correctly rounded division where the device offers it: the Q8_0 activation scales then
  // equal the CPU's bit for bit.
  std::string options = "-cl-std=CL1.2";
  if (d.correct_div_sqrt) options += " -cl-fp32-correctly-rounded-divide-sqrt";
  if (subgroups) options += " -DKVASIR_SUBGROUPS";
  return options;
}

namespace {

// The runtime of d built with or without subgroups (or the one built before), under the caller's
// lock.
Result<const DeviceRuntime*> BuildRuntime(const ClDevice& d, bool subgroups,
                                          std::map<std::string, const DeviceRuntime*>& built) {
  std::vector<ProgramSource> programs = BackendPrograms();
  const char* hook = std::getenv("KVASIR_OPENCL_BREAK_KERNEL");
  if (hook != nullptr && *hook != '\0' && !BreakKernel(programs, hook)) {
    return Error("KVASIR_OPENCL_BREAK_KERNEL names '{}', which is no kernel of the backend", hook);
  }
  const std::string options = BuildOptions(d, subgroups);
  Sha256 h;
  for (const std::string& part : {d.address, d.name, d.driver_version, options}) {
    h.Update({reinterpret_cast<const uint8_t*>(part.data()), part.size() + 1});
  }
  for (const ProgramSource& p : programs) {
    h.Update({reinterpret_cast<const uint8_t*>(p.text.data()), p.text.size() + 1});
  }
  const std::string key = Sha256Hex(h.Finish());
  if (auto it = built.find(key); it != built.end()) return it->second;

  if (d.c_version.find("OpenCL C 1.0") != std::string::npos ||
      d.c_version.find("OpenCL C 1.1") != std::string::npos) {
    return Error("backend {} ({}): needs OpenCL C 1.2, the device offers '{}'", d.address,
                 d.Label(), d.c_version);
  }
  const cl_context_properties props[] = {CL_CONTEXT_PLATFORM,
                                         reinterpret_cast<cl_context_properties>(d.platform), 0};
  cl_int err = CL_SUCCESS;
  cl_context ctx = clCreateContext(props, 1, &d.device, nullptr, nullptr, &err);
  if (err != CL_SUCCESS) {
    return Error("backend {} ({}): cannot create a context: {}", d.address, d.Label(),
                 ClErrorName(err));
  }
  auto rt = std::make_unique<DeviceRuntime>();
  rt->device = d;
  rt->context = ctx;
  rt->subgroups = subgroups;
  const std::string cache_dir = CacheDir();
  const auto start = std::chrono::steady_clock::now();
  int cached = 0;
  std::string timings;
  for (const ProgramSource& src : programs) {
    bool from_cache = false;
    const auto t0 = std::chrono::steady_clock::now();
    Result<cl_program> p = BuildProgram(d, ctx, src, options, cache_dir, &from_cache);
    timings +=
        fmt::format(" {} {:.1f} s", src.name,
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (!p.ok()) {
      for (cl_program q : rt->programs) clReleaseProgram(q);
      clReleaseContext(ctx);
      return p.status();
    }
    cached += from_cache ? 1 : 0;
    rt->programs.push_back(*p);
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (cached < static_cast<int>(programs.size())) {
    KV_LOG_DEBUG("{}: program build times:{}", d.address, timings);
    KV_LOG_INFO("{}: compiled {} of {} OpenCL programs for {} in {:.1f} s{}", d.address,
                programs.size() - cached, programs.size(), d.name, seconds,
                cache_dir.empty() ? " (no program cache)" : ", cached in " + cache_dir);
  }
  const DeviceRuntime* out = rt.release();
  built[key] = out;
  return out;
}

}  // namespace

Result<const DeviceRuntime*> GetDeviceRuntime(const ClDevice& d, bool subgroups) {
  // Never destroyed: programs and contexts live as long as the process (drivers tear down their
  // own state at exit, in an order static destructors cannot know).
  static std::mutex* mu = new std::mutex;
  static auto* built = new std::map<std::string, const DeviceRuntime*>;
  std::lock_guard<std::mutex> lock(*mu);
  Result<const DeviceRuntime*> rt = BuildRuntime(d, subgroups, *built);
  if (!rt.ok() && subgroups && std::getenv("KVASIR_OPENCL_BREAK_KERNEL") == nullptr) {
    KV_LOG_WARN("{}: the subgroup reductions do not build, using local memory: {}", d.address,
                rt.status().message());
    return BuildRuntime(d, false, *built);
  }
  return rt;
}

}  // namespace kvasir::opencl
