// The successor link alone (ring/successor_link.h), against a fake successor on loopback played
// by the test: it comes up and says so, carries frames, tells when the link drops and dials again,
// counts and logs a refused successor without ever coming up, and stops while it cannot dial.
#include "ring/successor_link.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>

#include "link_events.h"
#include "ring/messages.h"
#include "ring/node_key.h"
#include "ring/secure_stream.h"

namespace kvasir::ring {
namespace {

const std::string kSecret = "successor-link-test-secret-0123456789";

LinkAuth Auth(const std::shared_ptr<const NodeKey>& key) {
  LinkAuth a;
  a.key = key;
  a.ring_secret = kSecret;
  return a;
}

// The test's side of one connection the link dialed: handshake as the responder, then HELLO.
struct FakeSuccessor {
  std::unique_ptr<Link> link;
  wire::Hello their_hello{};

  static std::unique_ptr<FakeSuccessor> Accept(net::Listener& listener, const wire::Hello& me) {
    auto raw = listener.Accept();
    EXPECT_TRUE(raw.ok()) << raw.status().message();
    if (!raw.ok()) return nullptr;
    auto key = std::make_shared<const NodeKey>(NodeKey::Generate());
    auto hs = HandshakeRespond(**raw, Auth(key), Auth(key));
    EXPECT_TRUE(hs.ok()) << hs.status().message();
    if (!hs.ok()) return nullptr;
    auto fake = std::make_unique<FakeSuccessor>();
    fake->link = std::make_unique<Link>(
        std::make_unique<SecureStream>(std::move(*raw), hs->tx, hs->rx, 1 << 20), "predecessor");
    auto hello = fake->link->Receive();
    EXPECT_TRUE(hello.ok() && std::holds_alternative<HelloMsg>(*hello));
    if (!hello.ok() || !std::holds_alternative<HelloMsg>(*hello)) return nullptr;
    fake->their_hello = std::get<HelloMsg>(*hello).hello;
    EXPECT_TRUE(fake->link->Send(HelloMsg{me}).ok());
    return fake;
  }
};

class SuccessorLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto l = net::Listener::Bind("127.0.0.1", 0);
    ASSERT_TRUE(l.ok()) << l.status().message();
    listener_ = std::make_unique<net::Listener>(std::move(*l));
  }
  void TearDown() override {
    if (link_) link_->Stop();
    listener_.reset();  // connections waiting in its backlog are reset: a handshake ends at once
    if (runner_.joinable()) runner_.join();
  }

  // Starts a link to the fake successor that expects it to hold layers from 4.
  void Start(int handshake_timeout_ms = 1000, uint16_t port = 0) {
    SuccessorLinkOptions o;
    o.name = "stage";
    o.desc = "fake";
    if (port == 0) port = listener_->port();
    o.dial = [port](const std::function<bool()>&) { return net::DialTcp("127.0.0.1", port, 2000); };
    o.auth = Auth(std::make_shared<const NodeKey>(NodeKey::Generate()));
    o.handshake_timeout_ms = handshake_timeout_ms;
    o.max_payload = 1 << 16;
    o.hello = HelloOf(wire::Role::kStage, 0, 4);
    o.check_hello = [](const wire::Hello& h) {
      if (h.window_first != 4) return Status::Error(fmt::format("starts at {}", h.window_first));
      return Status::Ok();
    };
    o.on_change = [this](bool up, const std::string& reason) {
      events_.Add(up ? "up" : "down: " + reason);
    };
    o.on_refused = [this] { events_.Add("refused"); };
    link_ = std::make_unique<SuccessorLink>(std::move(o));
    runner_ = std::thread([this] { link_->Run(); });
  }

  std::unique_ptr<net::Listener> listener_;
  std::unique_ptr<SuccessorLink> link_;
  std::thread runner_;
  Events events_;
};

TEST_F(SuccessorLinkTest, ComesUpCarriesFramesAndDialsAgainAfterADrop) {
  Start();
  auto fake = FakeSuccessor::Accept(*listener_, HelloOf(wire::Role::kStage, 4, 8));
  ASSERT_NE(fake, nullptr);
  EXPECT_EQ(fake->their_hello.window_last, 4u);  // this stage's HELLO, as given
  EXPECT_EQ(events_.Next(), "up");
  EXPECT_TRUE(link_->up());
  ASSERT_TRUE(link_->SendFrame(EncodeMessage(PingMsg{false, {42, 0}})));
  auto got = fake->link->Receive();
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_TRUE(std::holds_alternative<PingMsg>(*got));
  EXPECT_EQ(std::get<PingMsg>(*got).body.nonce, 42u);

  fake->link->Close();  // the successor dies
  EXPECT_EQ(events_.Next(), "down: link to successor fake down");
  auto again = FakeSuccessor::Accept(*listener_, HelloOf(wire::Role::kStage, 4, 8));
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(events_.Next(), "up");
}

TEST_F(SuccessorLinkTest, ASuccessorWhoseHelloIsRefusedNeverComesUp) {
  Start();
  auto fake = FakeSuccessor::Accept(
      *listener_, HelloOf(wire::Role::kStage, 5, 8));  // not where this window ends
  ASSERT_NE(fake, nullptr);
  EXPECT_EQ(events_.Next(), "refused");
  EXPECT_FALSE(link_->up());
  EXPECT_FALSE(link_->SendFrame(EncodeMessage(PingMsg{false, {1, 0}})));
}

TEST_F(SuccessorLinkTest, AStalledHandshakeIsCutAtItsDeadline) {
  Start(/*handshake_timeout_ms=*/300);
  auto raw = listener_->Accept();  // takes the connection and says nothing
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(events_.Next(), "refused");
  EXPECT_FALSE(link_->up());
}

TEST_F(SuccessorLinkTest, StopsWhileTheSuccessorCannotBeReached) {
  uint16_t closed_port = 0;
  {
    auto l = net::Listener::Bind("127.0.0.1", 0);
    ASSERT_TRUE(l.ok());
    closed_port = l->port();
  }  // nothing listens there now: the link keeps dialing and backing off
  Start(1000, closed_port);
  std::this_thread::yield();
  link_->Stop();
  runner_.join();  // returns: Stop() wakes the backoff
  EXPECT_FALSE(link_->up());
}

}  // namespace
}  // namespace kvasir::ring
