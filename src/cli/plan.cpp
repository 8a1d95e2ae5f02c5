// kvasir plan -m MODEL --devices devices.json [--ctx 4096] [-o manifest.json]: chooses devices,
// ring order and layer windows for a model (src/planner) and writes the rank manifest. The plan
// table goes to stdout when the manifest goes to a file, to stderr when the manifest goes to
// stdout.
#include <fmt/format.h>

#include <cstdio>
#include <string>

#include "cli/cli_util.h"
#include "cli/commands.h"
#include "model/model_id.h"
#include "planner/device_profile.h"
#include "planner/manifest.h"
#include "planner/model_cost.h"
#include "planner/solver.h"

namespace kvasir::cli {
namespace {

constexpr const char *kCmd = "plan";

std::string RenderPlan(const Plan &plan, const std::string &model) {
  Table table({"rank", "device", "layers", "weights", "KV", "memory / budget", "ms/token"},
              {Table::Align::kRight, Table::Align::kLeft, Table::Align::kLeft, Table::Align::kRight,
               Table::Align::kRight, Table::Align::kRight, Table::Align::kRight});
  for (size_t i = 0; i < plan.ranks.size(); ++i) {
    const PlannedRank &r = plan.ranks[i];
    std::string layers = fmt::format("[{}, {}){}{}", r.first, r.last, r.has_embed ? " +embd" : "",
                                     r.has_head ? " +head" : "");
    table.AddRow({std::to_string(i), r.device, layers, PlannerBytes(r.weight_bytes),
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

}  // namespace

int PlanMain(int argc, char **argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{
        "Choose devices, ring order and layer windows for a model; "
        "write the manifest.",
        "kvasir plan"};
    std::string model_path, devices_path, out_path;
    int ctx = 4096;
    app.add_option("-m,--model", model_path, "GGUF file")->required();
    app.add_option("--devices", devices_path, "devices.json (see docs/MANIFEST.md)")->required();
    app.add_option("--ctx", ctx, "context each stage reserves KV cache for")->capture_default_str();
    app.add_option("-o,--output", out_path, "manifest file (default: stdout)");
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (ctx <= 0) return UsageError(kCmd, fmt::format("--ctx must be > 0 (got {})", ctx));
    if (!out_path.empty()) {
      if (Status s = CheckWritable(out_path); !s.ok()) return Fail(kCmd, s);
    }

    auto devices = LoadDevices(devices_path);
    if (!devices.ok()) return Fail(kCmd, devices.status());
    auto file = OpenGguf(model_path);
    if (!file.ok()) return Fail(kCmd, file.status());
    auto cost = ComputeModelCost(**file);
    if (!cost.ok()) return Fail(kCmd, WithPath(cost.status(), model_path));
    auto id = ComputeModelId((*file)->header(), model_path);
    if (!id.ok()) return Fail(kCmd, id.status());

    PlanOptions options;
    options.ctx = ctx;
    auto plan = SolvePlan(*cost, *devices, options);
    if (!plan.ok()) return Fail(kCmd, WithPath(plan.status(), devices_path));

    Manifest manifest = BuildManifest(*cost, *plan, ModelIdHex(*id), model_path);
    if (Status s = ValidateManifest(manifest); !s.ok()) {
      return Fail(kCmd, "internal: the plan's manifest is invalid: " + s.message());
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
