// Planner: the solver against a brute force over every subset, order and split; memory budgets;
// left-out and refused inputs; the manifest's JSON round trip and validation; ModelCost of a real
// file.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "base/check.h"
#include "gguf/gguf_file.h"
#include "planner/device_profile.h"
#include "planner/manifest.h"
#include "planner/model_cost.h"
#include "planner/solver.h"
#include "test_assets.h"

namespace kvasir {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr double kInf = std::numeric_limits<double>::infinity();

// A synthetic model: `n_layer` layers of `layer_mib` MiB (or the given sizes), a 20 MiB embedding
// and a 22 MiB head, 64 KiB of KV per token and layer, TinyLlama's boundary.
ModelCost SyntheticCost(std::vector<uint64_t> layer_bytes) {
  ModelCost c;
  c.n_layer = int(layer_bytes.size());
  c.layer_bytes = std::move(layer_bytes);
  for (int l = 0; l < c.n_layer; ++l) {
    c.layer_tensors.push_back({"blk." + std::to_string(l) + ".attn_q.weight",
                               "blk." + std::to_string(l) + ".ffn_down.weight"});
  }
  c.embed_bytes = 20 * kMiB;
  c.embed_tensors = {"token_embd.weight"};
  c.head_bytes = 22 * kMiB;
  c.head_tensors = {"output_norm.weight", "output.weight"};
  c.kv_bytes_per_token_layer = 2 * 4 * 64 * 4;
  c.boundary_bytes_per_token = 2048 * 4 + 48;
  return c;
}

DeviceProfile Dev(std::string name, uint64_t mem_mib, double ms_per_gib, double rtt = 0,
                  double mbps = 0) {
  DeviceProfile d;
  d.name = std::move(name);
  d.memory_bytes = mem_mib * kMiB;
  d.ms_per_gib = ms_per_gib;
  d.rtt_ms = rtt;
  d.bandwidth_mbps = mbps;
  return d;
}

// Brute force: every subset, every order, every composition of the layers into non-empty windows.
// It prices a window itself, from the cost model as docs/MANIFEST.md states it, not with the
// library's cost functions, so a mistake there cannot hide in both:
//   memory  = its layers + shared tensors + embedding (first window) + head (last window, less the
//             embedding when tied and held by the same window) + KV (layers x ctx x per-token-layer)
//             + overhead
//   compute = bytes read per token (its layers, plus the head on the last window) / GiB x ms_per_gib
//   hop     = rtt + boundary bytes x 8 / (megabits per second x 1000), only with two ranks or more
double BruteForce(const ModelCost &c, const std::vector<DeviceProfile> &devs,
                  const PlanOptions &o) {
  int n = int(devs.size()), L = c.n_layer;
  double best = kInf;
  for (uint32_t mask = 1; mask < (1u << n); ++mask) {
    std::vector<int> order;
    for (int d = 0; d < n; ++d) {
      if (mask & (1u << d)) order.push_back(d);
    }
    int k = int(order.size());
    if (k > L) continue;
    do {
      // Choose k-1 cut points among 1..L-1 via a bitmask over the L-1 gaps.
      for (uint32_t cuts = 0; cuts < (1u << (L - 1)); ++cuts) {
        if (std::popcount(cuts) != k - 1) continue;
        std::vector<int> bounds = {0};
        for (int g = 0; g < L - 1; ++g) {
          if (cuts & (1u << g)) bounds.push_back(g + 1);
        }
        bounds.push_back(L);
        double total = 0;
        bool fits = true;
        for (int r = 0; r < k && fits; ++r) {
          const DeviceProfile &d = devs[order[r]];
          int a = bounds[r], b = bounds[r + 1];
          uint64_t layers = 0;
          for (int l = a; l < b; ++l) layers += c.layer_bytes[size_t(l)];
          const bool first = a == 0, last = b == L;
          uint64_t mem = layers + c.shared_bytes + (first ? c.embed_bytes : 0) +
                         (last ? c.head_bytes - (c.tied_output && first ? c.embed_bytes : 0) : 0) +
                         uint64_t(b - a) * uint64_t(o.ctx) * c.kv_bytes_per_token_layer +
                         o.overhead_bytes;
          fits = mem <= d.memory_bytes;
          const double read = double(layers + (last ? c.head_bytes : 0));
          total += read / double(uint64_t{1} << 30) * d.ms_per_gib;
          if (k >= 2) {
            total += d.rtt_ms + (d.bandwidth_mbps > 0 ? double(c.boundary_bytes_per_token) * 8.0 /
                                                            (d.bandwidth_mbps * 1000.0)
                                                      : 0.0);
          }
        }
        if (fits) best = std::min(best, total);
      }
    } while (std::next_permutation(order.begin(), order.end()));
  }
  return best;
}

void ExpectPlanConsistent(const ModelCost &c, const std::vector<DeviceProfile> &devs,
                          const PlanOptions &o, const Plan &plan) {
  ASSERT_FALSE(plan.ranks.empty());
  int next = 0;
  double sum = 0;
  for (const auto &r : plan.ranks) {
    EXPECT_EQ(r.first, next);
    EXPECT_LT(r.first, r.last);
    EXPECT_EQ(r.has_embed, r.first == 0);
    EXPECT_EQ(r.has_head, r.last == c.n_layer);
    auto it = std::find_if(devs.begin(), devs.end(), [&](auto &d) { return d.name == r.device; });
    ASSERT_NE(it, devs.end());
    EXPECT_LE(r.memory_bytes, it->memory_bytes) << r.device;
    EXPECT_EQ(r.memory_bytes, c.WindowWeightBytes(r.first, r.last) +
                                  c.WindowKvBytes(r.first, r.last, o.ctx) + o.overhead_bytes);
    sum += r.ms_per_token();
    next = r.last;
  }
  EXPECT_EQ(next, c.n_layer);
  EXPECT_NEAR(sum, plan.ms_per_token, 1e-9);
  EXPECT_EQ(plan.ranks.size() + plan.left_out.size(), devs.size());
}

TEST(Solver, MatchesBruteForceOnRandomClusters) {
  std::mt19937 rng(1234);
  int feasible = 0;
  for (int trial = 0; trial < 60; ++trial) {
    int L = 6 + int(rng() % 5);  // 6..10 layers
    int n = 2 + int(rng() % 3);  // 2..4 devices
    std::vector<uint64_t> layers;
    for (int l = 0; l < L; ++l) layers.push_back((10 + rng() % 40) * kMiB);
    ModelCost c = SyntheticCost(layers);
    c.tied_output = trial % 3 == 0;
    if (c.tied_output) c.head_bytes = c.embed_bytes + 1 * kMiB;
    std::vector<DeviceProfile> devs;
    for (int d = 0; d < n; ++d) {
      devs.push_back(Dev("dev-" + std::to_string(d), 100 + rng() % 400, 20.0 + rng() % 400,
                         0.1 * (rng() % 50), rng() % 2 ? 0.0 : 10.0 + rng() % 1000));
    }
    PlanOptions o;
    o.ctx = 256 << (rng() % 4);
    o.overhead_bytes = 16 * kMiB;
    double brute = BruteForce(c, devs, o);
    auto plan = SolvePlan(c, devs, o);
    if (brute == kInf) {
      EXPECT_FALSE(plan.ok()) << "trial " << trial;
      continue;
    }
    ++feasible;
    ASSERT_TRUE(plan.ok()) << "trial " << trial << ": " << plan.status().message();
    EXPECT_NEAR(plan->ms_per_token, brute, 1e-9) << "trial " << trial;
    ExpectPlanConsistent(c, devs, o, *plan);
  }
  EXPECT_GT(feasible,
            20);  // the random clusters exercise the optimum, not only refusals
}

TEST(Solver, GreedyFallbackBeyondExactLimit) {
  ModelCost c = SyntheticCost(std::vector<uint64_t>(8, 30 * kMiB));
  std::vector<DeviceProfile> devs;
  for (int d = 0; d < 5; ++d) devs.push_back(Dev("d" + std::to_string(d), 200, 100.0 + 50 * d, 1));
  PlanOptions o;
  o.ctx = 512;
  o.exact_max_devices = 3;
  auto plan = SolvePlan(c, devs, o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ExpectPlanConsistent(c, devs, o, *plan);
  EXPECT_LE(plan->ranks.size(), 3u);
  int not_searched = 0;
  for (const auto &l : plan->left_out) not_searched += l.reason.find("not searched") == 0;
  EXPECT_EQ(not_searched, 2);
}

TEST(Solver, RespectsMemoryBudgets) {
  // One fast device too small for the whole model: the plan must split, and each window fits.
  ModelCost c = SyntheticCost(std::vector<uint64_t>(8, 50 * kMiB));
  std::vector<DeviceProfile> devs = {Dev("fast", 300, 10), Dev("slow", 1000, 200, 1, 1000)};
  PlanOptions o;
  o.ctx = 1024;
  auto plan = SolvePlan(c, devs, o);
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->ranks.size(), 2u);
  ExpectPlanConsistent(c, devs, o, *plan);
  // The fast device takes as many layers as fit in its 300 MiB: one more would not fit (or would
  // leave the slow device without a layer).
  for (const auto &r : plan->ranks) {
    if (r.device != "fast") continue;
    if (r.first == 0) {
      EXPECT_FALSE(r.last + 1 < 8 && WindowFits(c, devs[0], 0, r.last + 1, o));
    } else {
      EXPECT_FALSE(r.first - 1 > 0 && WindowFits(c, devs[0], r.first - 1, 8, o));
    }
  }
}

TEST(Solver, LeavesOutASlowDeviceAndSaysWhy) {
  ModelCost c = SyntheticCost(std::vector<uint64_t>(8, 40 * kMiB));
  std::vector<DeviceProfile> devs = {Dev("gpu", 4096, 5, 1, 1000),
                                     Dev("phone-2", 4096, 400, 20, 50)};
  auto plan = SolvePlan(c, devs, {});
  ASSERT_TRUE(plan.ok()) << plan.status().message();
  ASSERT_EQ(plan->ranks.size(), 1u);
  EXPECT_EQ(plan->ranks[0].device, "gpu");
  EXPECT_EQ(plan->ranks[0].hop_ms,
            0.0);  // a single stage sends nothing over the network
  ASSERT_EQ(plan->left_out.size(), 1u);
  EXPECT_EQ(plan->left_out[0].device, "phone-2");
  EXPECT_NE(
      plan->left_out[0].reason.find(fmt::format(
          "adding it would raise the per-token time from {} to", PlannerMs(plan->ms_per_token))),
      std::string::npos)
      << plan->left_out[0].reason;
}

TEST(Solver, RefusesImpossibleInputNamingTheNumbers) {
  ModelCost c = SyntheticCost(std::vector<uint64_t>(8, 100 * kMiB));  // 842 MiB of weights
  PlanOptions o;
  o.ctx = 4096;  // 8 * 4096 * 2 KiB = 64 MiB of KV
  auto plan = SolvePlan(c, {Dev("a", 300, 10), Dev("b", 300, 10)}, o);
  ASSERT_FALSE(plan.ok());
  EXPECT_EQ(plan.status().message().rfind("devices hold 600.0 MiB, the model needs 970.0 MiB at "
                                          "ctx 4096",
                                          0),
            0u)
      << plan.status().message();

  // Enough memory in total, but one layer fits no device.
  std::vector<uint64_t> layers(8, 10 * kMiB);
  layers[5] = 500 * kMiB;
  auto big_layer = SolvePlan(SyntheticCost(layers), {Dev("a", 400, 10), Dev("b", 400, 10)}, o);
  ASSERT_FALSE(big_layer.ok());
  EXPECT_NE(big_layer.status().message().find("layer 5 alone needs 572.0 MiB at ctx 4096"),
            std::string::npos)
      << big_layer.status().message();
  EXPECT_NE(big_layer.status().message().find("(400.0 MiB, a)"), std::string::npos);

  EXPECT_FALSE(SolvePlan(c, {}, o).ok());
  o.ctx = 0;
  EXPECT_NE(SolvePlan(c, {Dev("a", 9000, 10)}, o).status().message().find("ctx must be > 0"),
            std::string::npos);
}

TEST(Devices, ParsesAndNamesBrokenFields) {
  auto ok = ParseDevices(R"({"devices": [
      {"name": "gpu-box", "backend": "cuda:1", "kind": "gpu", "memory_gib": 24, "ms_per_gib": 1.5,
       "link": {"rtt_ms": 0.4, "bandwidth_mbps": 1000}},
      {"name": "phone-1", "backend": "opencl", "kind": "phone", "memory_bytes": 3000000000,
       "ms_per_gib": 90},
      {"name": "laptop", "memory_gib": 4, "ms_per_gib": 30}]})",
                         "devices.json");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  ASSERT_EQ(ok->size(), 3u);
  EXPECT_EQ((*ok)[0].backend, "cuda:1");
  EXPECT_EQ((*ok)[0].kind, "gpu");
  EXPECT_EQ((*ok)[1].backend, "opencl:0:0");  // the first device, spelled out
  EXPECT_EQ((*ok)[2].backend, "cpu");
  EXPECT_EQ((*ok)[0].memory_bytes, uint64_t{24} << 30);
  EXPECT_EQ((*ok)[0].bandwidth_mbps, 1000);
  EXPECT_EQ((*ok)[1].rtt_ms, 0);
  EXPECT_EQ((*ok)[1].memory_bytes, 3000000000u);

  auto msg = [](const char *text) { return ParseDevices(text, "devices.json").status().message(); };
  EXPECT_EQ(msg(R"({"devices": [{"name": "p", "memory_gib": 2, "ms_per_gib": -3}]})"),
            "devices.json: device 'p': ms_per_gib must be > 0 (got -3)");
  EXPECT_EQ(msg(R"({"devices": [{"name": "p", "memory_gib": 2}]})"),
            "devices.json: device 'p': missing ms_per_gib (measure it with a "
            "decode benchmark)");
  EXPECT_NE(msg(R"({"devices": [{"name": "p", "memory_gib": 2, "ms_per_gb": 3}]})")
                .find("device 'p': unknown field 'ms_per_gb'"),
            std::string::npos);
  EXPECT_NE(msg(R"({"devices": [{"name": "p", "backend": "tpu", "memory_gib": 2,
                  "ms_per_gib": 3}]})")
                .find("backend 'tpu' is not one of cpu, opencl[:PLATFORM:DEVICE], cuda[:N]"),
            std::string::npos);
  EXPECT_NE(msg(R"({"devices": [{"name": "p", "backend": "gpu", "memory_gib": 2,
                  "ms_per_gib": 3}]})")
                .find("the device's kind, gpu, npu or phone, goes in \"kind\""),
            std::string::npos);
  EXPECT_NE(msg(R"({"devices": [{"name": "p", "backend": "cuda:x", "memory_gib": 2,
                  "ms_per_gib": 3}]})")
                .find("device 'p': backend 'cuda:x' is not cuda[:N]"),
            std::string::npos);
  EXPECT_NE(msg(R"({"devices": [{"name": "p", "kind": "toaster", "memory_gib": 2,
                  "ms_per_gib": 3}]})")
                .find("kind 'toaster' is not one of cpu, gpu, npu, phone"),
            std::string::npos);
  EXPECT_NE(msg(R"({"devices": [{"name": "p", "memory_gib": 2, "ms_per_gib": 3},
                                {"name": "p", "memory_gib": 2, "ms_per_gib": 3}]})")
                .find("device 'p': name used twice"),
            std::string::npos);
  EXPECT_NE(msg(R"({"devices": [{"name": "p", "memory_gib": 2, "ms_per_gib": 3,
                  "link": {"bandwidth_mbps": 0}}]})")
                .find("link.bandwidth_mbps must be > 0"),
            std::string::npos);
  EXPECT_EQ(msg("{"), "devices.json: not valid JSON");
  EXPECT_NE(msg(R"({"devices": [{"memory_gib": 2}]})").find("device 0: missing name"),
            std::string::npos);
}

Manifest SampleManifest() {
  ModelCost c = SyntheticCost(std::vector<uint64_t>(8, 40 * kMiB));
  std::vector<DeviceProfile> devs = {Dev("a", 220, 50, 1, 100), Dev("b", 220, 60, 1, 100),
                                     Dev("c", 220, 70, 1, 100)};
  devs[1].backend = "opencl:0:1";
  auto plan = SolvePlan(c, devs, {.ctx = 512});
  KV_CHECK(plan.ok(), "{}", plan.status().message());
  return BuildManifest(c, *plan, std::string(32, 'a'), "/models/tl8.gguf");
}

TEST(Manifest, JsonRoundTrip) {
  Manifest m = SampleManifest();
  ASSERT_GE(m.ranks.size(), 2u);
  m.ranks[0].tensors[0].sha256 = std::string(64, '0');
  auto back = ParseManifest(ManifestToJson(m).dump(), "manifest.json");
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(ManifestToJson(*back), ManifestToJson(m));
  EXPECT_EQ(back->ring, m.ring);
  EXPECT_EQ(back->ranks[0].tensors[0].sha256, std::string(64, '0'));
  EXPECT_FALSE(back->ranks[0].tensors[1].sha256.has_value());
  // Each rank carries its device's backend.
  for (const ManifestRank &r : back->ranks) {
    EXPECT_EQ(r.backend, r.device == "b" ? "opencl:0:1" : "cpu") << r.device;
  }
  // Rank 0 carries the embedding, the last rank the head.
  auto has = [](const ManifestRank &r, const std::string &n) {
    return std::any_of(r.tensors.begin(), r.tensors.end(), [&](auto &t) { return t.name == n; });
  };
  EXPECT_TRUE(has(back->ranks.front(), "token_embd.weight"));
  EXPECT_TRUE(has(back->ranks.back(), "output.weight"));
  EXPECT_FALSE(has(back->ranks.front(), "output.weight"));
}

std::string ErrorOf(const Manifest &m) {
  return ParseManifest(ManifestToJson(m).dump(), "manifest.json").status().message();
}

TEST(Manifest, ValidationNamesTheBrokenConstraint) {
  Manifest base = SampleManifest();
  ASSERT_EQ(base.ranks.size(), 3u);
  EXPECT_EQ(ErrorOf(base), "");

  Manifest gap = base;
  gap.ranks[1].first += 1;
  EXPECT_NE(ErrorOf(gap).find("manifest.json: rank 1: layers ["), std::string::npos);
  EXPECT_NE(ErrorOf(gap).find("leave a gap"), std::string::npos) << ErrorOf(gap);

  Manifest overlap = base;
  overlap.ranks[1].first -= 1;
  EXPECT_NE(ErrorOf(overlap).find("overlap the previous rank's"), std::string::npos)
      << ErrorOf(overlap);

  Manifest past = base;
  past.ranks[2].last = 9;
  EXPECT_NE(ErrorOf(past).find("rank 2: layers ["), std::string::npos);
  EXPECT_NE(ErrorOf(past).find("go past n_layer 8"), std::string::npos) << ErrorOf(past);

  Manifest short_cover = base;
  short_cover.ranks[2].last = 7;
  short_cover.ranks[2].has_head = false;
  EXPECT_NE(ErrorOf(short_cover).find("layers [7, 8) belong to no rank"), std::string::npos)
      << ErrorOf(short_cover);

  Manifest order = base;
  std::swap(order.ranks[0].rank, order.ranks[1].rank);
  EXPECT_NE(ErrorOf(order).find("rank 0: numbered 1, expected 0"), std::string::npos);

  Manifest ring = base;
  ring.ring[2] = "z";
  EXPECT_NE(ErrorOf(ring).find("ring[2] is 'z'"), std::string::npos);

  Manifest sha = base;
  sha.ranks[1].tensors[0].sha256 = "xyz";
  EXPECT_NE(ErrorOf(sha).find("sha256 'xyz' is not 64 hex digits"), std::string::npos);

  Manifest id = base;
  id.model_id = "12";
  EXPECT_NE(ErrorOf(id).find("model_id '12' is not 32 hex digits"), std::string::npos);

  Manifest backend = base;
  backend.ranks[2].backend = "gpu";
  EXPECT_NE(ErrorOf(backend).find("rank 2: backend 'gpu' is not one of"), std::string::npos)
      << ErrorOf(backend);

  EXPECT_EQ(ParseManifest("[1]", "m.json").status().message(), "m.json: expected a JSON object");
  nlohmann::json j = ManifestToJson(base);
  j["ranks"][1].erase("layers");
  EXPECT_EQ(ManifestFromJson(j, "m.json").status().message(),
            "m.json: rank 1: field 'layers' must be [first, last]");
  // A manifest without backends (written before they existed) runs every rank on the CPU.
  j = ManifestToJson(base);
  for (auto &r : j["ranks"]) r.erase("backend");
  auto old = ManifestFromJson(j, "m.json");
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_EQ(old->ranks[1].backend, "cpu");
  j = ManifestToJson(base);
  j["ctx"] = "big";
  EXPECT_EQ(ManifestFromJson(j, "m.json").status().message(),
            "m.json: field 'ctx' has the wrong type (string)");
}

TEST(ModelCost, RealFileBytesAddUp) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  auto file = GgufFile::Open(testing::AssetPath("models/stories260K.gguf"));
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto cost = ComputeModelCost(*file);
  ASSERT_TRUE(cost.ok()) << cost.status().message();
  uint64_t total = 0;
  for (const auto &t : file->tensors()) total += t.n_bytes;
  uint64_t sum = cost->embed_bytes + cost->head_bytes + cost->shared_bytes -
                 (cost->tied_output ? cost->embed_bytes : 0);
  for (uint64_t b : cost->layer_bytes) sum += b;
  EXPECT_EQ(sum, total);
  EXPECT_EQ(cost->TotalWeightBytes(), total);
  EXPECT_EQ(cost->n_layer, int(cost->layer_bytes.size()));
  EXPECT_GT(cost->n_layer, 0);
  for (uint64_t b : cost->layer_bytes) EXPECT_GT(b, 0u);
  EXPECT_GT(cost->kv_bytes_per_token_layer, 0u);
  // Every tensor appears in exactly one window of a full split into single layers... and the full
  // window lists each tensor once.
  auto names = cost->WindowTensors(0, cost->n_layer);
  EXPECT_EQ(names.size(), file->tensors().size());
}

}  // namespace
}  // namespace kvasir

namespace kvasir {
namespace {

// The hybrid MoE fixture: a layer holds all 8 experts but a token reads 2 of them; DeltaNet layers
// keep a fixed state per sequence instead of KV per token.
TEST(ModelCostTest, HybridMoeCountsActiveExpertsAndRecurrentState) {
  KV_REQUIRE_ASSET("models/synth-qwen35moe-f32.gguf");
  auto file = GgufFile::Open(testing::AssetPath("models/synth-qwen35moe-f32.gguf"));
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto cost = ComputeModelCost(*file);
  ASSERT_TRUE(cost.ok()) << cost.status().message();
  ASSERT_EQ(cost->n_layer, 8);
  for (int l = 0; l < 8; ++l) {
    uint64_t experts = 0;
    for (const char *t : {"ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"}) {
      experts += file->FindTensor(fmt::format("blk.{}.{}.weight", l, t))->n_bytes;
    }
    EXPECT_EQ(cost->layer_read_bytes[l], cost->layer_bytes[l] - experts + experts * 2 / 8)
        << "layer " << l;
    const bool attention = l == 3 || l == 7;
    EXPECT_EQ(cost->layer_kv_bytes_per_token[l], attention ? 2u * 2 * 64 * 4 : 0u);
    EXPECT_EQ(cost->layer_state_bytes[l], attention ? 0u : 4u * (3 * 256 + 4 * 32 * 32));
  }
  // [2, 5): DeltaNet 2 and 4 (fixed) and attention 3 (per token).
  EXPECT_EQ(cost->WindowKvBytes(2, 5, 100), 2u * 4 * (3 * 256 + 4 * 32 * 32) + 100u * 2 * 2 * 64 * 4);
  EXPECT_LT(cost->WindowReadBytes(0, 8), cost->WindowWeightBytes(0, 8));
}

}  // namespace
}  // namespace kvasir
