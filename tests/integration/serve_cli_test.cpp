// `kvasir serve` as a process: flags refused before anything starts, and the one-stage ring in its
// own process (--stages 1) serving requests and stopping cleanly on SIGTERM.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "http_test_client.h"
#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir::testing {
namespace {

using ::testing::HasSubstr;

constexpr const char* kModel = "models/stories260K.gguf";

// Waits until `done()` holds, checking every 10 ms, for at most `ms`.
bool WaitFor(const std::function<bool()>& done, int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (!done()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

TEST(ServeCliTest, FlagsAreCheckedBeforeAnythingStarts) {
  KV_REQUIRE_ASSET(kModel);
  const std::string model = AssetPath(kModel);
  for (const auto& [args, mentions] :
       std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"serve"}, "a model is required"},
           {{"serve", "--ring", "127.0.0.1:1", "-m", model}, "drop -m"},
           {{"serve", "--ring", "127.0.0.1:1", "--market", "http://x"}, "use one of"},
           {{"serve", "--market", "http://127.0.0.1:1"}, "--market needs --model NAME"},
           {{"serve", "-m", model, "--chat-template", "nope"}, "--chat-template"},
           {{"serve", "-m", model, "--max-sessions", "0"}, "--max-sessions"},
           {{"serve", "-m", model, "--max-body", "12"}, "--max-body"},
           {{"serve", "-m", model, "--vocab", model}, "--vocab is for --ring"},
           {{"serve", "-m", model, "--head-key", std::string(64, 'a')}, "trust flags"},
           {{"serve", "--ring", "127.0.0.1:1", "--stages", "3"}, "--stages"},
           {{"serve", "-m", model, "--stats-interval", "0"}, "--stats-interval"},
       }) {
    SCOPED_TRACE(args.back());
    ExpectUsageError(RunKvasir(args), "serve", mentions);
  }
}

TEST(ServeCliTest, AShortApiKeyIsRefused) {
  KV_REQUIRE_ASSET(kModel);
  TempDir dir;
  const std::string key = dir.File("api.key");
  std::ofstream(key) << "short\n";
  ::chmod(key.c_str(), 0600);
  ExpectRuntimeError(
      RunKvasir({"serve", "-m", AssetPath(kModel), "--api-key-file", key}), "serve", "api.key");
}

TEST(ServeCliTest, OneStageInItsOwnProcessServesAndStopsOnSigterm) {
  KV_REQUIRE_ASSET(kModel);
  TempDir dir;
  const std::string log = dir.File("serve.log");
  ChildProcess serve({KVASIR_BINARY, "serve", "-m", AssetPath(kModel), "--stages", "1",
                      "--listen", "127.0.0.1:0", "--stats-interval", "0.05"},
                     log, SIGTERM);
  int port = 0;
  ASSERT_TRUE(WaitFor(
      [&] {
        std::smatch m;
        const std::string text = ReadFileToString(log);
        if (!std::regex_search(text, m, std::regex("serve: listening on [0-9.]+:([0-9]+)"))) {
          return false;
        }
        port = std::stoi(m[1]);
        return true;
      },
      60000))
      << ReadFileToString(log);
  HttpAnswer health;
  ASSERT_TRUE(WaitFor(
      [&] {
        TestHttp h(static_cast<uint16_t>(port));
        h.Send("GET", "/health");
        health = h.ReadWhole();
        return health.status == 200;
      },
      60000))
      << health.body;
  const auto j = nlohmann::json::parse(health.body);
  ASSERT_EQ(j["stages"].size(), 1u) << "one stage, holding every layer";
  EXPECT_EQ(j["stages"][0]["layers"], nlohmann::json({0, 5}));
  TestHttp c(static_cast<uint16_t>(port));
  c.Send("POST", "/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 12,
                                        "temperature": 0})");
  const HttpAnswer a = c.ReadWhole();
  ASSERT_EQ(a.status, 200) << a.body;
  const RunResult expected = RunKvasir({"generate", "-m", AssetPath(kModel), "-p",
                                        "Once upon a time", "-n", "12", "--temp", "0"});
  EXPECT_EQ(nlohmann::json::parse(a.body)["choices"][0]["text"], expected.out);
  serve.Signal(SIGTERM);
  int status = -1;
  ASSERT_TRUE(WaitFor([&] { return (status = serve.Ended()) != -1; }, 20000));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << ReadFileToString(log);
  EXPECT_THAT(ReadFileToString(log), HasSubstr("serve: stopping"));
}

}  // namespace
}  // namespace kvasir::testing
