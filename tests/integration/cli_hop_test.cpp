// `kvasir bench --stages` and the --hop-* flags of `bench` and `run`, end to end: a local ring
// behind delaying proxies, and every flag checked before anything starts.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string>

#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::Describe;
using testing::ExpectUsageError;
using ::testing::HasSubstr;
using testing::RunKvasir;
using testing::RunResult;

constexpr const char* kStories = "models/stories260K.gguf";

TEST(CliHopTest, BenchOnALocalRingWaitsForEveryDelayedHop) {
  KV_REQUIRE_ASSET(kStories);
  RunResult r =
      RunKvasir({"bench", "-m", AssetPath(kStories), "--stages", "2", "-t", "1", "--streams", "1",
                 "-p", "8", "-n", "8", "-r", "1", "--hop-delay-ms", "10", "--json"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  nlohmann::json j = nlohmann::json::parse(r.out, nullptr, /*allow_exceptions=*/false);
  ASSERT_FALSE(j.is_discarded()) << r.out;
  EXPECT_EQ(j["stages"], 2);
  EXPECT_THAT(j["links"].get<std::string>(), HasSubstr("10 ms one-way delay per hop"));
  ASSERT_EQ(j["rows"].size(), 1u);
  // Two hops of 10 ms per token: at most 50 tokens/s, however fast the stages are.
  const double tps = j["rows"][0]["per_stream_decode_tokens_per_s"].get<double>();
  EXPECT_GT(tps, 0.0);
  EXPECT_LE(tps, 50.0);
}

TEST(CliHopTest, HopFlagsAreCheckedBeforeAnythingStarts) {
  KV_REQUIRE_ASSET(kStories);
  const std::string m = AssetPath(kStories);
  ExpectUsageError(RunKvasir({"bench", "-m", m, "--hop-delay-ms", "5"}), "bench", "need --stages");
  ExpectUsageError(RunKvasir({"bench", "-m", m, "--stages", "2", "--hop-delay-ms", "-1"}), "bench",
                   "--hop-delay-ms -1");
  ExpectUsageError(RunKvasir({"bench", "-m", m, "--stages", "2", "--hop-jitter-ms", "2",
                              "--hop-jitter", "pareto"}),
                   "bench", "--hop-jitter 'pareto'");
  ExpectUsageError(RunKvasir({"bench", "-m", m, "--stages", "99"}), "bench", "--stages 99");
  ExpectUsageError(RunKvasir({"bench", "-m", m, "--stages", "2", "--streams", "0"}), "bench",
                   "--streams 0");
  ExpectUsageError(RunKvasir({"bench", "-m", m, "--stages", "2", "--insecure"}), "bench",
                   "its own secret");
  ExpectUsageError(RunKvasir({"bench", "--ring", "127.0.0.1:1", "-m", m, "--stages", "2"}), "bench",
                   "either --stages or --ring");
  ExpectUsageError(
      RunKvasir({"run", "-m", m, "--stages", "2", "-p", "hi", "--relay", "--hop-delay-ms", "5"}),
      "run", "either --relay or the --hop-* flags");
  ExpectUsageError(RunKvasir({"run", "-m", m, "--stages", "2", "-p", "hi", "--hop-mbps", "-3"}),
                   "run", "--hop-mbps -3");
}

}  // namespace
}  // namespace kvasir
