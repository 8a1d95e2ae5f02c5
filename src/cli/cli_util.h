// Helpers shared by the subcommands: argument parsing with one-line errors, the exit-code policy
// (0 ok, 1 runtime error, 2 usage error), human-readable sizes, plain-text tables, timing, and
// loading a model (file + full layer window + tokenizer) for generate/eval/bench.
#pragma once

#include <csignal>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/human.h"
#include "base/status.h"
#include "gguf/gguf_file.h"
#include "model/layer_window.h"
#include "model/sampler.h"
#include "tokenizer/tokenizer.h"

namespace kvasir::cli {

inline constexpr int kExitOk = 0;
inline constexpr int kExitRuntime = 1;
inline constexpr int kExitUsage = 2;

// Parses argv into `app`. Returns nullopt when the command should run, otherwise the exit code to
// return: 0 after printing --help to stdout, 2 after printing one line
// "kvasir <cmd>: <message>; run 'kvasir <cmd> --help'" to stderr.
std::optional<int> ParseArgs(CLI::App& app, std::string_view cmd, int argc, char** argv);

// Prints "kvasir <cmd>: <message>" (one line; newlines in the message become spaces) to stderr and
// returns `code`.
int Fail(std::string_view cmd, std::string_view message, int code = kExitRuntime);
inline int Fail(std::string_view cmd, const Status& status) { return Fail(cmd, status.message()); }
// A usage error: the message plus "; run 'kvasir <cmd> --help'", exit code 2.
int UsageError(std::string_view cmd, std::string_view message);

// Runs `body` and turns any escaping exception into a one-line runtime error, so that no
// subcommand ends with an uncaught exception.
template <typename Fn>
int Guarded(std::string_view cmd, Fn&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    return Fail(cmd, std::string("unexpected error: ") + e.what());
  } catch (...) {
    return Fail(cmd, "unexpected error");
  }
}

// Adds --temp, --top-k, --top-p, --min-p, --repeat-penalty and --seed (shared by every command that
// samples).
void AddSamplingOptions(CLI::App& app, SamplingParams* params, std::optional<uint64_t>* seed);
// The first out-of-range sampling flag, as a message, or nullopt.
std::optional<std::string> CheckSampling(const SamplingParams& params);

// Number of threads to use by default: the cores this process may run on (at least 1).
int DefaultThreads();
// MemAvailable from /proc/meminfo in bytes, or 0.
uint64_t AvailableMemory();
// "2GiB", "512MiB", "1.5G", "800M", "4096" (bytes): binary units, an optional B. Errors quote the
// text.
Result<uint64_t> ParseByteSize(const std::string& text);

// "260", "292.86 K", "420.12 M", "6.74 B".
std::string HumanCount(uint64_t count);
// A string as one line of at most `max_chars` characters (control characters escaped, the rest cut
// with "...").
std::string OneLine(std::string_view text, size_t max_chars);
// Shape in ggml order: "[64, 512]".
std::string ShapeString(const GgufTensorInfo& t);

// A plain-text table with aligned columns. Numbers align right, text left.
class Table {
 public:
  enum class Align { kLeft, kRight };
  explicit Table(std::vector<std::string> header, std::vector<Align> align = {});
  void AddRow(std::vector<std::string> row);
  // Adds a separator line before the next row.
  void AddSeparator();
  // "  a  b  c" with a rule under the header; `markdown` gives "| a | b |" with "| --: |" rules.
  std::string Render(bool markdown = false) const;

 private:
  std::vector<std::string> header_;
  std::vector<Align> align_;
  std::vector<std::vector<std::string>> rows_;  // an empty row is a separator
};

// Wall-clock stopwatch.
class Stopwatch {
 public:
  Stopwatch() : start_(std::chrono::steady_clock::now()) {}
  void Reset() { start_ = std::chrono::steady_clock::now(); }
  double Seconds() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  double Millis() const { return Seconds() * 1e3; }

 private:
  std::chrono::steady_clock::time_point start_;
};

// Checks up front that `path` can be written (the file is writable, or it does not exist and its
// directory is), so that a long run does not fail only at the end. Errors name the path.
Status CheckWritable(const std::string& path);
// Writes `j` (pretty-printed, newline-terminated) to `path`. Errors name the path.
Status WriteJsonFile(const std::string& path, const nlohmann::json& j);
// Reads a JSON file (at most 16 MiB). Errors name the path.
Result<nlohmann::json> ReadJsonFile(const std::string& path);
// Writes raw bytes to `path`. Errors name the path.
Status WriteBinaryFile(const std::string& path, const void* data, size_t n_bytes);

// `status` with "path: " in front unless its message already names the path.
Status WithPath(const Status& status, const std::string& path);

// Opens a GGUF file; errors always name the path.
Result<std::shared_ptr<const GgufFile>> OpenGguf(const std::string& path);

// Sum of n_bytes of all tensors, and of n_elements.
uint64_t TensorBytes(const GgufFile& file);
uint64_t TensorElements(const GgufFile& file);
// "f32 1.01 MiB, q8_0 233.00 KiB": bytes per tensor type, largest first.
std::vector<std::pair<std::string, uint64_t>> BytesPerType(const GgufFile& file);

// A model ready to run: the file, its whole layer window, and (optionally) its tokenizer.
struct LoadedModel {
  std::shared_ptr<const GgufFile> file;
  std::unique_ptr<LayerWindow> window;
  std::unique_ptr<Tokenizer> tokenizer;  // null unless requested
};

// Opens `path` and loads layers [0, n_layer) with embeddings and head on `backend` (--backend
// text). `n_ctx` 0 = the window's default; max_checkpoints and attn_type as WindowOptions.
// Errors name the file.
Result<LoadedModel> LoadModel(const std::string& path, int n_ctx, int n_threads,
                              bool with_tokenizer, const std::string& backend = "cpu",
                              int max_checkpoints = 8, AttnType attn_type = AttnType::kF32);

}  // namespace kvasir::cli
