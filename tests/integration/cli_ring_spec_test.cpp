// `--draft` on the ring commands, end to end: `kvasir run` prints the same text with and without
// speculation (prompt lookup, a draft model, the model's own nextn block) and reports the last
// stage's drafts in --stats; `bench --stages` reports them in
// its JSON; impossible drafter choices are refused before any stage starts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::Describe;
using ::testing::HasSubstr;
using testing::ReadFileToString;
using testing::RunKvasir;
using testing::RunResult;
using testing::TempDir;

constexpr const char* kStories = "models/stories260K.gguf";
const char* const kPrompt = "The cat sat on the mat. The cat sat on the mat. The cat";
const char* const kMtpPrompt = "Once upon a time";

std::vector<std::string> RunArgs(const std::vector<std::string>& extra) {
  std::vector<std::string> args = {
      "run",    "-m", AssetPath(kStories), "--stages", "3", "-t", "1", "-p", kPrompt, "-n", "40",
      "--temp", "0"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

TEST(CliRingSpecTest, RunDraftsOnTheLastStageAndPrintsTheSameText) {
  KV_REQUIRE_ASSET(kStories);
  const RunResult plain = RunKvasir(RunArgs({}));
  ASSERT_EQ(plain.code, 0) << Describe(plain);
  for (const std::vector<std::string>& flags : std::vector<std::vector<std::string>>{
           {"--draft", "ngram"},
           {"--draft", "model", "--draft-model", AssetPath(kStories), "--draft-max", "3"},
           {"--draft", "model", "--draft-model", AssetPath(kStories), "--draft-max", "3",
            "--draft-windows", "3"}}) {
    TempDir dir;
    std::vector<std::string> extra = flags;
    extra.insert(extra.end(), {"--stats", dir.File("stats.json")});
    const RunResult r = RunKvasir(RunArgs(extra));
    ASSERT_EQ(r.code, 0) << Describe(r);
    EXPECT_EQ(r.out, plain.out) << "greedy text is the text without speculation";
    EXPECT_THAT(r.err, HasSubstr("drafts:    " + flags[1] + " on the last stage"));
    const nlohmann::json j = nlohmann::json::parse(ReadFileToString(dir.File("stats.json")),
                                                   nullptr, /*allow_exceptions=*/false);
    ASSERT_FALSE(j.is_discarded());
    ASSERT_EQ(j["stages"].size(), 3u);
    EXPECT_FALSE(j["stages"][0].contains("draft"));
    const nlohmann::json& d = j["stages"][2]["draft"];
    EXPECT_EQ(d["drafter"], flags[1]);
    EXPECT_GT(d["accepted"].get<int>(), 0);
    EXPECT_LE(d["accepted"].get<int>(), d["drafted"].get<int>());
  }
}

// --draft mtp (and auto, on a model with a nextn block) drafts with the model's own block on the
// last stage, whose slice keeps it: the same greedy text, and the same drafts as `generate --draft
// mtp` in one process (steps, drafted and accepted in --stats; seed 24 makes one draft accepted,
// which a wrong hidden row would lose). On a model without the block `run` and `bench` refuse it
// first.
TEST(CliRingSpecTest, RunDraftsWithTheModelsOwnNextnBlock) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string model = dir.File("nextn.gguf");
  std::vector<std::string> synth = testing::HybridSynthArgs(model, "qwen35moe", "f32", "24");
  synth.insert(synth.end(), {"--nextn", "1"});
  ASSERT_EQ(RunKvasir(synth).code, 0);
  auto run = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"run",      "-m", model, "-t",     "1", "-p",
                                     kMtpPrompt, "-n", "40",  "--temp", "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunKvasir(args);
  };
  auto read_json = [](const std::string& path) {
    return nlohmann::json::parse(ReadFileToString(path), nullptr, /*allow_exceptions=*/false);
  };
  const RunResult local =
      RunKvasir({"generate", "-m", model, "-t", "1", "-p", kMtpPrompt, "-n", "40", "--temp", "0",
                 "--draft", "mtp", "--stats", dir.File("local.json")});
  ASSERT_EQ(local.code, 0) << Describe(local);
  const nlohmann::json want = read_json(dir.File("local.json"))["speculation"];
  ASSERT_GT(want["accepted"].get<int>(), 0) << want.dump();
  const RunResult plain = run({"--stages", "3"});
  ASSERT_EQ(plain.code, 0) << Describe(plain);
  for (const std::vector<std::string>& flags :
       std::vector<std::vector<std::string>>{{"--stages", "3", "--draft", "mtp"},
                                             {"--stages", "1", "--draft", "mtp"},
                                             {"--stages", "3", "--draft", "auto"}}) {
    const std::string stats = dir.File(flags[1] + flags[3] + ".json");
    std::vector<std::string> extra = flags;
    extra.insert(extra.end(), {"--stats", stats});
    const RunResult r = run(extra);
    ASSERT_EQ(r.code, 0) << Describe(r);
    EXPECT_EQ(r.out, plain.out) << flags[3] << ": greedy text is the text without speculation";
    EXPECT_THAT(r.err, HasSubstr("drafts:    mtp on the last stage"));
    const nlohmann::json j = read_json(stats);
    ASSERT_FALSE(j.is_discarded());
    const nlohmann::json& d = j["stages"].back()["draft"];
    EXPECT_EQ(d["drafter"], "mtp");
    for (const char* key : {"steps", "drafted", "accepted"}) {
      EXPECT_EQ(d[key], want[key]) << key << ", " << flags[1] << " stages: " << d.dump();
    }
  }
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"run", "-m", AssetPath(kStories), "--stages", "2", "-p", "hi", "--draft", "mtp"},
           {"bench", "-m", AssetPath(kStories), "--stages", "2", "--draft", "mtp"}}) {
    const RunResult refused = RunKvasir(args);
    EXPECT_EQ(refused.code, 2) << args[0] << ": a usage error, before any stage starts";
    EXPECT_THAT(refused.err, HasSubstr("multi-token-prediction block")) << args[0];
  }
}

TEST(CliRingSpecTest, BenchReportsTheDrafts) {
  KV_REQUIRE_ASSET(kStories);
  const RunResult r = RunKvasir({"bench",
                                 "-m",
                                 AssetPath(kStories),
                                 "--stages",
                                 "2",
                                 "-t",
                                 "1",
                                 "--streams",
                                 "1",
                                 "-p",
                                 "16",
                                 "-n",
                                 "16",
                                 "-r",
                                 "1",
                                 "--draft",
                                 "model",
                                 "--draft-model",
                                 AssetPath(kStories),
                                 "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  const nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  ASSERT_EQ(j["drafts"].size(), 1u);
  EXPECT_EQ(j["drafts"][0]["drafter"], "model");
  EXPECT_EQ(j["drafts"][0]["stage"], 1);
  EXPECT_GT(j["drafts"][0]["drafted"].get<int>(), 0);
  EXPECT_EQ(j["drafts"][0]["acceptance"].get<double>(), 1.0) << "the model drafting for itself";
}

TEST(CliRingSpecTest, ImpossibleDrafterChoicesAreRefusedFirst) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"run", "-m", "/nonexistent.gguf", "-p", "x", "--draft", "bogus"}, "not a drafter"},
      {{"run", "-m", "/nonexistent.gguf", "-p", "x", "--draft", "model"}, "needs --draft-model"},
      {{"run", "-m", "/nonexistent.gguf", "-p", "x", "--draft-max", "17"}, "--draft-max 17"},
      {{"run", "-m", "/nonexistent.gguf", "-p", "x", "--draft-windows", "5"},
       "--draft-windows 5: must be from 1 to 4"},
      {{"serve", "-m", "/nonexistent.gguf", "--draft", "ngram", "--draft-model", "/x.gguf"},
       "goes with --draft model or auto"},
      {{"bench", "-m", "/nonexistent.gguf", "--draft", "ngram"}, "--draft needs --stages"},
      {{"stage", "-m", "/nonexistent.gguf", "--layers", "0:1", "--listen", "127.0.0.1:0", "--next",
        "127.0.0.1:1", "--draft", "model", "--draft-model", "/nonexistent.gguf"},
       "--draft-model /nonexistent.gguf: no such file"},
  };
  for (const auto& [args, message] : cases) {
    const RunResult r = RunKvasir(args);
    EXPECT_EQ(r.code, 2) << Describe(r);
    EXPECT_THAT(r.err, HasSubstr(message)) << Describe(r);
  }
}

}  // namespace
}  // namespace kvasir
