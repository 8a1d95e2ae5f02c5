// A ring that heals (docs/PROTOCOL.md, "Repair"), with real `kvasir stage` processes: a stage
// killed or frozen mid-generation is replaced by a hot standby, the head replays every session,
// and every client gets exactly what one process gives for the same seed; without a standby the
// sessions end with a clear error after --repair-timeout; and nothing is left open afterwards.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <map>
#include <thread>

#include "kvasir_process.h"
#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "ring/client.h"
#include "ring_test_util.h"
#include "streaming_clients.h"
#include "test_assets.h"
#include "tokenizer/tokenizer.h"

namespace kvasir {
namespace {

using Clock = std::chrono::steady_clock;
using testing::AssetPath;
using testing::ChildProcess;

constexpr const char* kModel = "models/stories260K.gguf";
constexpr int kTokens = 160;  // per session: long enough to be mid-stream when a stage dies

std::string Addr(uint16_t port) { return fmt::format("127.0.0.1:{}", port); }

// One stage process of a healing ring: --link-timeout 2, and the given repair flags.
struct StageSpec {
  std::string name, layers;
  uint16_t port = 0;
  std::vector<uint16_t> next;  // the successor's address, then its standbys
  bool standby = false;
  double repair_timeout_s = 20;
  int replay_mb = -1;              // --replay-mb; -1: the default
  std::vector<std::string> extra{};  // more flags (the last stages': drafting)
};

std::unique_ptr<ChildProcess> StartStage(const StageSpec& s, const testing::TempDir& logs) {
  std::vector<std::string> args = {KVASIR_BINARY,
                                   "stage",
                                   "-m",
                                   AssetPath(kModel),
                                   "--layers",
                                   s.layers,
                                   "--listen",
                                   Addr(s.port),
                                   "--next",
                                   Addr(s.next[0]),
                                   "--name",
                                   s.name,
                                   "-t",
                                   "1",
                                   "--link-timeout",
                                   "2",
                                   "--repair-timeout",
                                   fmt::format("{}", s.repair_timeout_s)};
  std::string peers;
  for (size_t i = 1; i < s.next.size(); ++i) peers += (peers.empty() ? "" : ",") + Addr(s.next[i]);
  if (!peers.empty()) {
    args.push_back("--standby-peers");
    args.push_back(peers);
  }
  if (s.standby) args.push_back("--standby");
  if (s.replay_mb >= 0) {
    args.push_back("--replay-mb");
    args.push_back(fmt::format("{}", s.replay_mb));
  }
  args.insert(args.end(), s.extra.begin(), s.extra.end());
  for (std::string& a : testing::StageTrustArgs(s.name)) args.push_back(std::move(a));
  return std::make_unique<ChildProcess>(args, logs.File(s.name + ".log"), SIGTERM);
}

// The reference: the whole model in one process, `n` tokens (end-of-generation ignored).
std::vector<int32_t> Reference(const std::string& prompt, const SamplingParams& params, int n) {
  return testing::GenerateLocally(AssetPath(kModel), prompt, params, n, /*n_ctx=*/0,
                                  /*ignore_eog=*/true)
      .ids;
}

// Client i's request: greedy for even i, seeded sampling at temperature 0.9 for odd i.
SamplingParams ClientSampling(int i) { return testing::StreamSampling(i, 1000); }
std::string ClientPrompt(int i) { return testing::StreamPrompt(i); }
using testing::ClientRun;

// `n` clients stream at once; once each has `before` tokens, `disturb` runs (a stage is killed
// or frozen).
std::vector<ClientRun> StreamWhile(
    const std::string& head, int n, int before, const std::function<void()>& disturb,
    const std::function<SamplingParams(int)>& sampling = ClientSampling) {
  ring::ClientOptions opt;
  opt.ring_secret = testing::kTestRingSecret;
  opt.token_timeout_ms = 60000;
  opt.link_timeout_ms = 2000;  // as the stages': its keepalives keep the head's link up
  return testing::StreamWhile(head, opt, n, kTokens, before, disturb, sampling);
}

// Every client got its reference output, and was mid-stream when the ring was disturbed.
void ExpectUndisturbed(const std::vector<ClientRun>& runs, const std::string& what,
                       const std::function<SamplingParams(int)>& sampling = ClientSampling) {
  testing::ExpectUndisturbed(
      runs, what, kTokens, [&](int i) { return Reference(ClientPrompt(i), sampling(i), kTokens); });
}

// Waits until every stage of the ring reports no session open; returns their records then.
std::vector<wire::StageStats> ExpectIdle(const std::string& head, size_t n_stages) {
  auto client = ring::RingClient::Connect(head, 20000, testing::kTestRingSecret);
  EXPECT_TRUE(client.ok()) << client.status().message();
  if (!client.ok()) return {};
  EXPECT_TRUE((*client)->WaitReady(30000).ok());
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (true) {
    auto stats = (*client)->Stats();
    EXPECT_TRUE(stats.ok()) << stats.status().message();
    if (!stats.ok()) return {};
    EXPECT_EQ(stats->size(), n_stages);
    uint32_t open = 0;
    for (const auto& s : *stats) open += s.sessions_open;
    if (open == 0) return *stats;
    if (Clock::now() > deadline) {
      ADD_FAILURE() << open << " session(s) still open";
      return *stats;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

uint64_t RssOf(const std::vector<wire::StageStats>& stats, const std::string& name) {
  for (const auto& s : stats) {
    if (std::string(s.name) == name) return s.rss_bytes;
  }
  ADD_FAILURE() << "no stage " << name;
  return 0;
}

void DumpLogsOnFailure(const std::vector<std::unique_ptr<ChildProcess>>& stages) {
  if (!::testing::Test::HasFailure()) return;
  for (const auto& s : stages) {
    const std::string log = s->log();
    std::fprintf(stderr, "---- stage log ----\n%s\n",
                 log.substr(log.size() > 6000 ? log.size() - 6000 : 0).c_str());
  }
}

// The ring of these tests: H 0:1 -> A 1:2 -> B 2:4 -> T 4:5 -> H, each window after the head with
// a hot standby (A2, B2, T2); the predecessors list the standby after the stage. `tail_flags` go
// to T and T2.
struct HealingRing {
  testing::TempDir logs;
  // Each stage binds its own port, so that a killed stage's port refuses connections at once
  // (its predecessor moves on to a standby) and stays its own until it comes back.
  testing::ReservedPorts ports{7};  // H, A, B, T, A2, B2, T2
  std::vector<std::unique_ptr<ChildProcess>> stages;
  explicit HealingRing(double repair_timeout_s = 20, bool standbys = true, int replay_mb = -1,
                       const std::vector<std::string>& tail_flags = {}) {
    const uint16_t h = ports[0], a = ports[1], b = ports[2], t = ports[3];
    const uint16_t a2 = ports[4], b2 = ports[5], t2 = ports[6];
    auto with = [&](uint16_t p, uint16_t standby) {
      return standbys ? std::vector<uint16_t>{p, standby} : std::vector<uint16_t>{p};
    };
    std::vector<StageSpec> specs = {
        {"H", "0:1", h, with(a, a2), false, repair_timeout_s},
        {"A", "1:2", a, with(b, b2), false, repair_timeout_s},
        {"B", "2:4", b, with(t, t2), false, repair_timeout_s},
        {"T", "4:5", t, {h}, false, repair_timeout_s},
    };
    if (standbys) {
      specs.push_back({"A2", "1:2", a2, with(b, b2), true, repair_timeout_s});
      specs.push_back({"B2", "2:4", b2, with(t, t2), true, repair_timeout_s});
      specs.push_back({"T2", "4:5", t2, {h}, true, repair_timeout_s});
    }
    for (StageSpec& s : specs) {
      s.replay_mb = replay_mb;
      if (s.layers == "4:5") s.extra = tail_flags;
      stages.push_back(StartStage(s, logs));
    }
  }
  ~HealingRing() { DumpLogsOnFailure(stages); }
  std::string head() const { return Addr(ports[0]); }
  ChildProcess& stage(size_t i) { return *stages[i]; }
};

TEST(HealProcessTest, KilledStagesAreReplacedByStandbysAndClientsLoseNothing) {
  KV_REQUIRE_ASSET(kModel);
  HealingRing ring;
  {
    auto client = ring::RingClient::Connect(ring.head(), 20000, testing::kTestRingSecret);
    ASSERT_TRUE(client.ok()) << client.status().message();
    ASSERT_TRUE((*client)->WaitReady(30000).ok());
  }
  // A middle stage, then the last stage, then the head's successor.
  const std::pair<size_t, const char*> victims[] = {
      {2, "B (middle)"}, {3, "T (last)"}, {1, "A (head's successor)"}};
  for (const auto& [index, name] : victims) {
    auto runs = StreamWhile(ring.head(), 8, 4, [&] { ring.stage(index).Kill(SIGKILL); });
    ExpectUndisturbed(runs, fmt::format("kill -9 {}", name));
  }
  ExpectIdle(ring.head(), 4);
}

// Speculation meets a repair: the last stage drafts by prompt lookup and keeps guessed windows in
// flight (--draft-windows 3) when a middle stage, then the last stage, is killed. Tokens with
// drafts, chains of tokens from one verify chunk, and guessed windows drawn before each replay
// still reach the head after it began, and stages hold rows of drafts not yet rolled back: every
// client, greedy or seeded at a temperature (one draw per token, drafts or not), gets exactly one
// process's tokens without drafts, and no session fails.
TEST(HealProcessTest, ADraftingRingIsRepairedAndClientsLoseNothing) {
  KV_REQUIRE_ASSET(kModel);
  HealingRing ring(20, true, -1, {"--draft", "ngram", "--draft-max", "4", "--draft-windows", "3"});
  {
    auto client = ring::RingClient::Connect(ring.head(), 20000, testing::kTestRingSecret);
    ASSERT_TRUE(client.ok()) << client.status().message();
    ASSERT_TRUE((*client)->WaitReady(30000).ok());
  }
  const std::pair<size_t, const char*> victims[] = {{2, "B (middle)"}, {3, "T (last)"}};
  for (const auto& [index, name] : victims) {
    // Far enough into the sessions for prompt lookup to find repeats, and to guess ahead.
    auto runs = StreamWhile(ring.head(), 8, 40, [&] { ring.stage(index).Kill(SIGKILL); });
    ExpectUndisturbed(runs, fmt::format("drafting, kill -9 {}", name));
  }
  ExpectIdle(ring.head(), 4);
  auto client = ring::RingClient::Connect(ring.head(), 20000, testing::kTestRingSecret);
  ASSERT_TRUE(client.ok()) << client.status().message();
  auto stats = (*client)->StatsMessage();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  ASSERT_EQ(stats->drafts.size(), 4u);
  const wire::DraftStatsWire& drafts = stats->drafts.back();  // T2, the last stage now
  std::printf("T2 after the repair: %llu verify chunks, %llu drafted, %llu accepted\n",
              static_cast<unsigned long long>(drafts.steps),
              static_cast<unsigned long long>(drafts.drafted),
              static_cast<unsigned long long>(drafts.accepted));
  EXPECT_GT(drafts.accepted, 0u) << "the sessions replayed on T2 drafted nothing";
}

// Each stage's repair counts (STATS), by name.
std::map<std::string, wire::RepairStatsWire> RepairsByName(const std::string& head) {
  std::map<std::string, wire::RepairStatsWire> out;
  auto client = ring::RingClient::Connect(head, 20000, testing::kTestRingSecret);
  EXPECT_TRUE(client.ok()) << client.status().message();
  if (!client.ok()) return out;
  auto stats = (*client)->StatsMessage();
  EXPECT_TRUE(stats.ok()) << stats.status().message();
  if (!stats.ok()) return out;
  EXPECT_EQ(stats->repairs.size(), stats->records.size()) << "no repair counts in STATS";
  for (size_t i = 0; i < stats->records.size() && i < stats->repairs.size(); ++i) {
    out[stats->records[i].name] = stats->repairs[i];
  }
  return out;
}

// A middle stage killed during 8 sessions: the replacement runs every replayed position, the
// stages that survived send on their kept rows and run only the few positions they had not run
// yet; with --replay-mb 0 every stage runs every replayed position. Clients get the same tokens
// either way.
void CheckWhoRecomputes(int replay_mb) {
  HealingRing ring(20, true, replay_mb);
  {
    auto client = ring::RingClient::Connect(ring.head(), 20000, testing::kTestRingSecret);
    ASSERT_TRUE(client.ok()) << client.status().message();
    ASSERT_TRUE((*client)->WaitReady(30000).ok());
  }
  auto runs = StreamWhile(ring.head(), 8, 12, [&] { ring.stage(2).Kill(SIGKILL); });
  ExpectUndisturbed(runs, fmt::format("kill -9 B, --replay-mb {}", replay_mb));
  ExpectIdle(ring.head(), 4);
  auto r = RepairsByName(ring.head());
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r["H"].repairs, 8u);
  EXPECT_EQ(r["H"].pauses, 8u);
  EXPECT_GT(r["H"].pause_ms_max, 0u);
  const uint64_t total = r["H"].kept + r["H"].recomputed;  // positions replayed
  EXPECT_GE(total, 8u * 12);
  EXPECT_EQ(r["B2"].kept, 0u);
  EXPECT_EQ(r["B2"].recomputed, total) << "the replacement runs every position";
  for (const char* name : {"H", "A", "T"}) {
    EXPECT_EQ(r[name].kept + r[name].recomputed, total) << name;
    if (replay_mb == 0) {
      EXPECT_EQ(r[name].recomputed, total) << name;
    } else {
      // At most the positions of the steps in flight at the break, a few per session.
      EXPECT_LE(r[name].recomputed, 8u * 3) << name << " ran again what it held";
    }
    std::printf("--replay-mb %d: %s kept %llu, ran %llu of %llu replayed positions\n", replay_mb,
                name, static_cast<unsigned long long>(r[name].kept),
                static_cast<unsigned long long>(r[name].recomputed),
                static_cast<unsigned long long>(total));
  }
}

TEST(HealProcessTest, OnlyTheReplacementRunsTheReplayedPositions) {
  KV_REQUIRE_ASSET(kModel);
  CheckWhoRecomputes(-1);
}

TEST(HealProcessTest, WithoutKeptRowsEveryStageRunsTheReplayAndClientsLoseNothing) {
  KV_REQUIRE_ASSET(kModel);
  CheckWhoRecomputes(0);
}

TEST(HealProcessTest, FrozenStageIsReplacedAndRefusedWhenItWakes) {
  KV_REQUIRE_ASSET(kModel);
  HealingRing ring;
  {
    auto client = ring::RingClient::Connect(ring.head(), 20000, testing::kTestRingSecret);
    ASSERT_TRUE(client.ok()) << client.status().message();
    ASSERT_TRUE((*client)->WaitReady(30000).ok());
  }
  auto runs = StreamWhile(ring.head(), 8, 4, [&] { ring.stage(2).Signal(SIGSTOP); });
  ExpectUndisturbed(runs, "SIGSTOP B");
  // B wakes up: it dials T again, and T refuses it (B2 took its place).
  ring.stage(2).Signal(SIGCONT);
  auto client = ring::RingClient::Connect(ring.head(), 20000, testing::kTestRingSecret);
  ASSERT_TRUE(client.ok()) << client.status().message();
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  uint32_t refused = 0;
  while (refused == 0 && Clock::now() < deadline) {
    auto stats = (*client)->Stats();
    ASSERT_TRUE(stats.ok()) << stats.status().message();
    for (const auto& s : *stats) {
      if (std::string(s.name) == "T") refused = s.links_refused;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_GT(refused, 0u) << "T never refused the woken stage";
  // The ring still answers exactly, through B2.
  auto after = StreamWhile(ring.head(), 2, 0, [] {});
  for (size_t i = 0; i < after.size(); ++i) {
    EXPECT_EQ(after[i].error, "");
    EXPECT_EQ(after[i].ids, Reference(ClientPrompt(static_cast<int>(i)),
                                      ClientSampling(static_cast<int>(i)), kTokens));
  }
  ExpectIdle(ring.head(), 4);
  EXPECT_NE(ring.stage(2).log().find("older than"), std::string::npos)
      << "the woken stage was not told why it was refused";
}

TEST(HealProcessTest, WithoutAStandbySessionsEndAfterTheRepairTimeout) {
  KV_REQUIRE_ASSET(kModel);
  HealingRing ring(/*repair_timeout_s=*/2, /*standbys=*/false);
  {
    auto client = ring::RingClient::Connect(ring.head(), 20000, testing::kTestRingSecret);
    ASSERT_TRUE(client.ok()) << client.status().message();
    ASSERT_TRUE((*client)->WaitReady(30000).ok());
  }
  const auto t0 = Clock::now();
  auto runs = StreamWhile(ring.head(), 4, 4, [&] { ring.stage(2).Kill(SIGKILL); });
  const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
  for (const ClientRun& r : runs) {
    EXPECT_NE(r.error.find("not repaired within 2.0 s"), std::string::npos) << r.error;
    EXPECT_LT(r.ids.size(), static_cast<size_t>(kTokens));
  }
  EXPECT_GE(waited, 2.0);
  // The same stage back: the ring closes again, and no stage kept any of the ended sessions.
  ring.stage(2).Start();
  ExpectIdle(ring.head(), 4);
}

// Twenty repairs in a row under load: the middle window has two processes, both standbys, which
// take turns (the killed one comes back as the standby); afterwards every stage is idle.
TEST(HealProcessTest, TwentyRepairsInARowLeaveEveryStageIdle) {
  KV_REQUIRE_ASSET(kModel);
  testing::TempDir logs;
  const testing::ReservedPorts p(5);  // H, A, X, Y, T: a killed X or Y comes back on its own
  std::vector<std::unique_ptr<ChildProcess>> stages;
  for (const StageSpec& s : std::vector<StageSpec>{
           {"H", "0:1", p[0], {p[1]}},
           {"A", "1:2", p[1], {p[2], p[3]}},
           {"X", "2:4", p[2], {p[4]}, true},
           {"Y", "2:4", p[3], {p[4]}, true},
           {"T", "4:5", p[4], {p[0]}},
       }) {
    stages.push_back(StartStage(s, logs));
  }
  const std::string head = Addr(p[0]);
  // Idle after one round of sessions: the memory of the stages that stay, to compare with.
  (void)StreamWhile(head, 2, 0, [] {});
  const std::vector<wire::StageStats> before = ExpectIdle(head, 4);
  // X was adopted first (A lists it first).
  for (int repair = 0; repair < 20 && !::testing::Test::HasFailure(); ++repair) {
    ChildProcess& victim = *stages[repair % 2 == 0 ? 2 : 3];
    auto runs = StreamWhile(head, 2, 2, [&] { victim.Kill(SIGKILL); });
    for (size_t i = 0; i < runs.size(); ++i) {
      EXPECT_EQ(runs[i].error, "") << "repair " << repair << ", client " << i;
      EXPECT_EQ(runs[i].ids.size(), static_cast<size_t>(kTokens)) << "repair " << repair;
    }
    victim.Start();  // back as the standby of the next repair
  }
  const std::vector<wire::StageStats> after = ExpectIdle(head, 4);
  // The stages that held and replayed every session keep no more memory than a little slack
  // (allocator caches) over what they held idle before.
  for (const char* name : {"H", "A", "T"}) {
    EXPECT_LE(RssOf(after, name), RssOf(before, name) + (uint64_t{16} << 20)) << name;
  }
  DumpLogsOnFailure(stages);
}

// The repair flags are checked before anything runs, each refusal naming the flag.
TEST(HealProcessTest, RepairFlagsAreCheckedBeforeAStageStarts) {
  KV_REQUIRE_ASSET(kModel);
  auto stage = [](std::vector<std::string> extra) {
    std::vector<std::string> args = {"stage",       "-m",        AssetPath(kModel), "--layers",
                                     "0:2",         "--listen",  "127.0.0.1:0",     "--next",
                                     "127.0.0.1:1", "--insecure"};
    args.insert(args.end(), extra.begin(), extra.end());
    return testing::RunKvasir(args);
  };
  auto r = stage({"--standby"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("the head's window (layer 0) has no standby"), std::string::npos) << r.err;
  r = stage({"--repair-timeout", "-1"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--repair-timeout -1 must be from 0 to 3600 seconds"), std::string::npos)
      << r.err;
  r = stage({"--replay-mb", "-1"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--replay-mb -1 must be from 0 to"), std::string::npos) << r.err;
  r = stage({"--standby-peers", "127.0.0.1:2,nowhere"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--standby-peers"), std::string::npos) << r.err;
  r = testing::RunKvasir(
      {"run", "-m", AssetPath(kModel), "--stages", "3", "--standby", "1", "--relay", "-p", "x"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--standby works on direct links"), std::string::npos) << r.err;
  r = testing::RunKvasir(
      {"run", "-m", AssetPath(kModel), "--stages", "2", "--replay-mb", "-1", "-p", "x"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--replay-mb -1 must be from 0 to"), std::string::npos) << r.err;
  r = testing::RunKvasir({"serve", "-m", AssetPath(kModel), "--replay-mb", "2000000"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--replay-mb 2000000 must be from 0 to"), std::string::npos) << r.err;
  r = testing::RunKvasir({"serve", "--ring", "127.0.0.1:1", "--replay-mb", "8"});
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--replay-mb shape a local ring"), std::string::npos) << r.err;
}

// `kvasir run --replay-mb` reaches every stage it starts (each logs the budget it keeps).
TEST(HealProcessTest, RunGivesItsStagesTheReplayBudget) {
  KV_REQUIRE_ASSET(kModel);
  for (const char* mb : {"0", "3"}) {
    auto r = testing::RunKvasir({"run", "-m", AssetPath(kModel), "--stages", "3", "--replay-mb", mb,
                                 "--stage-log-level", "info", "-p", "Once", "-n", "4", "-t", "1"});
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string line = fmt::format("keeps {} MiB of rows sent on for replays", mb);
    size_t n = 0;
    for (size_t at = r.err.find(line); at != std::string::npos; at = r.err.find(line, at + 1)) ++n;
    EXPECT_EQ(n, 3u) << "--replay-mb " << mb << "\n" << r.err;
  }
}

}  // namespace
}  // namespace kvasir
