// End-to-end tests of the `kvasir` binary: exit codes, stdout and stderr of every subcommand, on
// the shared models and on tiny models written by `kvasir synth`.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::ReadFileToString;
using ::testing::StartsWith;
using testing::TempDir;

constexpr const char* kStories = "models/stories260K.gguf";

using testing::Describe;
using testing::LastLine;
using testing::RunResult;

RunResult Kvasir(const std::vector<std::string>& args) { return testing::RunKvasir(args); }

using testing::ExpectRuntimeError;
using testing::ExpectUsageError;

nlohmann::json ParseJson(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON:\n" << text;
  return j;
}

nlohmann::json Reference(const std::string& name) {
  return ParseJson(ReadFileToString(AssetPath("reference/" + name)));
}

using testing::SynthArgs;

// ---- usage errors ---------------------------------------------------------------------------

TEST(CliTest, NoCommandPrintsUsage) {
  RunResult r = Kvasir({});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("usage: kvasir"));
}

TEST(CliTest, SimdTargetFromEnvironment) {
  // A name that is no kernel target is refused before any command runs, naming what the CPU has.
  RunResult bad = testing::RunKvasir({"--version"}, {{"KVASIR_SIMD_TARGET", "AVX9000"}});
  EXPECT_EQ(bad.code, 2) << Describe(bad);
  EXPECT_THAT(bad.err, HasSubstr("KVASIR_SIMD_TARGET=AVX9000"));
  EXPECT_THAT(bad.err, HasSubstr("SCALAR"));
  EXPECT_EQ(bad.out, "");
  // The scalar target exists on every CPU and is taken.
  RunResult ok = testing::RunKvasir({"--version"}, {{"KVASIR_SIMD_TARGET", "SCALAR"}});
  EXPECT_EQ(ok.code, 0) << Describe(ok);
  EXPECT_THAT(ok.out, HasSubstr("kvasir"));
}

TEST(CliTest, HelpGoesToStdout) {
  RunResult r = Kvasir({"generate", "--help"});
  EXPECT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("--temp"));
  EXPECT_EQ(r.err, "");
}

TEST(CliTest, UnknownFlagIsUsageError) {
  ExpectUsageError(Kvasir({"generate", "-m", "x.gguf", "-p", "hi", "--bogus"}), "generate",
                   "--bogus");
  ExpectUsageError(Kvasir({"inspect", "x.gguf", "--frobnicate"}), "inspect", "--frobnicate");
  ExpectUsageError(Kvasir({"bench", "-m", "x.gguf", "--nope"}), "bench", "--nope");
}

TEST(CliTest, MissingModelIsUsageError) {
  ExpectUsageError(Kvasir({"generate", "-p", "hello"}), "generate", "model");
  ExpectUsageError(Kvasir({"eval", "--ids", "1,2"}), "eval", "model");
  ExpectUsageError(Kvasir({"inspect"}), "inspect", "model");
}

TEST(CliTest, BadFlagValuesAreUsageErrors) {
  ExpectUsageError(Kvasir({"generate", "-m", "x.gguf", "-p", "hi", "-n", "many"}), "generate",
                   "-n");
  ExpectUsageError(Kvasir({"generate", "-m", "x.gguf", "-p", "hi", "--top-p", "1.5"}), "generate",
                   "--top-p");
  ExpectUsageError(Kvasir({"eval", "-m", "x.gguf", "--ids", "1,abc", "--logits", "o.f32"}), "eval",
                   "'abc'");
  ExpectUsageError(Kvasir({"eval", "-m", "x.gguf", "--logits", "o.f32"}), "eval", "--ids");
  ExpectUsageError(Kvasir({"bench", "-m", "x.gguf", "-r", "0"}), "bench", "-r");
}

// ---- files that cannot be used --------------------------------------------------------------

TEST(CliTest, NonexistentFileNamesIt) {
  const std::string missing = "/nonexistent/dir/model.gguf";
  ExpectRuntimeError(Kvasir({"inspect", missing}), "inspect", missing);
  ExpectRuntimeError(Kvasir({"generate", "-m", missing, "-p", "hi"}), "generate", missing);
  ExpectRuntimeError(Kvasir({"eval", "-m", missing, "--ids", "1,2", "--logits", "/tmp/x"}), "eval",
                     missing);
  ExpectRuntimeError(Kvasir({"bench", "-m", missing}), "bench", missing);
}

TEST(CliTest, MalformedGgufNamesTheFile) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string garbage = dir.File("garbage.gguf");
  std::ofstream(garbage) << "this is not a gguf file at all, just some text";
  const std::string truncated = dir.File("truncated.gguf");
  std::string bytes = ReadFileToString(AssetPath(kStories));
  std::ofstream(truncated, std::ios::binary).write(bytes.data(), 20000);
  for (const std::string& path : {garbage, truncated}) {
    SCOPED_TRACE(path);
    ExpectRuntimeError(Kvasir({"inspect", path}), "inspect", path);
    ExpectRuntimeError(Kvasir({"generate", "-m", path, "-p", "hi"}), "generate", path);
  }
}

TEST(CliTest, UnsupportedArchitectureIsRefused) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  auto stories = GgufFile::Open(AssetPath(kStories));
  ASSERT_TRUE(stories.ok()) << stories.status().message();
  GgufWriter w;
  w.CopyKvs(stories->header());
  w.SetKv("general.architecture", GgufValue::String("mamba"));
  w.SetKv("mamba.block_count", GgufValue::Uint32(1));
  const std::string path = dir.File("mamba.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  RunResult r = Kvasir({"generate", "-m", path, "-p", "hi"});
  ExpectRuntimeError(r, "generate", "mamba");
  // inspect only reads the format, so it still works.
  RunResult ins = Kvasir({"inspect", path});
  EXPECT_EQ(ins.code, 0) << Describe(ins);
  EXPECT_THAT(ins.out, HasSubstr("mamba"));
}

TEST(CliTest, InspectShowsStageWindow) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  auto stories = GgufFile::Open(AssetPath(kStories));
  ASSERT_TRUE(stories.ok()) << stories.status().message();
  GgufWriter w;
  w.CopyKvs(stories->header());
  w.SetKv("kvasir.window.first", GgufValue::Uint32(1));
  w.SetKv("kvasir.window.last", GgufValue::Uint32(3));
  const std::string path = dir.File("stage.gguf");
  ASSERT_TRUE(w.Write(path).ok());
  RunResult r = Kvasir({"inspect", path});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("window:        layers [1, 3)"));
  RunResult j = Kvasir({"inspect", "--json", path});
  ASSERT_EQ(j.code, 0) << Describe(j);
  nlohmann::json doc = ParseJson(j.out);
  EXPECT_EQ(doc["window"]["first"], 1);
  EXPECT_EQ(doc["window"]["last"], 3);
}

TEST(CliTest, UnwritableOutputsAreRefusedBeforeRunning) {
  KV_REQUIRE_ASSET(kStories);
  RunResult r = Kvasir({"generate", "-m", AssetPath(kStories), "-p", "hi", "--stats",
                        "/nonexistent/dir/stats.json"});
  ExpectRuntimeError(r, "generate", "/nonexistent/dir/stats.json");
  EXPECT_EQ(r.out, "");
  ExpectRuntimeError(Kvasir({"eval", "-m", AssetPath(kStories), "--ids", "1,2", "--logits",
                             "/nonexistent/dir/x.f32"}),
                     "eval", "/nonexistent/dir/x.f32");
}

TEST(CliTest, PromptOverContextIsRefused) {
  KV_REQUIRE_ASSET(kStories);
  RunResult r = Kvasir({"generate", "-m", AssetPath(kStories), "-c", "8", "-p",
                        "Once upon a time there was a little girl named Lily who liked to play"});
  ExpectRuntimeError(r, "generate", "context");
  EXPECT_EQ(r.out, "");
}

TEST(CliTest, GenerationStopsAtContextEnd) {
  KV_REQUIRE_ASSET(kStories);
  RunResult r = Kvasir({"generate", "-m", AssetPath(kStories), "-c", "8", "-p", "Once upon a time",
                        "-n", "20", "--temp", "0"});
  EXPECT_EQ(r.code, 0) << Describe(r);
  // 5 prompt tokens + 4 generated fill 8 positions (the last pick is never fed back).
  EXPECT_THAT(r.err, HasSubstr("stop: context"));
  EXPECT_THAT(r.err, HasSubstr("generated: 4 tokens"));
}

// ---- inspect ----------------------------------------------------------------------------------

TEST(CliTest, InspectShowsLayers) {
  KV_REQUIRE_ASSET(kStories);
  RunResult r = Kvasir({"inspect", AssetPath(kStories)});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("architecture:  llama"));
  EXPECT_THAT(r.out, HasSubstr("5 layers"));
  EXPECT_THAT(r.out, HasSubstr("blk.4"));
  EXPECT_THAT(r.out, Not(HasSubstr("blk.5")));
  EXPECT_THAT(r.out, HasSubstr("token_embd.weight"));
  EXPECT_THAT(r.out, HasSubstr("[string x 512]"));

  RunResult j = Kvasir({"inspect", "--json", AssetPath(kStories)});
  ASSERT_EQ(j.code, 0) << Describe(j);
  nlohmann::json doc = ParseJson(j.out);
  EXPECT_EQ(doc["n_layers"], 5);
  EXPECT_EQ(doc["layers"].size(), 5u);
  EXPECT_EQ(doc["architecture"], "llama");
  EXPECT_EQ(doc["version"], 3);
  EXPECT_GT(doc["total"]["bytes"].get<uint64_t>(), 1000000u);
  EXPECT_TRUE(doc["bytes_per_type"].contains("f32"));
}

// ---- generate / eval against the llama.cpp references ---------------------------------------

void ExpectGenerateMatches(const std::string& model, const std::string& ref_name) {
  KV_REQUIRE_ASSET("models/" + model);
  KV_REQUIRE_ASSET("reference/" + ref_name);
  nlohmann::json ref = Reference(ref_name);
  RunResult r = Kvasir({"generate", "-m", AssetPath("models/" + model), "-p",
                        ref["prompt"].get<std::string>(), "-n", "24", "--temp", "0", "-t", "2"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_EQ(r.out, ref["text"].get<std::string>());
  EXPECT_THAT(r.err, HasSubstr("prompt:    5 tokens"));
  EXPECT_THAT(r.err, HasSubstr("generated: 24 tokens"));
}

TEST(CliTest, GenerateMatchesReferenceF32) {
  ExpectGenerateMatches("stories260K.gguf", "stories260K.p1.json");
}

TEST(CliTest, GenerateMatchesReferenceQ8_0) {
  ExpectGenerateMatches("stories260K-q8_0.gguf", "stories260K-q8_0.p1.json");
}

TEST(CliTest, GenerateWritesStats) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string stats = dir.File("stats.json");
  RunResult r = Kvasir({"generate", "-m", AssetPath(kStories), "-p", "Once upon a time", "-n", "8",
                        "--seed", "3", "-t", "1", "--stats", stats});
  ASSERT_EQ(r.code, 0) << Describe(r);
  nlohmann::json j = ParseJson(ReadFileToString(stats));
  for (const char* key :
       {"model", "n_prompt", "n_generated", "prefill_tokens_per_s", "decode_tokens_per_s",
        "ttft_ms", "total_ms", "threads", "simd_target", "peak_rss_bytes", "stop_reason"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["n_prompt"], 5);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_GT(j["peak_rss_bytes"].get<uint64_t>(), 0u);
  const std::string stop = j["stop_reason"];
  EXPECT_TRUE(stop == "length" || stop == "eog") << stop;
  if (stop == "length") {
    EXPECT_EQ(j["n_generated"], 8);
  }

  // The same seed gives the same text.
  RunResult again = Kvasir({"generate", "-m", AssetPath(kStories), "-p", "Once upon a time", "-n",
                            "8", "--seed", "3", "-t", "2"});
  ASSERT_EQ(again.code, 0) << Describe(again);
  EXPECT_EQ(again.out, r.out);
}

TEST(CliTest, EvalLogitsMatchReference) {
  KV_REQUIRE_ASSET(kStories);
  KV_REQUIRE_ASSET("reference/stories260K.p1.exact.f32");
  nlohmann::json ref = Reference("stories260K.p1.json");
  std::vector<int> ids = ref["prompt_ids"].get<std::vector<int>>();
  const std::vector<int> gen = ref["generated_ids"].get<std::vector<int>>();
  ids.insert(ids.end(), gen.begin(), gen.end());
  std::string ids_text;
  for (int id : ids) ids_text += (ids_text.empty() ? "" : ",") + std::to_string(id);

  TempDir dir;
  const std::string logits_path = dir.File("logits.f32");
  RunResult r =
      Kvasir({"eval", "-m", AssetPath(kStories), "--ids", ids_text, "--logits", logits_path});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("n_tokens " + std::to_string(ids.size())));
  EXPECT_THAT(r.out, HasSubstr("perplexity "));

  const size_t n_vocab = ref["n_vocab"];
  std::string raw = ReadFileToString(logits_path);
  ASSERT_EQ(raw.size(), ids.size() * n_vocab * sizeof(float));
  std::vector<float> logits(raw.size() / sizeof(float));
  std::memcpy(logits.data(), raw.data(), raw.size());
  std::string exact_raw = ReadFileToString(AssetPath("reference/stories260K.p1.exact.f32"));
  std::vector<float> exact(exact_raw.size() / sizeof(float));
  std::memcpy(exact.data(), exact_raw.data(), exact_raw.size());
  ASSERT_EQ(exact.size(), gen.size() * n_vocab);

  const size_t n_prompt = ref["prompt_ids"].size();
  double max_abs = 0.0;
  for (size_t k = 0; k < gen.size(); ++k) {
    const float* row = logits.data() + (n_prompt - 1 + k) * n_vocab;
    const auto argmax = std::max_element(row, row + n_vocab) - row;
    EXPECT_EQ(argmax, gen[k]) << "step " << k;
    for (size_t v = 0; v < n_vocab; ++v) {
      max_abs = std::max(max_abs, std::fabs(double(row[v]) - exact[k * n_vocab + v]));
    }
  }
  // llama.cpp itself is within 7.4e-6 of the float64 truth on this case; `kvasir eval` was
  // measured at 5.3e-6 (the same on every SIMD target): the bound is twice that.
  std::printf("max |eval - exact| = %.3g (bound 1.1e-5)\n", max_abs);
  EXPECT_LE(max_abs, 1.1e-5);
}

TEST(CliTest, EvalRejectsIdsOutsideVocab) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  RunResult r = Kvasir(
      {"eval", "-m", AssetPath(kStories), "--ids", "1,403,99999", "--logits", dir.File("x.f32")});
  ExpectRuntimeError(r, "eval", "99999");
}

TEST(CliTest, EvalFromPrompt) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  RunResult r = Kvasir({"eval", "-m", AssetPath(kStories), "--prompt", "Once upon a time",
                        "--logits", dir.File("x.f32")});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("n_tokens 5"));
  EXPECT_EQ(ReadFileToString(dir.File("x.f32")).size(), 5u * 512u * 4u);
}

// ---- bench --------------------------------------------------------------------------------------

TEST(CliTest, BenchJsonParses) {
  KV_REQUIRE_ASSET(kStories);
  RunResult r = Kvasir(
      {"bench", "-m", AssetPath(kStories), "--json", "-p", "8", "-n", "4", "-r", "1", "-t", "1"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  nlohmann::json j = ParseJson(r.out);
  EXPECT_GT(j["prefill_tokens_per_s"]["median"].get<double>(), 0.0);
  EXPECT_GT(j["decode_tokens_per_s"]["median"].get<double>(), 0.0);
  EXPECT_EQ(j["threads"], 1);
  EXPECT_EQ(j["n_prompt"], 8);
  EXPECT_EQ(j["n_gen"], 4);
  EXPECT_TRUE(j.contains("simd_target"));
  EXPECT_TRUE(j.contains("peak_rss_bytes"));

  RunResult table = Kvasir({"bench", "-m", AssetPath(kStories), "-p", "8", "-n", "4", "-r", "1"});
  ASSERT_EQ(table.code, 0) << Describe(table);
  EXPECT_THAT(table.out, HasSubstr("pp8"));
  EXPECT_THAT(table.out, HasSubstr("tg4"));
}

// ---- synth --------------------------------------------------------------------------------------

TEST(CliTest, SynthEachTypeThenInspectAndGenerate) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  for (const std::string type : {"f32", "f16", "bf16", "q8_0", "q4_0"}) {
    SCOPED_TRACE(type);
    const std::string path = dir.File("tiny-" + type + ".gguf");
    RunResult s = Kvasir(SynthArgs(path, type));
    ASSERT_EQ(s.code, 0) << Describe(s);
    EXPECT_EQ(s.out, "");

    RunResult ins = Kvasir({"inspect", "--json", path});
    ASSERT_EQ(ins.code, 0) << Describe(ins);
    nlohmann::json j = ParseJson(ins.out);
    EXPECT_EQ(j["n_layers"], 2);
    EXPECT_TRUE(j["bytes_per_type"].contains(type)) << j["bytes_per_type"].dump();
    // 2 + 9 per layer + output: token_embd, output_norm, output.
    EXPECT_EQ(j["total"]["tensors"], 21);

    RunResult gen = Kvasir({"generate", "-m", path, "-p", "Once upon a time", "-n", "6", "--temp",
                            "0", "--ignore-eos"});
    ASSERT_EQ(gen.code, 0) << Describe(gen);
    EXPECT_THAT(gen.err, HasSubstr("generated: 6 tokens"));
  }
}

TEST(CliTest, SynthQwenArchitectures) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  for (const std::string arch : {"qwen2", "qwen3"}) {
    SCOPED_TRACE(arch);
    const std::string path = dir.File(arch + ".gguf");
    std::vector<std::string> args = SynthArgs(path, "q8_0");
    args[2] = arch;  // --arch
    args[4] = "1";   // --layers
    args.push_back("--tied");
    RunResult s = Kvasir(args);
    ASSERT_EQ(s.code, 0) << Describe(s);
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(f->GetString("general.architecture").value(), arch);
    EXPECT_EQ(f->FindTensor("blk.0.attn_q.bias") != nullptr, arch == "qwen2");
    EXPECT_EQ(f->FindTensor("blk.0.attn_k_norm.weight") != nullptr, arch == "qwen3");
    RunResult gen = Kvasir({"generate", "-m", path, "-p", "Once upon a time", "-n", "4", "--temp",
                            "0", "--ignore-eos"});
    EXPECT_EQ(gen.code, 0) << Describe(gen);
  }
}

TEST(CliTest, SynthFallsBackToF16ForPartialBlocks) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string path = dir.File("odd.gguf");
  RunResult s =
      Kvasir({"synth", "--layers", "1", "--embd", "64", "--heads", "4", "--ff", "72",
              "--vocab-from", AssetPath(kStories), "--type", "q8_0", "--tied", "-o", path});
  ASSERT_EQ(s.code, 0) << Describe(s);
  EXPECT_THAT(s.err, HasSubstr("blk.0.ffn_down.weight: row length 72"));
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->FindTensor("blk.0.ffn_down.weight")->type, uint32_t(TensorType::kF16));
  EXPECT_EQ(f->FindTensor("blk.0.ffn_up.weight")->type, uint32_t(TensorType::kQ8_0));
  EXPECT_EQ(f->FindTensor("output.weight"), nullptr);
  EXPECT_EQ(f->GetUint("llama.feed_forward_length").value(), 72u);
  EXPECT_EQ(f->GetUint("llama.attention.head_count_kv").value(), 4u);
  EXPECT_EQ(f->GetUint("llama.rope.dimension_count").value(), 16u);
  EXPECT_EQ(f->GetString("tokenizer.ggml.model").value(), "llama");
}

TEST(CliTest, SynthSameSeedSameBytes) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string a = dir.File("a.gguf"), b = dir.File("b.gguf"), c = dir.File("c.gguf");
  std::vector<std::string> args_a = SynthArgs(a, "q4_0");
  args_a.insert(args_a.end(), {"-t", "1"});
  std::vector<std::string> args_b = SynthArgs(b, "q4_0");
  args_b.insert(args_b.end(), {"-t", "2"});
  ASSERT_EQ(Kvasir(args_a).code, 0);
  ASSERT_EQ(Kvasir(args_b).code, 0);
  ASSERT_EQ(Kvasir(SynthArgs(c, "q4_0", "8")).code, 0);
  const std::string bytes_a = ReadFileToString(a);
  EXPECT_GT(bytes_a.size(), 10000u);
  EXPECT_TRUE(bytes_a == ReadFileToString(b)) << "same seed, different bytes";
  EXPECT_FALSE(bytes_a == ReadFileToString(c)) << "different seeds, same bytes";
}

// --rope-freqs llama3 writes the factors Llama 3.1 files carry: the same values as the shared
// fixture, which holds what convert_hf_to_gguf.py computes for factor 8, low 1, high 4, 8192.
TEST(CliTest, SynthWritesLlama3RopeFreqsAndRopeScalingKeys) {
  KV_REQUIRE_ASSET(kStories);
  KV_REQUIRE_ASSET("models/synth-llama31-f32.gguf");
  TempDir dir;
  const std::string path = dir.File("l31.gguf");
  RunResult s = Kvasir({"synth", "--layers", "1", "--embd", "256", "--heads", "4", "--ff", "64",
                        "--vocab-from", AssetPath(kStories), "--type", "f32", "--rope-base",
                        "500000", "--rope-freqs", "llama3", "--rope-factor", "8",
                        "--rope-orig-ctx", "8192", "-o", path});
  ASSERT_EQ(s.code, 0) << Describe(s);
  auto ours = GgufFile::Open(path);
  auto ref = GgufFile::Open(AssetPath("models/synth-llama31-f32.gguf"));
  ASSERT_TRUE(ours.ok() && ref.ok());
  const GgufTensorInfo* a = ours->FindTensor("rope_freqs.weight");
  const GgufTensorInfo* b = ref->FindTensor("rope_freqs.weight");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_EQ(a->ne[0], 32u);
  const auto da = ours->TensorData(*a), db = ref->TensorData(*b);
  ASSERT_EQ(da.size(), db.size());
  for (size_t i = 0; i < 32; ++i) {
    float x, y;
    std::memcpy(&x, da.data() + 4 * i, 4);
    std::memcpy(&y, db.data() + 4 * i, 4);
    EXPECT_NEAR(x, y, 1e-6f * y) << "pair " << i;
  }

  const std::string yarn = dir.File("yarn.gguf");
  s = Kvasir({"synth", "--layers", "1", "--embd", "64", "--heads", "4", "--ff", "64",
              "--vocab-from", AssetPath(kStories), "--rope-scaling", "yarn", "--rope-factor", "4",
              "--rope-orig-ctx", "512", "-o", yarn});
  ASSERT_EQ(s.code, 0) << Describe(s);
  auto y = GgufFile::Open(yarn);
  ASSERT_TRUE(y.ok());
  EXPECT_EQ(y->GetString("llama.rope.scaling.type").value(), "yarn");
  EXPECT_EQ(y->GetUint("llama.rope.scaling.original_context_length").value(), 512u);
  RunResult gen = Kvasir({"generate", "-m", yarn, "-p", "Once upon a time", "-n", "4", "--temp",
                          "0", "--ignore-eos"});
  EXPECT_EQ(gen.code, 0) << Describe(gen);
  ExpectUsageError(Kvasir({"synth", "--layers", "1", "--embd", "64", "--heads", "4", "--ff", "64",
                           "--vocab-from", AssetPath(kStories), "--rope-scaling", "longrope",
                           "-o", dir.File("x.gguf")}),
                   "synth", "longrope");
}

TEST(CliTest, SynthValidatesShape) {
  TempDir dir;
  const std::string out = dir.File("x.gguf");
  auto args = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = {"synth", "--vocab-from", "v.gguf", "-o", out, "--layers",
                                  "1",     "--ff",         "32"};
    v.insert(v.end(), extra.begin(), extra.end());
    return v;
  };
  ExpectUsageError(Kvasir(args({"--embd", "66", "--heads", "4"})), "synth", "--heads");
  ExpectUsageError(Kvasir(args({"--embd", "64", "--heads", "4", "--kv-heads", "3"})), "synth",
                   "--kv-heads");
  ExpectUsageError(Kvasir(args({"--embd", "0", "--heads", "4"})), "synth", "--embd");
  ExpectUsageError(Kvasir(args({"--embd", "64", "--heads", "4", "--type", "q4_k"})), "synth",
                   "q4_k");
  ExpectUsageError(Kvasir(args({"--embd", "64", "--heads", "4", "--arch", "mamba"})), "synth",
                   "mamba");
  EXPECT_FALSE(std::filesystem::exists(out));
}

// ---- plan ------------------------------------------------------------------------------------

TEST(CliTest, PlanWritesAManifestForTheExampleCluster) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string devices = std::string(KVASIR_SOURCE_DIR) + "/docs/examples/devices.json";
  const std::string manifest = dir.File("manifest.json");
  RunResult r = Kvasir({"plan", "-m", AssetPath(kStories), "--devices", devices, "-o", manifest});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("estimated per-token time"));
  EXPECT_THAT(r.out, HasSubstr("left out: adding it would raise the per-token time"));
  nlohmann::json m = ParseJson(ReadFileToString(manifest));
  ASSERT_TRUE(m.is_object());
  EXPECT_EQ(m["n_layer"], 5);
  EXPECT_EQ(m["ctx"], 4096);
  EXPECT_EQ(m["model_id"].get<std::string>().size(), 32u);
  ASSERT_FALSE(m["ranks"].empty());
  EXPECT_EQ(m["ranks"][0]["layers"][0], 0);
  EXPECT_EQ(m["ranks"].back()["layers"][1], 5);

  // Without -o the manifest is stdout's only content.
  RunResult s = Kvasir({"plan", "-m", AssetPath(kStories), "--devices", devices});
  ASSERT_EQ(s.code, 0) << Describe(s);
  EXPECT_EQ(ParseJson(s.out), m);
}

TEST(CliTest, PlanRefusesWhatDoesNotFit) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string devices = dir.File("devices.json");
  std::ofstream(devices) << R"({"devices": [{"name": "tiny", "memory_bytes": 1000000,
                                             "ms_per_gib": 10}]})";
  ExpectRuntimeError(Kvasir({"plan", "-m", AssetPath(kStories), "--devices", devices}), "plan",
                     "devices hold 976.6 KiB, the model needs");
  std::ofstream(devices) << R"({"devices": [{"name": "p", "memory_gib": 1, "ms_per_gib": 0}]})";
  ExpectRuntimeError(Kvasir({"plan", "-m", AssetPath(kStories), "--devices", devices}), "plan",
                     "device 'p': ms_per_gib must be > 0");
  ExpectUsageError(Kvasir({"plan", "-m", AssetPath(kStories)}), "plan", "--devices");
}

// The README's manifest flow: plan a cluster, run the ring from the manifest, and the text is the
// reference text; a manifest planned for another model is refused.
TEST(CliTest, RunFromAManifestMatchesTheReference) {
  KV_REQUIRE_ASSET(kStories);
  KV_REQUIRE_ASSET("reference/stories260K.p1.json");
  TempDir dir;
  const std::string devices = std::string(KVASIR_SOURCE_DIR) + "/docs/examples/devices.json";
  const std::string manifest = dir.File("manifest.json");
  ASSERT_EQ(Kvasir({"plan", "-m", AssetPath(kStories), "--devices", devices, "-o", manifest}).code,
            0);
  // The example's ranks run on CUDA and OpenCL devices; here every rank runs on this CPU.
  RunResult r = Kvasir({"run", "--manifest", manifest, "--backends", "cpu", "-p",
                        "Once upon a time", "-n", "24", "--temp", "0", "-t", "1", "-c", "256"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  const nlohmann::json ref =
      ParseJson(ReadFileToString(AssetPath("reference/stories260K.p1.json")));
  EXPECT_EQ(r.out, ref["text"].get<std::string>());
  EXPECT_THAT(r.err, HasSubstr("gpu-box"));  // stages are named after the manifest's devices

  ExpectRuntimeError(Kvasir({"run", "--manifest", manifest, "-m",
                             AssetPath("models/stories260K-q8_0.gguf"), "-p", "hi"}),
                     "run", "is not the model");
  ExpectUsageError(Kvasir({"stage", "--manifest", manifest, "--rank", "9", "--listen",
                           "127.0.0.1:0", "--next", "127.0.0.1:1"}),
                   "stage", "--rank 9");
  // Where it listens: exactly one of --listen and --listen-fd, and the fd must be a listening
  // socket (stdin is /dev/null here).
  ExpectUsageError(Kvasir({"stage", "--manifest", manifest, "--rank", "0", "--next",
                           "127.0.0.1:1"}),
                   "stage", "--listen");
  ExpectUsageError(Kvasir({"stage", "--manifest", manifest, "--rank", "0", "--listen",
                           "127.0.0.1:0", "--listen-fd", "3", "--next", "127.0.0.1:1"}),
                   "stage", "--listen");
  ExpectRuntimeError(Kvasir({"stage", "-m", AssetPath(kStories), "--layers", "0:5",
                             "--listen-fd", "0", "--next", "127.0.0.1:1", "--insecure"}),
                     "stage", "fd 0");
}

// `kvasir profile` prints a devices.json entry that `kvasir plan` takes as it is.
TEST(CliTest, ProfileEntryFeedsThePlanner) {
  KV_REQUIRE_ASSET(kStories);
  RunResult r = Kvasir({"profile", "-m", AssetPath(kStories), "-n", "4", "-t", "1", "--name", "me"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  nlohmann::json entry = ParseJson(r.out);
  ASSERT_TRUE(entry.is_object()) << r.out;
  EXPECT_EQ(entry["name"], "me");
  EXPECT_GT(entry["ms_per_gib"].get<double>(), 0.0);
  EXPECT_GT(entry["memory_bytes"].get<uint64_t>(), 0u);
  TempDir dir;
  const std::string devices = dir.File("devices.json");
  std::ofstream(devices) << nlohmann::json{{"devices", {entry}}}.dump();
  RunResult plan = Kvasir({"plan", "-m", AssetPath(kStories), "--devices", devices});
  ASSERT_EQ(plan.code, 0) << Describe(plan);
  EXPECT_EQ(ParseJson(plan.out)["ranks"][0]["device"], "me");
  ExpectUsageError(Kvasir({"profile", "-m", AssetPath(kStories), "-n", "0"}), "profile", "-n");
}

}  // namespace
}  // namespace kvasir

// ---- market, join, generate --market ------------------------------------------------------

namespace kvasir {
namespace {

TEST(CliTest, MarketAndJoinFlagsAreCheckedBeforeAnything) {
  ExpectUsageError(Kvasir({"join"}), "join", "--market");
  ExpectUsageError(Kvasir({"join", "--market", "ftp://m.example"}), "join", "--market");
  ExpectUsageError(Kvasir({"join", "--market", "http://m.example", "--memory", "2XB"}), "join",
                   "--memory: '2XB': unknown unit");
  ExpectUsageError(Kvasir({"join", "--market", "http://m.example", "--poll", "0"}), "join",
                   "--poll");
  ExpectUsageError(Kvasir({"market"}), "market", "--db");
  ExpectUsageError(Kvasir({"market", "--db", "/tmp/x.sqlite", "--lease", "1"}), "market",
                   "--lease");
  ExpectUsageError(Kvasir({"market", "--db", "/tmp/x.sqlite", "--relay", "https://r"}), "market",
                   "--relay");
  ExpectUsageError(Kvasir({"generate", "--market", "http://m.example", "-p", "hi"}), "generate",
                   "--model NAME");
}

TEST(CliTest, AddModelRegistersOnceAndBalancesPrintATable) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string db = dir.File("m.sqlite");
  ExpectUsageError(Kvasir({"market", "add-model", "--db", db, "-m", AssetPath(kStories), "--url",
                           "not a url", "--windows", "3"}),
                   "market", "URL");
  ExpectRuntimeError(Kvasir({"market", "add-model", "--db", db, "-m", AssetPath(kStories), "--url",
                             "http://f.example/s.gguf", "--windows", "9"}),
                     "market", "--windows 9");
  RunResult ok = Kvasir({"market", "add-model", "--db", db, "-m", AssetPath(kStories), "--url",
                         "http://f.example/s.gguf", "--windows", "3"});
  ASSERT_EQ(ok.code, 0) << Describe(ok);
  EXPECT_THAT(ok.out, HasSubstr("model stories260K"));
  EXPECT_THAT(ok.out, HasSubstr("4:5"));
  ExpectRuntimeError(Kvasir({"market", "add-model", "--db", db, "-m", AssetPath(kStories), "--url",
                             "http://f.example/s.gguf", "--windows", "3"}),
                     "market", "already registered");
  RunResult b = Kvasir({"market", "balances", "--db", db});
  ASSERT_EQ(b.code, 0) << Describe(b);
  EXPECT_THAT(b.out, HasSubstr("credit"));
}

TEST(CliTest, GenerateOnAMarketThatIsNotThereNamesIt) {
  RunResult r = Kvasir({"generate", "--market", "http://127.0.0.1:1", "--model", "x", "--market-wait",
                        "1", "-p", "hi"});
  EXPECT_EQ(r.code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("127.0.0.1:1"));
}

}  // namespace
}  // namespace kvasir
