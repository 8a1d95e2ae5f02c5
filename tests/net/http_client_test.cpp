// The HTTP client against a scripted server that misbehaves in every way a range download can
// notice, and against a real nginx over http and https.
#include "net/http_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <random>

#include "fake_http_server.h"
#include "nginx_fixture.h"
#include "test_assets.h"

namespace kvasir::net {
namespace {

using testing::FakeHttpServer;
using testing::FakeRequest;
using ::testing::HasSubstr;

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  std::mt19937 rng(7);
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

HttpOptions FastOptions() {
  HttpOptions o;
  o.connect_timeout_ms = 2000;
  o.request_timeout_ms = 2000;
  return o;
}

struct Got {
  Status status;
  std::string body;
  RangeReply reply;
  HttpFailure failure = HttpFailure::kNone;
};

Got Get(const std::string& url, uint64_t offset, uint64_t length, bool clamp = false,
        HttpOptions options = FastOptions()) {
  Got g;
  auto client = HttpClient::Create(ParseUrl(url).value(), options);
  EXPECT_TRUE(client.ok()) << client.status().message();
  g.status = (*client)->GetRange(
      offset, length, clamp,
      [&](std::span<const uint8_t> b) {
        g.body.append(reinterpret_cast<const char*>(b.data()), b.size());
        return Status::Ok();
      },
      &g.reply);
  g.failure = (*client)->failure();
  return g;
}

TEST(HttpClientTest, ReadsARange) {
  const std::string file = Pattern(100000);
  FakeHttpServer server([&](const FakeRequest& r) { return FakeHttpServer::Partial(r, file); });
  Got g = Get(server.Url("/m.gguf"), 1000, 5000);
  ASSERT_TRUE(g.status.ok()) << g.status.message();
  EXPECT_EQ(g.body, file.substr(1000, 5000));
  EXPECT_EQ(g.reply.total_size, file.size());
  EXPECT_EQ(g.reply.etag, "\"fake\"");
}

TEST(HttpClientTest, ClampsAtEndOfFileOnlyWhenAsked) {
  const std::string file = Pattern(3000);
  FakeHttpServer server([&](const FakeRequest& r) { return FakeHttpServer::Partial(r, file); });
  Got g = Get(server.Url("/m"), 0, 1 << 20, /*clamp=*/true);
  ASSERT_TRUE(g.status.ok()) << g.status.message();
  EXPECT_EQ(g.body, file);
  g = Get(server.Url("/m"), 0, 1 << 20, /*clamp=*/false);
  EXPECT_FALSE(g.status.ok());
  EXPECT_THAT(g.status.message(), HasSubstr("the server sent 'bytes 0-2999/3000'"));
  EXPECT_EQ(g.failure, HttpFailure::kRefused);
}

TEST(HttpClientTest, TruncatedBodyIsRetryableAndSaysHowFarItGot) {
  const std::string file = Pattern(100000);
  FakeHttpServer server(
      [&](const FakeRequest& r) { return FakeHttpServer::Partial(r, file, /*send=*/700); });
  Got g = Get(server.Url("/m"), 0, 4000);
  ASSERT_FALSE(g.status.ok());
  EXPECT_THAT(g.status.message(), HasSubstr("ended after 700 of 4000 bytes"));
  EXPECT_EQ(g.failure, HttpFailure::kTruncated);
  EXPECT_EQ(g.reply.received, 700u);
  EXPECT_EQ(g.body, file.substr(0, 700));
}

TEST(HttpClientTest, RefusesAServerThatIgnoresRange) {
  const std::string file = Pattern(5000);
  FakeHttpServer server([&](const FakeRequest&) {
    return "HTTP/1.1 200 OK\r\nContent-Length: 5000\r\nConnection: close\r\n\r\n" + file;
  });
  Got g = Get(server.Url("/m"), 10, 20);
  EXPECT_THAT(g.status.message(), HasSubstr("ignored the Range request"));
  EXPECT_EQ(g.failure, HttpFailure::kRefused);
  EXPECT_EQ(g.body, "");
}

TEST(HttpClientTest, RefusesTheWrongBytes) {
  const std::string file = Pattern(5000);
  FakeHttpServer server([&](const FakeRequest& r) {
    FakeRequest shifted = r;
    shifted.first += 1;
    return FakeHttpServer::Partial(shifted, file);
  });
  Got g = Get(server.Url("/m"), 10, 20);
  EXPECT_THAT(g.status.message(), HasSubstr("asked for bytes 10-29, the server sent 'bytes 11-29"));
  EXPECT_EQ(g.failure, HttpFailure::kRefused);
}

TEST(HttpClientTest, RefusesMissingContentRangeAndGarbage) {
  FakeHttpServer no_range([&](const FakeRequest&) {
    return std::string(
        "HTTP/1.1 206 Partial Content\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc");
  });
  Got g = Get(no_range.Url("/m"), 0, 3);
  EXPECT_THAT(g.status.message(), HasSubstr("malformed Content-Range"));
  EXPECT_EQ(g.failure, HttpFailure::kRefused);

  FakeHttpServer garbage(
      [&](const FakeRequest&) { return std::string("SSH-2.0-OpenSSH\r\n\r\n"); });
  g = Get(garbage.Url("/m"), 0, 3);
  EXPECT_THAT(g.status.message(), HasSubstr("reading the response header failed"));
  EXPECT_EQ(g.failure, HttpFailure::kRefused);
}

TEST(HttpClientTest, AConnectionClosedBeforeOrInsideTheHeaderIsRetryable) {
  // What a restarted server does to a request in flight: the connection ends with no reply, or in
  // the middle of its header. Neither is garbage that a second try would see again.
  FakeHttpServer silent([&](const FakeRequest&) { return std::string(); });
  Got g = Get(silent.Url("/m"), 0, 3);
  EXPECT_THAT(g.status.message(), HasSubstr("reading the response header failed"));
  EXPECT_EQ(g.failure, HttpFailure::kNetwork);

  FakeHttpServer cut([&](const FakeRequest&) { return std::string("HTTP/1.1 206 Partial"); });
  g = Get(cut.Url("/m"), 0, 3);
  EXPECT_THAT(g.status.message(), HasSubstr("reading the response header failed"));
  EXPECT_EQ(g.failure, HttpFailure::kNetwork);
}

TEST(HttpClientTest, ClassifiesStatusCodes) {
  FakeHttpServer busy([&](const FakeRequest&) {
    return std::string(
        "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  });
  Got g = Get(busy.Url("/m"), 0, 3);
  EXPECT_THAT(g.status.message(), HasSubstr("503"));
  EXPECT_EQ(g.failure, HttpFailure::kServerBusy);

  FakeHttpServer missing([&](const FakeRequest&) {
    return std::string("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  });
  g = Get(missing.Url("/m"), 0, 3);
  EXPECT_THAT(g.status.message(), HasSubstr("404 Not Found"));
  EXPECT_EQ(g.failure, HttpFailure::kRefused);
}

TEST(HttpClientTest, FollowsRedirectsButNotForever) {
  const std::string file = Pattern(5000);
  FakeHttpServer target([&](const FakeRequest& r) { return FakeHttpServer::Partial(r, file); });
  FakeHttpServer redirect([&](const FakeRequest&) {
    return "HTTP/1.1 302 Found\r\nLocation: " + target.Url("/real.gguf") +
           "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
  });
  auto client = HttpClient::Create(ParseUrl(redirect.Url("/m")).value(), FastOptions()).value();
  std::string body;
  RangeReply reply;
  Status s = client->GetRange(
      100, 50, false,
      [&](std::span<const uint8_t> b) {
        body.append(reinterpret_cast<const char*>(b.data()), b.size());
        return Status::Ok();
      },
      &reply);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(body, file.substr(100, 50));
  EXPECT_EQ(client->url().ToString(), target.Url("/real.gguf"));

  FakeHttpServer loop([&](const FakeRequest&) {
    return std::string(
        "HTTP/1.1 301 Moved\r\nLocation: /again\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  });
  Got g = Get(loop.Url("/m"), 0, 3);
  EXPECT_THAT(g.status.message(), HasSubstr("more than 5 redirects"));
}

TEST(HttpClientTest, NothingListeningIsANetworkError) {
  uint16_t port = 0;
  {
    auto l = net::Listener::Bind("127.0.0.1", 0);
    port = l->port();
  }
  Got g = Get("http://127.0.0.1:" + std::to_string(port) + "/m", 0, 3);
  EXPECT_THAT(g.status.message(), HasSubstr("cannot connect"));
  EXPECT_EQ(g.failure, HttpFailure::kNetwork);
}

TEST(HttpClientTest, SilentServerTimesOut) {
  auto listener = net::Listener::Bind("127.0.0.1", 0).value();  // accepts (backlog), never answers
  HttpOptions o = FastOptions();
  o.request_timeout_ms = 300;
  Got g = Get("http://127.0.0.1:" + std::to_string(listener.port()) + "/m", 0, 3, false, o);
  EXPECT_THAT(g.status.message(), HasSubstr("timed out"));
  EXPECT_EQ(g.status.code(), StatusCode::kTimeout);
  EXPECT_EQ(g.failure, HttpFailure::kNetwork);
}

TEST(HttpClientTest, ValidatorsThatCanPinAFile) {
  EXPECT_TRUE(IsStrongEtag("\"abc\""));
  EXPECT_TRUE(IsStrongEtag("\"\""));
  EXPECT_FALSE(IsStrongEtag("W/\"abc\""));
  EXPECT_FALSE(IsStrongEtag("abc"));
  EXPECT_FALSE(IsStrongEtag("\"a\"b\""));
  EXPECT_FALSE(IsStrongEtag("\"a b\""));
  EXPECT_FALSE(IsStrongEtag("\""));

  EXPECT_EQ(ParseHttpDate("Thu, 01 Jan 1970 00:00:00 GMT"), 0);
  EXPECT_EQ(ParseHttpDate("Sun, 06 Nov 1994 08:49:37 GMT"), 784111777);
  EXPECT_EQ(ParseHttpDate("Thu, 29 Feb 2024 12:00:00 GMT"), 1709208000);
  EXPECT_EQ(ParseHttpDate("Sat, 06 Nov 1994 08:49:37 GMT"), std::nullopt);   // wrong weekday
  EXPECT_EQ(ParseHttpDate("Thu, 29 Feb 2023 12:00:00 GMT"), std::nullopt);   // not a leap year
  EXPECT_EQ(ParseHttpDate("Sunday, 06-Nov-94 08:49:37 GMT"), std::nullopt);  // obsolete form
  EXPECT_EQ(ParseHttpDate("Sun, 06 Nov 1994 08:49:37 UTC"), std::nullopt);
  EXPECT_EQ(ParseHttpDate(""), std::nullopt);

  const std::string date = "Mon, 01 Jan 2024 00:00:00 GMT";
  EXPECT_EQ(IfRangeValidator("\"v1\"", date), "\"v1\"");
  // A weak ETag cannot be used with If-Range: the date is, when there is one.
  EXPECT_EQ(IfRangeValidator("W/\"v1\"", date), date);
  EXPECT_EQ(IfRangeValidator("W/\"v1\"", ""), "");
  EXPECT_EQ(IfRangeValidator("", "yesterday"), "");
  EXPECT_EQ(IfRangeValidator("", ""), "");
}

TEST(HttpClientTest, ParsesAndJudgesResponseHeads) {
  auto head = ParseResponseHead(
      "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 10-19/100\r\nContent-Length: 10\r\n"
      "ETag: \"v1\"\r\nLast-Modified: Mon, 01 Jan 2024 00:00:00 GMT\r\n\r\n");
  ASSERT_TRUE(head.ok()) << head.status().message();
  EXPECT_EQ(head->status, 206u);
  EXPECT_EQ(head->etag, "\"v1\"");
  EXPECT_EQ(head->content_length, 10u);
  ReplyVerdict v = JudgeReply(*head, RangeRequest{10, 10, false, "\"v1\""}, "u");
  EXPECT_EQ(v.failure, HttpFailure::kNone) << v.status.message();
  EXPECT_EQ(v.first, 10u);
  EXPECT_EQ(v.last, 19u);
  EXPECT_EQ(v.total, 100u);
  // The same range of another version (a server that does not implement If-Range).
  v = JudgeReply(*head, RangeRequest{10, 10, false, "\"v0\""}, "u");
  EXPECT_EQ(v.failure, HttpFailure::kChanged);
  EXPECT_THAT(v.status.message(), HasSubstr("the file at u changed during the download"));
  // A Content-Length that disagrees with Content-Range.
  head->content_length = 11;
  EXPECT_EQ(JudgeReply(*head, RangeRequest{10, 10, false, ""}, "u").failure, HttpFailure::kRefused);
  // Impossible requests are refused, not trusted.
  EXPECT_EQ(JudgeReply(*head, RangeRequest{~uint64_t{0}, 2, false, ""}, "u").failure,
            HttpFailure::kRefused);

  EXPECT_FALSE(ParseResponseHead("HTTP/1.1 206 Partial").ok());
  EXPECT_FALSE(ParseResponseHead("SSH-2.0-OpenSSH\r\n\r\n").ok());
  EXPECT_FALSE(
      ParseResponseHead("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n").ok());
}

TEST(HttpClientTest, IfRangePinsTheFileAndAChangedFileIsRefused) {
  testing::FakeFile v1{Pattern(5000), "ETag: \"v1\"\r\n"};
  testing::FakeFile v2{Pattern(5000), "ETag: \"v2\"\r\n"};
  v2.bytes[20] ^= 1;
  std::atomic<bool> changed{false};
  std::mutex mu;
  std::string if_range;
  FakeHttpServer server([&](const FakeRequest& r) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if_range = r.Header("If-Range");
    }
    return FakeHttpServer::Serve(r, changed ? v2 : v1);
  });
  auto client = HttpClient::Create(ParseUrl(server.Url("/m")).value(), FastOptions()).value();
  std::string body;
  auto sink = [&](std::span<const uint8_t> b) {
    body.append(reinterpret_cast<const char*>(b.data()), b.size());
    return Status::Ok();
  };
  RangeReply reply;
  Status s = client->GetRange(RangeRequest{10, 20, false, "\"v1\""}, sink, &reply);
  ASSERT_TRUE(s.ok()) << s.message();
  EXPECT_EQ(body, v1.bytes.substr(10, 20));
  EXPECT_EQ(if_range, "\"v1\"");

  changed = true;
  body.clear();
  s = client->GetRange(RangeRequest{10, 20, false, "\"v1\""}, sink, &reply);
  EXPECT_THAT(s.message(), HasSubstr("the file at " + server.Url("/m") +
                                     " changed during the download (it was ETag \"v1\", the "
                                     "server now has ETag \"v2\""));
  EXPECT_EQ(client->failure(), HttpFailure::kChanged);
  EXPECT_FALSE(client->retryable());
  EXPECT_EQ(body, "");  // not one byte of the other version reaches the sink

  // Only a strong ETag or an HTTP date can go into If-Range.
  s = client->GetRange(RangeRequest{10, 20, false, "W/\"v1\""}, sink, &reply);
  EXPECT_THAT(s.message(), HasSubstr("neither a strong ETag nor an HTTP date"));
}

// 206 with a 100-byte body, then one body byte a second: each read makes progress, the request
// as a whole does not.
void Trickle(const FakeRequest&, FakeHttpServer::Conn& conn) {
  if (!conn.Write("HTTP/1.1 206 Partial Content\r\nContent-Range: bytes 0-99/100\r\n"
                  "Content-Length: 100\r\nConnection: close\r\n\r\n")) {
    return;
  }
  for (int i = 0; i < 100 && conn.Write("x"); ++i) {
    if (!conn.Pause(std::chrono::seconds(1))) return;
  }
}

TEST(HttpClientTest, ATricklingServerFailsAtTheRequestDeadline) {
  FakeHttpServer server{FakeHttpServer::Handler(Trickle)};
  HttpOptions o = FastOptions();
  o.request_timeout_ms = 1500;
  const auto t0 = std::chrono::steady_clock::now();
  Got g = Get(server.Url("/m"), 0, 100, false, o);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(g.status.code(), StatusCode::kTimeout) << g.status.message();
  EXPECT_THAT(g.status.message(), HasSubstr("timed out"));
  EXPECT_THAT(g.status.message(), HasSubstr("within 1.5 s"));
  EXPECT_EQ(g.failure, HttpFailure::kNetwork);  // retryable
  EXPECT_GE(seconds, 1.4);
  EXPECT_LT(seconds, 1.5 + 3);
  EXPECT_GE(g.reply.received, 1u);
  EXPECT_LT(g.reply.received, 100u);

  // A status line that trickles in is held to the same deadline.
  FakeHttpServer slow_head{FakeHttpServer::Handler([](const FakeRequest&, FakeHttpServer::Conn& c) {
    for (char ch : std::string("HTTP/1.1 206 Partial Content\r\n")) {
      if (!c.Write(std::string(1, ch)) || !c.Pause(std::chrono::milliseconds(300))) return;
    }
  })};
  const auto t1 = std::chrono::steady_clock::now();
  g = Get(slow_head.Url("/m"), 0, 100, false, o);
  EXPECT_EQ(g.status.code(), StatusCode::kTimeout) << g.status.message();
  EXPECT_THAT(g.status.message(), HasSubstr("reading the response header failed: timed out"));
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(), 1.5 + 3);
}

class NginxClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    file_ = Pattern(3 << 20);
    std::ofstream(dir_.File("blob.bin"), std::ios::binary) << file_;
  }
  testing::TempDir dir_;
  std::string file_;
};

TEST_F(NginxClientTest, RangesOverHttpAndHttpsOnOneKeptAliveConnection) {
  KV_START_NGINX(nginx, (testing::Nginx::Options{dir_.path()}));
  auto client =
      HttpClient::Create(ParseUrl(nginx->Url("/blob.bin")).value(), FastOptions()).value();
  for (uint64_t off : {uint64_t{0}, uint64_t{1} << 20, uint64_t{3 << 20} - 10}) {
    std::string body;
    RangeReply reply;
    const uint64_t len = std::min<uint64_t>(100000, file_.size() - off);
    Status s = client->GetRange(
        off, len, false,
        [&](std::span<const uint8_t> b) {
          body.append(reinterpret_cast<const char*>(b.data()), b.size());
          return Status::Ok();
        },
        &reply);
    ASSERT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(body, file_.substr(off, len));
    EXPECT_EQ(reply.total_size, file_.size());
    EXPECT_FALSE(reply.etag.empty());
  }
  EXPECT_EQ(client->requests(), 3u);

  if (nginx->TlsUrl("/").empty()) KV_SKIP_OR_FAIL(nginx->tls_why());
  HttpOptions tls = FastOptions();
  tls.ca_file = nginx->ca_file();
  Got g = Get(nginx->TlsUrl("/blob.bin"), 5, 1000, false, tls);
  ASSERT_TRUE(g.status.ok()) << g.status.message();
  EXPECT_EQ(g.body, file_.substr(5, 1000));

  // Without the private CA the certificate does not verify, and retrying would not help.
  g = Get(nginx->TlsUrl("/blob.bin"), 5, 1000);
  EXPECT_THAT(g.status.message(), HasSubstr("TLS handshake failed"));
  EXPECT_THAT(g.status.message(), HasSubstr("--ca"));
  EXPECT_EQ(g.failure, HttpFailure::kRefused);
}

TEST_F(NginxClientTest, NginxWithRangesOffIsRefused) {
  KV_START_NGINX(nginx, (testing::Nginx::Options{dir_.path()}));
  Got g = Get(nginx->Url("/norange/blob.bin"), 10, 100);
  EXPECT_THAT(g.status.message(), HasSubstr("ignored the Range request"));
  EXPECT_EQ(g.failure, HttpFailure::kRefused);
  g = Get(nginx->Url("/missing.bin"), 0, 100);
  EXPECT_THAT(g.status.message(), HasSubstr("404"));
}

}  // namespace
}  // namespace kvasir::net
