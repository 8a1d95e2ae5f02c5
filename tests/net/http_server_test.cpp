// The server skeleton through its HTTP user: a handler that replies later does not hold the
// others, a proven answer moves its connection out of the flood's reach, silent connections leave
// early under pressure, a full server answers 503, and Stop closes everything. Every wait is on an
// event (the server's counters, a reply) with a deadline.
#include "net/http_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/resource.h>

#include <algorithm>
#include <future>
#include <thread>

#include "flood.h"
#include "net/http_request.h"
#include "raw_client.h"
#include "test_assets.h"

namespace kvasir::net {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using testing::RawClient;  // kvasir::testing
using ::testing::StartsWith;

constexpr int kDeadlineMs = testing::RawClient::kDeadlineMs;

std::string Get(const std::string& target, bool keep_alive = true) {
  return "GET " + target + " HTTP/1.1\r\nHost: x\r\n" +
         (keep_alive ? "" : "Connection: close\r\n") + "\r\n";
}

HttpServerOptions Small(int open_total, int per_address, int pressure_from) {
  HttpServerOptions o;
  o.server.name = "test";
  o.server.listen = "127.0.0.1:0";
  o.server.admission.open = {open_total, per_address, pressure_from};
  o.server.admission.proven = {8, 4, 8};
  // Normal deadlines far beyond any wait below: a close shows the pressed deadline at work.
  SetHttpTimeouts(&o.server.admission, 60000, 60000);
  return o;
}

// Answers "/slow" from another thread once `release` is set, everything else at once; "/proven"
// marks its connection proven.
struct TestHandler {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::vector<std::thread> threads;
  ~TestHandler() {
    for (auto& t : threads) t.join();
  }
  HttpHandler handler() {
    return [this](HttpServerRequest req, HttpResponder reply) {
      HttpServerResponse res;
      res.body = req.method + " " + req.target + " from " + req.remote_ip;
      if (req.target == "/slow") {
        threads.emplace_back([reply, res, f = released] {
          f.wait();
          reply(res);
        });
        return;
      }
      res.proven = req.target == "/proven";
      reply(res);
    };
  }
};

TEST(HttpServerTest, AHandlerThatRepliesLaterDoesNotHoldTheOthers) {
  TestHandler h;
  auto server = HttpServer::Start(Small(16, 16, 16), h.handler());
  ASSERT_TRUE(server.ok()) << server.status().message();
  RawClient slow((*server)->port());
  slow.Send(Get("/slow"));
  RawClient quick((*server)->port());
  quick.Send(Get("/quick"));
  EXPECT_THAT(quick.ReadResponse(), HasSubstr("GET /quick from 127.0.0.1"));
  h.release.set_value();
  EXPECT_THAT(slow.ReadResponse(), HasSubstr("GET /slow from 127.0.0.1"));
  // Kept alive: a second request on the same connection.
  slow.Send(Get("/again", false));
  EXPECT_THAT(slow.ReadResponse(), HasSubstr("GET /again"));
  EXPECT_EQ((*server)->stats().requests, 3u);
}

TEST(HttpServerTest, AProvenAnswerKeepsItsConnectionOutOfTheFloodsReach) {
  TestHandler h;
  auto server = HttpServer::Start(Small(16, 16, 8), h.handler());
  ASSERT_TRUE(server.ok());
  HttpServer& s = **server;
  RawClient node(s.port());
  node.Send(Get("/proven"));
  ASSERT_THAT(node.ReadResponse(), StartsWith("HTTP/1.1 200"));
  ASSERT_TRUE(s.WaitFor([&] { return s.stats().server.proven == 1; }, kDeadlineMs));
  RawClient plain(s.port());
  plain.Send(Get("/plain"));
  ASSERT_THAT(plain.ReadResponse(), StartsWith("HTTP/1.1 200"));
  // Four addresses keep the open pool full and under pressure, reopening what is closed.
  testing::ConnectionFlood flood({s.port(), testing::ConnectionFlood::LoopbackSources(4), 8, ""});
  ASSERT_TRUE(s.WaitFor([&] { return s.stats().server.evicted + s.stats().server.expired >= 40; },
                        kDeadlineMs))
      << "the flood never turned over";
  // The idle plain connection was closed for the flood; the proven one is still served.
  EXPECT_TRUE(plain.ClosedByServer());
  node.Send(Get("/after"));
  EXPECT_THAT(node.ReadResponse(), HasSubstr("GET /after from 127.0.0.1"));
  EXPECT_EQ(s.stats().server.proven, 1u);
}

TEST(HttpServerTest, SilentConnectionsLeaveAtThePressedDeadline) {
  TestHandler h;
  auto server = HttpServer::Start(Small(8, 8, 2), h.handler());
  ASSERT_TRUE(server.ok());
  HttpServer& s = **server;
  // A request being answered holds a place and is never closed for a deadline.
  RawClient slow(s.port());
  slow.Send(Get("/slow"));
  RawClient silent(s.port(), "127.0.0.2");
  ASSERT_TRUE(s.WaitFor([&] { return s.stats().server.open == 2; }, kDeadlineMs));
  // Two of eight places taken is pressure here: the silent one leaves after 1 s, not 60 s.
  EXPECT_TRUE(silent.ClosedByServer());
  EXPECT_TRUE(s.WaitFor([&] { return s.stats().server.open == 1; }, kDeadlineMs));
  EXPECT_EQ(s.stats().server.expired, 1u);
  h.release.set_value();
  EXPECT_THAT(slow.ReadResponse(), HasSubstr("GET /slow"));
}

TEST(HttpServerTest, AFullServerAnswers503WithTheErrorBody) {
  TestHandler h;
  HttpServerOptions o = Small(2, 2, 2);
  o.server.admission.timeout(Stage::kSilent).pressed_ms = 60000;  // a and b stay while used
  o.error_body = [](int status, const std::string& code, const std::string& message) {
    HttpServerResponse r;
    r.status = status;
    r.content_type = "application/json";
    r.body = "{\"code\":\"" + code + "\",\"message\":\"" + message + "\"}";
    return r;
  };
  auto server = HttpServer::Start(o, h.handler());
  ASSERT_TRUE(server.ok());
  HttpServer& s = **server;
  RawClient a(s.port()), b(s.port());
  ASSERT_TRUE(s.WaitFor([&] { return s.stats().server.open == 2; }, kDeadlineMs));
  RawClient c(s.port());
  c.Send(Get("/"));
  const std::string reply = c.ReadResponse();
  EXPECT_THAT(reply, StartsWith("HTTP/1.1 503"));
  EXPECT_THAT(reply, HasSubstr("{\"code\":\"unavailable\""));
  EXPECT_EQ(s.stats().server.refused, 1u);
  // Oversized requests get the same body format.
  a.Send("GET / HTTP/1.1\r\nHost: x\r\nX-Pad: " + std::string(9000, 'p') + "\r\n\r\n");
  EXPECT_THAT(a.ReadResponse(), AllOf(StartsWith("HTTP/1.1 431"), HasSubstr("too_large")));
}

TEST(HttpServerTest, StopClosesEveryConnection) {
  TestHandler h;
  auto server = HttpServer::Start(Small(16, 16, 16), h.handler());
  ASSERT_TRUE(server.ok());
  RawClient silent((*server)->port()), idle((*server)->port());
  idle.Send(Get("/"));
  ASSERT_THAT(idle.ReadResponse(), StartsWith("HTTP/1.1 200"));
  (*server)->Stop();
  EXPECT_TRUE(silent.ClosedByServer());
  EXPECT_TRUE(idle.ClosedByServer());
  (*server)->Stop();  // idempotent
}

TEST(HttpServerTest, ServesHttpsWithAVerifiedCertificate) {
  kvasir::testing::TempDir dir;
  const std::string cert = dir.File("cert.pem"), key = dir.File("key.pem");
  if (const std::string why = kvasir::testing::MakeTestCertificate(cert, key, "IP:127.0.0.1");
      !why.empty()) {
    KV_SKIP_OR_FAIL(why);
  }
  TestHandler h;
  HttpServerOptions o = Small(16, 16, 16);
  o.server.tls_cert = cert;
  o.server.tls_key = key;
  auto server = HttpServer::Start(o, h.handler());
  ASSERT_TRUE(server.ok()) << server.status().message();
  ASSERT_TRUE((*server)->tls());
  HttpRequestOptions ro;
  ro.ca_file = cert;
  const std::string url = "https://127.0.0.1:" + std::to_string((*server)->port());
  auto reply = HttpRequest("GET", url + "/over-tls", {}, "", ro);
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  EXPECT_EQ(reply->status, 200);
  EXPECT_EQ(reply->body, "GET /over-tls from 127.0.0.1");
  // Plain HTTP to the TLS port gets no answer, and the server goes on.
  RawClient plain((*server)->port());
  plain.Send(Get("/plain"));
  EXPECT_EQ(plain.ReadResponse(), "");
  EXPECT_TRUE(HttpRequest("GET", url + "/again", {}, "", ro).ok());
}

TEST(HttpServerTest, StartRaisesTheOpenFileLimitToItsPlaces) {
  rlimit before{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &before), 0);
  // Places that fit under the hard limit with the server's spare 128, as many as 1,024 + 512.
  const rlim_t cap = before.rlim_max == RLIM_INFINITY ? 4096 : before.rlim_max;
  ASSERT_GT(cap, 256u) << "a hard open-file limit of " << cap << " leaves no room to test";
  const int open_places = static_cast<int>(std::min<rlim_t>(1024, (cap - 128) * 2 / 3));
  const int proven_places = static_cast<int>(std::min<rlim_t>(512, (cap - 128) / 3));
  rlimit low = before;
  low.rlim_cur = 64;  // below what the places need
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  TestHandler h;
  HttpServerOptions o = Small(open_places, 64, open_places / 2);
  o.server.admission.proven = {proven_places, 64, proven_places};
  auto server = HttpServer::Start(o, h.handler());
  rlimit now{};
  ::getrlimit(RLIMIT_NOFILE, &now);
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &before), 0);
  ASSERT_TRUE(server.ok()) << server.status().message();
  EXPECT_GE(now.rlim_cur, static_cast<rlim_t>(open_places + proven_places));
  (*server)->Stop();
}

TEST(HttpServerTest, StartRefusesBadOptions) {
  TestHandler h;
  HttpServerOptions o = Small(16, 16, 16);
  o.server.admission.open.pressure_from = 17;
  EXPECT_THAT(HttpServer::Start(o, h.handler()).status().message(),
              HasSubstr("open pool: pressure from 17"));
  o = Small(16, 16, 16);
  o.server.tls_cert = "/nonexistent/cert.pem";
  EXPECT_THAT(HttpServer::Start(o, h.handler()).status().message(), HasSubstr("go together"));
  o.server.tls_key = "/nonexistent/key.pem";
  EXPECT_THAT(HttpServer::Start(o, h.handler()).status().message(),
              HasSubstr("cannot load the certificate"));
  o = Small(16, 16, 16);
  o.server.listen = "nonsense";
  EXPECT_FALSE(HttpServer::Start(o, h.handler()).ok());
}

}  // namespace
}  // namespace kvasir::net
