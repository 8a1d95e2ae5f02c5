// Attacks on a ring started the documented way: three `kvasir stage` processes of stories260K
// (layers 0:2, 2:4, 4:5) sharing a ring secret file (tests/ring/attack_fixture.h). Each attack is
// replayed against the running ring and must be refused or contained: the peak memory (VmHWM) of
// every stage grows by less than 64 MiB and comes back down, an honest client is served exactly
// and never waits a second or more while it runs, and the ring serves exactly afterwards.
// Lines starting "[measure]" on stderr give the margins (docs/PROTOCOL.md, "Limits").
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <future>

#include "attack_fixture.h"
#include "gguf/gguf_file.h"
#include "model/model_id.h"
#include "ring/handshake.h"
#include "ring/link.h"
#include "ring/link_limits.h"
#include "ring/sampling_wire.h"
#include "ring/secure_stream.h"
#include "test_assets.h"
#include "tokenizer/tokenizer.h"

namespace kvasir {
namespace {

using testing::AttackRing;
using testing::Clock;
using testing::Flood;
using testing::Greedy;
using ::testing::HasSubstr;
using testing::RawRingClient;
using testing::SecondsSince;

constexpr const char* kStories = "models/stories260K.gguf";
constexpr int kLinkTimeoutS = AttackRing::kLinkTimeoutS;
constexpr const char* kPrompt = AttackRing::kPrompt;

// The u32 length of an encrypted record of `plain` bytes.
std::vector<uint8_t> RecordLength(uint32_t plain) {
  const uint32_t len = plain + crypto_secretstream_xchacha20poly1305_ABYTES;
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &len, 4);
  return b;
}

class AttackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KV_REQUIRE_ASSET(kStories);
    model_ = testing::AssetPath(kStories);
    ring_ = std::make_unique<AttackRing>(model_);
    ASSERT_TRUE(ring_->ready());
  }

  std::string Log(int i) { return ring_->stage(i).log(); }
  bool WaitForLog(int i, const std::string& needle, int ms = 10000) {
    return testing::WaitForText(ring_->log_path(i), needle, ms);
  }

  // A raw connection to stage `i`, through the handshake with `auth` (role stage by default).
  Result<std::unique_ptr<ring::Link>> Dial(int i, const ring::LinkAuth& auth,
                                           wire::Role role = wire::Role::kStage) {
    KV_ASSIGN_OR_RETURN(auto s, net::DialTcp("127.0.0.1", ring_->port(i), 2000));
    KV_ASSIGN_OR_RETURN(auto hs, ring::HandshakeInitiate(*s, role, auth));
    return std::make_unique<ring::Link>(
        std::make_unique<ring::SecureStream>(std::move(s), hs.tx, hs.rx, 80 << 20), "attacker");
  }

  static ring::LinkAuth Member() {
    ring::LinkAuth member;
    member.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
    member.ring_secret = testing::kTestRingSecret;
    return member;
  }

  // A member of the ring (it holds the secret) linked to stage `victim` as its predecessor.
  std::unique_ptr<ring::Link> MemberLink(int victim) {
    const int first[] = {4, 0, 2};  // the window of each stage's predecessor
    const int last[] = {5, 2, 4};
    for (int attempt = 0; attempt < 50; ++attempt) {
      auto link = Dial(victim, Member());
      EXPECT_TRUE(link.ok()) << link.status().message();
      if (!link.ok()) return nullptr;
      if (!(*link)->Send(ring::HelloMsg{testing::FakeStageHello(model_, first[victim],
                                                                last[victim])})
               .ok()) {
        continue;
      }
      auto hello = (*link)->Receive();
      if (hello.ok() && std::holds_alternative<ring::HelloMsg>(*hello)) {
        return std::move(link).value();
      }
    }
    ADD_FAILURE() << "stage " << victim << " never took the member as its predecessor";
    return nullptr;
  }

  uint32_t ClientRecordLimit() {
    auto file = GgufFile::Open(model_);
    auto tok = Tokenizer::FromGguf(file->header(), model_);
    return sizeof(wire::FrameHeader) + ring::MaxClientPayload(ring::MaxPromptBytes(**tok, 512));
  }

  std::string model_;
  std::unique_ptr<AttackRing> ring_;
};

// Injection: without the ring secret nobody becomes a neighbour, whatever it sends; a victim
// generating meanwhile gets exactly the single-process text.
TEST_F(AttackTest, InjectionIsRefused) {
  auto victim = std::async(std::launch::async, [&] {
    return testing::GenerateOnRing(ring_->head(), kPrompt, Greedy(), 48);
  });
  ring::LinkAuth no_secret;
  no_secret.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
  no_secret.insecure = true;
  ring::LinkAuth wrong = no_secret;
  wrong.ring_secret = "a-guessed-ring-secret-123456";
  wrong.insecure = false;
  for (int i = 0; i < 3; ++i) {
    for (const ring::LinkAuth* auth : {&no_secret, &wrong}) {
      auto link = Dial(i, *auth);
      ASSERT_FALSE(link.ok()) << "stage " << i << " accepted an unauthenticated predecessor";
      EXPECT_EQ(link.status().code(), StatusCode::kUnauthenticated) << link.status().message();
    }
    // The old way in: HELLO with no handshake at all.
    auto raw = net::DialTcp("127.0.0.1", ring_->port(i), 2000);
    ASSERT_TRUE(raw.ok());
    ring::Link plain(std::move(raw).value(), "plain");
    ASSERT_TRUE(plain.Send(ring::HelloMsg{testing::FakeStageHello(model_, 4, 5)}).ok());
    auto reply = plain.Receive();
    ASSERT_TRUE(reply.ok()) << reply.status().message();
    ASSERT_TRUE(std::holds_alternative<ring::ErrorMsg>(*reply));
    EXPECT_EQ(std::get<ring::ErrorMsg>(*reply).code, wire::ErrorCode::kVersion);
  }
  // A client may not pretend to be a stage: the role is bound to the handshake, and a client
  // handshake gives only client rights.
  ring::LinkAuth client;
  client.ring_secret = testing::kTestRingSecret;
  auto as_client = Dial(0, client, wire::Role::kClient);
  ASSERT_TRUE(as_client.ok()) << as_client.status().message();
  ASSERT_TRUE((*as_client)->Send(ring::HelloMsg{testing::FakeStageHello(model_, 4, 5)}).ok());
  auto refused = (*as_client)->Receive();
  ASSERT_TRUE(refused.ok());
  ASSERT_TRUE(std::holds_alternative<ring::ErrorMsg>(*refused));
  EXPECT_THAT(std::get<ring::ErrorMsg>(*refused).message, HasSubstr("role"));

  EXPECT_EQ(victim.get().ids, ring_->expected().ids);
  for (int i = 0; i < 3; ++i) EXPECT_THAT(Log(i), HasSubstr("refused")) << "refusals are logged";
  ring_->ExpectPeakBounded("injection");
  ring_->ExpectServes();
}

// Floods before the handshake: oversized frame headers, many idle connections from one address.
// Each is refused or timed out; the stage's memory and threads stay bounded, and the ring serves.
TEST_F(AttackTest, FloodsBeforeTheHandshakeAreBounded) {
  const pid_t head = ring_->stage(0).pid();
  const int threads_before = testing::ThreadsOf(head);
  std::vector<std::unique_ptr<testing::FdStream>> idle;
  // 12 connections each announcing a 64 MiB frame before any proof: refused at the header.
  for (int i = 0; i < 12; ++i) {
    auto fd = testing::DialFrom(ring_->port(0), "127.0.0.5");
    ASSERT_TRUE(fd.ok()) << fd.status().message();
    auto s = std::make_unique<testing::FdStream>(*fd);
    wire::FrameHeader h{wire::kMagic, static_cast<uint16_t>(wire::MsgType::kHidden), 0,
                        wire::kMaxPayload, 0};
    ASSERT_TRUE(s->WriteAll({reinterpret_cast<const uint8_t*>(&h), sizeof(h)}).ok());
    std::vector<uint8_t> junk(1 << 20, 0x55);
    (void)s->WriteAll(junk);
    idle.push_back(std::move(s));
  }
  // 1000 connections that say nothing.
  int opened = 0;
  for (int i = 0; i < 1000; ++i) {
    auto fd = testing::DialFrom(ring_->port(0), "127.0.0.5");
    if (!fd.ok()) continue;
    ++opened;
    idle.push_back(std::make_unique<testing::FdStream>(*fd));
  }
  EXPECT_GT(opened, 500);
  // While they are open: at most a handshake slot's thread each, bounded memory, and a victim is
  // served in time.
  EXPECT_LT(testing::ThreadsOf(head), threads_before + 64 + 8);
  ring_->ExpectHonestServedWithin1s("1000 idle connections");
  ring_->ExpectPeakBounded("1000 idle connections");
  // The handshake deadline closes the ones that were let in.
  EXPECT_TRUE(testing::WaitFor([&] { return testing::ThreadsOf(head) <= threads_before + 8; },
                               20000))
      << "pending connections were not reaped: " << testing::ThreadsOf(head) << " threads";
  idle.clear();
  ring_->ExpectMemoryReturns("after the flood");
  ring_->ExpectServes();
}

// The pass's attack on the head's memory, and what a client may still do: announce a 64 MiB
// record (refused at its length), hold a record at the client limit and drip it, or pipeline
// requests and never read the answers. 200 holders and 24 non-readers at once stay within the
// client budget (the longest holders are dropped first), honest clients are served meanwhile, and
// when the attackers leave, threads and memory come back without any new connection.
TEST_F(AttackTest, AnonymousClientsCannotExhaustTheHeadsMemory) {
  const uint16_t port = ring_->port(0);
  const pid_t head = ring_->stage(0).pid();
  const int threads_idle = testing::ThreadsOf(head);
  {
    std::vector<std::unique_ptr<RawRingClient>> liars;
    for (int i = 0; i < 32; ++i) {
      auto c = RawRingClient::Connect(port, fmt::format("127.0.0.{}", 2 + i % 4));
      ASSERT_TRUE(c.ok()) << c.status().message();
      std::vector<uint8_t> bytes = RecordLength(64u << 20);
      bytes.push_back(0);
      ASSERT_TRUE((*c)->SendRaw(bytes).ok());
      liars.push_back(std::move(c).value());
    }
    for (auto& c : liars) {
      auto m = c->Receive(10000);
      ASSERT_TRUE(m.ok()) << m.status().message();
      ASSERT_TRUE(std::holds_alternative<ring::ErrorMsg>(*m)) << ring::MessageName(*m);
      EXPECT_EQ(std::get<ring::ErrorMsg>(*m).code, wire::ErrorCode::kTooLarge);
    }
  }
  ring_->ExpectPeakBounded("32 clients announcing 64 MiB records");

  const uint32_t limit = ClientRecordLimit();
  std::vector<std::unique_ptr<RawRingClient>> holders;
  for (int i = 0; i < 200; ++i) {
    auto c = RawRingClient::Connect(port, fmt::format("127.0.1.{}", 1 + i % 50));
    ASSERT_TRUE(c.ok()) << i << ": " << c.status().message();
    std::vector<uint8_t> bytes = RecordLength(limit - 16);
    bytes.resize(bytes.size() + limit - 200, 0x5a);
    ASSERT_TRUE((*c)->SendRaw(bytes).ok());
    holders.push_back(std::move(c).value());
  }
  // They drip a byte each second: never silent long enough for the link timeout.
  Flood drip(1, [&](int, const std::atomic<bool>& running) {
    while (running.load()) {
      const uint8_t one = 0x5a;
      for (auto& c : holders) (void)c->SendRaw({&one, 1});
      pollfd none{};
      ::poll(&none, 0, 1000);  // the attacker's pace: one byte per second per client
    }
  });
  std::atomic<int> non_readers_dropped{0};
  Flood non_readers(24, [&](int i, const std::atomic<bool>& running) {
    auto c = RawRingClient::Connect(port, fmt::format("127.0.2.{}", 1 + i));
    if (!c.ok()) return;
    ring::PingMsg ping;
    while (running.load()) {
      if (!(*c)->SendBatch(ping, 256).ok()) {
        non_readers_dropped.fetch_add(1);
        return;
      }
    }
  });
  ASSERT_TRUE(WaitForLog(0, "dropped client", 30000)) << "no client was dropped";
  for (int i = 0; i < 3; ++i) ring_->ExpectHonestServedWithin1s("200 holders, 24 non-readers");
  ring_->ExpectPeakBounded("200 holders, 24 non-readers");
  EXPECT_TRUE(testing::WaitFor([&] { return non_readers_dropped.load() == 24; }, 30000))
      << non_readers_dropped.load() << " of 24 clients that never read were dropped";
  non_readers.Stop();
  drip.Stop();
  for (auto& c : holders) c->Close();
  holders.clear();
  // Without any new connection: the attackers' threads and memory are gone.
  EXPECT_TRUE(testing::WaitFor([&] { return testing::ThreadsOf(head) <= threads_idle; }, 10000))
      << testing::ThreadsOf(head) << " threads, " << threads_idle << " idle";
  ring_->ExpectMemoryReturns("after 256 anonymous clients");
  ring_->ExpectServes();
}

// Silent connections from a few addresses, renewed as the head closes them: from 4 addresses (the
// pass's attack on the 32 slots) and from 12 (more than the 64 slots hold). Honest clients are
// served within a second throughout, and a predecessor that restarts during the flood gets back in.
TEST_F(AttackTest, HandshakeSlotsCannotBeHeldByAFewAddresses) {
  const uint16_t port = ring_->port(0);
  auto silent = [&](int n_addresses, std::atomic<int>* opened) {
    return std::make_unique<Flood>(n_addresses, [=](int a, const std::atomic<bool>& running) {
      const std::string source = fmt::format("127.0.3.{}", 1 + a);
      std::vector<int> fds;
      while (running.load()) {
        std::erase_if(fds, [](int fd) {
          char b;
          const ssize_t n = ::recv(fd, &b, 1, MSG_DONTWAIT);
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
          ::close(fd);  // closed or refused by the head
          return true;
        });
        while (fds.size() < 10 && running.load()) {
          auto fd = testing::DialFrom(port, source, 500);
          if (!fd.ok()) break;
          fds.push_back(*fd);
          opened->fetch_add(1);
        }
        std::vector<pollfd> p;
        for (int fd : fds) p.push_back({fd, POLLIN, 0});
        ::poll(p.data(), p.size(), 100);
      }
      for (int fd : fds) ::close(fd);
    });
  };
  for (int n_addresses : {4, 12}) {
    std::atomic<int> opened{0};
    auto flood = silent(n_addresses, &opened);
    ASSERT_TRUE(testing::WaitFor([&] { return opened.load() >= 8 * n_addresses; }, 10000));
    const auto start = Clock::now();
    const std::string when = fmt::format("silent connections from {} addresses", n_addresses);
    // For longer than the shortened handshake deadline (1 s), twice over.
    double worst = 0;
    int served = 0;
    while (SecondsSince(start) < 2.5) {
      worst = std::max(worst, ring_->ExpectHonestServedWithin1s(when, /*print=*/false));
      ++served;
    }
    fmt::print(stderr, "[measure] {}: {} honest clients, the longest wait {:.3f} s\n", when,
               served, worst);
    EXPECT_GT(opened.load(), 10 * n_addresses) << "the head closed and the flood renewed them";
    ring_->ExpectPeakBounded(when);
  }
  // The tail restarts during a flood from 12 addresses: it dials the head again and the ring
  // closes within its redial backoff.
  std::atomic<int> opened{0};
  auto flood = silent(12, &opened);
  ASSERT_TRUE(testing::WaitFor([&] { return opened.load() >= 96; }, 10000));
  ring_->stage(2).Kill(SIGKILL);
  ring_->stage(2).Start();
  const auto restarted = Clock::now();
  auto c = ring::RingClient::Connect(ring_->head(), 10000, testing::kTestRingSecret);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_TRUE((*c)->WaitReady(15000).ok()) << "the restarted tail did not get back in";
  fmt::print(stderr, "[measure] the restarted tail was back in {:.2f} s during the flood\n",
             SecondsSince(restarted));
  ring_->ExpectHonestServedWithin1s("after the tail restarted during the flood");
}

// A neighbour that holds the secret but misbehaves: it replaces a live predecessor again and
// again with sessions open (their state must be freed downstream, on every stage), and it sends
// a STATS at the record limit (dropped, never an abort). Against the middle stage and the tail.
class ReplacedPredecessorTest : public AttackTest, public ::testing::WithParamInterface<int> {};

TEST_P(ReplacedPredecessorTest, ReplacedPredecessorsLeakNothing) {
  const int victim = GetParam();
  uint32_t session = 0x7000000;
  // The real predecessor redials too, and may take the place back between two of the attacker's
  // frames: such a round is cut short and tried again. 16 rounds must get all their frames out.
  int complete = 0;
  for (int attempt = 0; attempt < 200 && complete < 16; ++attempt) {
    auto link = MemberLink(victim);
    ASSERT_NE(link, nullptr);
    ring::StatsMsg st;
    st.records.resize(wire::kMaxStatsRecords);
    bool sent = link->Send(st).ok();
    for (int k = 0; k < 4 && sent; ++k) {
      ring::OpenSessionMsg o;
      o.session = ++session;
      o.sampling = ring::SamplingToWire(Greedy(), 8, true);
      o.prompt = {1, 2, 3};
      sent = link->Send(o).ok();
    }
    // Keep it open until the victim has opened the last session: the next round's link
    // replaces this one while its sessions are live.
    if (sent && WaitForLog(victim, fmt::format("session {} open", session), 5000)) ++complete;
  }
  ASSERT_EQ(complete, 16) << "the attacker's links were cut short every time";
  // The real predecessor takes its place back (its backoff is at most 5 s), and every stage has
  // forgotten the attacker's sessions.
  auto c = ring::RingClient::Connect(ring_->head(), 30000, testing::kTestRingSecret);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->WaitReady(30000).ok());
  ring_->ExpectServes();
  // The attacker's sessions are held for a repair (a replaced predecessor may be a standby that
  // replays them), at most --repair-timeout, and give their places to new sessions meanwhile.
  uint32_t open = 0;
  EXPECT_TRUE(testing::WaitFor(
      [&] {
        auto stats = (*c)->Stats();
        if (!stats.ok()) return false;
        open = 0;
        for (const auto& s : *stats) open += s.sessions_open;
        return open == 0;
      },
      (AttackRing::kRepairTimeoutS + 5) * 1000))
      << open << " sessions still open";
  EXPECT_THAT(Log(victim), HasSubstr("replaced by"));
  EXPECT_THAT(Log(victim), HasSubstr("STATS with 1024 records dropped"));
  ring_->ExpectPeakBounded("after the takeovers");
}

INSTANTIATE_TEST_SUITE_P(MiddleAndTail, ReplacedPredecessorTest, ::testing::Values(1, 2),
                         [](const auto& info) { return info.param == 1 ? "Middle" : "Tail"; });

// A second copy of a stage started by mistake: the newer copy takes the place once, and the
// older process's dials are refused while the copy holds it (generations in HELLO), with its
// redial backoff, not in a storm; memory stays flat. When the copy goes, the older process takes
// its place back and the ring serves.
TEST_F(AttackTest, ASecondCopyOfAStageDoesNotStorm) {
  const std::vector<std::string> args =
      testing::StageProcessArgs({"-m", model_}, "0:2", -1, ring_->port(1), "copy", "info");
  testing::ChildProcess copy(args, ring_->log_path(0) + ".copy");
  ASSERT_TRUE(testing::WaitFor([&] { return testing::CountOf(Log(1), "replaced by") >= 1; },
                               30000))
      << Log(1);
  const auto t0 = Clock::now();
  ASSERT_TRUE(testing::WaitFor([&] { return testing::CountOf(Log(1), "is older than") >= 1; },
                               30000))
      << "the older process never dialed again: " << Log(1);
  std::this_thread::sleep_for(std::chrono::seconds(5));
  const double took = SecondsSince(t0);
  const int refused = testing::CountOf(Log(1), "is older than");
  EXPECT_EQ(testing::CountOf(Log(1), "replaced by"), 1) << "the two copies took turns: " << Log(1);
  // Redials back off (100 ms doubling, at most 5 s): a handful in 5 s, not thousands.
  EXPECT_LE(refused, 30) << refused << " refusals in " << took << " s: a storm";
  fmt::print(stderr, "[measure] the older copy was refused {} times in {:.1f} s\n", refused, took);
  ring_->ExpectPeakBounded("with a duplicate stage");
  copy.Kill(SIGKILL);
  auto c = ring::RingClient::Connect(ring_->head(), 30000, testing::kTestRingSecret);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->WaitReady(30000).ok());
  ring_->ExpectServes();
}

// A client that stops reading mid-stream, with four sessions streaming and requests still coming
// (it is not silent): its queue at the head fills and it is dropped; another client's tokens never
// wait a second meanwhile.
TEST_F(AttackTest, AStoppedClientDoesNotStallOthers) {
  auto slow = RawRingClient::Connect(ring_->port(0), "127.0.0.9");
  ASSERT_TRUE(slow.ok()) << slow.status().message();
  ring::GenerateMsg g;
  g.prompt = kPrompt;
  g.sampling = ring::SamplingToWire(Greedy(), 100000, true);
  for (int i = 0; i < 4; ++i) ASSERT_TRUE((*slow)->Send(g).ok());
  Flood pings(1, [&](int, const std::atomic<bool>& running) {
    ring::PingMsg ping;
    while (running.load() && (*slow)->SendBatch(ping, 64).ok()) {
    }
  });
  const testing::HonestRun run = testing::RunHonestClient(ring_->head(), kPrompt, 400);
  ASSERT_TRUE(run.ok) << run.error;
  EXPECT_EQ(run.ids.size(), 400u);
  EXPECT_LT(run.worst(), 1.0) << "a token took " << run.max_gap_s
                              << " s while another client had stopped reading";
  ASSERT_TRUE(WaitForLog(0, "dropped client", 20000)) << Log(0);
  EXPECT_THAT(Log(0), HasSubstr("is not reading")) << "dropped because its queue filled";
  EXPECT_THAT(Log(0), ::testing::Not(HasSubstr("nothing received")));
  pings.Stop();
  ring_->ExpectPeakBounded("with a client that stopped reading");
  ring_->ExpectMemoryReturns("after the stopped client");
  ring_->ExpectServes();
}

// A client process that is stopped (SIGSTOP) sends nothing, keepalives included: the head drops
// it once --link-timeout passes, and another client is not delayed by a second meanwhile.
TEST_F(AttackTest, ASilentClientIsDroppedAtTheLinkTimeout) {
  std::vector<std::string> args = {KVASIR_BINARY, "generate", "--ring", ring_->head(), "-p",
                                   kPrompt, "-n", "100000", "--ignore-eos", "--temp", "0",
                                   "--ring-secret-file", testing::StageTrustArgs("x")[1]};
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t silent = fork();
  if (silent == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(fds[1], 1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(fds[1]);
  char buf[256];
  ASSERT_GT(read(fds[0], buf, sizeof(buf)), 0);  // it is streaming
  kill(silent, SIGSTOP);
  const auto stopped = Clock::now();
  ring_->ExpectHonestServedWithin1s("with a silent client");
  ASSERT_TRUE(WaitForLog(0, "anonymous client): nothing received", (kLinkTimeoutS + 10) * 1000))
      << Log(0);
  EXPECT_LT(SecondsSince(stopped), kLinkTimeoutS + 2.0);
  kill(silent, SIGKILL);
  waitpid(silent, nullptr, 0);
  close(fds[0]);
  ring_->ExpectPeakBounded("with a silent client");
  ring_->ExpectServes();
}

// A frozen middle stage (SIGSTOP) and no standby to take its place: a client gets a clear error
// within --link-timeout + --repair-timeout + 2 s, and after SIGCONT the ring serves again.
TEST_F(AttackTest, AFrozenStageEndsSessionsInTime) {
  auto client = ring::RingClient::Connect(ring_->head(), 10000, testing::kTestRingSecret);
  ASSERT_TRUE(client.ok());
  ring::GenerateMsg g;
  g.prompt = kPrompt;
  g.sampling = ring::SamplingToWire(Greedy(), 100000, true);
  int seen = 0;
  Clock::time_point stopped;
  auto r = (*client)->Generate(g, [&](const ring::TokenMsg&) {
    if (++seen == 5) {
      ring_->stage(1).Signal(SIGSTOP);
      stopped = Clock::now();
    }
  });
  ASSERT_FALSE(r.ok());
  const double waited = SecondsSince(stopped);
  EXPECT_LT(waited, kLinkTimeoutS + AttackRing::kRepairTimeoutS + 2.0) << r.status().message();
  EXPECT_THAT(r.status().message(), HasSubstr("not repaired")) << r.status().message();
  EXPECT_THAT(r.status().message(), HasSubstr("down")) << r.status().message();
  ring_->stage(1).Signal(SIGCONT);
  auto again = ring::RingClient::Connect(ring_->head(), 30000, testing::kTestRingSecret);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->WaitReady(30000).ok());
  ring_->ExpectServes();
  ring_->ExpectPeakBounded("after the freeze");
}

// Client requests at and past the limits are refused with an error; the link stays usable.
TEST_F(AttackTest, BadClientRequestsAreRefused) {
  auto c = RawRingClient::Connect(ring_->port(0));
  ASSERT_TRUE(c.ok()) << c.status().message();
  auto expect_refused = [&](const ring::Message& m, const std::string& needle) {
    ASSERT_TRUE((*c)->Send(m).ok());
    auto reply = (*c)->Receive(10000);
    ASSERT_TRUE(reply.ok()) << reply.status().message();
    ASSERT_TRUE(std::holds_alternative<ring::ErrorMsg>(*reply)) << ring::MessageName(*reply);
    EXPECT_THAT(std::get<ring::ErrorMsg>(*reply).message, HasSubstr(needle));
  };
  ring::GenerateMsg g;
  g.prompt = kPrompt;
  g.sampling = ring::SamplingToWire(Greedy(), 8, false);
  g.sampling.temperature = std::numeric_limits<float>::quiet_NaN();
  expect_refused(g, "temperature");
  g.sampling = ring::SamplingToWire(Greedy(), 8, false);
  g.sampling.repeat_penalty = std::numeric_limits<float>::infinity();
  expect_refused(g, "repeat_penalty");
  g.sampling = ring::SamplingToWire(Greedy(), 8, false);
  g.sampling.top_k = std::numeric_limits<int32_t>::min();
  expect_refused(g, "top_k");
  g.sampling = ring::SamplingToWire(Greedy(), 0, false);
  expect_refused(g, "max_tokens");
  g.sampling = ring::SamplingToWire(Greedy(), 8, false);
  g.stops.assign(8, std::string(1000, 's'));
  expect_refused(g, "stop strings");
  g.stops.clear();
  ring::StatsMsg st;
  st.records.resize(3);
  expect_refused(st, "no records");
  // Still the same link: a good request is served.
  g.sampling = ring::SamplingToWire(Greedy(), 4, true);
  ASSERT_TRUE((*c)->Send(g).ok());
  for (int tokens = 0; tokens < 4; ++tokens) {
    auto m = (*c)->Receive(10000);
    ASSERT_TRUE(m.ok()) << m.status().message();
    ASSERT_TRUE(std::holds_alternative<ring::TokenMsg>(*m)) << ring::MessageName(*m);
  }
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(ring_->stage(i).Alive());
}

// A member of the ring (it holds the secret) against the middle stage and the tail: sampling
// values no stage can use are refused by the stage that receives them, naming the field; a
// 64 MiB bf16 HIDDEN is refused at its record's length (nothing is allocated for it), rows past
// the context before they are widened; the stage's memory stays flat and the ring serves after.
TEST_F(AttackTest, RingMembersCannotMakeAStageAllocateOrCrash) {
  const wire::SamplingWire ok = ring::SamplingToWire(Greedy(), 8, true);
  // The real predecessor redials and may take its place back from the member at any moment: a
  // try whose link was replaced before the stage read it is made again.
  auto until_logged = [&](int victim, const std::function<void(ring::Link&)>& attack,
                          const std::string& logged) {
    for (int attempt = 0; attempt < 10; ++attempt) {
      auto link = MemberLink(victim);
      if (link == nullptr) return false;
      attack(*link);
      if (WaitForLog(victim, logged, 3000)) return true;
    }
    return false;
  };
  struct Bad {
    const char* field;
    std::function<void(wire::SamplingWire&)> set;
  };
  const Bad bad[] = {
      {"temperature", [](auto& w) { w.temperature = std::numeric_limits<float>::quiet_NaN(); }},
      {"repeat_penalty", [](auto& w) { w.repeat_penalty = -1; }},
      {"top_k", [](auto& w) { w.top_k = std::numeric_limits<int32_t>::min(); }},
  };
  uint32_t session = 0x6000000;
  for (int victim : {1, 2}) {
    for (const Bad& b : bad) {
      const uint32_t id = ++session;
      EXPECT_TRUE(until_logged(
          victim,
          [&](ring::Link& link) {
            ring::OpenSessionMsg o{id, ok, {1, 2, 3}, {}};
            b.set(o.sampling);
            (void)link.Send(o);
          },
          fmt::format("session {} refused: OPEN_SESSION: {}", id, b.field)))
          << "stage " << victim << " did not refuse " << b.field << "\n"
          << Log(victim);
    }
  }
  ring_->MarkIdle();
  EXPECT_TRUE(until_logged(
      1,
      [&](ring::Link& link) {
        (void)link.Send(ring::OpenSessionMsg{++session, ok, {1, 2, 3}, {}});
        ring::HiddenMsg h;
        h.session = session;
        h.n_embd = 64;
        h.dtype = wire::Dtype::kBF16;
        h.n_tokens = (wire::kMaxPayload - sizeof(wire::HiddenBody)) / (64 * 2);
        h.data.assign(size_t{h.n_tokens} * 64 * 2, 0);
        (void)link.Send(h);
      },
      "exceeds the"))
      << Log(1);
  // Within the record limit but past the context: refused before it is widened.
  EXPECT_TRUE(until_logged(
      1,
      [&](ring::Link& link) {
        (void)link.Send(ring::OpenSessionMsg{++session, ok, {1, 2, 3}, {}});
        std::vector<float> rows(size_t{600} * 64, 0.5f);
        (void)link.Send(ring::MakeHidden(session, 0, 600, 64, wire::Dtype::kBF16, 0, rows));
      },
      "pass the context of 512"))
      << Log(1);
  ring_->ExpectPeakBounded("a 64 MiB HIDDEN from a member");
  auto c = ring::RingClient::Connect(ring_->head(), 30000, testing::kTestRingSecret);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->WaitReady(30000).ok());
  ring_->ExpectServes();
  ring_->ExpectMemoryReturns("after the member's attacks");
}

}  // namespace
}  // namespace kvasir
