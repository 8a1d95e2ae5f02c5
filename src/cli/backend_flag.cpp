#include "cli/backend_flag.h"

#include <fmt/format.h>

#include <map>

#include "cli/cli_util.h"
#include "kernels/attention_bf16.h"

namespace kvasir::cli {

CLI::Option* AddBackendFlag(CLI::App& app, std::string* spec) {
  return app
      .add_option(
          "--backend", *spec,
          "where the layers run: " + BackendSyntax() + " (`kvasir devices` lists this machine's)")
      ->capture_default_str();
}

CLI::Option* AddAttnTypeFlag(CLI::App& app, AttnType* type) {
  static const std::map<std::string, AttnType> kNames = {{"f32", AttnType::kF32},
                                                         {"bf16", AttnType::kBf16}};
  return app
      .add_option("--attn-type", *type,
                  "attention's operands on the cpu backend: f32, or bf16 (keys, values, queries "
                  "and weights rounded to bf16, f32 sums: faster over long contexts, results "
                  "within bf16's precision; needs AVX512-BF16)")
      ->transform(CLI::CheckedTransformer(kNames, CLI::ignore_case))
      // Runs before the transformer above (CLI11 puts later transforms first), whose own message
      // and help would print the enum's map ("{bf16->,f32-> }"), which says nothing.
      ->transform(CLI::Validator(
          [](std::string& text) {
            const std::string lower = CLI::detail::to_lower(text);
            return kNames.count(lower) ? std::string()
                                       : fmt::format("'{}' is not f32 or bf16", text);
          },
          ""))
      ->default_str("f32")
      ->option_text("f32|bf16 (default f32)");
}

std::optional<int> CheckAttnTypeFlag(std::string_view cmd, AttnType type,
                                     const std::vector<std::string>& backends) {
  if (type == AttnType::kF32) return std::nullopt;
  for (const std::string& b : backends) {
    auto parsed = ParseBackendSpec(b);
    if (parsed.ok() && parsed->name != "cpu") {
      return UsageError(cmd, fmt::format("--attn-type bf16 is an option of the cpu backend, not {}",
                                         parsed->ToString()));
    }
  }
  if (!HaveBf16Attention()) {
    return Fail(cmd, fmt::format("--attn-type bf16 needs AVX512-BF16, which this CPU ({}) lacks",
                                 DeviceLabel("cpu")));
  }
  return std::nullopt;
}

std::optional<int> CheckBackendFlag(std::string_view cmd, std::string_view flag,
                                    const std::string& spec) {
  auto parsed = ParseBackendSpec(spec);
  if (!parsed.ok()) return UsageError(cmd, fmt::format("{}: {}", flag, parsed.status().message()));
  if (Status s = CheckBackendBuilt(*parsed); !s.ok()) {
    return Fail(cmd, fmt::format("{}: {}", flag, s.message()));
  }
  return std::nullopt;
}

Result<DeviceInfo> FindDevice(const std::string& spec) {
  KV_ASSIGN_OR_RETURN(BackendSpec parsed, ParseBackendSpec(spec));
  const std::string address = parsed.ToString();
  for (const BackendDevices& b : ListAllDevices()) {
    if (b.backend != parsed.name) continue;
    if (!b.status.ok()) return b.status.WithContext(fmt::format("backend {}", address));
    for (const DeviceInfo& d : b.devices) {
      if (d.address == address) return d;
    }
    return Error("backend {}: no such device here ({} has {})", address, b.backend,
                 b.devices.size());
  }
  return Error("backend {}: unknown", address);
}

std::string DeviceLabel(const std::string& spec) {
  auto d = FindDevice(spec);
  return d.ok() ? fmt::format("{} ({})", d->address, d->name) : spec;
}

}  // namespace kvasir::cli
