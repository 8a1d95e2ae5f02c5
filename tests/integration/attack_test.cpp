// Attacks on a ring started the documented way: three `kvasir stage` processes of stories260K
// (layers 0:2, 2:4, 4:5) sharing a ring secret file. Each attack is replayed against the running
// ring and must be refused or contained: the victim's output equals the single-process output,
// no stage's memory grows by more than 64 MiB and it comes back down, and the ring serves new
// sessions afterwards.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <future>
#include <thread>

#include "model/model_id.h"
#include "ring/handshake.h"
#include "ring/link.h"
#include "ring/sampling_wire.h"
#include "ring/secure_stream.h"
#include "ring/ring_test_util.h"
#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using ::testing::HasSubstr;
using testing::AssetPath;
using Clock = std::chrono::steady_clock;

constexpr const char* kStories = "models/stories260K.gguf";
constexpr int kLinkTimeoutS = 3;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A number field of /proc/PID/status ("VmRSS:" in kB, "Threads:"), 0 if the process is gone.
uint64_t StatusField(pid_t pid, const std::string& field) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string key;
  while (in >> key) {
    if (key == field) {
      uint64_t v = 0;
      in >> v;
      return v;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return 0;
}

uint64_t RssOf(pid_t pid) { return StatusField(pid, "VmRSS:") * 1024; }
int ThreadsOf(pid_t pid) { return static_cast<int>(StatusField(pid, "Threads:")); }

using Process = testing::ChildProcess;

using testing::Greedy;

class AttackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KV_REQUIRE_ASSET(kStories);
    model_ = AssetPath(kStories);
    bound_ = std::make_unique<testing::BoundPorts>(3);
    for (size_t i = 0; i < 3; ++i) ports_.push_back((*bound_)[i]);
    const char* layers[] = {"0:2", "2:4", "4:5"};
    for (int i = 0; i < 3; ++i) {
      const std::vector<std::string> args = testing::StageProcessArgs(
          {"-m", model_, "-c", "512", "--link-timeout", std::to_string(kLinkTimeoutS)}, layers[i],
          bound_->fd(i), ports_[(i + 1) % 3], fmt::format("a{}", i), "info");
      stages_.push_back(std::make_unique<Process>(args, dir_.File(fmt::format("a{}.log", i)),
                                                  SIGKILL, std::vector<int>{bound_->fd(i)}));
    }
    head_ = fmt::format("127.0.0.1:{}", ports_[0]);
    auto c = ring::RingClient::Connect(head_, 30000, testing::kTestRingSecret);
    ASSERT_TRUE(c.ok()) << c.status().message();
    ASSERT_TRUE((*c)->WaitReady(30000).ok());
    expected_ = testing::GenerateLocally(model_, kPrompt, Greedy(), 48, 512);
    for (auto& s : stages_) rss_before_.push_back(RssOf(s->pid()));
  }

  // RSS of every stage stayed within +64 MiB of where it started.
  void ExpectMemoryBounded(const char* when) {
    for (size_t i = 0; i < stages_.size(); ++i) {
      const uint64_t now = RssOf(stages_[i]->pid());
      EXPECT_LT(now, rss_before_[i] + (64u << 20))
          << when << ": stage " << i << " grew from " << rss_before_[i] << " to " << now;
    }
  }

  // The ring still answers exactly as one process, for 8 concurrent clients.
  void ExpectServes() {
    std::vector<std::future<testing::Generation>> all;
    for (int i = 0; i < 8; ++i) {
      all.push_back(std::async(std::launch::async, [&] {
        return testing::GenerateOnRing(head_, kPrompt, Greedy(), 48);
      }));
    }
    for (auto& f : all) EXPECT_EQ(f.get().ids, expected_.ids);
    for (auto& s : stages_) EXPECT_TRUE(s->Alive());
  }

  // A raw connection to stage `i`, through the handshake with `auth` (role stage).
  Result<std::unique_ptr<ring::Link>> Dial(int i, const ring::LinkAuth& auth,
                                           wire::Role role = wire::Role::kStage) {
    KV_ASSIGN_OR_RETURN(auto s, net::DialTcp("127.0.0.1", ports_[i], 2000));
    KV_ASSIGN_OR_RETURN(auto hs, ring::HandshakeInitiate(*s, role, auth));
    return std::make_unique<ring::Link>(
        std::make_unique<ring::SecureStream>(std::move(s), hs.tx, hs.rx, 80 << 20), "attacker");
  }

  wire::Hello StageHello(int first, int last) {
    wire::Hello h{};
    h.protocol_version = wire::kProtocolVersion;
    h.role = static_cast<uint32_t>(wire::Role::kStage);
    auto file = GgufFile::Open(model_);
    auto id = ComputeModelId(file->header(), model_);
    std::memcpy(h.model_id, id->data(), 16);
    h.n_layer = 5;
    h.n_embd = 64;
    h.window_first = first;
    h.window_last = last;
    std::snprintf(h.name, sizeof(h.name), "attacker");
    return h;
  }

  static constexpr const char* kPrompt = "Once upon a time";
  testing::TempDir dir_;
  std::string model_, head_;
  std::unique_ptr<testing::BoundPorts> bound_;  // held while the stages run
  std::vector<uint16_t> ports_;
  std::vector<std::unique_ptr<Process>> stages_;
  std::vector<uint64_t> rss_before_;
  testing::Generation expected_;
};

// Injection: without the ring secret nobody becomes a neighbour, whatever it sends; a victim
// generating meanwhile gets exactly the single-process text.
TEST_F(AttackTest, InjectionIsRefused) {
  auto victim = std::async(std::launch::async,
                           [&] { return testing::GenerateOnRing(head_, kPrompt, Greedy(), 48); });
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
    auto raw = net::DialTcp("127.0.0.1", ports_[i], 2000);
    ASSERT_TRUE(raw.ok());
    ring::Link plain(std::move(raw).value(), "plain");
    ASSERT_TRUE(plain.Send(ring::HelloMsg{StageHello(4, 5)}).ok());
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
  ASSERT_TRUE((*as_client)->Send(ring::HelloMsg{StageHello(4, 5)}).ok());
  auto refused = (*as_client)->Receive();
  ASSERT_TRUE(refused.ok());
  ASSERT_TRUE(std::holds_alternative<ring::ErrorMsg>(*refused));
  EXPECT_THAT(std::get<ring::ErrorMsg>(*refused).message, HasSubstr("role"));

  EXPECT_EQ(victim.get().ids, expected_.ids);
  for (int i = 0; i < 3; ++i) {
    EXPECT_THAT(stages_[i]->log(), HasSubstr("refused")) << "refusals are logged";
  }
  ExpectMemoryBounded("after injection");
  ExpectServes();
}

// Floods before the handshake: oversized frame headers, many idle connections. Each is refused
// or timed out; the stage's memory and threads stay bounded, and the ring keeps serving.
TEST_F(AttackTest, FloodsBeforeTheHandshakeAreBounded) {
  const pid_t head = stages_[0]->pid();
  const int threads_before = ThreadsOf(head);
  std::vector<std::unique_ptr<net::Stream>> idle;
  // 12 connections each announcing a 64 MiB frame before any proof: refused at the header.
  for (int i = 0; i < 12; ++i) {
    auto s = net::DialTcp("127.0.0.1", ports_[0], 2000);
    ASSERT_TRUE(s.ok());
    wire::FrameHeader h{wire::kMagic, static_cast<uint16_t>(wire::MsgType::kHidden), 0,
                        wire::kMaxPayload, 0};
    ASSERT_TRUE((*s)->WriteAll({reinterpret_cast<const uint8_t*>(&h), sizeof(h)}).ok());
    std::vector<uint8_t> junk(1 << 20, 0x55);
    (void)(*s)->WriteAll(junk);
    idle.push_back(std::move(s).value());
  }
  // 1000 connections that say nothing.
  int opened = 0;
  for (int i = 0; i < 1000; ++i) {
    auto s = net::DialTcp("127.0.0.1", ports_[0], 2000);
    if (!s.ok()) continue;
    ++opened;
    idle.push_back(std::move(s).value());
  }
  EXPECT_GT(opened, 500);
  // While they are open: bounded threads and memory, and a victim is served.
  EXPECT_LT(ThreadsOf(head), threads_before + 3 * 32 + 8);
  ExpectMemoryBounded("during the flood");
  EXPECT_EQ(testing::GenerateOnRing(head_, kPrompt, Greedy(), 48).ids, expected_.ids);
  // The handshake deadline (5 s) closes the ones that were let in.
  const auto t0 = Clock::now();
  while (ThreadsOf(head) > threads_before + 8 && SecondsSince(t0) < 20) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_LE(ThreadsOf(head), threads_before + 8) << "pending connections were not reaped";
  idle.clear();
  ExpectMemoryBounded("after the flood");
  ExpectServes();
}

// A neighbour that holds the secret but misbehaves: it replaces a live predecessor again and
// again with sessions open (their state must be freed downstream), and it sends a STATS at the
// record limit (dropped, never an abort).
TEST_F(AttackTest, ReplacedPredecessorsLeakNothing) {
  ring::LinkAuth member;
  member.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
  member.ring_secret = testing::kTestRingSecret;
  uint32_t session = 0x7000000;
  // The real stage 1 redials too, and may take the place back between two of the attacker's
  // frames: such a round is cut short and tried again. 16 rounds must get all their frames out.
  int complete = 0;
  for (int attempt = 0; attempt < 200 && complete < 16; ++attempt) {
    auto link = Dial(2, member);  // becomes stage 2's predecessor (ends at layer 4)
    ASSERT_TRUE(link.ok()) << link.status().message();
    if (!(*link)->Send(ring::HelloMsg{StageHello(2, 4)}).ok()) continue;
    auto hello = (*link)->Receive();
    if (!hello.ok()) continue;
    ASSERT_TRUE(std::holds_alternative<ring::HelloMsg>(*hello));
    bool sent = true;
    ring::StatsMsg st;
    st.records.resize(wire::kMaxStatsRecords);
    sent = sent && (*link)->Send(st).ok();
    for (int k = 0; k < 4 && sent; ++k) {
      ring::OpenSessionMsg o;
      o.session = ++session;
      o.sampling = ring::SamplingToWire(Greedy(), 8, true);
      o.prompt = {1, 2, 3};
      sent = (*link)->Send(o).ok();
    }
    // Keep it open: the next round's link replaces this one while its sessions are live.
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (sent) ++complete;
  }
  ASSERT_EQ(complete, 16) << "the attacker's links were cut short every time";
  // The real stage 1 takes its place back (its backoff is at most 5 s), and every stage has
  // forgotten the attacker's sessions.
  auto c = ring::RingClient::Connect(head_, 30000, testing::kTestRingSecret);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->WaitReady(30000).ok());
  ExpectServes();
  auto stats = (*c)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  for (const auto& s : *stats) EXPECT_EQ(s.sessions_open, 0u) << s.name;
  EXPECT_THAT(stages_[2]->log(), HasSubstr("replaced by"));
  EXPECT_THAT(stages_[2]->log(), HasSubstr("STATS with 1024 records dropped"));
  ExpectMemoryBounded("after the takeovers");
}

// A second copy of a stage started by mistake: the two copies take the place from each other
// with backoff, not in a storm, and memory stays flat. When the copy goes, the ring serves.
TEST_F(AttackTest, ASecondCopyOfAStageDoesNotStorm) {
  const std::vector<std::string> args =
      testing::StageProcessArgs({"-m", model_}, "0:2", -1, ports_[1], "copy", "info");
  Process copy(args, dir_.File("copy.log"));
  std::this_thread::sleep_for(std::chrono::seconds(8));
  const std::string log = stages_[1]->log();
  size_t replaced = 0;
  for (size_t at = log.find("replaced by"); at != std::string::npos;
       at = log.find("replaced by", at + 1)) {
    ++replaced;
  }
  // With backoff (100 ms doubling to 5 s, per side) 8 s hold at most a few dozen takeovers; without
  // it there were thousands per second.
  EXPECT_LT(replaced, 60u) << replaced << " takeovers in 8 s";
  ExpectMemoryBounded("with a duplicate stage");
  copy.Kill(SIGKILL);
  auto c = ring::RingClient::Connect(head_, 30000, testing::kTestRingSecret);
  ASSERT_TRUE(c.ok());
  ASSERT_TRUE((*c)->WaitReady(30000).ok());
  ExpectServes();
}

// A client that stops reading mid-stream (SIGSTOP) does not delay another client by more than a
// second, and is dropped.
TEST_F(AttackTest, AStoppedClientDoesNotStallOthers) {
  std::vector<std::string> args = {KVASIR_BINARY, "generate", "--ring", head_, "-p", kPrompt,
                                   "-n", "100000", "--ignore-eos", "--temp", "0",
                                   "--ring-secret-file", testing::StageTrustArgs("x")[1]};
  // Its stdout is a pipe nobody reads once it is stopped.
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  pid_t slow = fork();
  if (slow == 0) {
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
  kill(slow, SIGSTOP);
  // Another client, token by token: no gap over a second.
  auto client = ring::RingClient::Connect(head_, 10000, testing::kTestRingSecret);
  ASSERT_TRUE(client.ok());
  ring::GenerateMsg g;
  g.prompt = kPrompt;
  g.sampling = ring::SamplingToWire(Greedy(), 400, true);
  double worst = 0;
  auto last = Clock::now();
  auto r = (*client)->Generate(g, [&](const ring::TokenMsg&) {
    worst = std::max(worst, SecondsSince(last));
    last = Clock::now();
  });
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->n_generated, 400);
  EXPECT_LT(worst, 1.0) << "a token took " << worst << " s while another client was stopped";
  ExpectMemoryBounded("with a stopped client");
  // The stopped client's link is dropped: it sends nothing (no keepalive) past --link-timeout, or
  // its queue fills.
  auto dropped = [&] {
    const std::string log = stages_[0]->log();
    return log.find("anonymous client): nothing received") != std::string::npos ||
           log.find("dropped client") != std::string::npos;
  };
  const auto t0 = Clock::now();
  while (!dropped() && SecondsSince(t0) < kLinkTimeoutS + 10) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(dropped()) << stages_[0]->log();
  kill(slow, SIGKILL);
  waitpid(slow, nullptr, 0);
  close(fds[0]);
  ExpectServes();
}

// A frozen middle stage (SIGSTOP): a client gets a clear error within --link-timeout + 2 s, and
// after SIGCONT the ring serves again.
TEST_F(AttackTest, AFrozenStageEndsSessionsInTime) {
  auto client = ring::RingClient::Connect(head_, 10000, testing::kTestRingSecret);
  ASSERT_TRUE(client.ok());
  ring::GenerateMsg g;
  g.prompt = kPrompt;
  g.sampling = ring::SamplingToWire(Greedy(), 100000, true);
  int seen = 0;
  Clock::time_point stopped;
  auto r = (*client)->Generate(g, [&](const ring::TokenMsg&) {
    if (++seen == 5) {
      stages_[1]->Signal(SIGSTOP);
      stopped = Clock::now();
    }
  });
  ASSERT_FALSE(r.ok());
  const double waited = SecondsSince(stopped);
  EXPECT_LT(waited, kLinkTimeoutS + 2.0) << r.status().message();
  EXPECT_THAT(r.status().message(), HasSubstr("down")) << r.status().message();
  stages_[1]->Signal(SIGCONT);
  auto again = ring::RingClient::Connect(head_, 30000, testing::kTestRingSecret);
  ASSERT_TRUE(again.ok());
  ASSERT_TRUE((*again)->WaitReady(30000).ok());
  ExpectServes();
  ExpectMemoryBounded("after the freeze");
}

// Client requests at and past the limits are refused with an error; the link stays usable.
TEST_F(AttackTest, BadClientRequestsAreRefused) {
  ring::LinkAuth client;
  client.ring_secret = testing::kTestRingSecret;
  auto link = Dial(0, client, wire::Role::kClient);
  ASSERT_TRUE(link.ok());
  wire::Hello h{};
  h.protocol_version = wire::kProtocolVersion;
  h.role = static_cast<uint32_t>(wire::Role::kClient);
  ASSERT_TRUE((*link)->Send(ring::HelloMsg{h}).ok());
  ASSERT_TRUE((*link)->Receive().ok());
  auto expect_refused = [&](const ring::Message& m, const std::string& needle) {
    ASSERT_TRUE((*link)->Send(m).ok());
    auto reply = (*link)->Receive();
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
  g.sampling = ring::SamplingToWire(Greedy(), 0, false);
  expect_refused(g, "max_tokens");
  ring::StatsMsg st;
  st.records.resize(3);
  expect_refused(st, "no records");
  // Still the same link: a good request is served.
  g.sampling = ring::SamplingToWire(Greedy(), 4, true);
  ASSERT_TRUE((*link)->Send(g).ok());
  int tokens = 0;
  while (tokens < 4) {
    auto m = (*link)->Receive();
    ASSERT_TRUE(m.ok()) << m.status().message();
    ASSERT_TRUE(std::holds_alternative<ring::TokenMsg>(*m)) << ring::MessageName(*m);
    ++tokens;
  }
  for (auto& s : stages_) EXPECT_TRUE(s->Alive());
}

}  // namespace
}  // namespace kvasir
