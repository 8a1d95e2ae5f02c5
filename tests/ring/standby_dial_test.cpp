// Whom a stage dials when its successor link drops (src/ring/stage_standby.cpp): the successor's
// standbys only while its own predecessor is linked. A stage that lost both links at once may be
// the process that was replaced while it was frozen or cut off; a standby it called would link
// on to the head and cut the healthy tail off.
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "net/stream.h"
#include "ring_test_util.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kStories = "models/stories260K.gguf";

std::string Model() { return testing::AssetPath(kStories); }

// A standby of the successor's window that only counts the connections made to it.
class CountingPeer {
 public:
  CountingPeer() {
    auto l = net::Listener::Bind("127.0.0.1", 0);
    EXPECT_TRUE(l.ok()) << l.status().message();
    listener_ = std::make_unique<net::Listener>(std::move(l).value());
    thread_ = std::thread([this] {
      while (true) {
        auto s = listener_->Accept();
        if (!s.ok()) return;
        dialed_.fetch_add(1);  // dropped at once: the stage dials on
      }
    });
  }
  ~CountingPeer() {
    listener_->Close();
    thread_.join();
  }
  std::string address() const { return "127.0.0.1:" + std::to_string(listener_->port()); }
  int dialed() const { return dialed_.load(); }
  // Whether a connection came within `ms`.
  bool DialedWithin(int ms) const {
    const auto end = Clock::now() + std::chrono::milliseconds(ms);
    while (Clock::now() < end) {
      if (dialed() > 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return dialed() > 0;
  }

 private:
  std::unique_ptr<net::Listener> listener_;
  std::thread thread_;
  std::atomic<int> dialed_{0};
};

// The middle stage of a ring of stories260K (layers 2:4 of 5), linked to fake neighbours, with
// `standby` listed after its successor.
std::unique_ptr<testing::FakeNeighbours> MiddleStage(const CountingPeer& standby) {
  ring::StageOptions o;
  o.model_path = Model();
  o.first = 2;
  o.last = 4;
  o.n_ctx = 64;
  o.link_timeout_ms = 2000;
  o.standby_peers = {standby.address()};
  auto fake = testing::FakeNeighbours::Start(o, testing::FakeStageHello(Model(), 0, 2),
                                             testing::FakeStageHello(Model(), 4, 5));
  if (fake != nullptr) {
    EXPECT_TRUE(fake->WaitForwarding());
  }
  return fake;
}

TEST(StandbyDialTest, ASuccessorLostWithThePredecessorLinkedIsReplacedByItsStandby) {
  KV_REQUIRE_ASSET(kStories);
  CountingPeer standby;
  auto fake = MiddleStage(standby);
  ASSERT_NE(fake, nullptr);
  fake->CloseSuccessor();
  EXPECT_TRUE(standby.DialedWithin(5000)) << "the successor's standby was never dialed";
}

// The order that cut rings in two: the successor's link is seen down first, the predecessor's a
// moment later (both closed while the stage was frozen, or in one watchdog pass).
TEST(StandbyDialTest, AStageThatLostBothLinksCallsNoStandby) {
  KV_REQUIRE_ASSET(kStories);
  CountingPeer standby;
  auto fake = MiddleStage(standby);
  ASSERT_NE(fake, nullptr);
  fake->CloseSuccessor();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  fake->pred().Close();
  EXPECT_FALSE(standby.DialedWithin(3000))
      << "a stage without a predecessor called its successor's standby";
}

}  // namespace
}  // namespace kvasir
