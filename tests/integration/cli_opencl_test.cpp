// The OpenCL backend end to end, through the kvasir binary: a ring whose middle stage runs on
// OpenCL prints the all-CPU ring's greedy text, `kvasir eval --backend opencl` stays within a
// stated tolerance of the CPU's logits, and the hostile cases (a device without room, a kernel that
// fails to build, a type the backend cannot run, a device the machine lacks) end with a message
// naming what is wrong and exit 1, never an abort. Every test skips, saying why, where this kvasir
// has no OpenCL backend or the machine no OpenCL device (CI installs PoCL, so there they run).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/registry.h"
#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::Describe;
using testing::ExpectRuntimeError;
using ::testing::HasSubstr;
using testing::LastLine;
using testing::RunKvasir;
using testing::RunResult;

// Why the OpenCL tests cannot run here, or "".
std::string NoOpenCl() {
  for (const BackendRegistration* r : BuiltBackends()) {
    if (std::string(r->name) != "opencl") continue;
    auto devices = r->devices();
    if (!devices.ok()) return "no OpenCL device here: " + devices.status().message();
    if (devices->empty()) return "no OpenCL device here: the platforms list none";
    return "";
  }
  return "this kvasir is built without the OpenCL backend (no OpenCL headers at configure time)";
}

#define KV_REQUIRE_OPENCL()                               \
  if (const std::string why = NoOpenCl(); !why.empty()) { \
    GTEST_SKIP() << why;                                  \
  }

// The largest normalised squared error, sum (opencl - cpu)^2 / sum cpu^2, that `kvasir eval
// --backend opencl` may show against the CPU's logits; and the top token of every position must
// agree. The kernels sum norms and softmaxes in f32 where the CPU sums in double; an activation
// that moves by one ulp can then round to another Q8_0 value before a quantized product, which
// random-weight models amplify. Measured on PoCL: 0 to 2e-4 (docs/BACKENDS.md).
constexpr double kEvalTolerance = 1e-3;

constexpr const char* kPrompt = "Once upon a time";
// 40-odd tokens: prefill tiles of 8 with a partial last one.
constexpr const char* kLongPrompt =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park "
    "with her friends. One day, she saw a big red ball under a tree.";

std::vector<std::string> Ring(const std::string& model, int stages, const std::string& backends) {
  return {"run",        "-m",     model, "--stages", std::to_string(stages),
          "--backends", backends, "-p",  kPrompt,    "-n",
          "24",         "--temp", "0",   "-t",       "1"};
}

// A model for the rings: a file of ../shared, or one `kvasir synth` writes with a shared file's
// shape and type but 4 layers (a 2-layer file cannot be cut into three stages).
struct RingModel {
  std::string name;
  std::vector<std::string> synth;  // empty: models/<name>.gguf
};
void PrintTo(const RingModel& m, std::ostream* os) { *os << m.name; }

std::vector<RingModel> RingModels() {
  const std::vector<std::string> vocab = {"--vocab-from", "models/stories260K.gguf"};
  return {
      {"stories260K", {}},
      {"stories260K-q8_0", {}},
      {"synth-qwen35moe-f32", {}},
      // synth-llama-q4_k_m with 4 layers.
      {"synth4-llama-q4_k_m",
       {"--arch", "llama", "--layers", "4", "--embd", "256", "--heads", "8", "--kv-heads", "4",
        "--ff", "512", "--type", "q4_k_m", "--seed", "3"}},
      // synth-qwen3-q4_0 with 4 layers.
      {"synth4-qwen3-q4_0",
       {"--arch", "qwen3", "--layers", "4", "--embd", "256", "--heads", "8", "--kv-heads", "4",
        "--head-dim", "64", "--ff", "512", "--type", "q4_0", "--tied", "--seed", "4"}},
  };
}

// The model's path: the shared file, or a synthesized one in `dir`.
std::string ModelPath(const RingModel& m, const testing::TempDir& dir) {
  if (m.synth.empty()) return AssetPath("models/" + m.name + ".gguf");
  const std::string out = dir.File(m.name + ".gguf");
  std::vector<std::string> args = {"synth"};
  args.insert(args.end(), m.synth.begin(), m.synth.end());
  args.insert(args.end(), {"--vocab-from", AssetPath("models/stories260K.gguf"), "-o", out});
  const RunResult r = RunKvasir(args);
  EXPECT_EQ(r.code, 0) << Describe(r);
  return out;
}

class OpenClRingTest : public ::testing::TestWithParam<RingModel> {};

TEST_P(OpenClRingTest, AThreeStageRingWithAnOpenClMiddleStagePrintsTheCpuRingsText) {
  KV_REQUIRE_OPENCL();
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  if (GetParam().synth.empty()) KV_REQUIRE_ASSET("models/" + GetParam().name + ".gguf");
  testing::TempDir dir;
  const std::string model = ModelPath(GetParam(), dir);
  const RunResult cpu = RunKvasir(Ring(model, 3, "cpu"));
  ASSERT_EQ(cpu.code, 0) << Describe(cpu);
  ASSERT_FALSE(cpu.out.empty());
  const RunResult cl = RunKvasir(Ring(model, 3, "cpu,opencl,cpu"));
  ASSERT_EQ(cl.code, 0) << Describe(cl);
  EXPECT_EQ(cl.out, cpu.out);
  // The stage table puts the middle stage on the OpenCL device.
  const size_t at = cl.err.find("\nstage1 ");
  ASSERT_NE(at, std::string::npos) << cl.err;
  EXPECT_THAT(cl.err.substr(at, cl.err.find('\n', at + 1) - at), HasSubstr(" opencl:0:0 ("));
}

INSTANTIATE_TEST_SUITE_P(Models, OpenClRingTest, ::testing::ValuesIn(RingModels()),
                         [](const auto& info) {
                           std::string s = info.param.name;
                           for (char& c : s)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

// The 2-layer shared files run as 2-stage rings, OpenCL at the head (embeddings) and at the tail
// (the output head), each against the all-CPU ring.
class OpenClTwoLayerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(OpenClTwoLayerTest, TwoStageRingsWithOpenClAtEitherEndPrintTheCpuRingsText) {
  KV_REQUIRE_OPENCL();
  const std::string rel = "models/" + GetParam() + ".gguf";
  KV_REQUIRE_ASSET(rel);
  const std::string model = AssetPath(rel);
  const RunResult cpu = RunKvasir(Ring(model, 2, "cpu"));
  ASSERT_EQ(cpu.code, 0) << Describe(cpu);
  ASSERT_FALSE(cpu.out.empty());
  for (const char* backends : {"opencl,cpu", "cpu,opencl"}) {
    SCOPED_TRACE(backends);
    const RunResult cl = RunKvasir(Ring(model, 2, backends));
    ASSERT_EQ(cl.code, 0) << Describe(cl);
    EXPECT_EQ(cl.out, cpu.out);
  }
}

INSTANTIATE_TEST_SUITE_P(Models, OpenClTwoLayerTest,
                         ::testing::Values("synth-llama-q4_k_m", "synth-qwen3-q4_0"),
                         [](const auto& info) {
                           std::string s = info.param;
                           for (char& c : s)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

std::vector<float> ReadF32(const std::string& path) {
  const std::string bytes = testing::ReadFileToString(path);
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// `kvasir eval --backend opencl` against the CPU's logits, on the long prompt (prefill) and on the
// short one, for the ring models and for F16 and Q5_K_M files (every type the backend runs).
class OpenClEvalTest : public ::testing::TestWithParam<RingModel> {};

TEST_P(OpenClEvalTest, EvalLogitsStayWithinTheToleranceOfTheCpus) {
  KV_REQUIRE_OPENCL();
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  if (GetParam().synth.empty()) KV_REQUIRE_ASSET("models/" + GetParam().name + ".gguf");
  testing::TempDir dir;
  const std::string model = ModelPath(GetParam(), dir);
  for (const char* prompt : {kLongPrompt, kPrompt}) {
    const std::string cpu_out = dir.File("cpu.f32"), cl_out = dir.File("opencl.f32");
    const RunResult cpu =
        RunKvasir({"eval", "-m", model, "--prompt", prompt, "--logits", cpu_out, "-t", "1"});
    ASSERT_EQ(cpu.code, 0) << Describe(cpu);
    const RunResult cl = RunKvasir(
        {"eval", "-m", model, "--prompt", prompt, "--logits", cl_out, "--backend", "opencl"});
    ASSERT_EQ(cl.code, 0) << Describe(cl);
    const std::vector<float> want = ReadF32(cpu_out), got = ReadF32(cl_out);
    ASSERT_EQ(got.size(), want.size());
    ASSERT_FALSE(want.empty());
    double err = 0, norm = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_TRUE(std::isfinite(got[i])) << "logit " << i;
      err += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
      norm += double{want[i]} * want[i];
    }
    EXPECT_LE(err / norm, kEvalTolerance) << "prompt: " << prompt;
    std::printf("%s, %zu-byte prompt: normalised squared error %.3g (tolerance %.3g)\n",
                GetParam().name.c_str(), std::strlen(prompt), err / norm, kEvalTolerance);
    const size_t vocab = 512;  // every model here has stories260K's vocabulary
    ASSERT_EQ(want.size() % vocab, 0u);
    for (size_t r = 0; r < want.size() / vocab; ++r) {
      const auto top = [&](const std::vector<float>& v) {
        return std::max_element(v.begin() + r * vocab, v.begin() + (r + 1) * vocab) - v.begin();
      };
      EXPECT_EQ(top(got), top(want)) << "position " << r << ", prompt: " << prompt;
    }
  }
}

std::vector<RingModel> EvalModels() {
  std::vector<RingModel> out = RingModels();
  out.push_back({"synth-llama-q4_k_m", {}});
  out.push_back({"synth-qwen3-q4_0", {}});
  const auto small = [](const char* type) {
    return std::vector<std::string>{"--arch",  "llama", "--layers", "2",   "--embd", "256",
                                    "--heads", "4",     "--ff",     "512", "--type", type};
  };
  out.push_back({"synth2-llama-f16", small("f16")});
  out.push_back({"synth2-llama-q5_k_m", small("q5_k_m")});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, OpenClEvalTest, ::testing::ValuesIn(EvalModels()),
                         [](const auto& info) {
                           std::string s = info.param.name;
                           for (char& c : s)
                             c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return s;
                         });

// ---- Hostile cases ------------------------------------------------------------------------------

const std::string kModel = "models/stories260K.gguf";

std::vector<std::string> Eval(const std::string& logits, const std::string& backend = "opencl") {
  return {"eval",     "-m",   AssetPath(kModel), "--prompt", kPrompt,
          "--logits", logits, "--backend",       backend};
}

TEST(OpenClHostileTest, ADeviceWithoutRoomForTheWindowIsRefusedNamingTheSizes) {
  KV_REQUIRE_OPENCL();
  KV_REQUIRE_ASSET(kModel);
  testing::TempDir dir;
  // 300000 bytes: less than stories260K's 1 MiB of weights.
  const RunResult r =
      RunKvasir(Eval(dir.File("l.f32")), {{"KVASIR_OPENCL_MEMORY_LIMIT", "300000"}});
  ExpectRuntimeError(r, "eval", "backend opencl:0:0 (");
  EXPECT_THAT(LastLine(r.err), HasSubstr(" for tensor blk."));
  EXPECT_THAT(LastLine(r.err), HasSubstr(" free of 292.97 KiB)"));
  EXPECT_FALSE(std::filesystem::exists(dir.File("l.f32")));
  const RunResult gen = RunKvasir(
      {"generate", "-m", AssetPath(kModel), "-p", kPrompt, "-n", "4", "--backend", "opencl"},
      {{"KVASIR_OPENCL_MEMORY_LIMIT", "300000"}});
  ExpectRuntimeError(gen, "generate", " free of 292.97 KiB)");
}

TEST(OpenClHostileTest, AKernelThatFailsToBuildNamesTheDeviceAndTheKernel) {
  KV_REQUIRE_OPENCL();
  KV_REQUIRE_ASSET(kModel);
  testing::TempDir dir;
  const RunResult r =
      RunKvasir(Eval(dir.File("l.f32")),
                {{"KVASIR_OPENCL_BREAK_KERNEL", "rms_norm"}, {"KVASIR_OPENCL_CACHE", dir.path()}});
  ExpectRuntimeError(r, "eval", "backend opencl:0:0 (");
  EXPECT_THAT(r.err, HasSubstr("kernel rms_norm (rows.cl, line "));
  EXPECT_THAT(r.err, HasSubstr("does not build"));
  EXPECT_THAT(r.err, HasSubstr("kvasir_test_hook_breaks_this_kernel"));  // from the build log
}

TEST(OpenClHostileTest, ATypeTheBackendCannotRunIsRefusedAtLoadNamingTensorTypeAndBackend) {
  KV_REQUIRE_OPENCL();
  KV_REQUIRE_ASSET(kModel);
  testing::TempDir dir;
  const std::string model = dir.File("q5_0.gguf");
  const RunResult synth = RunKvasir(testing::SynthArgs(model, "q5_0"));
  ASSERT_EQ(synth.code, 0) << Describe(synth);
  const RunResult r = RunKvasir({"eval", "-m", model, "--prompt", kPrompt, "--logits",
                                 dir.File("l.f32"), "--backend", "opencl"});
  ExpectRuntimeError(r, "eval",
                     "has type q5_0, which backend opencl:0:0 cannot run (it runs: f32, f16, q8_0, "
                     "q4_0, q4_k, q5_k, q6_k)");
  EXPECT_THAT(LastLine(r.err), HasSubstr(": tensor "));
}

TEST(OpenClHostileTest, ADeviceTheMachineLacksIsRefusedNamingWhatItHas) {
  KV_REQUIRE_OPENCL();
  KV_REQUIRE_ASSET(kModel);
  testing::TempDir dir;
  ExpectRuntimeError(RunKvasir(Eval(dir.File("l.f32"), "opencl:0:99")), "eval",
                     "opencl:0:99: platform 0 has");
}

// Programs are built once per device and driver: the next process reads them from the cache, and
// a cache file the driver refuses (here garbage) is rebuilt, not trusted.
TEST(OpenClCacheTest, ProgramsComeFromTheCacheAndACorruptCacheIsRebuilt) {
  KV_REQUIRE_OPENCL();
  KV_REQUIRE_ASSET(kModel);
  testing::TempDir dir;
  const std::string cache = dir.File("cache");
  const std::vector<std::pair<std::string, std::string>> env = {{"KVASIR_OPENCL_CACHE", cache}};
  const RunResult first = RunKvasir(Eval(dir.File("a.f32")), env);
  ASSERT_EQ(first.code, 0) << Describe(first);
  EXPECT_THAT(first.err, HasSubstr("compiled 5 of 5 OpenCL programs"));
  int binaries = 0;
  for (const auto& e : std::filesystem::directory_iterator(cache)) {
    if (e.path().extension() == ".bin") ++binaries;
  }
  EXPECT_EQ(binaries, 5);

  const RunResult second = RunKvasir(Eval(dir.File("b.f32")), env);
  ASSERT_EQ(second.code, 0) << Describe(second);
  EXPECT_THAT(second.err, ::testing::Not(HasSubstr("compiled")));
  EXPECT_EQ(testing::ReadFileToString(dir.File("b.f32")),
            testing::ReadFileToString(dir.File("a.f32")));

  for (const auto& e : std::filesystem::directory_iterator(cache)) {
    if (e.path().extension() == ".bin") std::ofstream(e.path()) << "not a program binary";
  }
  const RunResult third = RunKvasir(Eval(dir.File("c.f32")), env);
  ASSERT_EQ(third.code, 0) << Describe(third);
  EXPECT_THAT(third.err, HasSubstr("compiled 5 of 5 OpenCL programs"));
  EXPECT_EQ(testing::ReadFileToString(dir.File("c.f32")),
            testing::ReadFileToString(dir.File("a.f32")));
}

TEST(OpenClDevicesTest, DevicesListsTheOpenClDevicesWithTheirMemoryAndTypes) {
  KV_REQUIRE_OPENCL();
  const RunResult r = RunKvasir({"devices", "--json"}, {{"KVASIR_OPENCL_MEMORY_LIMIT", "1048576"}});
  ASSERT_EQ(r.code, 0) << Describe(r);
  const auto j = nlohmann::json::parse(r.out);
  const nlohmann::json* cl = nullptr;
  for (const auto& b : j["backends"]) {
    if (b["backend"] == "opencl") cl = &b;
  }
  ASSERT_NE(cl, nullptr) << r.out;
  ASSERT_FALSE((*cl)["devices"].empty()) << r.out;
  const auto& d = (*cl)["devices"][0];
  EXPECT_EQ(d["address"], "opencl:0:0");
  EXPECT_FALSE(d["name"].get<std::string>().empty());
  EXPECT_EQ(d["memory_bytes"].get<uint64_t>(), 1048576u);
  EXPECT_EQ(d["types"], nlohmann::json({"f32", "f16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"}));
}

}  // namespace
}  // namespace kvasir
