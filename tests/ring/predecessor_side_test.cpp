// The predecessor side alone (ring/predecessor_side.h), with fake neighbours over loopback played
// by the test: a predecessor that handshakes is accepted and its messages told; one that signs
// with a key the stage does not expect is refused; a newer predecessor takes the place of the
// one linked, whose late frames are not told, and the older process is refused when it comes
// back; a connection that says nothing is cut at the handshake deadline; a client is counted,
// reached, and its departure told; a relayed predecessor is dialed (and dialed again when it
// goes) while a direct one is refused; a standby's check edge answers the market's check while
// its predecessor is linked.
#include "ring/predecessor_side.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "link_events.h"
#include "ring/node_key.h"
#include "ring/secure_stream.h"

namespace kvasir::ring {
namespace {

const std::string kSecret = "predecessor-side-test-secret-0123456789";
using Clock = std::chrono::steady_clock;

// The test's end of one link to the side: it dials, handshakes as the initiator, says HELLO and
// reads the side's answer.
struct FakePeer {
  std::unique_ptr<Link> link;
  wire::Hello their_hello{};

  static Result<std::unique_ptr<FakePeer>> Dial(uint16_t port, const LinkAuth& auth,
                                                const wire::Hello& me) {
    KV_ASSIGN_OR_RETURN(auto raw, net::DialTcp("127.0.0.1", port, 2000));
    return Open(std::move(raw), auth, me);
  }
  // The same over `raw`, however it was opened (the side may have dialed it).
  static Result<std::unique_ptr<FakePeer>> Open(std::unique_ptr<net::Stream> raw,
                                                const LinkAuth& auth, const wire::Hello& me) {
    KV_ASSIGN_OR_RETURN(HandshakeResult hs,
                        HandshakeInitiate(*raw, static_cast<wire::Role>(me.role), auth));
    auto peer = std::make_unique<FakePeer>();
    peer->link = std::make_unique<Link>(
        std::make_unique<SecureStream>(std::move(raw), hs.tx, hs.rx, 1 << 20), "stage");
    KV_RETURN_IF_ERROR(peer->link->Send(HelloMsg{me}));
    KV_ASSIGN_OR_RETURN(Message answer, peer->link->Receive());
    if (const auto* e = std::get_if<ErrorMsg>(&answer)) return Error("refused: {}", e->message);
    if (!std::holds_alternative<HelloMsg>(answer)) return Error("no HELLO back");
    peer->their_hello = std::get<HelloMsg>(answer).hello;
    return peer;
  }
  Status Ping(uint64_t nonce) { return link->Send(PingMsg{false, {nonce, 0}}); }
};

class PredecessorSideTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (side_) side_->Stop();
  }

  // Starts a side for a window starting at layer 4, which takes a predecessor that ends there.
  void Start(PredecessorSideOptions o) {
    auto l = net::Listener::Bind("127.0.0.1", 0);
    ASSERT_TRUE(l.ok()) << l.status().message();
    o.name = "stage";
    if (o.stage_auth.key == nullptr) o.stage_auth = Auth(stage_key_);
    o.stage_max_payload = 1 << 16;
    o.client_max_payload = 1 << 16;
    o.hello = [] { return HelloOf(wire::Role::kStage, 4, 8); };
    o.check_hello = [](const wire::Hello& h, wire::ErrorCode* code) {
      *code = wire::ErrorCode::kNotAdjacent;
      if (h.window_last != 4) return Status::Error(fmt::format("ends at {}", h.window_last));
      return Status::Ok();
    };
    o.on_pred_up = [this](const wire::Hello& h, const std::string&) {
      events_.Add(fmt::format("up {}", h.generation));
    };
    o.on_pred_down = [this](const std::string& reason) { events_.Add("down: " + reason); };
    o.on_client_joined = [this](uint64_t c) { events_.Add(fmt::format("joined {}", c)); };
    o.on_client_left = [this](uint64_t c) { events_.Add(fmt::format("left {}", c)); };
    o.on_message = [this](PeerMessage m) {
      const auto* ping = std::get_if<PingMsg>(&m.msg);
      events_.Add(fmt::format("{} {}", m.from_pred ? "pred" : fmt::format("client {}", m.client),
                              ping != nullptr ? ping->body.nonce : 0));
    };
    o.on_refused = [this] { events_.Add("refused"); };
    side_ = std::make_unique<PredecessorSide>(std::move(o), std::move(*l));
    side_->Start();
  }
  void Start() { Start(PredecessorSideOptions{}); }

  static LinkAuth Auth(std::shared_ptr<const NodeKey> key) {
    LinkAuth a;
    a.key = std::move(key);
    a.ring_secret = kSecret;
    return a;
  }
  // An anonymous client that checks the stage's key.
  LinkAuth ClientAuth() const {
    LinkAuth a;
    a.peer_key = stage_key_->public_key();
    return a;
  }
  // A relay edge, played by a listener: the side dials it (`hook`), and the peer behind it runs
  // the handshake as the initiator, as through a relay.
  static DialHook DialTo(const net::Listener& edge) {
    return [port = edge.port()](const std::function<bool()>&) {
      return net::DialTcp("127.0.0.1", port, 2000);
    };
  }
  // The predecessor behind `edge`, at the side's next dial there.
  Result<std::unique_ptr<FakePeer>> AcceptPred(net::Listener& edge, uint64_t generation) {
    KV_ASSIGN_OR_RETURN(auto raw, edge.Accept());
    return FakePeer::Open(std::move(raw), Auth(pred_key_),
                          HelloOf(wire::Role::kStage, 0, 4, generation));
  }
  Result<std::unique_ptr<FakePeer>> DialPred(uint64_t generation) {
    return FakePeer::Dial(side_->port(), Auth(pred_key_),
                          HelloOf(wire::Role::kStage, 0, 4, generation));
  }

  std::shared_ptr<const NodeKey> stage_key_ = std::make_shared<NodeKey>(NodeKey::Generate());
  std::shared_ptr<const NodeKey> pred_key_ = std::make_shared<NodeKey>(NodeKey::Generate());
  std::unique_ptr<PredecessorSide> side_;
  Events events_;
};

TEST_F(PredecessorSideTest, APredecessorThatHandshakesIsAcceptedAndItsMessagesTold) {
  Start();
  auto pred = DialPred(10);
  ASSERT_TRUE(pred.ok()) << pred.status().message();
  EXPECT_EQ((*pred)->their_hello.window_first, 4u);  // the side's HELLO, as given
  EXPECT_EQ(events_.Next(), "up 10");
  EXPECT_TRUE(side_->pred_up());
  ASSERT_TRUE((*pred)->Ping(42).ok());
  EXPECT_EQ(events_.Next(), "pred 42");
  EXPECT_GT(side_->pred_bytes_in(), 0u);

  (*pred)->link->Close();  // the predecessor dies
  EXPECT_EQ(events_.Next().rfind("down: link from predecessor", 0), 0u);
  EXPECT_FALSE(side_->pred_up());
}

TEST_F(PredecessorSideTest, APredecessorWithTheWrongKeyOrWindowIsRefused) {
  PredecessorSideOptions o;
  o.stage_auth.key = stage_key_;
  o.stage_auth.peer_key = pred_key_->public_key();  // only this key, no ring secret
  Start(std::move(o));
  LinkAuth wrong;
  wrong.key = std::make_shared<NodeKey>(NodeKey::Generate());
  wrong.peer_key = stage_key_->public_key();
  auto refused = FakePeer::Dial(side_->port(), wrong, HelloOf(wire::Role::kStage, 0, 4, 1));
  EXPECT_FALSE(refused.ok());
  EXPECT_EQ(events_.Next(), "refused");
  EXPECT_FALSE(side_->pred_up());

  LinkAuth right;
  right.key = pred_key_;
  right.peer_key = stage_key_->public_key();
  auto misplaced = FakePeer::Dial(side_->port(), right, HelloOf(wire::Role::kStage, 0, 3, 1));
  ASSERT_FALSE(misplaced.ok());
  EXPECT_NE(misplaced.status().message().find("ends at 3"), std::string::npos);
  EXPECT_EQ(events_.Next(), "refused");

  auto accepted = FakePeer::Dial(side_->port(), right, HelloOf(wire::Role::kStage, 0, 4, 1));
  ASSERT_TRUE(accepted.ok()) << accepted.status().message();
  EXPECT_EQ(events_.Next(), "up 1");
}

TEST_F(PredecessorSideTest, ANewerPredecessorReplacesTheOldOneWhoseLateFramesAreIgnored) {
  Start();
  auto old_pred = DialPred(10);
  ASSERT_TRUE(old_pred.ok()) << old_pred.status().message();
  EXPECT_EQ(events_.Next(), "up 10");
  ASSERT_TRUE((*old_pred)->Ping(1).ok());
  EXPECT_EQ(events_.Next(), "pred 1");

  auto new_pred = DialPred(20);
  ASSERT_TRUE(new_pred.ok()) << new_pred.status().message();
  EXPECT_EQ(events_.Next().rfind("down: predecessor", 0), 0u);
  EXPECT_EQ(events_.Next(), "up 20");
  (void)(*old_pred)->Ping(7);  // from a process that has lost its place: never told
  ASSERT_TRUE((*new_pred)->Ping(2).ok());
  EXPECT_EQ(events_.Next(), "pred 2");

  // The old process comes back (it was frozen): refused while the newer one holds the place.
  auto again = DialPred(10);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(events_.Next(), "refused");
  EXPECT_TRUE(side_->pred_up());
  EXPECT_EQ(side_->newest_pred_generation(), 20u);
  ASSERT_TRUE((*new_pred)->Ping(3).ok());
  EXPECT_EQ(events_.Next(), "pred 3");
  for (const std::string& e : events_.Rest()) EXPECT_NE(e, "pred 7");
}

TEST_F(PredecessorSideTest, ASilentConnectionIsCutAtTheHandshakeDeadline) {
  PredecessorSideOptions o;
  o.handshake_timeout_ms = 300;
  o.pressure_handshake_timeout_ms = 300;
  Start(std::move(o));
  const auto start = Clock::now();
  auto raw = net::DialTcp("127.0.0.1", side_->port(), 2000);
  ASSERT_TRUE(raw.ok()) << raw.status().message();
  EXPECT_EQ(events_.Next(), "refused");
  // The side closed it: what the connection reads next is its end.
  uint8_t buf[64];
  Result<size_t> n = (*raw)->ReadSome(buf);
  while (n.ok() && *n > 0) n = (*raw)->ReadSome(buf);
  EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(250));
  EXPECT_FALSE(side_->pred_up());
}

TEST_F(PredecessorSideTest, AClientIsCountedReachedAndItsDepartureTold) {
  PredecessorSideOptions o;
  o.accepts_clients = true;
  Start(std::move(o));
  auto client = FakePeer::Dial(side_->port(), ClientAuth(), HelloOf(wire::Role::kClient, 0, 0));
  ASSERT_TRUE(client.ok()) << client.status().message();
  EXPECT_EQ(events_.Next(), "joined 1");
  EXPECT_EQ(side_->clients(), 1u);
  ASSERT_TRUE((*client)->Ping(5).ok());
  EXPECT_EQ(events_.Next(), "client 1 5");
  side_->SendToClient(1, PingMsg{true, {6, 0}});
  auto got = (*client)->link->Receive();
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_TRUE(std::holds_alternative<PingMsg>(*got));
  EXPECT_EQ(std::get<PingMsg>(*got).body.nonce, 6u);

  (*client)->link->Close();
  EXPECT_EQ(events_.Next(), "left 1");
  EXPECT_EQ(side_->clients(), 0u);
  EXPECT_FALSE(side_->pred_up());
}

TEST_F(PredecessorSideTest, AStageThatTakesNoClientsRefusesThem) {
  PredecessorSideOptions o;
  o.clients_refusal = "clients connect to the head";
  Start(std::move(o));
  auto client = FakePeer::Dial(side_->port(), ClientAuth(), HelloOf(wire::Role::kClient, 0, 0));
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.status().message().find("clients connect to the head"), std::string::npos);
  EXPECT_EQ(events_.Next(), "refused");
  EXPECT_EQ(side_->clients(), 0u);
}

TEST_F(PredecessorSideTest, ARelayedPredecessorIsDialedAndADirectOneRefused) {
  auto edge = net::Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(edge.ok()) << edge.status().message();
  PredecessorSideOptions o;
  o.dial_pred = DialTo(*edge);
  o.pred_via = "the relay";
  Start(std::move(o));
  auto pred = AcceptPred(*edge, 10);
  ASSERT_TRUE(pred.ok()) << pred.status().message();
  EXPECT_EQ(events_.Next(), "up 10");
  ASSERT_TRUE((*pred)->Ping(9).ok());
  EXPECT_EQ(events_.Next(), "pred 9");

  auto direct = DialPred(20);
  ASSERT_FALSE(direct.ok());
  EXPECT_NE(direct.status().message().find("through the relay"), std::string::npos);
  EXPECT_EQ(events_.Next(), "refused");
  EXPECT_EQ(side_->newest_pred_generation(), 10u);

  (*pred)->link->Close();  // the relayed predecessor goes: the side tells it, and dials again
  EXPECT_EQ(events_.Next().rfind("down: link from predecessor", 0), 0u);
  auto back = AcceptPred(*edge, 11);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(events_.Next(), "up 11");
  side_->Stop();  // returns while the dialer waits for its next connection or backs off
}

// A standby behind NAT keeps its check edge dialed besides its predecessor's: the market's check
// (a client's handshake that demands the stage's key) is answered there while the predecessor
// that adopted it holds their edge, and again after it (docs/MARKET.md, "Checked before
// promoted").
TEST_F(PredecessorSideTest, AStandbyAnswersTheMarketsCheckWhileItsPredecessorHoldsTheirEdge) {
  auto edge = net::Listener::Bind("127.0.0.1", 0);
  auto check_edge = net::Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(edge.ok() && check_edge.ok());
  PredecessorSideOptions o;
  o.dial_pred = DialTo(*edge);
  o.pred_via = "the relay";
  o.dial_check = DialTo(*check_edge);
  o.clients_refusal = "clients connect to the head";
  Start(std::move(o));
  auto pred = AcceptPred(*edge, 10);
  ASSERT_TRUE(pred.ok()) << pred.status().message();
  EXPECT_EQ(events_.Next(), "up 10");  // adopted
  for (int check = 0; check < 2; ++check) {
    auto market = check_edge->Accept();
    ASSERT_TRUE(market.ok()) << market.status().message();
    auto hs = HandshakeInitiate(**market, wire::Role::kClient, ClientAuth());
    EXPECT_TRUE(hs.ok()) << "check " << check << ": " << hs.status().message();
    (*market)->Shutdown();
    // The predecessor's link goes on.
    ASSERT_TRUE((*pred)->Ping(100 + check).ok());
    std::string e = events_.Next();
    while (e == "refused") e = events_.Next();  // the check, which says no HELLO
    EXPECT_EQ(e, fmt::format("pred {}", 100 + check));
    EXPECT_TRUE(side_->pred_up());
  }
  // A check that proves another key fails: the stage answers only as itself.
  auto market = check_edge->Accept();
  ASSERT_TRUE(market.ok()) << market.status().message();
  LinkAuth wrong;
  wrong.peer_key = pred_key_->public_key();
  EXPECT_FALSE(HandshakeInitiate(**market, wire::Role::kClient, wrong).ok());
  side_->Stop();
}

// A promoted standby's stage is told to stop keeping the check edge: the dial waiting on the relay
// (here one that waits until it is cancelled, as an unpaired relay end does) is cut at once, and
// the edge is not dialed again.
TEST_F(PredecessorSideTest, ACheckEdgeStoppedIsCutAndNotDialedAgain) {
  std::atomic<int> dials{0};
  std::atomic<bool> cut{false};
  PredecessorSideOptions o;
  o.dial_check =
      [&](const std::function<bool()>& cancelled) -> Result<std::unique_ptr<net::Stream>> {
    ++dials;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!cancelled() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    if (cancelled()) cut = true;
    return Error("the relay paired no other end");
  };
  o.clients_refusal = "clients connect to the head";
  Start(std::move(o));
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (dials.load() == 0 && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(dials.load(), 1);
  side_->StopCheckEdge();
  side_->StopCheckEdge();  // idempotent
  const auto cut_by = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!cut.load() && std::chrono::steady_clock::now() < cut_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(cut.load()) << "the dial waiting on the relay was not cut";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past the first backoff
  EXPECT_EQ(dials.load(), 1) << "the check edge was dialed again after it was stopped";
  side_->Stop();
}

}  // namespace
}  // namespace kvasir::ring
