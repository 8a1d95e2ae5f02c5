// kvasir plan -m MODEL --devices devices.json [--ctx 4096] [-o manifest.json] [--no-hash]:
// chooses devices, ring order and layer windows for a model (src/planner) and writes the rank
// manifest, with the SHA-256 of every tensor unless --no-hash. The plan table goes to stdout when
// the manifest goes to a file, to stderr when the manifest goes to stdout; hashing progress goes to
// stderr.
#include <fmt/format.h>

#include <algorithm>

#include <cstdio>
#include <string>

#include "base/log.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "model/model_id.h"
#include "planner/device_profile.h"
#include "planner/manifest.h"
#include "planner/model_cost.h"
#include "planner/solver.h"
#include "planner/tensor_hash.h"
#include "net/url.h"
#include "shard/fetch.h"

namespace kvasir::cli {
namespace {

constexpr const char *kCmd = "plan";

std::string RenderPlan(const Plan &plan, const std::string &model) {
  Table table(
      {"rank", "device", "backend", "layers", "weights", "KV", "memory / budget", "ms/token"},
      {Table::Align::kRight, Table::Align::kLeft, Table::Align::kLeft, Table::Align::kLeft,
       Table::Align::kRight, Table::Align::kRight, Table::Align::kRight, Table::Align::kRight});
  for (size_t i = 0; i < plan.ranks.size(); ++i) {
    const PlannedRank &r = plan.ranks[i];
    std::string layers = fmt::format("[{}, {}){}{}", r.first, r.last, r.has_embed ? " +embd" : "",
                                     r.has_head ? " +head" : "");
    table.AddRow({std::to_string(i), r.device, r.backend, layers, PlannerBytes(r.weight_bytes),
                  PlannerBytes(r.kv_bytes),
                  PlannerBytes(r.memory_bytes) + " / " + PlannerBytes(r.budget_bytes),
                  fmt::format("{:.3f}", r.ms_per_token())});
  }
  std::string out =
      fmt::format("plan for {} ({} layers, ctx {}):\n", model, plan.n_layer, plan.ctx);
  out += table.Render();
  out +=
      fmt::format("estimated per-token time: {} ({:.1f} tokens/s)\n", PlannerMs(plan.ms_per_token),
                  plan.ms_per_token > 0 ? 1000.0 / plan.ms_per_token : 0.0);
  for (const auto &l : plan.left_out) out += fmt::format("{}: left out: {}\n", l.device, l.reason);
  return out;
}

// Progress of HashTensors on stderr: quiet for the first second (small models hash in less), then
// a line every 10% or every 3 seconds, whichever comes first, and a closing line.
class HashProgress {
 public:
  void Update(uint64_t done, uint64_t total) {
    const double now = clock_.Seconds();
    if (now < 1.0 && !printed_) return;
    const bool last = done == total;
    if (!last && done < next_bytes_ && now < next_seconds_) return;
    if (last && !printed_) return;
    if (last) {
      std::fprintf(stderr, "plan: hashed %s in %.1f s (%.0f MiB/s)\n", HumanBytes(total).c_str(),
                   now, now > 0 ? double(total) / (1 << 20) / now : 0.0);
      return;
    }
    std::fprintf(stderr, "plan: hashing tensors %s / %s\n", HumanBytes(done).c_str(),
                 HumanBytes(total).c_str());
    printed_ = true;
    next_bytes_ = done + total / 10;
    next_seconds_ = now + 3.0;
  }

 private:
  Stopwatch clock_;
  bool printed_ = false;
  uint64_t next_bytes_ = 0;
  double next_seconds_ = 0;
};

}  // namespace

int PlanMain(int argc, char **argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{
        "Choose devices, ring order and layer windows for a model; "
        "write the manifest.",
        "kvasir plan"};
    std::string model_path, devices_path, out_path, url, ca_file;
    int ctx = 4096;
    bool no_hash = false;
    app.add_option("-m,--model", model_path,
                   "GGUF file, or its http(s):// URL (only the header is read; no hashes)")
        ->required();
    app.add_option("--url", url,
                   "URL the stages fetch the model from, recorded in the manifest (with a local "
                   "-m: hashes come from the file)");
    app.add_option("--ca", ca_file, "PEM file of CA certificates to trust for https://")
        ->check(CLI::ExistingFile);
    app.add_option("--devices", devices_path, "devices.json (see docs/MANIFEST.md)")->required();
    app.add_option("--ctx", ctx, "context each stage reserves KV cache for")->capture_default_str();
    app.add_option("-o,--output", out_path, "manifest file (default: stdout)");
    std::string keys_path;
    app.add_option("--keys", keys_path,
                   "JSON object of device name -> node key (`kvasir id` on each device): each "
                   "rank's neighbours then accept only that node")
        ->check(CLI::ExistingFile);
    app.add_flag("--no-hash", no_hash,
                 "leave out the tensors' sha256 (hashing reads every byte of the model)");
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (ctx <= 0) return UsageError(kCmd, fmt::format("--ctx must be > 0 (got {})", ctx));
    if (!out_path.empty()) {
      if (Status s = CheckWritable(out_path); !s.ok()) return Fail(kCmd, s);
    }

    if (!url.empty()) {
      if (auto u = net::ParseUrl(url); !u.ok()) return UsageError(kCmd, u.status().message());
    }
    const bool remote = net::LooksLikeUrl(model_path);
    if (remote) {
      if (auto u = net::ParseUrl(model_path); !u.ok()) {
        return UsageError(kCmd, u.status().message());
      }
      if (!url.empty() && url != model_path) {
        return UsageError(kCmd, "-m is a URL already; --url is for a local -m");
      }
      url = model_path;
    }

    auto devices = LoadDevices(devices_path);
    if (!devices.ok()) return Fail(kCmd, devices.status());
    Result<std::shared_ptr<const GgufFile>> file = Status::Error("unset");
    if (remote) {
      // Only the header and tensor index cross the network.
      net::HttpOptions http;
      http.ca_file = ca_file;
      auto rh = ReadRemoteHeader(model_path, http);
      if (!rh.ok()) return Fail(kCmd, rh.status());
      auto header = ParseGgufHeader(rh->bytes, rh->file_size, rh->url);
      if (!header.ok()) return Fail(kCmd, header.status());
      file = std::make_shared<const GgufFile>(
          GgufFile::HeaderOnly(std::move(header).value(), model_path, rh->file_size));
      KV_LOG_INFO("plan: read the header of {} ({} of {})", model_path, HumanBytes(rh->bytes_read),
                  HumanBytes(rh->file_size));
      if (!no_hash) {
        KV_LOG_INFO("plan: tensor hashes left out: the model is only known by URL (plan from a "
                    "local copy with -m FILE --url URL to include them)");
        no_hash = true;
      }
    } else {
      file = OpenGguf(model_path);
    }
    if (!file.ok()) return Fail(kCmd, file.status());
    auto cost = ComputeModelCost(**file);
    if (!cost.ok()) return Fail(kCmd, WithPath(cost.status(), model_path));
    auto id = ComputeModelId((*file)->header(), model_path);
    if (!id.ok()) return Fail(kCmd, id.status());

    PlanOptions options;
    options.ctx = ctx;
    auto plan = SolvePlan(*cost, *devices, options);
    if (!plan.ok()) return Fail(kCmd, WithPath(plan.status(), devices_path));

    Manifest manifest = BuildManifest(*cost, *plan, ModelIdHex(*id), url.empty() ? model_path : url);
    if (Status s = ValidateManifest(manifest); !s.ok()) {
      return Fail(kCmd, "internal: the plan's manifest is invalid: " + s.message());
    }
    if (!keys_path.empty()) {
      auto keys = ReadJsonFile(keys_path);
      if (!keys.ok()) return Fail(kCmd, keys.status());
      if (keys->is_object()) {
        for (const auto& item : keys->items()) {
          const std::string& device = item.key();
          const bool known = std::any_of(devices->begin(), devices->end(),
                                         [&](const auto& d) { return d.name == device; });
          if (!known) {
            return Fail(kCmd, fmt::format("{}: device '{}' is not in {}", keys_path, device,
                                          devices_path));
          }
        }
      }
      if (Status s = SetManifestKeys(&manifest, *keys, keys_path); !s.ok()) return Fail(kCmd, s);
    }
    if (!no_hash) {
      // A tensor held by two ranks (a tied embedding) is hashed once.
      HashProgress progress;
      auto hashes =
          HashTensors(**file, ManifestTensorNames(manifest),
                      [&](uint64_t done, uint64_t total) { progress.Update(done, total); });
      if (!hashes.ok()) return Fail(kCmd, hashes.status());
      if (Status s = SetManifestHashes(&manifest, *hashes); !s.ok()) {
        return Fail(kCmd, "internal: " + s.message());
      }
    }
    std::string table = RenderPlan(*plan, model_path);
    if (out_path.empty()) {
      std::fputs(table.c_str(), stderr);
      std::printf("%s\n", ManifestToJson(manifest).dump(2).c_str());
      return kExitOk;
    }
    if (Status s = WriteJsonFile(out_path, ManifestToJson(manifest)); !s.ok()) return Fail(kCmd, s);
    std::fputs(table.c_str(), stdout);
    std::printf("manifest written to %s\n", out_path.c_str());
    return kExitOk;
  });
}

}  // namespace kvasir::cli
