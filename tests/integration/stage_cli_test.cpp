// `kvasir stage` and `kvasir generate --ring` end to end, as processes: what a stage refuses at
// start and from peers, its refusal counter, rings pinned to node keys by `kvasir plan --keys`,
// and the client's and stage's flags (-t, --max-sessions, -n 0, --token-timeout). Ports are bound
// once by the test and handed over (--listen-fd); every wait is on an event with a deadline.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "kvasir_process.h"
#include "ring_test_util.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::BoundPorts;
using testing::ChildProcess;
using testing::Describe;
using testing::ExpectRuntimeError;
using testing::ExpectUsageError;
using ::testing::HasSubstr;
using testing::RunKvasir;
using testing::RunResult;
using testing::TempDir;

constexpr const char* kStories = "models/stories260K.gguf";

std::string Addr(uint16_t port) { return fmt::format("127.0.0.1:{}", port); }

// The reference text of stories260K for "Once upon a time", 24 greedy tokens (llama.cpp's).
std::string ReferenceText() {
  return nlohmann::json::parse(
             testing::ReadFileToString(AssetPath("reference/stories260K.p1.json")))["text"]
      .get<std::string>();
}

// A `kvasir stage` process of stories260K on an inherited socket, logging at info to `log`,
// stopped with SIGTERM at the end. `extra` adds or overrides flags (trust, limits).
std::unique_ptr<ChildProcess> Stage(const std::string& layers, int listen_fd, uint16_t next,
                                    const std::string& log, std::vector<std::string> extra) {
  std::vector<std::string> args = {
      KVASIR_BINARY, "stage",    "-m",          AssetPath(kStories),
      "--layers",    layers,     "--listen-fd", std::to_string(listen_fd),
      "--next",      Addr(next), "-t",          "1",
      "--log-level", "info"};
  args.insert(args.end(), extra.begin(), extra.end());
  return std::make_unique<ChildProcess>(args, log, SIGTERM, std::vector<int>{listen_fd});
}

// A two-stage ring ([0, 2) head, [2, 5) tail) on `ports`, authenticated by the test ring secret;
// `head_extra` / `tail_extra` add flags. Logs go to head.log / tail.log in `dir`.
struct TwoStages {
  TwoStages(const TempDir& dir, std::vector<std::string> head_extra = {},
            std::vector<std::string> tail_extra = {})
      : ports(2), head_log(dir.File("head.log")), tail_log(dir.File("tail.log")) {
    auto with_trust = [](std::vector<std::string> extra, const std::string& name) {
      for (std::string& a : testing::StageTrustArgs(name)) extra.push_back(std::move(a));
      return extra;
    };
    head = Stage("0:2", ports.fd(0), ports[1], head_log, with_trust(head_extra, "head"));
    tail = Stage("2:5", ports.fd(1), ports[0], tail_log, with_trust(tail_extra, "tail"));
  }
  std::string head_addr() const { return Addr(ports[0]); }
  BoundPorts ports;
  std::string head_log, tail_log;
  std::unique_ptr<ChildProcess> head, tail;
};

// Waits for `done` (polled every 10 ms) until `seconds` have passed.
bool WaitFor(const std::function<bool()>& done, double seconds = 30) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(static_cast<int>(seconds * 1000));
  while (!done()) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

bool LogHas(const std::string& log, const std::string& text) {
  return testing::ReadFileToString(log).find(text) != std::string::npos;
}

// Asks a stage for its statistics (SIGUSR1) and returns the "links refused N" it logs. `log` must
// be this process's alone (a restarted stage's log would say "listening" before it can take
// SIGUSR1).
int LinksRefused(ChildProcess& stage, const std::string& log) {
  static const std::regex kLine("links refused ([0-9]+)");
  auto count_lines = [&] {
    const std::string text = testing::ReadFileToString(log);
    return std::distance(std::sregex_iterator(text.begin(), text.end(), kLine),
                         std::sregex_iterator());
  };
  // SIGUSR1 before the stage blocks it would end the process: wait until it is up.
  if (!WaitFor([&] { return LogHas(log, "listening on port"); })) {
    ADD_FAILURE() << "the stage did not start:\n" << testing::ReadFileToString(log);
    return -1;
  }
  const auto before = count_lines();
  stage.Signal(SIGUSR1);
  if (!WaitFor([&] { return count_lines() > before; })) {
    ADD_FAILURE() << "no statistics line after SIGUSR1:\n" << testing::ReadFileToString(log);
    return -1;
  }
  const std::string text = testing::ReadFileToString(log);
  std::smatch last;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kLine);
       it != std::sregex_iterator(); ++it) {
    last = *it;
  }
  return std::stoi(last[1].str());
}

std::string WriteFile(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.File(name);
  std::ofstream(path) << text;
  chmod(path.c_str(), 0600);  // secrets among them: a stage warns about a file others may read
  return path;
}

// ---- refused at start -------------------------------------------------------------------------

TEST(StageCliTest, AStageWithNoWayToAuthenticateItsNeighboursRefusesToStart) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  RunResult r = RunKvasir({"stage", "-m", AssetPath(kStories), "--layers", "0:5", "--listen",
                           "127.0.0.1:0", "--next", "127.0.0.1:1", "--key", dir.File("k")});
  ExpectRuntimeError(r, "stage", "nothing to authenticate the predecessor");
  EXPECT_THAT(r.err, HasSubstr("--ring-secret-file"));

  // A manifest whose ranks carry no node keys is no help either (CPU ranks, so that no backend
  // this build lacks is refused first).
  const std::string devices = dir.File("devices.json");
  {
    std::ofstream out(devices);
    out << R"({"devices": [
      {"name": "a", "backend": "cpu", "memory_gib": 0.2, "ms_per_gib": 25},
      {"name": "b", "backend": "cpu", "memory_gib": 0.2, "ms_per_gib": 25}]})";
  }
  const std::string manifest = dir.File("manifest.json");
  ASSERT_EQ(RunKvasir({"plan", "-m", AssetPath(kStories), "--devices", devices, "-o", manifest}).code,
            0);
  r = RunKvasir({"stage", "--manifest", manifest, "--rank", "0", "--listen", "127.0.0.1:0",
                 "--next", "127.0.0.1:1", "--key", dir.File("k")});
  ExpectRuntimeError(r, "stage", "nothing to authenticate");
}

TEST(StageCliTest, InsecureStagesAndClientsStayOnLoopback) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  RunResult r =
      RunKvasir({"stage", "-m", AssetPath(kStories), "--layers", "0:5", "--listen", "0.0.0.0:0",
                 "--next", "127.0.0.1:1", "--insecure", "--key", dir.File("k")});
  ExpectRuntimeError(r, "stage", "--insecure stages listen on loopback only");
  EXPECT_THAT(r.err, HasSubstr("not 0.0.0.0:0"));
  r = RunKvasir({"generate", "--ring", "192.0.2.1:7000", "--insecure", "-p", "hi"});
  EXPECT_EQ(r.code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("--insecure reaches heads on loopback only, not 192.0.2.1:7000"));

  // On loopback an --insecure ring serves an --insecure client.
  BoundPorts ports(2);
  auto head = Stage("0:2", ports.fd(0), ports[1], dir.File("head.log"),
                    {"--insecure", "--key", dir.File("h.key")});
  auto tail = Stage("2:5", ports.fd(1), ports[0], dir.File("tail.log"),
                    {"--insecure", "--key", dir.File("t.key")});
  r = RunKvasir({"generate", "--ring", Addr(ports[0]), "--insecure", "-p", "Once upon a time", "-n",
                 "24", "--temp", "0"});
  ASSERT_EQ(r.code, 0) << Describe(r) << testing::ReadFileToString(dir.File("head.log"));
  EXPECT_EQ(r.out, ReferenceText());
}

// ---- refused peers and the counter --------------------------------------------------------------

// A stage whose predecessor link is relayed (--pred-via) refuses a stage that dials it directly,
// even one that proves the ring secret, and counts each refusal.
TEST(StageCliTest, APredViaStageRefusesADirectTcpPredecessor) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  BoundPorts ports(3);  // the two stages, and a "relay" that never answers
  const std::string relayed_log = dir.File("relayed.log"), direct_log = dir.File("direct.log");
  const std::string relay = fmt::format("ws://127.0.0.1:{}/edge/t1", ports[2]);
  std::vector<std::string> relayed_args = {"--pred-via", relay};
  for (std::string& a : testing::StageTrustArgs("relayed")) relayed_args.push_back(std::move(a));
  auto relayed = Stage("2:5", ports.fd(1), ports[0], relayed_log, relayed_args);
  EXPECT_EQ(LinksRefused(*relayed, relayed_log), 0);
  auto direct = Stage("0:2", ports.fd(0), ports[1], direct_log, testing::StageTrustArgs("direct"));
  ASSERT_TRUE(WaitFor([&] {
    return LogHas(relayed_log, "takes its predecessor through the relay");
  })) << testing::ReadFileToString(relayed_log);
  EXPECT_TRUE(LogHas(relayed_log, relay));
  EXPECT_FALSE(LogHas(relayed_log, "link up: predecessor"));
  EXPECT_GE(LinksRefused(*relayed, relayed_log), 1);
  ASSERT_TRUE(WaitFor([&] { return LogHas(direct_log, "through the relay"); }))
      << "the refused stage was not told why:\n"
      << testing::ReadFileToString(direct_log);
}

// Clients that fail the handshake are refused and counted; an honest one is served and not
// counted.
TEST(StageCliTest, TheRefusalCounterCountsEachRefusedPeer) {
  KV_REQUIRE_ASSET(kStories);
  KV_REQUIRE_ASSET("reference/stories260K.p1.json");
  TempDir dir;
  TwoStages ring(dir);
  const std::string wrong = WriteFile(dir, "wrong.secret", "not-the-ring-secret-0123456789");
  const std::string right = WriteFile(dir, "right.secret", testing::kTestRingSecret);
  // Once the ring is up, nothing has been refused.
  RunResult ok = RunKvasir({"generate", "--ring", ring.head_addr(), "--ring-secret-file", right,
                            "-p", "Once upon a time", "-n", "24", "--temp", "0"});
  ASSERT_EQ(ok.code, 0) << Describe(ok);
  EXPECT_EQ(ok.out, ReferenceText());
  EXPECT_EQ(LinksRefused(*ring.head, ring.head_log), 0);
  for (int i = 0; i < 2; ++i) {
    RunResult r = RunKvasir({"generate", "--ring", ring.head_addr(), "--ring-secret-file", wrong,
                             "-p", "Once upon a time", "-n", "4"});
    EXPECT_EQ(r.code, 1) << Describe(r);
    EXPECT_EQ(r.out, "");
  }
  EXPECT_EQ(LinksRefused(*ring.head, ring.head_log), 2);
  ok = RunKvasir({"generate", "--ring", ring.head_addr(), "--ring-secret-file", right, "-p",
                  "Once upon a time", "-n", "4", "--temp", "0"});
  EXPECT_EQ(ok.code, 0) << Describe(ok);
  EXPECT_EQ(LinksRefused(*ring.head, ring.head_log), 2);
  EXPECT_EQ(LinksRefused(*ring.tail, ring.tail_log), 0);
}

// ---- node keys from `kvasir plan --keys` --------------------------------------------------------

// Three devices' keys (`kvasir id`) go into the manifest with `plan --keys`; stages started from
// it with no ring secret link up by those keys alone and serve the reference text; a stage with
// another key in a rank's place is refused by its neighbours, and a client that expects another
// head key refuses the head.
TEST(StageCliTest, PlanKeysPinTheRingToItsNodes) {
  KV_REQUIRE_ASSET(kStories);
  KV_REQUIRE_ASSET("reference/stories260K.p1.json");
  TempDir dir;
  nlohmann::json keys;
  for (const char* device : {"a", "b", "c", "stranger"}) {
    RunResult id = RunKvasir({"id", "--key", dir.File(std::string(device) + ".key")});
    ASSERT_EQ(id.code, 0) << Describe(id);
    keys[device] = id.out.substr(0, id.out.find('\n'));
    ASSERT_EQ(keys[device].get<std::string>().size(), 64u) << id.out;
  }
  const std::string stranger = keys["stranger"];
  keys.erase("stranger");
  const std::string keys_path = WriteFile(dir, "keys.json", keys.dump());
  // Three devices that each hold 64.75 MiB: the model needs all three at ctx 256.
  const std::string devices = WriteFile(dir, "devices.json", R"({"devices": [
      {"name": "a", "memory_bytes": 67900000, "ms_per_gib": 10},
      {"name": "b", "memory_bytes": 67900000, "ms_per_gib": 10},
      {"name": "c", "memory_bytes": 67900000, "ms_per_gib": 10}]})");
  const std::string manifest = dir.File("manifest.json");
  RunResult plan = RunKvasir({"plan", "-m", AssetPath(kStories), "--devices", devices, "--ctx",
                              "256", "--keys", keys_path, "-o", manifest});
  ASSERT_EQ(plan.code, 0) << Describe(plan);
  const nlohmann::json m = nlohmann::json::parse(testing::ReadFileToString(manifest));
  ASSERT_EQ(m["ranks"].size(), 3u) << m.dump();
  std::vector<std::string> device_of;
  for (const auto& r : m["ranks"]) {
    device_of.push_back(r["device"]);
    EXPECT_EQ(r["node_key"], keys[device_of.back()]) << r.dump();
  }

  BoundPorts ports(3);
  auto start = [&](int rank, const std::string& key_file) {
    return std::make_unique<ChildProcess>(
        std::vector<std::string>{KVASIR_BINARY, "stage", "--manifest", manifest, "--rank",
                                 std::to_string(rank), "--key", key_file, "--listen-fd",
                                 std::to_string(ports.fd(rank)), "--next",
                                 Addr(ports[(rank + 1) % 3]), "-t", "1", "--log-level", "info"},
        dir.File(fmt::format("rank{}.log", rank)), SIGTERM, std::vector<int>{ports.fd(rank)});
  };
  std::vector<std::unique_ptr<ChildProcess>> stages;
  for (int r = 0; r < 3; ++r) stages.push_back(start(r, dir.File(device_of[r] + ".key")));
  auto generate = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = {"generate", "--ring", Addr(ports[0]), "-p", "Once upon a time",
                                     "-n",       "24",     "--temp",       "0"};
    args.insert(args.end(), extra.begin(), extra.end());
    return RunKvasir(args);
  };
  RunResult r = generate({"--manifest", manifest});
  ASSERT_EQ(r.code, 0) << Describe(r) << testing::ReadFileToString(dir.File("rank0.log"));
  EXPECT_EQ(r.out, ReferenceText());

  // A client told to expect another node as the head refuses this one.
  r = generate({"--head-key", stranger, "--token-timeout", "5"});
  EXPECT_EQ(r.code, 1) << Describe(r);
  EXPECT_EQ(r.out, "");

  // The stranger in rank 1's place: it says so, and both its neighbours refuse it.
  stages[1].reset();
  stages[1] = start(1, dir.File("stranger.key"));
  const std::string log1 = dir.File("rank1.log");
  ASSERT_TRUE(WaitFor([&] { return LogHas(log1, "its neighbours will refuse it"); }))
      << testing::ReadFileToString(log1);
  EXPECT_TRUE(LogHas(log1, fmt::format("gives rank 1 the node key {}",
                                       keys[device_of[1]].get<std::string>().substr(0, 8))))
      << testing::ReadFileToString(log1);
  const int refused0 = LinksRefused(*stages[0], dir.File("rank0.log"));
  const int refused2 = LinksRefused(*stages[2], dir.File("rank2.log"));
  ASSERT_TRUE(WaitFor([&] {
    return LinksRefused(*stages[2], dir.File("rank2.log")) > refused2 &&
           LinksRefused(*stages[0], dir.File("rank0.log")) > refused0;
  })) << testing::ReadFileToString(dir.File("rank0.log"))
      << testing::ReadFileToString(dir.File("rank2.log"));

  // The right node back in its place: the ring serves again.
  stages[1].reset();
  stages[1] = start(1, dir.File(device_of[1] + ".key"));
  r = generate({"--manifest", manifest});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_EQ(r.out, ReferenceText());
}

// ---- flags -------------------------------------------------------------------------------------

TEST(StageCliTest, ThreadAndSessionFlagsAreChecked) {
  const std::vector<std::string> stage = {"stage",    "-m",          "x.gguf", "--layers",   "0:1",
                                          "--listen", "127.0.0.1:0", "--next", "127.0.0.1:1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> v = stage;
    v.insert(v.end(), extra.begin(), extra.end());
    return RunKvasir(v);
  };
  ExpectUsageError(with({"-t", "0"}), "stage", "-t must be >= 1");
  ExpectUsageError(with({"-t", "100000"}), "stage", "-t 100000: this machine runs");
  ExpectUsageError(with({"--max-sessions", "0"}), "stage", "--max-sessions must be >= 1");
  ExpectUsageError(with({"--link-timeout", "0"}), "stage", "--link-timeout");
  ExpectUsageError(RunKvasir({"generate", "-m", "x.gguf", "-p", "hi", "-t", "0"}), "generate",
                   "-t must be >= 1");
  ExpectUsageError(RunKvasir({"generate", "-m", "x.gguf", "-p", "hi", "-n", "-1"}), "generate",
                   "-n must be >= 0");
  ExpectUsageError(RunKvasir({"generate", "--ring", "127.0.0.1:1", "--ring-secret-file",
                              "/dev/null", "-p", "hi", "--token-timeout", "0"}),
                   "generate", "--token-timeout 0");
}

// -n 0 asks for nothing: no text and exit 0, in one process and on a ring.
TEST(StageCliTest, NZeroGeneratesNothing) {
  KV_REQUIRE_ASSET(kStories);
  RunResult r = RunKvasir(
      {"generate", "-m", AssetPath(kStories), "-p", "Once upon a time", "-n", "0", "-t", "1"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(r.err, HasSubstr("generated: 0 tokens"));
  TempDir dir;
  TwoStages ring(dir);
  const std::string secret = WriteFile(dir, "ring.secret", testing::kTestRingSecret);
  r = RunKvasir({"generate", "--ring", ring.head_addr(), "--ring-secret-file", secret, "-p",
                 "Once upon a time", "-n", "0"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_EQ(r.out, "");
}

// How many sessions the head has opened so far ("session N open: ..." lines).
int SessionsOpened(const std::string& head_log) {
  const std::string text = testing::ReadFileToString(head_log);
  int n = 0;
  for (size_t at = text.find(" open: "); at != std::string::npos;
       at = text.find(" open: ", at + 1)) {
    ++n;
  }
  return n;
}

// A request for 4000 tokens (about 8 s on this ring; a client's whole exchange takes ~25 ms), and
// the stages' context raised to hold it: a session that is surely still open when the test acts.
std::vector<std::string> LongRequest(const std::string& head, const std::string& secret) {
  return {KVASIR_BINARY, "generate",         "--ring", head,   "--ring-secret-file", secret,
          "-p",          "Once upon a time", "-n",     "4000", "--ignore-eos"};
}
const std::vector<std::string> kLongContext = {"-c", "4096", "--link-timeout", "120"};

// A session that stops getting tokens (its tail frozen with SIGSTOP once it is open) ends at the
// client's --token-timeout with an error naming it, while the stages (link timeout 120 s) keep the
// ring up. Before a session starts the client's wait for the ring is bounded the same way, per try.
TEST(StageCliTest, TokenTimeoutEndsTheWaitForAFrozenRing) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  TwoStages ring(dir, kLongContext, kLongContext);
  const std::string secret = WriteFile(dir, "ring.secret", testing::kTestRingSecret);
  std::vector<std::string> args = LongRequest(ring.head_addr(), secret);
  args.erase(args.begin());
  args.insert(args.end(), {"--token-timeout", "1"});
  RunResult r;
  std::thread client([&] { r = RunKvasir(args); });
  const bool opened = WaitFor([&] { return SessionsOpened(ring.head_log) == 1; });
  ring.tail->Signal(SIGSTOP);
  const auto t0 = std::chrono::steady_clock::now();
  client.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ring.tail->Signal(SIGCONT);
  ASSERT_TRUE(opened) << testing::ReadFileToString(ring.head_log);
  EXPECT_EQ(r.code, 1) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("the ring sent no token for 1.0 s")) << r.err;
  // The tail may freeze before or after the first token (a loaded machine decides): either way
  // the client gives up on its own timeout, between tokens as before the first.
  // It ends on its own timeout, long before the stages' 120 s link timeout would end the session.
  EXPECT_LT(seconds, 60) << r.err;
  std::printf("gave up %.2f s after the tail froze\n", seconds);
}

// --max-sessions 1 on the head: while one session is open, a second request is refused as busy,
// naming the limit; once the first ends (its client killed), the next one is served.
TEST(StageCliTest, MaxSessionsRefusesTheSessionOverTheLimit) {
  KV_REQUIRE_ASSET(kStories);
  KV_REQUIRE_ASSET("reference/stories260K.p1.json");
  TempDir dir;
  std::vector<std::string> head_extra = kLongContext;
  head_extra.insert(head_extra.end(), {"--max-sessions", "1"});
  TwoStages ring(dir, head_extra, kLongContext);
  const std::string secret = WriteFile(dir, "ring.secret", testing::kTestRingSecret);
  const std::vector<std::string> request = {"generate",
                                            "--ring",
                                            ring.head_addr(),
                                            "--ring-secret-file",
                                            secret,
                                            "-p",
                                            "Once upon a time",
                                            "-n",
                                            "24",
                                            "--temp",
                                            "0"};
  auto first =
      std::make_unique<ChildProcess>(LongRequest(ring.head_addr(), secret), dir.File("first.log"));
  ASSERT_TRUE(WaitFor([&] { return SessionsOpened(ring.head_log) == 1; }))
      << testing::ReadFileToString(ring.head_log)
      << testing::ReadFileToString(dir.File("first.log"));
  RunResult second = RunKvasir(request);
  const bool first_running = first->Alive();
  first.reset();  // SIGKILL: the head ends its session when the client's link goes
  EXPECT_TRUE(first_running) << "the long session ended before the second request was refused";
  EXPECT_EQ(second.code, 1) << Describe(second);
  EXPECT_EQ(second.out, "");
  EXPECT_THAT(second.err, HasSubstr("the ring ended the request")) << second.err;
  EXPECT_THAT(second.err, HasSubstr("1 sequences are open, the limit is 1")) << second.err;
  RunResult third;
  ASSERT_TRUE(WaitFor([&] {
    third = RunKvasir(request);
    return third.code == 0;
  })) << Describe(third);
  EXPECT_EQ(third.out, ReferenceText());
}

}  // namespace
}  // namespace kvasir
