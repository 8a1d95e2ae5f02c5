// Rings whose stages fetch their windows: `kvasir stage --fetch` processes against nginx, and a
// plan made from a URL run with `kvasir run`; both give the full model's tokens.
#include "fetch_test_fixture.h"

namespace kvasir {
namespace {

using namespace fetch_testing;  // NOLINT: the fixture's helpers
using testing::AssetPath;
using ::testing::HasSubstr;
using testing::Nginx;

class FetchRingTest : public FetchTest {};

// A stage that fetches its window from `url` into `slice_dir`; asked to stop (SIGTERM) at the end.
std::unique_ptr<testing::ChildProcess> FetchingStage(const std::string& url,
                                                     const std::string& layers, int listen_fd,
                                                     uint16_t next, const std::string& slice_dir,
                                                     const std::string& log) {
  return std::make_unique<testing::ChildProcess>(
      testing::StageProcessArgs({"--fetch", url, "--slice-dir", slice_dir}, layers, listen_fd,
                                next, "f" + layers.substr(0, layers.find(':')), "info"),
      log, SIGTERM, std::vector<int>{listen_fd});
}

// `kvasir stage --fetch` processes: each fetches its window from nginx, the ring generates the
// full model's tokens; started again, they reuse the verified slices instead of downloading.
TEST_F(FetchRingTest, StagesFetchTheirWindowsAndTheRingMatchesTheFullModel) {
  KV_REQUIRE_ASSET(kStories);
  KV_START_NGINX(nginx, NginxOptions());
  TempDir slices, logs;
  SamplingParams greedy;
  greedy.temperature = 0;
  const std::string prompt = "Once upon a time";
  const testing::Generation local =
      testing::GenerateLocally(AssetPath(kStories), prompt, greedy, 24);
  const std::vector<std::string> windows = {"0:2", "2:4", "4:5"};
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(round == 0 ? "fetching" : "reusing");
    const testing::BoundPorts ports(3);
    std::vector<std::unique_ptr<testing::ChildProcess>> stages;
    for (int i = 0; i < 3; ++i) {
      stages.push_back(FetchingStage(
          nginx->Url("/stories260K.gguf"), windows[i], ports.fd(i), ports[(i + 1) % 3], slices.path(),
          logs.File(fmt::format("stage{}-{}.log", i, round))));
    }
    const testing::Generation ring =
        testing::GenerateOnRing(fmt::format("127.0.0.1:{}", ports[0]), prompt, greedy, 24);
    EXPECT_EQ(ring.ids, local.ids);
    EXPECT_EQ(ring.text, local.text);
    for (int i = 0; i < 3; ++i) {
      const std::string log = stages[i]->log();
      EXPECT_THAT(log, HasSubstr(round == 0 ? "fetched layers" : "not downloading")) << log;
    }
  }
  EXPECT_TRUE(std::filesystem::exists(slices.File("stories260K.layers-2-4.gguf")));
}

// plan -m URL reads only the header; plan -m FILE --url URL adds the hashes; `run --manifest`
// with a URL model starts stages that fetch (and verify) their own windows.
TEST_F(FetchRingTest, PlanFromAUrlAndRunARingThatFetchesItsWindows) {
  KV_REQUIRE_ASSET(kStories);
  KV_START_NGINX(nginx, NginxOptions());
  TempDir work, cache;
  const std::string url = nginx->Url("/stories260K.gguf");
  const std::string devices = work.File("devices.json");
  // Budgets that fit one or two of stories260K's layers each: the plan needs all three devices.
  std::ofstream(devices) << R"({"devices": [
    {"name": "a", "memory_bytes": 67900000, "ms_per_gib": 10, "link": {"rtt_ms": 0.1}},
    {"name": "b", "memory_bytes": 67900000, "ms_per_gib": 10, "link": {"rtt_ms": 0.1}},
    {"name": "c", "memory_bytes": 67900000, "ms_per_gib": 10, "link": {"rtt_ms": 0.1}}]})";

  CliRun r =
      Kvasir({"plan", "-m", url, "--devices", devices, "--ctx", "256", "-o", work.File("url.json")},
             cache.path());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("tensor hashes left out"));
  auto from_url = nlohmann::json::parse(ReadFileToString(work.File("url.json")));
  EXPECT_EQ(from_url["model"], url);
  ASSERT_EQ(from_url["ranks"].size(), 3u);
  EXPECT_FALSE(from_url["ranks"][0]["tensors"][0].contains("sha256"));

  r = Kvasir({"plan", "-m", AssetPath(kStories), "--url", url, "--devices", devices, "--ctx", "256",
              "-o", work.File("m.json")},
             cache.path());
  ASSERT_EQ(r.code, 0) << r.err;
  auto manifest = nlohmann::json::parse(ReadFileToString(work.File("m.json")));
  EXPECT_EQ(manifest["model"], url);
  EXPECT_EQ(manifest["model_id"], from_url["model_id"]);
  EXPECT_TRUE(manifest["ranks"][2]["tensors"][0].contains("sha256"));

  r = Kvasir({"run", "--manifest", work.File("m.json"), "-p", "Once upon a time", "-n", "24",
              "--temp", "0", "-t", "1", "--stage-log-level", "info"},
             cache.path());
  ASSERT_EQ(r.code, 0) << r.err;
  SamplingParams greedy;
  greedy.temperature = 0;
  EXPECT_EQ(r.out,
            testing::GenerateLocally(AssetPath(kStories), "Once upon a time", greedy, 24).text);
  EXPECT_THAT(r.err, HasSubstr("verified: "));
  EXPECT_THAT(r.err, HasSubstr("tensors SHA-256"));
  for (const auto& rank : manifest["ranks"]) {
    const std::string slice =
        cache.File(fmt::format("stories260K.layers-{}-{}.gguf", rank["layers"][0].get<int>(),
                               rank["layers"][1].get<int>()));
    EXPECT_TRUE(std::filesystem::exists(slice)) << slice;
  }

  // A corrupted slice in the cache is not trusted: its digest differs, so it is fetched again.
  const std::string first = cache.File(
      fmt::format("stories260K.layers-0-{}.gguf", manifest["ranks"][0]["layers"][1].get<int>()));
  {
    std::fstream f(first, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-100, std::ios::end);
    f.write("corrupt", 7);
  }
  r = Kvasir({"run", "--manifest", work.File("m.json"), "-p", "Once upon a time", "-n", "24",
              "--temp", "0", "-t", "1", "--stage-log-level", "info"},
             cache.path());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("not reusing"));
  EXPECT_EQ(r.out,
            testing::GenerateLocally(AssetPath(kStories), "Once upon a time", greedy, 24).text);
}

}  // namespace
}  // namespace kvasir
