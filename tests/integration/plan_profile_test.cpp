// End-to-end tests of `kvasir plan` and `kvasir profile` as a user runs them: the manifest carries
// the SHA-256 of every tensor (checked against hashes computed here from the file's bytes), and
// `profile --link` against `profile --link-serve` measures a link whose entry the planner takes.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/evp.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf_file.h"
#include "net/stream.h"
#include "planner/device_profile.h"
#include "planner/manifest.h"
#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using nlohmann::json;
using testing::AssetPath;
using ::testing::HasSubstr;
using testing::ReadFileToString;
using ::testing::StartsWith;
using testing::TempDir;

constexpr const char* kStories = "models/stories260K.gguf";

using testing::Describe;
using testing::LastLine;
using testing::RunResult;

std::vector<char*> Argv(std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  return argv;
}

RunResult Kvasir(const std::vector<std::string>& args) { return testing::RunKvasir(args); }

void ExpectUsageError(const RunResult& r, const std::string& mentions) {
  testing::ExpectUsageError(r, "profile", mentions);
}

json ParseJson(const std::string& text) {
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "not JSON:\n" << text;
  return j;
}

// SHA-256 with OpenSSL directly, apart from the code under test.
std::string OpensslSha256(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EXPECT_EQ(EVP_Digest(bytes.data(), bytes.size(), digest, &len, EVP_sha256(), nullptr), 1);
  std::string hex;
  for (unsigned i = 0; i < len; ++i) hex += fmt::format("{:02x}", digest[i]);
  return hex;
}

// Every tensor's SHA-256, from the file's bytes read with plain file reads at the offsets of the
// tensor index.
std::map<std::string, std::string> HashesFromFile(const std::string& path) {
  auto file = GgufFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().message();
  const std::string bytes = ReadFileToString(path);
  std::map<std::string, std::string> out;
  for (const auto& t : file->tensors()) {
    out[t.name] = OpensslSha256(bytes.substr(file->header().data_offset + t.offset, t.n_bytes));
  }
  return out;
}

// Three devices that each hold only a part of stories260K at ctx 256, so the plan has 2+ ranks.
std::string SplitDevices(const TempDir& dir) {
  const std::string path = dir.File("devices.json");
  std::ofstream(path) << R"({"devices": [
    {"name": "a", "memory_bytes": 67900000, "ms_per_gib": 10},
    {"name": "b", "memory_bytes": 67900000, "ms_per_gib": 10},
    {"name": "c", "memory_bytes": 67900000, "ms_per_gib": 10}]})";
  return path;
}

// ---- plan: tensor hashes --------------------------------------------------------------------

TEST(PlanProfileTest, ManifestCarriesTheSha256OfEveryTensor) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string manifest = dir.File("manifest.json");
  RunResult r = Kvasir({"plan", "-m", AssetPath(kStories), "--devices", SplitDevices(dir), "--ctx",
                        "256", "-o", manifest});
  ASSERT_EQ(r.code, 0) << Describe(r);
  const json m = ParseJson(ReadFileToString(manifest));
  ASSERT_GE(m["ranks"].size(), 2u) << m.dump(1);
  const auto expected = HashesFromFile(AssetPath(kStories));
  std::set<std::string> seen;
  for (const json& rank : m["ranks"]) {
    for (const json& t : rank["tensors"]) {
      const std::string name = t["name"];
      ASSERT_TRUE(t.contains("sha256")) << name;
      const std::string sha = t["sha256"];
      EXPECT_EQ(sha.size(), 64u);
      EXPECT_EQ(sha.find_first_not_of("0123456789abcdef"), std::string::npos) << sha;
      ASSERT_TRUE(expected.count(name)) << name;
      EXPECT_EQ(sha, expected.at(name)) << name;
      seen.insert(name);
    }
  }
  EXPECT_EQ(seen.size(), expected.size());  // every tensor of the model is in some rank

  // The manifest reads back with its hashes.
  auto back = LoadManifest(manifest);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(ManifestToJson(*back), m);
  EXPECT_EQ(back->ranks[0].tensors[0].sha256, expected.at(back->ranks[0].tensors[0].name));
}

TEST(PlanProfileTest, TiedEmbeddingHasOneHashOnBothEnds) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string model = dir.File("tied.gguf");
  std::vector<std::string> synth = testing::SynthArgs(model, "f32", "3", "4");
  synth.push_back("--tied");
  ASSERT_EQ(Kvasir(synth).code, 0);
  RunResult r = Kvasir({"plan", "-m", model, "--devices", SplitDevices(dir), "--ctx", "256"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  const json m = ParseJson(r.out);
  ASSERT_GE(m["ranks"].size(), 2u);
  auto embd_hash = [](const json& rank) -> std::string {
    for (const json& t : rank["tensors"]) {
      if (t["name"] == "token_embd.weight") return t["sha256"];
    }
    return "absent";
  };
  const std::string expected = HashesFromFile(model).at("token_embd.weight");
  EXPECT_EQ(embd_hash(m["ranks"].front()), expected);
  EXPECT_EQ(embd_hash(m["ranks"].back()), expected);
}

TEST(PlanProfileTest, NoHashLeavesTheHashesOut) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string devices = SplitDevices(dir);
  RunResult hashed =
      Kvasir({"plan", "-m", AssetPath(kStories), "--devices", devices, "--ctx", "256"});
  RunResult bare = Kvasir(
      {"plan", "-m", AssetPath(kStories), "--devices", devices, "--ctx", "256", "--no-hash"});
  ASSERT_EQ(hashed.code, 0) << Describe(hashed);
  ASSERT_EQ(bare.code, 0) << Describe(bare);
  EXPECT_THAT(hashed.out, HasSubstr("\"sha256\""));
  EXPECT_THAT(bare.out, ::testing::Not(HasSubstr("sha256")));
  // Otherwise the same manifest.
  json m = ParseJson(hashed.out);
  for (json& rank : m["ranks"]) {
    for (json& t : rank["tensors"]) t.erase("sha256");
  }
  EXPECT_EQ(m, ParseJson(bare.out));
}

// ---- profile: links -------------------------------------------------------------------------

// A `kvasir` process in the background whose stderr is read through a pipe. Killed and reaped by
// the destructor if it is still running.
class Background {
 public:
  explicit Background(const std::vector<std::string>& args) {
    std::vector<std::string> argv_s = {KVASIR_BINARY};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<char*> argv = Argv(argv_s);
    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    pid_ = fork();
    if (pid_ == 0) {
      int null_fd = open("/dev/null", O_RDWR);
      dup2(null_fd, 0);
      dup2(null_fd, 1);
      dup2(fds[1], 2);
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    err_fd_ = fds[0];
  }
  ~Background() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (err_fd_ >= 0) close(err_fd_);
  }

  // Reads stderr until it contains `needle`, within `ms`. False on timeout or end of stderr.
  bool WaitFor(const std::string& needle, int ms) {
    return Pump(ms, [&] { return err_.find(needle) != std::string::npos; }) == kMatched;
  }

  // Reads stderr to its end (the process exits) within `ms`, then reaps the process: its exit
  // code, or -1 when it did not end in time.
  int Wait(int ms) {
    if (Pump(ms, [] { return false; }) != kEnded) return -1;
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

  const std::string& err() const { return err_; }

 private:
  enum PumpResult { kMatched, kEnded, kTimedOut };
  template <typename Done>
  PumpResult Pump(int ms, Done done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
    while (!done()) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      pollfd p{err_fd_, POLLIN, 0};
      if (left <= 0 || poll(&p, 1, int(left)) <= 0) return kTimedOut;
      char buf[4096];
      const ssize_t n = read(err_fd_, buf, sizeof(buf));
      if (n <= 0) return done() ? kMatched : kEnded;
      err_.append(buf, size_t(n));
    }
    return kMatched;
  }

  pid_t pid_ = -1;
  int err_fd_ = -1;
  std::string err_;
};

TEST(PlanProfileTest, ProfileLinkEntryFeedsThePlanner) {
  KV_REQUIRE_ASSET(kStories);
  Background server({"profile", "--link-serve", "127.0.0.1:0", "--once"});
  const std::string marker = "listening on 127.0.0.1:";
  ASSERT_TRUE(server.WaitFor(" (one session)", 10000)) << server.err();
  const size_t at = server.err().find(marker);
  ASSERT_NE(at, std::string::npos) << server.err();
  const std::string port = std::to_string(std::stoi(server.err().substr(at + marker.size())));

  RunResult r = Kvasir({"profile", "-m", AssetPath(kStories), "-n", "4", "-t", "1", "--name", "me",
                        "--link", "127.0.0.1:" + port, "--link-bytes", "8M"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_THAT(r.err, HasSubstr("profile: link to 127.0.0.1:" + port + ": rtt "));
  const json entry = ParseJson(r.out);
  ASSERT_TRUE(entry.contains("link")) << r.out;
  EXPECT_GT(entry["link"]["rtt_ms"].get<double>(), 0.0);
  EXPECT_LT(entry["link"]["rtt_ms"].get<double>(), 50.0);
  EXPECT_GT(entry["link"]["bandwidth_mbps"].get<double>(), 0.0);
  std::printf("profile --link on loopback: %s\n", entry["link"].dump().c_str());

  // The server ends after its one session and reports it.
  EXPECT_EQ(server.Wait(10000), 0) << server.err();
  EXPECT_THAT(server.err(), HasSubstr("51 pings, 8.00 MiB received"));

  // The entry as printed is a devices.json entry.
  TempDir dir;
  const std::string devices = dir.File("devices.json");
  std::ofstream(devices) << json{{"devices", {entry}}}.dump();
  auto parsed = LoadDevices(devices);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  EXPECT_DOUBLE_EQ((*parsed)[0].rtt_ms, entry["link"]["rtt_ms"].get<double>());
  EXPECT_DOUBLE_EQ((*parsed)[0].bandwidth_mbps, entry["link"]["bandwidth_mbps"].get<double>());
  RunResult plan = Kvasir({"plan", "-m", AssetPath(kStories), "--devices", devices, "--no-hash"});
  ASSERT_EQ(plan.code, 0) << Describe(plan);
  EXPECT_EQ(ParseJson(plan.out)["ranks"][0]["device"], "me");
}

TEST(PlanProfileTest, ProfileLinkToAWrongPeerIsRefused) {
  KV_REQUIRE_ASSET(kStories);
  auto listener = net::Listener::Bind("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok()) << listener.status().message();
  std::thread garbage([&] {
    auto c = listener->Accept();
    if (!c.ok()) return;
    const std::string reply = "SSH-2.0-OpenSSH_9.6\r\n";
    (void)(*c)->WriteAll({reinterpret_cast<const uint8_t*>(reply.data()), reply.size()});
    uint8_t buf[256];
    while (true) {
      auto n = (*c)->ReadSome(buf);
      if (!n.ok() || *n == 0) break;
    }
  });
  const std::string addr = "127.0.0.1:" + std::to_string(listener->port());
  RunResult r = Kvasir({"profile", "-m", AssetPath(kStories), "-n", "1", "--link", addr});
  listener->Close();
  garbage.join();
  EXPECT_EQ(r.code, 1) << Describe(r);
  EXPECT_EQ(r.out, "");
  EXPECT_THAT(LastLine(r.err), StartsWith("kvasir profile: link probe: " + addr +
                                          ": is not a kvasir link probe server (it sent 53 53"));

  // Nobody listening: the error names the address.
  RunResult closed = Kvasir({"profile", "-m", AssetPath(kStories), "-n", "1", "--link", addr});
  EXPECT_EQ(closed.code, 1) << Describe(closed);
  EXPECT_THAT(LastLine(closed.err), HasSubstr("cannot connect to " + addr));
}

TEST(PlanProfileTest, ProfileLinkFlagsAreChecked) {
  const std::string m = AssetPath(kStories);
  ExpectUsageError(Kvasir({"profile"}), "-m,--model is required (unless --link-serve)");
  ExpectUsageError(Kvasir({"profile", "-m", m, "--once"}), "--once goes with --link-serve");
  ExpectUsageError(Kvasir({"profile", "--link-serve", "127.0.0.1:0", "-m", m}),
                   "--link-serve only answers probes; it takes no -m or --link");
  ExpectUsageError(Kvasir({"profile", "--link-serve", "nowhere"}), "--link-serve: 'nowhere'");
  ExpectUsageError(Kvasir({"profile", "-m", m, "--link", "nowhere"}), "--link: 'nowhere'");
  ExpectUsageError(Kvasir({"profile", "-m", m, "--link", "127.0.0.1:0"}), "--link: port 0");
  ExpectUsageError(Kvasir({"profile", "-m", m, "--link", "127.0.0.1:9", "--link-bytes", "lots"}),
                   "--link-bytes 'lots' is not a size from 64K to 64G");
  ExpectUsageError(Kvasir({"profile", "-m", m, "--link", "127.0.0.1:9", "--link-bytes", "1K"}),
                   "--link-bytes '1K'");
  ExpectUsageError(Kvasir({"profile", "-m", m, "--link-bytes", "4M"}),
                   "--link-bytes and --link-pings go with --link");
  ExpectUsageError(Kvasir({"profile", "-m", m, "--link", "127.0.0.1:9", "--link-pings", "0"}),
                   "--link-pings must be in 1..10000");
}

}  // namespace
}  // namespace kvasir
