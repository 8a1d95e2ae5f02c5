// `kvasir stage --fetch` and `kvasir join` check every option before anything goes out: a bad
// value fails naming its flag, and the server the model (or the market) is on gets no request.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "fake_http_server.h"
#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using ::testing::HasSubstr;
using testing::RunKvasir;

struct BadFlag {
  std::vector<std::string> args;
  std::string named;  // what the error must name
};

// `kvasir CMD ARGS`, then each of `defaults` whose flag ARGS does not give: every flag is given
// once, so an error naming it can only come from its value.
std::vector<std::string> Command(const std::string& cmd, const std::vector<std::string>& args,
                                 const std::vector<std::pair<std::string, std::string>>& defaults) {
  std::vector<std::string> out = {cmd};
  out.insert(out.end(), args.begin(), args.end());
  for (const auto& [flag, value] : defaults) {
    if (std::find(args.begin(), args.end(), flag) == args.end()) {
      out.insert(out.end(), {flag, value});
    }
  }
  return out;
}

class NodeCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::ofstream(dir_.File("short.secret")) << "too short\n";
    std::ofstream(dir_.File("bad.key")) << "not a key\n";
  }
  // Counts every request; answers none with data (nothing should ask).
  testing::FakeHttpServer server_{[](const testing::FakeRequest&) {
    return std::string("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 0\r\n\r\n");
  }};
  testing::TempDir dir_;
};

TEST_F(NodeCliTest, StageRefusesEveryBadFlagBeforeFetching) {
  const std::vector<BadFlag> cases = {
      {{"--replay-mb", "-1"}, "--replay-mb"},
      {{"--replay-mb", "2000000"}, "--replay-mb"},
      {{"--backend", "nosuch"}, "nosuch"},
      {{"--attn-type", "f8"}, "--attn-type"},
      {{"--link-timeout", "0"}, "--link-timeout"},
      {{"--repair-timeout", "-1"}, "--repair-timeout"},
      {{"--listen", "127.0.0.1:99999"}, "--listen"},
      {{"--next", "nowhere"}, "--next"},
      {{"--standby-peers", "127.0.0.1:1,bad"}, "--standby-peers"},
      {{"--chunk", "0"}, "--chunk"},
      {{"--max-sessions", "0"}, "--max-sessions"},
      {{"--boundary", "f8"}, "--boundary"},
      {{"--cache-ttl", "0"}, "--cache-ttl"},
      {{"--standby", "--layers", "0:1"}, "--standby"},
      {{"--pred-via", "http://relay/edge/x"}, "--pred-via"},
      {{"--ring-secret-file", dir_.File("short.secret")}, "short.secret"},
      {{"--key", dir_.File("bad.key")}, "bad.key"},
      {{"--retries", "1000"}, "--retries"},
  };
  for (const BadFlag& c : cases) {
    const std::vector<std::string> args = Command("stage", c.args,
                                                  {{"--fetch", server_.Url("/model.gguf")},
                                                   {"--layers", "1:2"},
                                                   {"--listen", "127.0.0.1:0"},
                                                   {"--next", "127.0.0.1:1"},
                                                   {"--key", dir_.File("node.key")},
                                                   {"--slice-dir", dir_.File("cache")}});
    const testing::RunResult r = RunKvasir(args);
    EXPECT_NE(r.code, 0) << c.named << "\n" << testing::Describe(r);
    EXPECT_THAT(r.err, HasSubstr(c.named)) << testing::Describe(r);
    EXPECT_EQ(server_.requests(), 0) << c.named << "\n" << testing::Describe(r);
  }
  // The same command without a bad flag does go to the server (and fails on its 500), so the
  // cases above were refused by their flag and not by something else.
  const testing::RunResult r =
      RunKvasir({"stage", "--fetch", server_.Url("/model.gguf"), "--layers", "1:2", "--listen",
                 "127.0.0.1:0", "--next", "127.0.0.1:1", "--key", dir_.File("node.key"),
                 "--slice-dir", dir_.File("cache"), "--insecure", "--retries", "0"});
  EXPECT_NE(r.code, 0) << testing::Describe(r);
  EXPECT_GT(server_.requests(), 0) << testing::Describe(r);
}

TEST_F(NodeCliTest, JoinRefusesEveryBadFlagBeforeAskingTheMarket) {
  const std::vector<BadFlag> cases = {
      {{"--link-timeout", "0.1"}, "--link-timeout"},
      {{"--repair-timeout", "-1"}, "--repair-timeout"},
      {{"--listen", "127.0.0.1:99999"}, "--listen"},
      {{"--advertise", "nohost"}, "--advertise"},
      {{"-t", "100000"}, "-t 100000"},
      {{"--backend", "nosuch"}, "nosuch"},
      {{"--memory", "lots"}, "--memory"},
      {{"--poll", "0"}, "--poll"},
      {{"--key", dir_.File("bad.key")}, "bad.key"},
  };
  for (const BadFlag& c : cases) {
    const std::vector<std::string> args = Command("join", c.args,
                                                  {{"--market", server_.Url("")},
                                                   {"--key", dir_.File("node.key")},
                                                   {"--cache", dir_.File("cache")},
                                                   {"--memory", "1GiB"}});
    const testing::RunResult r = RunKvasir(args);
    EXPECT_NE(r.code, 0) << c.named << "\n" << testing::Describe(r);
    EXPECT_THAT(r.err, HasSubstr(c.named)) << testing::Describe(r);
    EXPECT_EQ(server_.requests(), 0) << c.named << "\n" << testing::Describe(r);
  }
}

}  // namespace
}  // namespace kvasir
