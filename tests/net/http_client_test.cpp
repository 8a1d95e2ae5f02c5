// The HTTP client against a scripted server that misbehaves in every way a range download can
// notice, and against a real nginx over http and https.
#include "net/http_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <random>

#include "fake_http_server.h"
#include "nginx_fixture.h"
#include "test_assets.h"

namespace kvasir::net {
namespace {

using ::testing::HasSubstr;
using testing::FakeHttpServer;
using testing::FakeRequest;

std::string Pattern(size_t n) {
  std::string s(n, '\0');
  std::mt19937 rng(7);
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

HttpOptions FastOptions() {
  HttpOptions o;
  o.connect_timeout_ms = 2000;
  o.io_timeout_ms = 2000;
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
    return std::string("HTTP/1.1 206 Partial Content\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc");
  });
  Got g = Get(no_range.Url("/m"), 0, 3);
  EXPECT_THAT(g.status.message(), HasSubstr("malformed Content-Range"));
  EXPECT_EQ(g.failure, HttpFailure::kRefused);

  FakeHttpServer garbage([&](const FakeRequest&) { return std::string("SSH-2.0-OpenSSH\r\n\r\n"); });
  g = Get(garbage.Url("/m"), 0, 3);
  EXPECT_THAT(g.status.message(), HasSubstr("reading the response header failed"));
  EXPECT_EQ(g.failure, HttpFailure::kRefused);
}

TEST(HttpClientTest, ClassifiesStatusCodes) {
  FakeHttpServer busy([&](const FakeRequest&) {
    return std::string("HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
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
    return std::string("HTTP/1.1 301 Moved\r\nLocation: /again\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  });
  Got g = Get(loop.Url("/m"), 0, 3);
  EXPECT_THAT(g.status.message(), HasSubstr("more than 5 redirects"));
}

TEST(HttpClientTest, NothingListeningIsANetworkError) {
  uint16_t port = 0;
  {
    auto l = ring::Listener::Bind("127.0.0.1", 0);
    port = l->port();
  }
  Got g = Get("http://127.0.0.1:" + std::to_string(port) + "/m", 0, 3);
  EXPECT_THAT(g.status.message(), HasSubstr("cannot connect"));
  EXPECT_EQ(g.failure, HttpFailure::kNetwork);
}

TEST(HttpClientTest, SilentServerTimesOut) {
  auto listener = ring::Listener::Bind("127.0.0.1", 0).value();  // accepts (backlog), never answers
  HttpOptions o = FastOptions();
  o.io_timeout_ms = 300;
  Got g = Get("http://127.0.0.1:" + std::to_string(listener.port()) + "/m", 0, 3, false, o);
  EXPECT_THAT(g.status.message(), HasSubstr("timed out"));
  EXPECT_EQ(g.failure, HttpFailure::kNetwork);
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
  auto client = HttpClient::Create(ParseUrl(nginx->Url("/blob.bin")).value(), FastOptions()).value();
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
