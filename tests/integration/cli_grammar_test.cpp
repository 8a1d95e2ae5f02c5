// `generate` and `run` under --json-schema-file / --grammar-file: the answer follows the schema,
// one process draws exactly as a ring of three stages does, and a schema or grammar the engine
// cannot honour is a usage error naming what is wrong, before any model is read.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::Describe;
using testing::ExpectUsageError;
using testing::RunKvasir;
using testing::RunResult;

constexpr const char* kStories = "models/stories260K.gguf";
constexpr const char* kSchema = R"({
  "type": "object",
  "properties": {
    "hero": {"type": "string", "minLength": 1, "maxLength": 12},
    "age": {"type": "integer", "minimum": 1, "maximum": 99},
    "mood": {"enum": ["happy", "sad", "sleepy"]}
  },
  "required": ["hero", "age", "mood"],
  "additionalProperties": false
})";

std::string Write(const testing::TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.path() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

void ExpectFollowsSchema(const std::string& out) {
  const auto j = nlohmann::json::parse(out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << "not JSON: " << out;
  ASSERT_TRUE(j.is_object()) << out;
  EXPECT_EQ(j.size(), 3u) << out;
  ASSERT_TRUE(j["hero"].is_string()) << out;
  ASSERT_TRUE(j["age"].is_number_integer()) << out;
  EXPECT_GE(j["age"].get<int>(), 1);
  EXPECT_LE(j["age"].get<int>(), 99);
  EXPECT_TRUE(j["mood"] == "happy" || j["mood"] == "sad" || j["mood"] == "sleepy") << out;
}

TEST(CliGrammarTest, OneProcessAndARingAnswerTheSameUnderASchema) {
  KV_REQUIRE_ASSET(kStories);
  testing::TempDir dir;
  const std::string schema = Write(dir, "schema.json", kSchema);
  for (const std::string temp : {"0", "0.9"}) {
    SCOPED_TRACE("temperature " + temp);
    const std::vector<std::string> request = {
        "-p", "Once upon a time",   "-n",  "300", "--temp", temp, "--seed",
        "5",  "--json-schema-file", schema};
    std::vector<std::string> local = {"generate", "-m", AssetPath(kStories)};
    local.insert(local.end(), request.begin(), request.end());
    const RunResult one = RunKvasir(local);
    ASSERT_EQ(one.code, 0) << Describe(one);
    EXPECT_THAT(one.err, ::testing::HasSubstr("stop: eog"));
    ExpectFollowsSchema(one.out);
    std::vector<std::string> ring = {"run", "-m", AssetPath(kStories), "--stages", "3"};
    ring.insert(ring.end(), request.begin(), request.end());
    const RunResult three = RunKvasir(ring);
    ASSERT_EQ(three.code, 0) << Describe(three);
    EXPECT_EQ(three.out, one.out);
  }
}

TEST(CliGrammarTest, AGrammarFileConstrainsTheText) {
  KV_REQUIRE_ASSET(kStories);
  testing::TempDir dir;
  const std::string g =
      Write(dir, "yesno.gbnf", "root ::= (\"yes\" | \"no\") \", \" [a-z]{3,8} \".\"\n");
  const RunResult r = RunKvasir({"generate", "-m", AssetPath(kStories), "-p", "Is it?", "-n", "40",
                                 "--temp", "0.8", "--seed", "3", "--grammar-file", g});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.out, ::testing::MatchesRegex("(yes|no), [a-z]{3,8}\\.\n?")) << r.out;
}

TEST(CliGrammarTest, WhatCannotBeHonouredIsAUsageError) {
  testing::TempDir dir;
  const std::string bad_schema = Write(dir, "bad.json", R"({"type": "integer", "multipleOf": 7})");
  ExpectUsageError(RunKvasir({"generate", "-m", "/nonexistent.gguf", "-p", "x",
                              "--json-schema-file", bad_schema}),
                   "generate", "multipleOf");
  const std::string bad_grammar = Write(dir, "bad.gbnf", "root ::= vaule\n");
  ExpectUsageError(
      RunKvasir({"run", "-m", "/nonexistent.gguf", "-p", "x", "--grammar-file", bad_grammar}),
      "run", "vaule");
  ExpectUsageError(RunKvasir({"generate", "-m", "/nonexistent.gguf", "-p", "x", "--grammar-file",
                              dir.path() + "/missing.gbnf"}),
                   "generate", "missing.gbnf");
  ExpectUsageError(RunKvasir({"generate", "-m", "/nonexistent.gguf", "-p", "x", "--grammar-file",
                              bad_grammar, "--draft", "ngram"}),
                   "generate", "--draft");
}

}  // namespace
}  // namespace kvasir
