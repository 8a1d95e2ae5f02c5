// kvasir inspect MODEL [--json]: a GGUF file's metadata, its tensors grouped per layer, and its
// bytes per tensor type. Reads the header only; tensor bytes are never touched.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "cli/cli_util.h"
#include "cli/commands.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "inspect";
// Arrays up to this many items are shown in full; longer ones are summarised.
constexpr size_t kMaxArrayItems = 8;

// Tensors of one layer (blk.N.*), or one non-layer tensor.
struct TensorGroup {
  std::string name;  // "blk.3" or "token_embd.weight"
  int layer = -1;    // N for blk.N, -1 otherwise
  int n_tensors = 0;
  uint64_t n_bytes = 0;
  uint64_t n_elements = 0;
  std::set<std::string> types;
};

// Layer index of "blk.N.something", or -1.
int LayerOf(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  size_t dot = name.find('.', 4);
  if (dot == std::string::npos || dot == 4) return -1;
  int layer = 0;
  for (size_t i = 4; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9' || layer > 10000000) return -1;
    layer = layer * 10 + (name[i] - '0');
  }
  return layer;
}

// Layer groups in layer order, then the other tensors in file order.
std::vector<TensorGroup> GroupTensors(const GgufFile& file) {
  std::map<int, TensorGroup> layers;
  std::vector<TensorGroup> others;
  for (const auto& t : file.tensors()) {
    int layer = LayerOf(t.name);
    TensorGroup* g;
    if (layer >= 0) {
      g = &layers[layer];
      g->name = fmt::format("blk.{}", layer);
      g->layer = layer;
    } else {
      others.emplace_back();
      g = &others.back();
      g->name = t.name;
    }
    g->n_tensors++;
    g->n_bytes += t.n_bytes;
    g->n_elements += t.n_elements();
    g->types.insert(TensorTypeName(t.type));
  }
  std::vector<TensorGroup> out;
  for (auto& [layer, g] : layers) out.push_back(std::move(g));
  for (auto& g : others) out.push_back(std::move(g));
  return out;
}

std::string JoinTypes(const std::set<std::string>& types) {
  std::string s;
  for (const auto& t : types) s += (s.empty() ? "" : ", ") + t;
  return s;
}

std::string TypeLabel(const GgufValue& v) {
  if (const GgufArray* a = v.AsArray()) {
    return fmt::format("{}[{}]", GgufTypeName(v.type), GgufTypeName(a->elem_type));
  }
  return GgufTypeName(v.type);
}

std::string ValueText(const GgufValue& v) {
  if (const GgufArray* a = v.AsArray(); a != nullptr && a->size() > kMaxArrayItems) {
    return fmt::format("[{} x {}]", GgufTypeName(a->elem_type), a->size());
  }
  return OneLine(v.ToDisplayString(kMaxArrayItems), 100);
}

// A metadata value as JSON: scalars and short arrays in full, long arrays as a summary.
nlohmann::json ValueJson(const GgufValue& v) {
  return std::visit(
      [&](const auto& x) -> nlohmann::json {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, GgufArray>) {
          if (x.size() > kMaxArrayItems) {
            return {{"elem_type", GgufTypeName(x.elem_type)}, {"count", x.size()}};
          }
          return std::visit(
              [](const auto& items) -> nlohmann::json {
                using V = typename std::decay_t<decltype(items)>::value_type;
                nlohmann::json arr = nlohmann::json::array();
                for (const auto& item : items) {
                  if constexpr (std::is_same_v<V, GgufValue>) {
                    arr.push_back(ValueJson(item));
                  } else {
                    arr.push_back(static_cast<V>(item));
                  }
                }
                return arr;
              },
              x.items);
        } else {
          return x;
        }
      },
      v.value);
}

struct Window {
  int64_t first = -1;
  int64_t last = -1;
};

std::optional<Window> FindWindow(const GgufFile& file) {
  const GgufValue* first = file.Find("kvasir.window.first");
  const GgufValue* last = file.Find("kvasir.window.last");
  if (first == nullptr && last == nullptr) return std::nullopt;
  Window w;
  if (first != nullptr) w.first = first->AsInt().value_or(-1);
  if (last != nullptr) w.last = last->AsInt().value_or(-1);
  return w;
}

std::string StringKey(const GgufFile& file, std::string_view key) {
  const GgufValue* v = file.Find(key);
  const std::string* s = v != nullptr ? v->AsString() : nullptr;
  return s != nullptr ? *s : "";
}

void PrintText(const GgufFile& file, const std::vector<TensorGroup>& groups) {
  std::string out;
  out += fmt::format("file:          {} ({})\n", file.path(), HumanBytes(file.file_size()));
  out += fmt::format("GGUF version:  {}\n", file.version());
  out += fmt::format("architecture:  {}\n", StringKey(file, "general.architecture"));
  out += fmt::format("name:          {}\n", OneLine(StringKey(file, "general.name"), 100));
  if (auto w = FindWindow(file)) {
    out += fmt::format("window:        layers [{}, {})\n", w->first, w->last);
  }

  out += fmt::format("\nmetadata ({} keys)\n", file.kvs().size());
  Table kv_table({"key", "type", "value"});
  for (const auto& kv : file.kvs()) {
    kv_table.AddRow({kv.key, TypeLabel(kv.value), ValueText(kv.value)});
  }
  out += kv_table.Render();

  out += fmt::format("\ntensors ({})\n", file.tensors().size());
  using A = Table::Align;
  Table t_table({"group", "tensors", "params", "bytes", "types"},
                {A::kLeft, A::kRight, A::kRight, A::kRight, A::kLeft});
  uint64_t total_bytes = 0, total_elements = 0;
  std::set<std::string> all_types;
  bool separated = false;
  for (const auto& g : groups) {
    if (g.layer < 0 && !separated && &g != &groups.front()) {
      t_table.AddSeparator();
      separated = true;
    }
    t_table.AddRow({g.name, std::to_string(g.n_tensors), HumanCount(g.n_elements),
                    HumanBytes(g.n_bytes), JoinTypes(g.types)});
    total_bytes += g.n_bytes;
    total_elements += g.n_elements;
    all_types.insert(g.types.begin(), g.types.end());
  }
  t_table.AddSeparator();
  t_table.AddRow({"total", std::to_string(file.tensors().size()), HumanCount(total_elements),
                  HumanBytes(total_bytes), JoinTypes(all_types)});
  out += t_table.Render();
  int n_layers = static_cast<int>(
      std::count_if(groups.begin(), groups.end(), [](const auto& g) { return g.layer >= 0; }));
  out += fmt::format("{} layers\n", n_layers);

  out += "\nbytes per type\n";
  Table type_table({"type", "bytes", "share"}, {A::kLeft, A::kRight, A::kRight});
  for (const auto& [type, bytes] : BytesPerType(file)) {
    double share = total_bytes > 0 ? 100.0 * static_cast<double>(bytes) / total_bytes : 0.0;
    type_table.AddRow({type, HumanBytes(bytes), fmt::format("{:.1f}%", share)});
  }
  out += type_table.Render();
  std::fwrite(out.data(), 1, out.size(), stdout);
}

nlohmann::json ToJson(const GgufFile& file, const std::vector<TensorGroup>& groups) {
  nlohmann::json j;
  j["file"] = file.path();
  j["file_bytes"] = file.file_size();
  j["version"] = file.version();
  j["architecture"] = StringKey(file, "general.architecture");
  j["name"] = StringKey(file, "general.name");
  if (auto w = FindWindow(file)) j["window"] = {{"first", w->first}, {"last", w->last}};

  nlohmann::json meta = nlohmann::json::array();
  for (const auto& kv : file.kvs()) {
    meta.push_back(
        {{"key", kv.key}, {"type", TypeLabel(kv.value)}, {"value", ValueJson(kv.value)}});
  }
  j["metadata"] = std::move(meta);

  nlohmann::json layers = nlohmann::json::array(), others = nlohmann::json::array();
  for (const auto& g : groups) {
    nlohmann::json row = {{"name", g.name},
                          {"tensors", g.n_tensors},
                          {"bytes", g.n_bytes},
                          {"params", g.n_elements},
                          {"types", g.types}};
    if (g.layer >= 0) {
      row["layer"] = g.layer;
      layers.push_back(std::move(row));
    } else {
      others.push_back(std::move(row));
    }
  }
  j["n_layers"] = layers.size();
  j["layers"] = std::move(layers);
  j["other_tensors"] = std::move(others);

  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : file.tensors()) {
    std::vector<uint64_t> shape(t.ne.begin(), t.ne.begin() + std::clamp<uint32_t>(t.n_dims, 1, 4));
    tensors.push_back({{"name", t.name},
                       {"type", TensorTypeName(t.type)},
                       {"shape", shape},
                       {"offset", t.offset},
                       {"bytes", t.n_bytes}});
  }
  j["tensors"] = std::move(tensors);
  j["total"] = {{"tensors", file.tensors().size()},
                {"bytes", TensorBytes(file)},
                {"params", TensorElements(file)}};
  nlohmann::json types = nlohmann::json::object();
  for (const auto& [type, bytes] : BytesPerType(file)) types[type] = bytes;
  j["bytes_per_type"] = std::move(types);
  return j;
}

}  // namespace

int InspectMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{"Show a GGUF file's metadata, tensors per layer and bytes per type.",
                 "kvasir inspect"};
    std::string path;
    bool json = false;
    app.add_option("model", path, "GGUF file")->required();
    app.add_flag("--json", json, "print one JSON object instead of tables");
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;

    auto file = OpenGguf(path);
    if (!file.ok()) return Fail(kCmd, file.status());
    std::vector<TensorGroup> groups = GroupTensors(**file);
    if (json) {
      // Strings from the file may be invalid UTF-8: replace those bytes rather than throw.
      std::string text =
          ToJson(**file, groups).dump(2, ' ', false, nlohmann::json::error_handler_t::replace) +
          "\n";
      std::fwrite(text.data(), 1, text.size(), stdout);
    } else {
      PrintText(**file, groups);
    }
    return kExitOk;
  });
}

}  // namespace kvasir::cli
