// kvasir fetch against a real nginx on loopback: a fetched window is byte for byte the slice cut
// locally, a one-layer window costs about that layer's bytes, an interrupted fetch (the process
// killed, or the server killed and restarted) resumes, and a server that ignores Range, a
// truncated body, a checksum mismatch or the wrong model each fail with a clear message and leave
// no file behind.
#include "fetch_test_fixture.h"

namespace kvasir {
namespace {

using namespace fetch_testing;  // NOLINT: the fixture's helpers
using testing::AssetPath;
using ::testing::HasSubstr;
using testing::Nginx;
TEST_F(FetchTest, EveryOneLayerWindowOfStoriesIsTheLocalSlice) {
  KV_REQUIRE_ASSET(kStories);
  KV_START_NGINX(nginx, NginxOptions());
  for (auto [first, last] :
       std::vector<std::pair<int, int>>{{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {0, 5}}) {
    SCOPED_TRACE(fmt::format("layers {}:{}", first, last));
    const std::string out = out_.File("stage.gguf");
    FetchSummary sum;
    Status s = FetchSlice(Options(nginx->Url("/stories260K.gguf"), first, last, out), &sum);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(ReadFileToString(out), SliceBytes(AssetPath(kStories), first, last, out_));
    EXPECT_EQ(sum.file_bytes, std::filesystem::file_size(AssetPath(kStories)));
    EXPECT_EQ(sum.resumed_bytes, 0u);
    std::printf("stories260K layers %d:%d: %s\n", first, last, Ratio(sum).c_str());
    std::filesystem::remove(out);
  }
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});
}

TEST_F(FetchTest, OneLayerWindowDownloadsAboutThatLayer) {
  KV_START_NGINX(nginx, NginxOptions());
  const std::string out = out_.File("stage.gguf");
  FetchSummary sum;
  FetchOptions o = Options(nginx->Url("/synth.gguf"), 2, 3, out);
  o.max_request_bytes = 1 << 20;  // many requests over 4 connections
  Status s = FetchSlice(o, &sum);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadFileToString(out), SliceBytes(Served("synth.gguf"), 2, 3, out_));
  std::printf("synth 4-layer layers 2:3: %s\n", Ratio(sum).c_str());
  // The header read and the alignment gaps are all that is transferred beyond the window.
  EXPECT_LE(sum.downloaded_bytes, sum.header_bytes + sum.window_bytes + 64 * 1024);
  EXPECT_LT(sum.window_bytes * 3, sum.file_bytes);
  EXPECT_GT(sum.requests, 5u);
}

TEST_F(FetchTest, HttpsWithAPrivateCa) {
  KV_START_NGINX(nginx, NginxOptions());
  if (nginx->TlsUrl("/").empty()) KV_SKIP_OR_FAIL(nginx->tls_why());
  const std::string out = out_.File("stage.gguf");
  FetchOptions o = Options(nginx->TlsUrl("/synth.gguf"), 3, 4, out);
  o.http.ca_file = nginx->ca_file();
  FetchSummary sum;
  Status s = FetchSlice(o, &sum);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadFileToString(out), SliceBytes(Served("synth.gguf"), 3, 4, out_));

  // Without --ca: refused at once (no retries), nothing left.
  std::filesystem::remove(out);
  o.http.ca_file.clear();
  s = FetchSlice(o, &sum);
  EXPECT_THAT(s.message(), HasSubstr("TLS handshake failed"));
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});
}

TEST_F(FetchTest, ServerIgnoringRangeIsRefusedAndLeavesNothing) {
  KV_START_NGINX(nginx, NginxOptions());
  Status s = FetchSlice(Options(nginx->Url("/norange/synth.gguf"), 0, 1, out_.File("stage.gguf")),
                        nullptr);
  EXPECT_THAT(s.message(), HasSubstr("ignored the Range request"));
  EXPECT_THAT(s.message(), HasSubstr("/norange/synth.gguf"));
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});
}

TEST_F(FetchTest, TruncatedBodiesAreRetriedThenRefusedAndLeaveNothing) {
  const std::string file = ReadFileToString(Served("synth.gguf"));
  // Honest about the header, then every tensor range stops after 1000 bytes.
  testing::FakeHttpServer server([&](const testing::FakeRequest& r) {
    return testing::FakeHttpServer::Partial(r, file, r.first == 0 ? -1 : 1000);
  });
  FetchOptions o = Options(server.Url("/synth.gguf"), 1, 2, out_.File("stage.gguf"));
  Status s = FetchSlice(o, nullptr);
  EXPECT_THAT(s.message(), HasSubstr("ended after 1000 of"));
  EXPECT_THAT(s.message(), HasSubstr("gave up after 3 attempts"));
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});
}

TEST_F(FetchTest, ChecksumsFromTheManifestAreVerified) {
  KV_START_NGINX(nginx, NginxOptions());
  auto parent = GgufFile::Open(Served("synth.gguf"));
  ASSERT_TRUE(parent.ok());
  FetchOptions o = Options(nginx->Url("/synth.gguf"), 1, 2, out_.File("stage.gguf"));
  for (const auto& t : parent->tensors()) {
    if (t.name.rfind("blk.1.", 0) == 0) {
      o.sha256[t.name] = Sha256Hex(Sha256Of(parent->TensorData(t)));
    }
  }
  ASSERT_EQ(o.sha256.size(), 9u);
  o.expected_model_id = ModelIdHex(ComputeModelId(parent->header(), "synth").value());
  FetchSummary sum;
  Status s = FetchSlice(o, &sum);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(sum.verified_tensors, 9);
  std::filesystem::remove(o.out_path);

  // One wrong digest: the tensor is named, nothing is left.
  o.sha256["blk.1.ffn_up.weight"] = std::string(64, 'a');
  s = FetchSlice(o, &sum);
  EXPECT_THAT(s.message(), HasSubstr("tensor blk.1.ffn_up.weight: SHA-256"));
  EXPECT_THAT(s.message(), HasSubstr("does not match the manifest's aaaa"));
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});

  // A manifest for another model, or another window.
  o.sha256.clear();
  o.expected_model_id = std::string(32, '0');
  s = FetchSlice(o, &sum);
  EXPECT_THAT(s.message(), HasSubstr("the manifest names model 0000"));
  o.expected_model_id.reset();
  o.sha256["blk.3.ffn_up.weight"] = std::string(64, 'a');
  s = FetchSlice(o, &sum);
  EXPECT_THAT(s.message(), HasSubstr("lists tensor blk.3.ffn_up.weight for layers 1:2"));
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});
}

TEST_F(FetchTest, BadRequestsAreRefused) {
  KV_START_NGINX(nginx, NginxOptions());
  Status s = FetchSlice(Options(nginx->Url("/synth.gguf"), 2, 9, out_.File("s.gguf")), nullptr);
  EXPECT_THAT(s.message(), HasSubstr("are not a window of the model's 4 layers"));
  s = FetchSlice(Options(nginx->Url("/missing.gguf"), 0, 1, out_.File("s.gguf")), nullptr);
  EXPECT_THAT(s.message(), HasSubstr("404"));
  s = FetchSlice(Options(nginx->Url("/synth.gguf"), 0, 1, out_.File("no/such/dir/s.gguf")),
                 nullptr);
  EXPECT_THAT(s.message(), HasSubstr("does not exist"));
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});
}

// A server whose file is replaced by a tampered copy of the same size right after the first
// request (the header read): the validators of both versions are `v1` and `v2` (header lines),
// and If-Range is honoured as RFC 9110 says. Records the If-Range of every request.
class SwappingServer {
 public:
  SwappingServer(const std::string& bytes, std::string v1, std::string v2)
      : v1_{bytes, std::move(v1)},
        v2_{bytes, std::move(v2)},
        server_([this](const testing::FakeRequest& r) {
          const int n = n_++;
          {
            std::lock_guard<std::mutex> lock(mu_);
            if_ranges_.push_back(r.Header("If-Range"));
          }
          return testing::FakeHttpServer::Serve(r, n == 0 ? v1_ : v2_);
        }) {
    // Flip one byte in every 4 KiB past the first 64 KiB: the tensors change, the header does not.
    for (size_t i = 64 << 10; i < v2_.bytes.size(); i += 4096) v2_.bytes[i] ^= 0x5a;
  }
  std::string Url() const { return server_.Url("/synth.gguf"); }
  std::vector<std::string> if_ranges() {
    std::lock_guard<std::mutex> lock(mu_);
    return if_ranges_;
  }

 private:
  testing::FakeFile v1_, v2_;
  std::atomic<int> n_{0};
  std::mutex mu_;
  std::vector<std::string> if_ranges_;
  testing::FakeHttpServer server_;
};

constexpr const char* kDate1 = "Last-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n";
constexpr const char* kDate2 = "Last-Modified: Tue, 02 Jan 2024 00:00:00 GMT\r\n";

TEST_F(FetchTest, ASameSizeSwapIsRefusedWhenThereIsALastModifiedDate) {
  SwappingServer server(ReadFileToString(Served("synth.gguf")), kDate1, kDate2);
  FetchSummary sum;
  Status s = FetchSlice(Options(server.Url(), 1, 3, out_.File("stage.gguf")), &sum);
  EXPECT_THAT(s.message(), HasSubstr("the file at " + server.Url() +
                                     " changed during the download (it was Last-Modified Mon, 01 "
                                     "Jan 2024 00:00:00 GMT, the server now has Last-Modified Tue, "
                                     "02 Jan 2024 00:00:00 GMT"));
  EXPECT_THAT(s.message(), HasSubstr("unusable and were removed"));
  EXPECT_EQ(s.code(), StatusCode::kInvalidInput);
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});
  const auto sent = server.if_ranges();
  ASSERT_GE(sent.size(), 2u);
  EXPECT_EQ(sent[0], "");  // the header read: nothing to pin yet
  EXPECT_EQ(sent[1], "Mon, 01 Jan 2024 00:00:00 GMT");
}

TEST_F(FetchTest, ASameSizeSwapIsRefusedWhenThereIsAStrongEtag) {
  SwappingServer server(ReadFileToString(Served("synth.gguf")),
                        "ETag: \"v1\"\r\n" + std::string(kDate1),
                        "ETag: \"v2\"\r\n" + std::string(kDate1));
  Status s = FetchSlice(Options(server.Url(), 1, 3, out_.File("stage.gguf")), nullptr);
  EXPECT_THAT(s.message(), HasSubstr("changed during the download (it was ETag \"v1\", the server "
                                     "now has ETag \"v2\""));
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});
  const auto sent = server.if_ranges();
  ASSERT_GE(sent.size(), 2u);
  EXPECT_EQ(sent[1], "\"v1\"");  // the ETag, not the (unchanged) date
}

TEST_F(FetchTest, AWeakEtagIsNotUsedForIfRangeButStillCompared) {
  // Weak ETag and a date: the date pins the file.
  {
    SwappingServer server(ReadFileToString(Served("synth.gguf")),
                          "ETag: W/\"v1\"\r\n" + std::string(kDate1),
                          "ETag: W/\"v1\"\r\n" + std::string(kDate2));
    Status s = FetchSlice(Options(server.Url(), 1, 3, out_.File("stage.gguf")), nullptr);
    EXPECT_THAT(s.message(), HasSubstr("changed during the download (it was Last-Modified"));
    const auto sent = server.if_ranges();
    ASSERT_GE(sent.size(), 2u);
    EXPECT_EQ(sent[1], "Mon, 01 Jan 2024 00:00:00 GMT");
    EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});
  }
  // A weak ETag alone pins nothing (no If-Range is sent), but a reply with another one is refused.
  {
    SwappingServer server(ReadFileToString(Served("synth.gguf")), "ETag: W/\"v1\"\r\n",
                          "ETag: W/\"v2\"\r\n");
    Status s = FetchSlice(Options(server.Url(), 1, 3, out_.File("stage.gguf")), nullptr);
    EXPECT_THAT(s.message(), HasSubstr("changed during the download (ETag 'W/\"v1\"' -> "
                                       "'W/\"v2\"')"));
    EXPECT_THAT(s.message(), HasSubstr("unusable and were removed"));
    for (const std::string& v : server.if_ranges()) EXPECT_EQ(v, "");
    EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});
  }
}


TEST_F(FetchTest, WithoutValidatorsOrDigestsTheSummarySaysNotVerified) {
  // Nothing can notice this swap: the fetch succeeds, and says that it is not verified.
  SwappingServer server(ReadFileToString(Served("synth.gguf")), "", "");
  TempDir cache;
  const std::string out = out_.File("stage.gguf");
  CliRun r = Kvasir({"fetch", "--url", server.Url(), "--layers", "1:3", "-o", out, "--json"},
                    cache.path());
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["verified"], false);
  EXPECT_EQ(j["pinned_by"], "");
  EXPECT_THAT(j["verification"].get<std::string>(),
              ::testing::StartsWith("not verified: no digests"));
  EXPECT_THAT(r.err, HasSubstr("cannot be checked"));
  EXPECT_NE(ReadFileToString(out), SliceBytes(Served("synth.gguf"), 1, 3, out_));
  for (const std::string& v : server.if_ranges()) EXPECT_EQ(v, "");
  std::filesystem::remove(out);

  r = Kvasir({"fetch", "--url", server.Url(), "--layers", "1:3", "-o", out}, cache.path());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("; not verified: no digests (and the server sent no strong ETag"));
}

TEST_F(FetchTest, TheSummarySaysWhatPinnedAndWhatVerified) {
  KV_START_NGINX(nginx, NginxOptions());
  FetchSummary sum;
  FetchOptions o = Options(nginx->Url("/synth.gguf"), 3, 4, out_.File("stage.gguf"));
  ASSERT_TRUE(FetchSlice(o, &sum).ok());
  EXPECT_THAT(sum.pinned_by, ::testing::StartsWith("ETag \""));
  EXPECT_THAT(DescribeVerification(sum),
              ::testing::StartsWith("not verified: no digests (the download was pinned to one "
                                    "version of the file by ETag"));
  std::filesystem::remove(o.out_path);
  auto parent = GgufFile::Open(Served("synth.gguf"));
  for (const auto& t : parent->tensors()) {
    if (t.name.rfind("blk.3.", 0) == 0) {
      o.sha256[t.name] = Sha256Hex(Sha256Of(parent->TensorData(t)));
    }
  }
  ASSERT_TRUE(FetchSlice(o, &sum).ok());
  // The last window also holds output_norm and output, which have no digest here.
  EXPECT_EQ(DescribeVerification(sum),
            "verified: 9 tensors SHA-256 (2 of 11 tensors have no digest)");
  std::filesystem::remove(o.out_path);
  for (const char* name : {"output_norm.weight", "output.weight"}) {
    if (const GgufTensorInfo* t = parent->FindTensor(name)) {
      o.sha256[name] = Sha256Hex(Sha256Of(parent->TensorData(*t)));
    }
  }
  ASSERT_TRUE(FetchSlice(o, &sum).ok());
  EXPECT_EQ(DescribeVerification(sum), fmt::format("verified: {} tensors SHA-256", sum.n_tensors));
}

TEST_F(FetchTest, AFileReplacedOnNginxMidDownloadIsRefused) {
  KV_START_NGINX(nginx, NginxOptions());
  const std::string original = ReadFileToString(Served("synth.gguf"));
  const std::string swap = Served("swap.gguf");
  std::ofstream(swap, std::ios::binary) << original;
  FetchOptions o = Options(nginx->Url("/slow/swap.gguf"), 0, 3, out_.File("stage.gguf"));
  o.max_request_bytes = 512 << 10;
  ProgressWaiter progress;
  progress.Attach(o);
  Status s;
  std::thread fetch([&] { s = FetchSlice(o, nullptr); });
  EXPECT_TRUE(progress.WaitFor(1u << 20)) << "1 MiB did not arrive within 20 s";
  // The same size, other bytes, a later modification time (so nginx's ETag changes too).
  std::string tampered = original;
  for (size_t i = 64 << 10; i < tampered.size(); i += 4096) tampered[i] ^= 0x5a;
  std::ofstream(swap + ".new", std::ios::binary) << tampered;
  std::filesystem::last_write_time(
      swap + ".new", std::filesystem::last_write_time(swap) + std::chrono::seconds(100));
  std::filesystem::rename(swap + ".new", swap);
  fetch.join();
  std::filesystem::remove(swap);
  EXPECT_THAT(s.message(), HasSubstr("changed during the download (it was ETag"));
  EXPECT_THAT(s.message(), HasSubstr("unusable and were removed"));
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});
}

// 503 to everything: counts the attempts of the header read.
TEST_F(FetchTest, RetriesNMeansNPlusOneAttempts) {
  testing::FakeHttpServer busy([](const testing::FakeRequest&) {
    return std::string(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  });
  TempDir cache;
  for (int retries : {0, 2}) {
    const int before = busy.requests();
    CliRun r = Kvasir({"fetch", "--url", busy.Url("/m.gguf"), "--layers", "0:1", "-o",
                       out_.File("s.gguf"), "--retries", std::to_string(retries)},
                      cache.path());
    EXPECT_EQ(r.code, 1);
    EXPECT_EQ(busy.requests() - before, retries + 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr(fmt::format("gave up after {} attempt", retries + 1)));
  }
  // The same for a piece: the header read is answered, every tensor range is not.
  const std::string file = ReadFileToString(Served("synth.gguf"));
  testing::FakeHttpServer pieces_busy([&](const testing::FakeRequest& r) {
    if (r.first == 0) return testing::FakeHttpServer::Partial(r, file);
    return std::string(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  });
  FetchOptions o = Options(pieces_busy.Url("/synth.gguf"), 1, 2, out_.File("s.gguf"));
  o.connections = 1;
  o.retry.retries = 2;
  Status s = FetchSlice(o, nullptr);
  EXPECT_THAT(s.message(), HasSubstr("gave up after 3 attempts"));
  EXPECT_EQ(s.code(), StatusCode::kUnavailable);
  EXPECT_EQ(pieces_busy.requests(), 1 + 3);
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{});
}

// 206 and its head at once, then one body byte a second.
void TrickleFile(const std::string& file, const testing::FakeRequest& r,
                 testing::FakeHttpServer::Conn& conn) {
  const std::string whole = testing::FakeHttpServer::Partial(r, file);
  const size_t body = whole.find("\r\n\r\n") + 4;
  if (!conn.Write(std::string_view(whole).substr(0, body))) return;
  for (size_t i = body; i < whole.size(); ++i) {
    if (!conn.Write(std::string_view(whole).substr(i, 1))) return;
    if (!conn.Pause(std::chrono::seconds(1))) return;
  }
}

TEST_F(FetchTest, TimeoutIsADeadlineForTheWholeRequest) {
  const std::string file = ReadFileToString(Served("synth.gguf"));
  testing::FakeHttpServer trickle{testing::FakeHttpServer::Handler(
      [&](const testing::FakeRequest& r, testing::FakeHttpServer::Conn& c) {
        TrickleFile(file, r, c);
      })};
  TempDir cache;
  for (int retries : {0, 1}) {
    SCOPED_TRACE(fmt::format("--retries {}", retries));
    const int before = trickle.requests();
    const auto t0 = std::chrono::steady_clock::now();
    CliRun r = Kvasir({"fetch", "--url", trickle.Url("/synth.gguf"), "--layers", "0:1", "-o",
                       out_.File("s.gguf"), "--timeout", "2", "--retries", std::to_string(retries)},
                      cache.path());
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(r.code, 1);
    EXPECT_THAT(r.err, HasSubstr("timed out"));
    EXPECT_THAT(r.err, HasSubstr("within 2.0 s"));
    EXPECT_EQ(trickle.requests() - before, retries + 1);
    // Each attempt ends at its 2 s deadline; 0.5 s of backoff between attempts.
    EXPECT_LT(seconds, (retries + 1) * 2 + retries * 0.5 + 3) << r.err;
  }
}

TEST_F(FetchTest, AStalledRequestIsRetriedWithBackoff) {
  const std::string file = ReadFileToString(Served("synth.gguf"));
  std::atomic<int> n{0};
  // The header read is answered; the first tensor range stalls after its head; the rest are fine.
  testing::FakeHttpServer server{testing::FakeHttpServer::Handler(
      [&](const testing::FakeRequest& r, testing::FakeHttpServer::Conn& c) {
        if (n++ == 1) {
          const std::string whole = testing::FakeHttpServer::Partial(r, file);
          c.Write(std::string_view(whole).substr(0, whole.find("\r\n\r\n") + 4 + 1000));
          c.Pause(std::chrono::seconds(60));
          return;
        }
        c.Write(testing::FakeHttpServer::Partial(r, file));
      })};
  FetchOptions o = Options(server.Url("/synth.gguf"), 1, 2, out_.File("stage.gguf"));
  o.connections = 1;
  o.http.request_timeout_ms = 1000;
  FetchSummary sum;
  Status s = FetchSlice(o, &sum);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadFileToString(o.out_path), SliceBytes(Served("synth.gguf"), 1, 2, out_));
  EXPECT_GE(server.requests(), 3);
}

// Starts `kvasir fetch ARGS` in the background with output to files in `dir`.
pid_t Spawn(const std::vector<std::string>& args, const TempDir& dir) {
  std::vector<std::string> argv_s = {KVASIR_BINARY, "fetch"};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  const pid_t pid = fork();
  if (pid == 0) {
    const std::string out = dir.File("fetch.stdout"), err = dir.File("fetch.stderr");
    freopen(out.c_str(), "w", stdout);
    freopen(err.c_str(), "w", stderr);
    std::vector<char*> argv;
    for (auto& a : argv_s) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

int DonePieces(const std::string& state) {
  std::ifstream in(state);
  if (!in) return 0;
  auto j = nlohmann::json::parse(in, nullptr, false);
  return j.is_discarded() || !j.contains("done") ? 0 : static_cast<int>(j["done"].size());
}

TEST_F(FetchTest, AKilledFetchResumesWhereItStopped) {
  KV_START_NGINX(nginx, NginxOptions());
  TempDir logs;
  const std::string out = out_.File("stage.gguf");
  // 2 MiB/s per connection, 256 KiB per request: a piece lands every ~0.1 s.
  const pid_t pid = Spawn({"--url", nginx->Url("/slow/synth.gguf"), "--layers", "1:3", "-o", out,
                           "-j", "2", "--request-size", "0.25"},
                          logs);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (DonePieces(out + ".part.state") < 4 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(WIFSIGNALED(status)) << "the fetch finished before it could be killed:\n"
                                   << ReadFileToString(logs.File("fetch.stderr"));
  EXPECT_FALSE(std::filesystem::exists(out)) << "a killed fetch left a file under the final name";
  ASSERT_TRUE(std::filesystem::exists(out + ".part"));

  FetchSummary sum;
  FetchOptions o = Options(nginx->Url("/synth.gguf"), 1, 3, out);
  o.max_request_bytes = 256 << 10;  // the same pieces as the killed run
  Status s = FetchSlice(o, &sum);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_GE(sum.resumed_bytes, 4u * (256 << 10) - 4096);
  EXPECT_LT(sum.downloaded_bytes, sum.header_bytes + sum.window_bytes - sum.resumed_bytes + 65536);
  EXPECT_EQ(ReadFileToString(out), SliceBytes(Served("synth.gguf"), 1, 3, out_));
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{"stage.gguf"});
  std::printf("resumed %llu of %llu window bytes; downloaded %llu\n",
              static_cast<unsigned long long>(sum.resumed_bytes),
              static_cast<unsigned long long>(sum.window_bytes),
              static_cast<unsigned long long>(sum.downloaded_bytes));
}

TEST_F(FetchTest, SurvivesTheServerBeingKilledAndRestarted) {
  KV_START_NGINX(nginx, NginxOptions());
  const std::string out = out_.File("stage.gguf");
  FetchOptions o = Options(nginx->Url("/slow/synth.gguf"), 0, 2, out);
  o.retry.retries = 7;
  o.retry.delay_ms = 100;
  o.max_request_bytes = 512 << 10;
  ProgressWaiter progress;
  progress.Attach(o);
  FetchSummary sum;
  Status s;
  std::thread fetch([&] { s = FetchSlice(o, &sum); });
  EXPECT_TRUE(progress.WaitFor(2u << 20)) << "2 MiB did not arrive within 20 s";
  // SIGKILL cuts the transfers in flight; the test holds the listening sockets, so the retries
  // wait in their backlog until the new nginx accepts them.
  nginx->Kill();
  std::string why;
  ASSERT_TRUE(nginx->Restart(&why)) << why;
  fetch.join();
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(ReadFileToString(out), SliceBytes(Served("synth.gguf"), 0, 2, out_));
}

TEST_F(FetchTest, LeftoversOfAnotherDownloadAreNotResumed) {
  KV_START_NGINX(nginx, NginxOptions());
  const std::string out = out_.File("stage.gguf");
  std::ofstream(out + ".part") << std::string(1000, 'x');
  std::ofstream(out + ".part.state")
      << R"({"version":1,"url":"http://elsewhere/m.gguf","done":[[0,1000]]})";
  FetchSummary sum;
  Status s = FetchSlice(Options(nginx->Url("/synth.gguf"), 3, 4, out), &sum);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(sum.resumed_bytes, 0u);
  EXPECT_EQ(ReadFileToString(out), SliceBytes(Served("synth.gguf"), 3, 4, out_));
  EXPECT_EQ(Leftovers(out_), std::vector<std::string>{"stage.gguf"});
}

TEST_F(FetchTest, VerifySliceChecksIdentityWindowAndDigests) {
  KV_START_NGINX(nginx, NginxOptions());
  const std::string out = out_.File("stage.gguf");
  ASSERT_TRUE(FetchSlice(Options(nginx->Url("/synth.gguf"), 3, 4, out), nullptr).ok());
  auto parent = GgufFile::Open(Served("synth.gguf"));
  const std::string id = ModelIdHex(ComputeModelId(parent->header(), "synth").value());
  EXPECT_TRUE(VerifySlice(out, id, 3, 4, {}).ok());
  EXPECT_THAT(VerifySlice(out, id, 2, 4, {}).message(), HasSubstr("holds layers 3:4, not 2:4"));
  EXPECT_THAT(VerifySlice(out, std::string(32, 'f'), 3, 4, {}).message(),
              HasSubstr("a slice of model"));
  EXPECT_THAT(VerifySlice(out, id, 3, 4, {{"blk.3.attn_q.weight", std::string(64, '0')}}).message(),
              HasSubstr("does not match"));
}
TEST_F(FetchTest, CommandLine) {
  KV_REQUIRE_ASSET(kStories);
  KV_START_NGINX(nginx, NginxOptions());
  TempDir cache;
  const std::string out = out_.File("s.gguf");
  CliRun r = Kvasir(
      {"fetch", "--url", nginx->Url("/stories260K.gguf"), "--layers", "2:3", "-o", out, "--json"},
      cache.path());
  ASSERT_EQ(r.code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["n_tensors"], 9);
  EXPECT_EQ(j["first"], 2);
  EXPECT_EQ(j["window_bytes"], 181760);
  // Not a terminal: progress comes as log lines with bytes, rate and ETA.
  EXPECT_THAT(r.err, HasSubstr("fetch layers 2:3: 100%"));
  EXPECT_THAT(r.err, HasSubstr("ETA"));
  EXPECT_EQ(ReadFileToString(out), SliceBytes(AssetPath(kStories), 2, 3, out_));

  r = Kvasir({"fetch", "--url", nginx->Url("/stories260K.gguf"), "--layers", "4:5", "-o", out},
             cache.path());
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("fetched layers 4:5 of " + nginx->Url("/stories260K.gguf") +
                               ": 11 tensors"));

  // Usage errors exit 2 and name the flag; a refused download exits 1 with one line.
  r = Kvasir({"fetch", "--url", "ftp://x/m.gguf", "--layers", "0:1", "-o", out}, cache.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("scheme 'ftp'"));
  r = Kvasir({"fetch", "--url", nginx->Url("/stories260K.gguf"), "-o", out}, cache.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--layers"));
  r = Kvasir(
      {"fetch", "--url", nginx->Url("/stories260K.gguf"), "--layers", "0:1", "-o", out, "-j", "0"},
      cache.path());
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, HasSubstr("--connections must be in 1..64"));
  r = Kvasir({"fetch", "--url", nginx->Url("/norange/stories260K.gguf"), "--layers", "0:1", "-o",
              out_.File("n.gguf")},
             cache.path());
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, HasSubstr("kvasir fetch: "));
  EXPECT_THAT(r.err, HasSubstr("ignored the Range request"));
  EXPECT_FALSE(std::filesystem::exists(out_.File("n.gguf")));
}

}  // namespace
}  // namespace kvasir
