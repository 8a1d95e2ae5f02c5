// `kvasir generate --draft`: speculative decoding end to end. Greedy text with each drafter is the
// llama.cpp reference text, --stats reports what was drafted and accepted, and impossible drafter
// choices are refused before any work.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::Describe;
using ::testing::HasSubstr;
using testing::ReadFileToString;
using testing::RunResult;
using testing::TempDir;

constexpr const char* kStories = "models/stories260K.gguf";

RunResult Kvasir(const std::vector<std::string>& args) { return testing::RunKvasir(args); }

nlohmann::json ParseJson(const std::string& text) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON:\n" << text;
  return j;
}

TEST(CliSpecTest, GreedyTextWithEachDrafterIsTheReference) {
  KV_REQUIRE_ASSET(kStories);
  KV_REQUIRE_ASSET("reference/stories260K.p1.json");
  const nlohmann::json ref =
      ParseJson(ReadFileToString(AssetPath("reference/stories260K.p1.json")));
  const std::vector<std::vector<std::string>> drafters = {
      {"--draft", "ngram"},
      {"--draft", "model", "--draft-model", AssetPath(kStories), "--draft-max", "3"},
      {"--draft", "auto", "--draft-model", AssetPath("models/stories260K-q8_0.gguf")},
  };
  for (const auto& flags : drafters) {
    TempDir dir;
    std::vector<std::string> args = {"generate",
                                     "-m",
                                     AssetPath(kStories),
                                     "-p",
                                     ref["prompt"].get<std::string>(),
                                     "-n",
                                     "24",
                                     "--temp",
                                     "0",
                                     "-t",
                                     "1",
                                     "--stats",
                                     dir.File("stats.json")};
    args.insert(args.end(), flags.begin(), flags.end());
    RunResult r = Kvasir(args);
    ASSERT_EQ(r.code, 0) << Describe(r);
    EXPECT_EQ(r.out, ref["text"].get<std::string>()) << flags[1];
    EXPECT_THAT(r.err, HasSubstr("generated: 24 tokens"));
    const nlohmann::json s = ParseJson(ReadFileToString(dir.File("stats.json")));
    const nlohmann::json& spec = s["speculation"];
    EXPECT_EQ(spec["drafter"], flags[1] == "ngram" ? "ngram" : "model");
    EXPECT_LE(spec["accepted"].get<int>(), spec["drafted"].get<int>());
    EXPECT_EQ(s["n_generated"], 24);
    if (flags[1] == "model") {
      // The model drafting for itself: every draft is taken, up to 4 tokens a step.
      EXPECT_GT(spec["drafted"].get<int>(), 0);
      EXPECT_EQ(spec["accepted"], spec["drafted"]);
      EXPECT_EQ(spec["acceptance"], 1.0);
      EXPECT_LE(s["decode_steps"].get<int>(), 8);
      EXPECT_THAT(r.err, HasSubstr("drafts:    model"));
    }
  }
}

// With temperature the RNG advances one draw per token, drafts or not: a seed gives the same text
// again, and the text it gives without drafts.
TEST(CliSpecTest, ASeedRepeatsASampledSpeculativeRun) {
  KV_REQUIRE_ASSET(kStories);
  const std::vector<std::string> args = {"generate",
                                         "-m",
                                         AssetPath(kStories),
                                         "-p",
                                         "Once upon a time",
                                         "-n",
                                         "32",
                                         "--temp",
                                         "0.9",
                                         "--seed",
                                         "11",
                                         "--draft",
                                         "model",
                                         "--draft-model",
                                         AssetPath("models/stories260K-q8_0.gguf")};
  RunResult a = Kvasir(args);
  ASSERT_EQ(a.code, 0) << Describe(a);
  RunResult b = Kvasir(args);
  ASSERT_EQ(b.code, 0) << Describe(b);
  EXPECT_EQ(a.out, b.out);
  EXPECT_FALSE(a.out.empty());
  EXPECT_THAT(a.err, HasSubstr("drafts:    model"));
  RunResult plain = Kvasir(std::vector<std::string>(args.begin(), args.end() - 4));
  ASSERT_EQ(plain.code, 0) << Describe(plain);
  EXPECT_EQ(plain.out, a.out);
}

TEST(CliSpecTest, WithoutDraftingStatsSayNone) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  RunResult r = Kvasir({"generate", "-m", AssetPath(kStories), "-p", "Once upon a time", "-n", "4",
                        "--temp", "0", "--stats", dir.File("s.json")});
  ASSERT_EQ(r.code, 0) << Describe(r);
  const nlohmann::json s = ParseJson(ReadFileToString(dir.File("s.json")));
  EXPECT_EQ(s["speculation"]["drafter"], "none");
  EXPECT_EQ(s["speculation"]["drafted"], 0);
}

TEST(CliSpecTest, ImpossibleChoicesAreRefused) {
  KV_REQUIRE_ASSET(kStories);
  const std::string m = AssetPath(kStories);
  // stories260K has no multi-token-prediction block to draft with.
  RunResult bad = Kvasir({"generate", "-m", m, "-p", "hi", "--draft", "mtp"});
  EXPECT_NE(bad.code, 0) << Describe(bad);
  EXPECT_THAT(bad.err, HasSubstr("--draft mtp"));
  RunResult no_model = Kvasir({"generate", "-m", m, "-p", "hi", "--draft", "model"});
  EXPECT_NE(no_model.code, 0);
  EXPECT_THAT(no_model.err, HasSubstr("--draft-model FILE"));
  RunResult too_many = Kvasir({"generate", "-m", m, "-p", "hi", "--draft-max", "65"});
  EXPECT_EQ(too_many.code, 2) << Describe(too_many);
  EXPECT_THAT(too_many.err, HasSubstr("--draft-max"));
  RunResult ring = Kvasir({"generate", "--ring", "127.0.0.1:1", "-p", "hi", "--draft", "ngram"});
  EXPECT_EQ(ring.code, 2) << Describe(ring);
  EXPECT_THAT(ring.err, HasSubstr("--draft runs with -m only"));
  KV_REQUIRE_ASSET("models/llama-2-tiny-random.gguf");
  RunResult vocab = Kvasir({"generate", "-m", m, "-p", "hi", "--draft", "model", "--draft-model",
                            AssetPath("models/llama-2-tiny-random.gguf")});
  EXPECT_NE(vocab.code, 0);
  EXPECT_THAT(vocab.err, HasSubstr("vocabulary of 32000 tokens, but the model's has 512"));
}

// `synth --nextn 1` appends a multi-token-prediction block after the stack; the stack itself keeps
// its bytes, so the model (which does not run the block) generates the same text.
TEST(CliSpecTest, SynthWritesNextnBlocksAfterTheStack) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  auto synth = [&](const std::string& out, const std::string& nextn) {
    std::vector<std::string> args = testing::HybridSynthArgs(out, "qwen35moe", "q8_0", "5");
    args.insert(args.end(), {"--nextn", nextn});
    return Kvasir(args);
  };
  const std::string plain = dir.File("plain.gguf"), mtp = dir.File("mtp.gguf");
  RunResult a = synth(plain, "0");
  ASSERT_EQ(a.code, 0) << Describe(a);
  RunResult b = synth(mtp, "1");
  ASSERT_EQ(b.code, 0) << Describe(b);
  auto f = GgufFile::Open(mtp);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->GetUint("qwen35moe.block_count").value(), 5u);
  EXPECT_EQ(f->GetUint("qwen35moe.nextn_predict_layers").value(), 1u);
  for (const char* t : {"blk.4.attn_q.weight", "blk.4.ffn_up_exps.weight",
                        "blk.4.nextn.eh_proj.weight", "blk.4.nextn.enorm.weight",
                        "blk.4.nextn.hnorm.weight", "blk.4.nextn.shared_head_norm.weight"}) {
    EXPECT_NE(f->FindTensor(t), nullptr) << t;
  }
  EXPECT_EQ(f->FindTensor("blk.4.nextn.eh_proj.weight")->ne[0], 128u);

  std::string text;
  for (const std::string& m : {plain, mtp}) {
    RunResult g = Kvasir({"generate", "-m", m, "-p", "Once upon a time", "-n", "12", "--temp", "0",
                          "--ignore-eos", "--draft", "ngram"});
    ASSERT_EQ(g.code, 0) << Describe(g);
    if (text.empty()) text = g.out;
    EXPECT_EQ(g.out, text);
  }
  RunResult llama =
      Kvasir({"synth", "--arch", "llama", "--layers", "1", "--embd", "64", "--heads", "4", "--ff",
              "64", "--vocab-from", AssetPath(kStories), "--nextn", "1", "-o", dir.File("x.gguf")});
  EXPECT_EQ(llama.code, 2) << Describe(llama);
  EXPECT_THAT(llama.err, HasSubstr("--nextn"));
}

}  // namespace
}  // namespace kvasir
