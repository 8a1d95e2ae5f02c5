// `kvasir market add-model` end to end: the context a session can earn for is bounded by the
// model's, the credit bound per ring is estimated or given, and both reach the market's map; the
// flags that set them are checked before anything is read.
#include <gtest/gtest.h>

#include "kvasir_process.h"
#include "market/api.h"
#include "market/market_server.h"
#include "market/store.h"
#include "market_test_util.h"
#include "test_assets.h"

namespace kvasir::market {
namespace {

using kvasir::testing::AssetPath;
using kvasir::testing::Describe;
using kvasir::testing::RunKvasir;
using ::testing::HasSubstr;

constexpr const char* kStories = "models/stories260K.gguf";

nlohmann::json MapOf(const std::string& db) {
  auto store = Store::Open(db);
  EXPECT_TRUE(store.ok()) << store.status().message();
  MarketApi api(store->get(), {});
  return kvasir::testing::Body(api.Handle(kvasir::testing::Plain("GET", "/v1/map"), UnixNow()));
}

TEST(MarketCliTest, AddModelBoundsTheContextAndTheRateOfCredit) {
  KV_REQUIRE_ASSET(kStories);
  kvasir::testing::TempDir dir;
  auto add = [&](const std::string& db, std::vector<std::string> extra) {
    std::vector<std::string> args = {"market",    "add-model",
                                     "--db",      dir.File(db),
                                     "-m",        AssetPath(kStories),
                                     "--url",     "http://f.example/s.gguf",
                                     "--windows", "3"};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunKvasir(args);
  };
  // Defaults: the model's trained context (2048 here), and the estimated bound.
  auto r = add("a.sqlite", {});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.out, HasSubstr("ctx 2048"));
  EXPECT_THAT(r.out, HasSubstr("credit for at most 1024000 rows/s per ring"));
  nlohmann::json m = MapOf(dir.File("a.sqlite"))["models"][0];
  EXPECT_EQ(m["ctx"], 2048);
  EXPECT_DOUBLE_EQ(m["max_rows_per_s"].get<double>(), 1024000.0);

  r = add("b.sqlite", {"--ctx", "128", "--max-rows-per-s", "5000"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  m = MapOf(dir.File("b.sqlite"))["models"][0];
  EXPECT_EQ(m["ctx"], 128);
  EXPECT_DOUBLE_EQ(m["max_rows_per_s"].get<double>(), 5000.0);

  kvasir::testing::ExpectRuntimeError(add("c.sqlite", {"--ctx", "4096"}), "market",
                                      "trained for a context of 2048 tokens");
  kvasir::testing::ExpectUsageError(add("c.sqlite", {"--max-rows-per-s", "-4"}), "market",
                                    "--max-rows-per-s");
  kvasir::testing::ExpectUsageError(add("c.sqlite", {"--ctx", "-1"}), "market", "--ctx");
}

TEST(MarketCliTest, GenerateTakesACertificateOnlyForAMarket) {
  kvasir::testing::ExpectUsageError(
      RunKvasir({"generate", "--ring", "127.0.0.1:1", "--ca", KVASIR_BINARY, "-p", "hi"}),
      "generate", "--ca goes with --market");
}

}  // namespace
}  // namespace kvasir::market
