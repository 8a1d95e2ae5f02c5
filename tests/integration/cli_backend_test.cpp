// Choosing a backend from the command line: `kvasir devices`, --backend on every command that runs
// layers, `run --backends` and its stage table, and the backend field of devices.json and of the
// manifest. A backend this build lacks is refused before any side effect, with a non-zero exit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "backend/registry.h"
#include "kernels/attention_bf16.h"
#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::ExpectRuntimeError;
using testing::ExpectUsageError;
using ::testing::HasSubstr;
using testing::LastLine;
using testing::RunKvasir;
using testing::RunResult;

bool Built(const std::string& name) {
  for (const BackendRegistration* r : BuiltBackends()) {
    if (r->name == name) return true;
  }
  return false;
}

// A backend this binary lacks ("opencl" or "cuda"), or "" when it has them all.
std::string Missing() {
  for (const char* name : {"opencl", "cuda"}) {
    if (!Built(name)) return name;
  }
  return "";
}

const std::string kModel = "models/stories260K.gguf";

TEST(CliBackendTest, DevicesListsEveryBackendWithDevicesOrTheReason) {
  RunResult r = RunKvasir({"devices"});
  ASSERT_EQ(r.code, 0) << testing::Describe(r);
  EXPECT_THAT(r.out, HasSubstr("cpu      cpu"));
  EXPECT_THAT(r.out, HasSubstr("q4_k"));
  if (!Missing().empty()) {
    EXPECT_THAT(r.out, HasSubstr(Missing() + ": not built into this kvasir"));
  }

  r = RunKvasir({"devices", "--json"});
  ASSERT_EQ(r.code, 0) << testing::Describe(r);
  const auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["backends"].size(), 3u);
  EXPECT_EQ(j["backends"][0]["backend"], "cpu");
  const auto& cpu = j["backends"][0]["devices"][0];
  EXPECT_EQ(cpu["address"], "cpu");
  EXPECT_GT(cpu["memory_bytes"].get<uint64_t>(), 0u);
  EXPECT_FALSE(cpu["types"].empty());
}

TEST(CliBackendTest, EveryLayerCommandTakesTheCpuBackend) {
  KV_REQUIRE_ASSET(kModel);
  const std::string m = AssetPath(kModel);
  RunResult plain = RunKvasir(
      {"generate", "-m", m, "-p", "Once upon a time", "-n", "12", "--temp", "0", "-t", "1"});
  RunResult cpu = RunKvasir({"generate", "-m", m, "-p", "Once upon a time", "-n", "12", "--temp",
                             "0", "-t", "1", "--backend", "cpu"});
  ASSERT_EQ(cpu.code, 0) << testing::Describe(cpu);
  EXPECT_EQ(cpu.out, plain.out);
  EXPECT_THAT(cpu.err, HasSubstr("(cpu, 1 threads"));
  RunResult bench =
      RunKvasir({"bench", "-m", m, "-p", "8", "-n", "4", "-r", "1", "--backend", "cpu", "--json"});
  ASSERT_EQ(bench.code, 0) << testing::Describe(bench);
  EXPECT_EQ(nlohmann::json::parse(bench.out)["backend"], "cpu");
  RunResult profile = RunKvasir({"profile", "-m", m, "-n", "4", "--backend", "cpu"});
  ASSERT_EQ(profile.code, 0) << testing::Describe(profile);
  EXPECT_EQ(nlohmann::json::parse(profile.out)["backend"], "cpu");
}

TEST(CliBackendTest, ABackendNotBuiltIsRefusedBeforeAnythingRuns) {
  const std::string missing = Missing();
  if (missing.empty()) GTEST_SKIP() << "every backend is built in";
  KV_REQUIRE_ASSET(kModel);
  const std::string m = AssetPath(kModel);
  testing::TempDir dir;
  const std::string logits = dir.File("logits.f32");
  const std::string want = "backend " + missing;
  ExpectRuntimeError(RunKvasir({"generate", "-m", m, "-p", "x", "--backend", missing}), "generate",
                     want);
  ExpectRuntimeError(
      RunKvasir({"eval", "-m", m, "--ids", "1,2", "--logits", logits, "--backend", missing}),
      "eval", want);
  EXPECT_FALSE(std::ifstream(logits).good());  // nothing written
  ExpectRuntimeError(RunKvasir({"bench", "-m", m, "--backend", missing}), "bench", want);
  ExpectRuntimeError(RunKvasir({"profile", "-m", m, "--backend", missing}), "profile", want);
  // The stage refuses before fetching anything (the URL leads nowhere).
  ExpectRuntimeError(RunKvasir({"stage", "--fetch", "http://127.0.0.1:9/m.gguf", "--layers", "0:2",
                                "--listen", "127.0.0.1:0", "--next", "127.0.0.1:9", "--insecure",
                                "--slice-dir", dir.path(), "--backend", missing}),
                     "stage", want);
  ExpectRuntimeError(RunKvasir({"join", "--market", "http://127.0.0.1:9", "--key",
                                dir.File("node.key"), "--backend", missing}),
                     "join", want);
  RunResult run = RunKvasir({"run", "-m", m, "--stages", "3", "--backends",
                             "cpu," + missing + ",cpu", "-p", "x", "-n", "2"});
  ExpectRuntimeError(run, "run", "--backends (stage 1): " + want);
  EXPECT_THAT(LastLine(run.err), HasSubstr("built without it (built: cpu"));
}

TEST(CliBackendTest, BackendTextThatIsNoBackendIsAUsageError) {
  KV_REQUIRE_ASSET(kModel);
  const std::string m = AssetPath(kModel);
  ExpectUsageError(RunKvasir({"generate", "-m", m, "-p", "x", "--backend", "gpu"}), "generate",
                   "backend 'gpu' is not one of cpu, opencl[:PLATFORM:DEVICE], cuda[:N]");
  ExpectUsageError(RunKvasir({"bench", "-m", m, "--backend", "cuda:x"}), "bench",
                   "backend 'cuda:x' is not cuda[:N]");
  ExpectUsageError(
      RunKvasir({"run", "-m", m, "--stages", "2", "--backends", "cpu,cpu,cpu", "-p", "x"}), "run",
      "--backends lists 3 backends for 2 stages");
}

TEST(CliBackendTest, RunShowsEachStagesBackendAndDeviceAndMatchesOneProcess) {
  KV_REQUIRE_ASSET(kModel);
  const std::string m = AssetPath(kModel);
  RunResult local = RunKvasir(
      {"generate", "-m", m, "-p", "Once upon a time", "-n", "24", "--temp", "0", "-t", "1"});
  RunResult ring = RunKvasir({"run", "-m", m, "--stages", "3", "--backends", "cpu,cpu,cpu", "-p",
                              "Once upon a time", "-n", "24", "--temp", "0", "-t", "1"});
  ASSERT_EQ(ring.code, 0) << testing::Describe(ring);
  EXPECT_EQ(ring.out, local.out);
  EXPECT_THAT(ring.err, HasSubstr("backend (device)"));
  size_t rows = 0;
  for (int i = 0; i < 3; ++i) {
    const size_t at = ring.err.find("\nstage" + std::to_string(i) + " ");
    ASSERT_NE(at, std::string::npos) << ring.err;
    EXPECT_THAT(ring.err.substr(at, ring.err.find('\n', at + 1) - at), HasSubstr(" cpu ("));
    ++rows;
  }
  EXPECT_EQ(rows, 3u);
}

// `run --attn-type` reaches every stage: a 3-stage ring's text equals one process's with the same
// attention and seed, which differs from the f32 text. Refused where `serve` refuses it: a CPU
// without AVX512-BF16, a stage on another backend.
TEST(CliBackendTest, RunPassesTheAttentionTypeToEveryStage) {
  KV_REQUIRE_ASSET(kModel);
  const std::string m = AssetPath(kModel);
  // Sampled hot and long: greedy text and short runs come out the same in both modes.
  const std::vector<std::string> common = {"-p",  "Once upon a time", "-n", "400", "--temp",
                                           "1.5", "--seed",           "1",  "-t",  "1"};
  auto with = [&](std::vector<std::string> args) {
    args.insert(args.end(), common.begin(), common.end());
    return RunKvasir(args);
  };
  ExpectUsageError(with({"run", "-m", m, "--stages", "3", "--attn-type", "f16"}), "run",
                   "--attn-type: 'f16' is not f32 or bf16");
  if (Built("opencl")) {
    ExpectUsageError(with({"run", "-m", m, "--stages", "3", "--backends", "cpu,opencl,cpu",
                           "--attn-type", "bf16"}),
                     "run", "--attn-type bf16 is an option of the cpu backend, not opencl");
  }
  if (!HaveBf16Attention()) {
    ExpectRuntimeError(with({"run", "-m", m, "--stages", "3", "--attn-type", "bf16"}), "run",
                       "--attn-type bf16 needs AVX512-BF16");
    GTEST_SKIP() << "this CPU lacks AVX512-BF16: only the refusal was checked";
  }
  RunResult local_f32 = with({"generate", "-m", m});
  RunResult local_bf16 = with({"generate", "-m", m, "--attn-type", "bf16"});
  RunResult ring_bf16 = with({"run", "-m", m, "--stages", "3", "--attn-type", "bf16"});
  ASSERT_EQ(local_f32.code, 0) << testing::Describe(local_f32);
  ASSERT_EQ(local_bf16.code, 0) << testing::Describe(local_bf16);
  ASSERT_EQ(ring_bf16.code, 0) << testing::Describe(ring_bf16);
  ASSERT_NE(local_bf16.out, local_f32.out) << "this prompt and seed no longer tell the two apart";
  EXPECT_EQ(ring_bf16.out, local_bf16.out);
}

TEST(CliBackendTest, PlanCarriesEachDevicesBackendIntoItsRank) {
  KV_REQUIRE_ASSET(kModel);
  testing::TempDir dir;
  const std::string devices = dir.File("devices.json");
  std::ofstream(devices) << R"({"devices": [
      {"name": "box", "backend": "cpu", "memory_gib": 0.068, "ms_per_gib": 5},
      {"name": "phone", "backend": "opencl:0:1", "kind": "phone", "memory_gib": 0.068,
       "ms_per_gib": 5}]})";
  const std::string manifest = dir.File("manifest.json");
  RunResult plan = RunKvasir(
      {"plan", "-m", AssetPath(kModel), "--devices", devices, "--no-hash", "-o", manifest});
  ASSERT_EQ(plan.code, 0) << testing::Describe(plan);
  EXPECT_THAT(plan.out, HasSubstr("opencl:0:1"));
  std::ifstream in(manifest);
  const auto j = nlohmann::json::parse(in);
  ASSERT_EQ(j["ranks"].size(), 2u);
  std::set<std::string> backends;
  for (const auto& r : j["ranks"]) {
    backends.insert(r["backend"].get<std::string>());
    EXPECT_EQ(r["backend"], r["device"] == "phone" ? "opencl:0:1" : "cpu");
  }
  EXPECT_EQ(backends.size(), 2u);
  // The manifest's OpenCL rank cannot run on this build: refused before the ring starts, naming
  // the rank; --backends overrides the manifest.
  if (!Built("opencl")) {
    RunResult run = RunKvasir({"run", "--manifest", manifest, "-p", "x", "-n", "2"});
    EXPECT_EQ(run.code, 1) << testing::Describe(run);
    EXPECT_THAT(LastLine(run.err), HasSubstr("manifest rank"));
    EXPECT_THAT(LastLine(run.err), HasSubstr("backend opencl:0:1"));
  }
  RunResult all_cpu = RunKvasir({"run", "--manifest", manifest, "--backends", "cpu", "-p",
                                 "Once upon a time", "-n", "8", "--temp", "0", "-t", "1"});
  EXPECT_EQ(all_cpu.code, 0) << testing::Describe(all_cpu);
}

}  // namespace
}  // namespace kvasir
