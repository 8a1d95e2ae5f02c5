// kvasir profile: times this device on a model's layer shapes and prints a devices.json entry for
// `kvasir plan`. Decode is bound by reading the weights, so the figure is milliseconds per GiB of
// weights run per token: the layers of the model as one window, fed hidden states, one row at a
// time, median over -n steps after a warm-up.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "model/arch/registry.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "profile";

// MemAvailable from /proc/meminfo in bytes, or 0.
uint64_t AvailableMemory() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit) {
    if (key == "MemAvailable:") return kb * 1024;
  }
  return 0;
}

struct ProfileOptions {
  std::string model_path;
  std::string name;
  int n_threads = 1;
  int n_steps = 32;
  double memory_fraction = 0.8;
};

int RunProfile(const ProfileOptions& o) {
  auto file = OpenGguf(o.model_path);
  if (!file.ok()) return Fail(kCmd, file.status());
  auto cfg = LoadModelConfig(**file);
  if (!cfg.ok()) return Fail(kCmd, cfg.status());
  WindowOptions wopt;
  wopt.n_threads = o.n_threads;
  wopt.n_ctx = o.n_steps + 2;
  auto window = LayerWindow::Load(*file, {0, cfg->n_layer, false, false}, wopt);
  if (!window.ok()) return Fail(kCmd, window.status());
  LayerWindow& w = **window;
  if (Status s = w.OpenSequence(0); !s.ok()) return Fail(kCmd, s);
  std::vector<float> hidden(static_cast<size_t>(cfg->n_embd), 0.01f);  // [1, n_embd]
  ForwardOutput out;
  std::vector<double> ms;
  for (int step = 0; step <= o.n_steps; ++step) {
    Stopwatch clock;
    ForwardInput in;
    in.chunks = {SeqChunk{0, step, 1}};
    in.hidden = hidden;
    if (Status s = w.Forward(in, &out); !s.ok()) return Fail(kCmd, s);
    if (step > 0) ms.push_back(clock.Millis());  // step 0 warms the caches and page tables
  }
  std::sort(ms.begin(), ms.end());
  const double median_ms = ms[ms.size() / 2];
  const double gib = static_cast<double>(w.weight_bytes()) / (1ull << 30);
  const double ms_per_gib = median_ms / gib;
  char host[64] = "this-device";
  gethostname(host, sizeof(host) - 1);
  const uint64_t memory = static_cast<uint64_t>(AvailableMemory() * o.memory_fraction);
  nlohmann::json entry = {{"name", o.name.empty() ? std::string(host) : o.name},
                          {"backend", "cpu"},
                          {"memory_bytes", memory},
                          {"ms_per_gib", ms_per_gib}};
  std::fprintf(stderr,
               "profile: %d layers, %s of weights, %.3f ms per token (median of %d, %d threads): "
               "%.2f ms per GiB; memory budget %s (%.0f%% of available)\n",
               cfg->n_layer, HumanBytes(w.weight_bytes()).c_str(), median_ms, o.n_steps,
               o.n_threads, ms_per_gib, HumanBytes(memory).c_str(), o.memory_fraction * 100);
  std::printf("%s\n", entry.dump(2).c_str());
  return kExitOk;
}

}  // namespace

int ProfileMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{"Time this device on a model's layers and print a devices.json entry.",
                 "kvasir profile"};
    ProfileOptions o;
    o.n_threads = DefaultThreads();
    app.add_option("-m,--model", o.model_path, "GGUF model file to time")->required();
    app.add_option("--name", o.name, "device name in the entry (default: host name)");
    app.add_option("-t,--threads", o.n_threads, "threads")->capture_default_str();
    app.add_option("-n,--steps", o.n_steps, "decode steps to time")->capture_default_str();
    app.add_option("--memory-fraction", o.memory_fraction,
                   "share of available memory offered to the ring")
        ->capture_default_str();
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (o.n_threads < 1) return UsageError(kCmd, "-t must be >= 1");
    if (o.n_steps < 1 || o.n_steps > 4096) return UsageError(kCmd, "-n must be in 1..4096");
    if (!(o.memory_fraction > 0 && o.memory_fraction <= 1)) {
      return UsageError(kCmd, "--memory-fraction must be in (0, 1]");
    }
    return RunProfile(o);
  });
}

}  // namespace kvasir::cli
