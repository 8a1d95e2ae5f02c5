#include "cli/cli_util.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <thread>

#include "model/arch/registry.h"

namespace kvasir::cli {

std::optional<int> ParseArgs(CLI::App& app, std::string_view cmd, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
      // --help (and friends): CLI11 renders it to stdout.
      return app.exit(e);
    }
    return UsageError(cmd, e.what());
  }
  return std::nullopt;
}

int Fail(std::string_view cmd, std::string_view message, int code) {
  std::string line = fmt::format("kvasir {}: {}", cmd, message);
  std::replace(line.begin(), line.end(), '\n', ' ');
  line.push_back('\n');
  std::fflush(stdout);
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  return code;
}

int UsageError(std::string_view cmd, std::string_view message) {
  return Fail(cmd, fmt::format("{}; run 'kvasir {} --help'", message, cmd), kExitUsage);
}

void AddSamplingOptions(CLI::App& app, SamplingParams* s, std::optional<uint64_t>* seed) {
  app.add_option("--temp", s->temperature, "temperature; 0 = greedy")->capture_default_str();
  app.add_option("--top-k", s->top_k, "top-k cut; 0 = off")->capture_default_str();
  app.add_option("--top-p", s->top_p, "top-p (nucleus) cut; 1 = off")->capture_default_str();
  app.add_option("--min-p", s->min_p, "min-p cut; 0 = off")->capture_default_str();
  app.add_option("--repeat-penalty", s->repeat_penalty, "repetition penalty; 1 = off")
      ->capture_default_str();
  app.add_option("--seed", *seed, "sampling seed (default: random)");
}

std::optional<std::string> CheckSampling(const SamplingParams& s) {
  if (!(s.temperature >= 0.0f) || std::isinf(s.temperature)) {
    return fmt::format("--temp must be finite and >= 0 (got {})", s.temperature);
  }
  if (s.top_k < 0) return fmt::format("--top-k must be >= 0 (got {})", s.top_k);
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f)) {
    return fmt::format("--top-p must be in (0, 1] (got {})", s.top_p);
  }
  if (!(s.min_p >= 0.0f && s.min_p <= 1.0f)) {
    return fmt::format("--min-p must be in [0, 1] (got {})", s.min_p);
  }
  if (!(s.repeat_penalty > 0.0f) || std::isinf(s.repeat_penalty)) {
    return fmt::format("--repeat-penalty must be > 0 (got {})", s.repeat_penalty);
  }
  return std::nullopt;
}

int DefaultThreads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned hc = std::thread::hardware_concurrency();
  return hc > 0 ? static_cast<int>(hc) : 1;
}

std::string HumanCount(uint64_t count) {
  if (count < 1000) return fmt::format("{}", count);
  static constexpr const char* kUnits[] = {"K", "M", "B", "T"};
  double v = static_cast<double>(count) / 1000.0;
  int unit = 0;
  while (v >= 1000.0 && unit < 3) {
    v /= 1000.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", v, kUnits[unit]);
}

std::string OneLine(std::string_view text, size_t max_chars) {
  std::string out;
  for (char c : text) {
    if (out.size() >= max_chars) {
      out += "...";
      break;
    }
    switch (c) {
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += fmt::format("\\x{:02x}", static_cast<unsigned char>(c));
        } else {
          out.push_back(c);
        }
    }
  }
  return out;
}

std::string ShapeString(const GgufTensorInfo& t) {
  std::string s = "[";
  uint32_t n = std::max<uint32_t>(t.n_dims, 1);
  for (uint32_t i = 0; i < n && i < 4; ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(t.ne[i]);
  }
  return s + "]";
}

// ---- Table ----------------------------------------------------------------------------------

Table::Table(std::vector<std::string> header, std::vector<Align> align)
    : header_(std::move(header)), align_(std::move(align)) {
  align_.resize(header_.size(), Align::kLeft);
}

void Table::AddRow(std::vector<std::string> row) {
  row.resize(header_.size());
  rows_.push_back(std::move(row));
}

void Table::AddSeparator() { rows_.emplace_back(); }

std::string Table::Render(bool markdown) const {
  // Display width: count UTF-8 lead bytes only, so "±" and "…" take one column.
  auto width = [](const std::string& s) {
    size_t w = 0;
    for (unsigned char c : s) w += (c & 0xC0) != 0x80;
    return w;
  };
  std::vector<size_t> widths(header_.size());
  for (size_t c = 0; c < header_.size(); ++c) widths[c] = width(header_[c]);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], width(row[c]));
  }
  auto cell = [&](const std::string& s, size_t c) {
    std::string pad(widths[c] - width(s), ' ');
    return align_[c] == Align::kRight ? pad + s : s + pad;
  };
  auto line = [&](const std::vector<std::string>& row) {
    std::string out = markdown ? "|" : "";
    for (size_t c = 0; c < row.size(); ++c) {
      if (markdown) {
        out += " " + cell(row[c], c) + " |";
      } else {
        out += (c == 0 ? "" : "  ") + cell(row[c], c);
      }
    }
    if (!markdown) {
      while (!out.empty() && out.back() == ' ') out.pop_back();
    }
    return out + "\n";
  };
  auto rule = [&]() {
    std::string out = markdown ? "|" : "";
    for (size_t c = 0; c < widths.size(); ++c) {
      if (markdown) {
        std::string dashes(std::max<size_t>(widths[c], 3), '-');
        if (align_[c] == Align::kRight) dashes.back() = ':';
        out += " " + dashes + " |";
      } else {
        out += (c == 0 ? "" : "  ") + std::string(widths[c], '-');
      }
    }
    return out + "\n";
  };
  std::string out = line(header_) + rule();
  for (const auto& row : rows_) out += row.empty() ? (markdown ? "" : rule()) : line(row);
  return out;
}

Status WithPath(const Status& status, const std::string& path) {
  if (status.ok() || status.message().find(path) != std::string::npos) return status;
  return status.WithContext(path);
}

// ---- Files ----------------------------------------------------------------------------------

Status CheckWritable(const std::string& path) {
  if (path.empty()) return Error("empty output path");
  if (access(path.c_str(), F_OK) == 0) {
    if (access(path.c_str(), W_OK) != 0) {
      return Error("{}: cannot write: {}", path, std::strerror(errno));
    }
    return Status::Ok();
  }
  const size_t slash = path.rfind('/');
  const std::string dir =
      slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
  if (access(dir.c_str(), W_OK | X_OK) != 0) {
    return Error("{}: cannot write: {}: {}", path, dir, std::strerror(errno));
  }
  return Status::Ok();
}

Status WriteBinaryFile(const std::string& path, const void* data, size_t n_bytes) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (f == nullptr) return Error("{}: cannot open for writing: {}", path, std::strerror(errno));
  size_t written = n_bytes == 0 ? 0 : std::fwrite(data, 1, n_bytes, f);
  int write_errno = errno;
  bool ok = written == n_bytes;
  if (std::fclose(f) != 0 && ok) {
    write_errno = errno;
    ok = false;
  }
  if (!ok) return Error("{}: write failed: {}", path, std::strerror(write_errno));
  return Status::Ok();
}

Status WriteJsonFile(const std::string& path, const nlohmann::json& j) {
  std::string text = j.dump(2) + "\n";
  return WriteBinaryFile(path, text.data(), text.size());
}

Result<nlohmann::json> ReadJsonFile(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (f == nullptr) return Error("{}: cannot read: {}", path, std::strerror(errno));
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0 && text.size() < (size_t{16} << 20)) {
    text.append(buf, n);
  }
  std::fclose(f);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Error("{}: not valid JSON", path);
  return j;
}

Result<std::shared_ptr<const GgufFile>> OpenGguf(const std::string& path) {
  auto file = GgufFile::Open(path);
  if (!file.ok()) return WithPath(file.status(), path);
  return std::make_shared<const GgufFile>(std::move(file).value());
}

uint64_t TensorBytes(const GgufFile& file) {
  uint64_t total = 0;
  for (const auto& t : file.tensors()) total += t.n_bytes;
  return total;
}

uint64_t TensorElements(const GgufFile& file) {
  uint64_t total = 0;
  for (const auto& t : file.tensors()) total += t.n_elements();
  return total;
}

std::vector<std::pair<std::string, uint64_t>> BytesPerType(const GgufFile& file) {
  std::map<std::string, uint64_t> per_type;
  for (const auto& t : file.tensors()) per_type[TensorTypeName(t.type)] += t.n_bytes;
  std::vector<std::pair<std::string, uint64_t>> out(per_type.begin(), per_type.end());
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

// ---- Model loading --------------------------------------------------------------------------

Result<LoadedModel> LoadModel(const std::string& path, int n_ctx, int n_threads,
                              bool with_tokenizer, const std::string& backend,
                              int max_checkpoints, AttnType attn_type) {
  LoadedModel model;
  KV_ASSIGN_OR_RETURN(model.file, OpenGguf(path));
  WindowOptions options;
  options.n_ctx = n_ctx;
  options.n_threads = n_threads;
  options.max_sequences = 1;
  options.backend = backend;
  options.max_checkpoints = max_checkpoints;
  options.attn_type = attn_type;

  auto config = LoadModelConfig(*model.file);
  if (!config.ok()) return WithPath(config.status(), path);
  WindowSpec spec{0, config->n_layer, true, true};
  auto window = LayerWindow::Load(model.file, spec, options);
  if (!window.ok()) return WithPath(window.status(), path);
  model.window = std::move(window).value();

  if (with_tokenizer) {
    auto tok = Tokenizer::FromGguf(model.file->header(), path);
    if (!tok.ok()) return WithPath(tok.status(), path);
    model.tokenizer = std::move(tok).value();
    if (model.tokenizer->n_vocab() != model.window->config().n_vocab) {
      return Error("{}: tokenizer has {} tokens but the model's vocabulary is {}", path,
                   model.tokenizer->n_vocab(), model.window->config().n_vocab);
    }
  }
  return model;
}

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

Result<uint64_t> ParseByteSize(const std::string& text) {
  size_t end = 0;
  while (end < text.size() && (std::isdigit(static_cast<unsigned char>(text[end])) || text[end] == '.')) ++end;
  std::string unit = text.substr(end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double value = 0;
  try {
    if (end == 0) throw std::invalid_argument("no number");
    value = std::stod(text.substr(0, end));
  } catch (const std::exception&) {
    return Error("'{}' is not a size (like 2GiB or 512MiB)", text);
  }
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  else if (unit == "k" || unit == "kb" || unit == "kib") scale = 1024.0;
  else if (unit == "m" || unit == "mb" || unit == "mib") scale = 1024.0 * 1024;
  else if (unit == "g" || unit == "gb" || unit == "gib") scale = 1024.0 * 1024 * 1024;
  else if (unit == "t" || unit == "tb" || unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  else return Error("'{}': unknown unit '{}' (use B, KiB, MiB, GiB or TiB)", text, unit);
  const double bytes = value * scale;
  if (!(bytes >= 1) || bytes > 1e18) return Error("'{}' is not a plausible size", text);
  return static_cast<uint64_t>(bytes);
}

}  // namespace kvasir::cli
