// libFuzzer target: arbitrary text as a rank manifest, a devices.json and a keys.json (the files
// a person hands `kvasir plan`, `stage --manifest` and `fetch`). Nothing may crash; a manifest that
// parses is valid, and prints as JSON that parses back to the same manifest; parsed devices have
// unique names and sane numbers.
// Input layout: byte 0 selects the file (0 manifest, 1 devices, 2 keys for a fixed manifest).
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <set>
#include <string_view>

#include "planner/device_profile.h"
#include "planner/manifest.h"

namespace {

using namespace kvasir;

// Two ranks of a 4-layer model: the manifest keys.json is applied to.
const Manifest& TwoRanks() {
  static const Manifest m = [] {
    auto r = ParseManifest(R"({"version": 1, "model_id": "00112233445566778899aabbccddeeff",
      "model": "m.gguf", "n_layer": 4, "ctx": 256, "ring": ["a", "b"], "ms_per_token": 2,
      "ranks": [
        {"rank": 0, "device": "a", "layers": [0, 2], "has_embed": true, "has_head": false,
         "weight_bytes": 10, "kv_bytes": 1, "ms_per_token": 1, "tensors": []},
        {"rank": 1, "device": "b", "layers": [2, 4], "has_embed": false, "has_head": true,
         "weight_bytes": 10, "kv_bytes": 1, "ms_per_token": 1, "tensors": []}]})",
                           "seed");
    if (!r.ok()) std::abort();
    return *r;
  }();
  return m;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int which = data[0] % 3;
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (which == 0) {
    auto m = ParseManifest(text, "fuzz.json");
    if (!m.ok()) return 0;
    if (!ValidateManifest(*m).ok()) std::abort();
    const nlohmann::json j = ManifestToJson(*m);
    auto again = ManifestFromJson(j, "again");
    if (!again.ok() || ManifestToJson(*again) != j) std::abort();
  } else if (which == 1) {
    auto d = ParseDevices(text, "devices.json");
    if (!d.ok()) return 0;
    std::set<std::string> names;
    for (const DeviceProfile& p : *d) {
      if (!names.insert(p.name).second) std::abort();
      if (!(p.ms_per_gib > 0) || !std::isfinite(p.ms_per_gib) || p.rtt_ms < 0 ||
          p.bandwidth_mbps < 0) {
        std::abort();
      }
    }
  } else {
    const auto keys = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (keys.is_discarded()) return 0;
    Manifest m = TwoRanks();
    if (SetManifestKeys(&m, keys, "keys.json").ok() && !ValidateManifest(m).ok()) std::abort();
  }
  return 0;
}
