// Rings whose links run through the relay: one link or every link relayed gives the tokens one
// process gives, a ring survives the relay going away and coming back, and the CLI's relay flags
// (`kvasir stage --pred-via/--next-via`, `kvasir run --relay`) work end to end.
#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "model/arch/registry.h"
#include "relay/relay_server.h"
#include "relay/ws_stream.h"
#include "ring/ring_test_util.h"
#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using ::testing::HasSubstr;
using testing::AssetPath;
using Clock = std::chrono::steady_clock;

constexpr const char* kStories = "models/stories260K.gguf";
constexpr std::string_view kSecret = "relay-ring-test-secret-0123456789";
constexpr const char* kPrompt = "Once upon a time";

using testing::Greedy;

// A listening socket on 127.0.0.1 (port 0), held by the test, so that a relay can stop and a new
// one serve the same port without it ever being free for another process to take.
class HeldPort {
 public:
  HeldPort() {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
    EXPECT_EQ(::listen(fd_, 128), 0);
  }
  ~HeldPort() { ::close(fd_); }
  int fd() const { return fd_; }

 private:
  int fd_ = -1;
};

// A relay on a free port, or serving `held` when given.
Result<std::unique_ptr<relay::RelayServer>> StartRelay(const HeldPort* held = nullptr) {
  relay::RelayOptions o;
  o.listen = "127.0.0.1:0";
  if (held != nullptr) o.listen_fd = held->fd();
  o.secret = std::string(kSecret);
  return relay::RelayServer::Start(o);
}

ring::DialHook Hook(const std::string& url, relay::Role role) {
  return [url, role](const std::function<bool()>& cancelled) {
    relay::RelayDialOptions o;
    o.connect_timeout_ms = 2000;
    o.cancelled = cancelled;
    const std::span<const uint8_t> secret(reinterpret_cast<const uint8_t*>(kSecret.data()),
                                          kSecret.size());
    return relay::DialRelayEdge(url, role, secret, o);
  };
}

// In-process stages of a model; link i (stage i -> stage i+1) goes through the relay on
// `relay_port` when relayed[i], else over direct TCP. Every stage binds port 0; a stage whose
// successor is direct is created after it, to learn its port, so at least one link is relayed.
class RelayedRing {
 public:
  static std::unique_ptr<RelayedRing> Start(const std::string& model, uint16_t relay_port,
                                            const std::vector<bool>& relayed) {
    const int n = static_cast<int>(relayed.size());
    auto file = GgufFile::Open(model);
    EXPECT_TRUE(file.ok()) << file.status().message();
    if (!file.ok()) return nullptr;
    const int n_layer = LoadModelConfig(*file)->n_layer;
    auto ring = std::unique_ptr<RelayedRing>(new RelayedRing());
    int start = -1;  // a stage whose successor link is relayed: it needs no port but its own
    for (int i = 0; i < n; ++i) {
      if (relayed[i]) start = i;
    }
    EXPECT_GE(start, 0) << "a ring of direct links needs its ports known in advance";
    if (start < 0) return nullptr;
    std::vector<uint16_t> ports(n, 0);
    std::vector<std::unique_ptr<ring::Stage>> stages(n);
    // start, start-1, ..., start+1: each stage's successor exists before it does.
    for (int k = 0; k < n; ++k) {
      const int i = (start - k + n) % n;
      const int next = (i + 1) % n, prev = (i + n - 1) % n;
      ring::StageOptions o;
      o.model_path = model;
      o.first = i * n_layer / n;
      o.last = (i + 1) * n_layer / n;
      o.listen = "127.0.0.1:0";
      o.name = fmt::format("r{}", i);
      o.n_ctx = 256;
      o.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
      o.ring_secret = testing::kTestRingSecret;
      const auto edge = [&](int from, int to) {
        return fmt::format("ws://127.0.0.1:{}/edge/test-{}-{}", relay_port, from, to);
      };
      if (relayed[i]) {
        o.next_via = edge(i, next);
        o.dial_next = Hook(o.next_via, relay::Role::kPredecessorSide);
      } else {
        o.next = fmt::format("127.0.0.1:{}", ports[next]);
      }
      if (relayed[prev]) {
        o.pred_via = edge(prev, i);
        o.dial_pred = Hook(o.pred_via, relay::Role::kSuccessorSide);
      }
      auto stage = ring::Stage::Create(o);
      EXPECT_TRUE(stage.ok()) << stage.status().message();
      if (!stage.ok()) return nullptr;
      ports[i] = (*stage)->port();
      stages[i] = std::move(stage).value();
    }
    ring->stages_ = std::move(stages);
    for (auto& s : ring->stages_) ring->threads_.emplace_back([st = s.get()] { (void)st->Run(); });
    ring->head_ = fmt::format("127.0.0.1:{}", ports[0]);
    return ring;
  }

  ~RelayedRing() {
    for (auto& s : stages_) s->Stop();
    for (auto& t : threads_) t.join();
  }
  const std::string& head() const { return head_; }

 private:
  std::vector<std::unique_ptr<ring::Stage>> stages_;
  std::vector<std::thread> threads_;
  std::string head_;
};

TEST(RelayRingTest, OneRelayedLinkGivesTheTokensOfOneProcess) {
  KV_REQUIRE_ASSET(kStories);
  const std::string model = AssetPath(kStories);
  auto relay = StartRelay();
  ASSERT_TRUE(relay.ok()) << relay.status().message();
  auto ring = RelayedRing::Start(model, (*relay)->port(), {false, true, false});
  ASSERT_NE(ring, nullptr);
  const auto got = testing::GenerateOnRing(ring->head(), kPrompt, Greedy(), 16);
  EXPECT_EQ(got.ids, testing::GenerateLocally(model, kPrompt, Greedy(), 16).ids);
  EXPECT_EQ((*relay)->stats().edges_active, 1u);
}

TEST(RelayRingTest, EveryLinkRelayedGivesTheTokensOfOneProcess) {
  KV_REQUIRE_ASSET(kStories);
  const std::string model = AssetPath(kStories);
  auto relay = StartRelay();
  ASSERT_TRUE(relay.ok()) << relay.status().message();
  auto ring = RelayedRing::Start(model, (*relay)->port(), {true, true, true});
  ASSERT_NE(ring, nullptr);
  const auto got = testing::GenerateOnRing(ring->head(), kPrompt, Greedy(), 16);
  EXPECT_EQ(got.ids, testing::GenerateLocally(model, kPrompt, Greedy(), 16).ids);
  EXPECT_EQ((*relay)->stats().edges_active, 3u);
  EXPECT_GT((*relay)->stats().bytes_forwarded, 0u);
}

TEST(RelayRingTest, TheRingRecoversWhenTheRelayComesBack) {
  KV_REQUIRE_ASSET(kStories);
  const std::string model = AssetPath(kStories);
  HeldPort held;
  auto relay = StartRelay(&held);
  ASSERT_TRUE(relay.ok()) << relay.status().message();
  const uint16_t port = (*relay)->port();
  auto ring = RelayedRing::Start(model, port, {true, true, true});
  ASSERT_NE(ring, nullptr);
  const auto want = testing::GenerateLocally(model, kPrompt, Greedy(), 12).ids;
  EXPECT_EQ(testing::GenerateOnRing(ring->head(), kPrompt, Greedy(), 12).ids, want);

  // The relay goes away with every edge; a new one takes its place on the same port.
  (*relay)->Stop();
  relay->reset();
  const auto t0 = Clock::now();
  auto again = StartRelay(&held);
  ASSERT_TRUE(again.ok()) << again.status().message();
  auto client = ring::RingClient::Connect(ring->head(), 5000, testing::kTestRingSecret);
  ASSERT_TRUE(client.ok()) << client.status().message();
  ASSERT_TRUE((*client)->WaitReady(10000).ok()) << "the stages did not redial the relay";
  std::printf("ring closed again %.0f ms after the relay restarted\n",
              std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  EXPECT_EQ(testing::GenerateOnRing(ring->head(), kPrompt, Greedy(), 12).ids, want);
  EXPECT_EQ((*again)->stats().edges_active, 3u);
}

// ---- the CLI ----------------------------------------------------------------------------------

using testing::RunResult;

RunResult Kvasir(const std::vector<std::string>& args) { return testing::RunKvasir(args); }

TEST(RelayRingTest, StageRefusesBadRelayFlags) {
  const std::vector<std::string> base = {"stage", "-m", "m.gguf", "--layers", "0:1", "--listen",
                                         "127.0.0.1:0"};
  const auto with = [&](std::vector<std::string> more) {
    std::vector<std::string> args = base;
    args.insert(args.end(), more.begin(), more.end());
    return Kvasir(args);
  };
  RunResult r = with({"--next", "127.0.0.1:1", "--pred-via", "https://relay/edge/a"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--pred-via"));
  EXPECT_THAT(r.err, HasSubstr("ws://"));
  r = with({"--next-via", "ws://relay/edge/no spaces"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--next-via"));
  r = with({"--next-via", "wss://relay/edges/a"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("/edge/<edge-id>"));
  r = with({});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--next HOST:PORT or --next-via URL is required"));
}

TEST(RelayRingTest, KvasirRunRelayMatchesTheReference) {
  KV_REQUIRE_ASSET(kStories);
  KV_REQUIRE_ASSET("reference/stories260K.p1.json");
  const auto t0 = Clock::now();
  RunResult r = Kvasir({"run", "-m", AssetPath(kStories), "--stages", "3", "--relay", "-p",
                        kPrompt, "-n", "24", "--temp", "0", "-t", "1", "-c", "256"});
  ASSERT_EQ(r.code, 0) << r.err;
  std::printf("kvasir run --relay (3 stages, 24 tokens): %.0f ms\n",
              std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
  const auto ref = nlohmann::json::parse(
      testing::ReadFileToString(AssetPath("reference/stories260K.p1.json")));
  EXPECT_EQ(r.out, ref["text"].get<std::string>());
  EXPECT_THAT(r.err, HasSubstr("every link through the relay"));
}

}  // namespace
}  // namespace kvasir
