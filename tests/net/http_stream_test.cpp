// Streamed answers (HttpBodyStream behind net::HttpServer): chunks go out as the producer writes
// them, a client that goes away is noticed by its producer, a slow reader is dropped without
// holding anyone else's stream, and stopping the server ends every stream. Every wait is on an
// event with a deadline.
#include "net/http_stream.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <future>
#include <thread>

#include "loopback_socket.h"
#include "net/http_server.h"

namespace kvasir::net {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr int kDeadlineMs = 10000;

// A raw client that reads whatever the server sends, with every read bounded by kDeadlineMs.
class Peer {
 public:
  explicit Peer(uint16_t port, int rcvbuf = 0) {
    fd_ = testing::ConnectLoopback(port, kDeadlineMs, &connected_, "", rcvbuf);
  }
  ~Peer() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }
  void Send(const std::string& s) { (void)::send(fd_, s.data(), s.size(), MSG_NOSIGNAL); }
  // Reads until `text` has arrived (true) or the connection ends or the deadline passes (false).
  bool ReadUntil(const std::string& text) {
    while (in_.find(text) == std::string::npos) {
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return false;
      in_.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  // Reads until the server closes (true) or the deadline passes (false).
  bool ReadToEnd() {
    while (true) {
      char buf[4096];
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
      in_.append(buf, static_cast<size_t>(n));
    }
  }
  const std::string& received() const { return in_; }

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string in_;
};

const std::string kRequest = "POST /events HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}";

HttpServerOptions Options() {
  HttpServerOptions o;
  o.server.name = "test";
  o.server.listen = "127.0.0.1:0";
  o.server.admission.open = {32, 32, 32};
  // A write that makes no progress for 2 s is a stalled reader.
  SetHttpTimeouts(&o.server.admission, 2000, 60000);
  return o;
}

// Hands every request's stream to the test through a queue of promises.
struct Streams {
  size_t max_pending = size_t{1} << 20;
  std::mutex mu;
  std::vector<std::promise<std::shared_ptr<HttpBodyStream>>> waiting =
      std::vector<std::promise<std::shared_ptr<HttpBodyStream>>>(8);
  std::vector<std::future<std::shared_ptr<HttpBodyStream>>> futures;
  size_t next = 0;
  Streams() {
    for (auto& p : waiting) futures.push_back(p.get_future());
  }
  HttpHandler handler() {
    return [this](HttpServerRequest, HttpResponder reply) {
      auto stream = std::make_shared<HttpBodyStream>(max_pending);
      HttpServerResponse res;
      res.content_type = "text/event-stream";
      res.headers.emplace_back("Cache-Control", "no-cache");
      res.stream = stream;
      reply(std::move(res));
      std::lock_guard<std::mutex> lock(mu);
      waiting[next++].set_value(stream);
    };
  }
  std::shared_ptr<HttpBodyStream> Get(size_t i) {
    if (futures[i].wait_for(std::chrono::milliseconds(kDeadlineMs)) != std::future_status::ready) {
      return nullptr;
    }
    return futures[i].get();
  }
};

TEST(HttpStreamTest, ChunksGoOutAsTheProducerWritesThem) {
  Streams streams;
  auto server = HttpServer::Start(Options(), streams.handler());
  ASSERT_TRUE(server.ok()) << server.status().message();
  Peer peer((*server)->port());
  peer.Send(kRequest);
  auto stream = streams.Get(0);
  ASSERT_NE(stream, nullptr);
  ASSERT_TRUE(peer.ReadUntil("\r\n\r\n"));
  EXPECT_THAT(peer.received(), StartsWith("HTTP/1.1 200 OK\r\n"));
  EXPECT_THAT(peer.received(), HasSubstr("Transfer-Encoding: chunked\r\n"));
  EXPECT_THAT(peer.received(), HasSubstr("Connection: close\r\n"));
  EXPECT_THAT(peer.received(), HasSubstr("Content-Type: text/event-stream\r\n"));
  EXPECT_THAT(peer.received(), HasSubstr("Cache-Control: no-cache\r\n"));
  // Each piece reaches the client before the next is written.
  ASSERT_TRUE(stream->Write("data: one\n\n"));
  ASSERT_TRUE(peer.ReadUntil("b\r\ndata: one\n\n\r\n"));
  ASSERT_TRUE(stream->Write("data: two\n\n"));
  ASSERT_TRUE(peer.ReadUntil("data: two\n\n\r\n"));
  stream->End();
  ASSERT_TRUE(peer.ReadToEnd());
  EXPECT_THAT(peer.received(), ::testing::EndsWith("data: two\n\n\r\n0\r\n\r\n"));
  EXPECT_FALSE(stream->gone());
  EXPECT_EQ((*server)->stats().streams_dropped, 0u);
}

TEST(HttpStreamTest, AClientThatClosesMidStreamIsNoticedByItsProducer) {
  Streams streams;
  auto server = HttpServer::Start(Options(), streams.handler());
  ASSERT_TRUE(server.ok());
  Peer peer((*server)->port());
  peer.Send(kRequest);
  auto stream = streams.Get(0);
  ASSERT_NE(stream, nullptr);
  std::promise<void> noticed;
  stream->OnGone([&] { noticed.set_value(); });
  ASSERT_TRUE(stream->Write("data: one\n\n"));
  ASSERT_TRUE(peer.ReadUntil("data: one"));
  peer.Close();
  ASSERT_EQ(noticed.get_future().wait_for(std::chrono::milliseconds(kDeadlineMs)),
            std::future_status::ready);
  EXPECT_TRUE(stream->gone());
  EXPECT_FALSE(stream->Write("data: two\n\n"));
  EXPECT_THAT(stream->why_gone(), HasSubstr("closed"));
  ASSERT_TRUE(
      (*server)->WaitFor([&] { return (*server)->stats().streams_dropped == 1; }, kDeadlineMs));
}

TEST(HttpStreamTest, ASlowReaderIsDroppedWithoutStallingAnotherStream) {
  Streams streams;
  streams.max_pending = 64 * 1024;
  auto server = HttpServer::Start(Options(), streams.handler());
  ASSERT_TRUE(server.ok());
  Peer slow((*server)->port(), /*rcvbuf=*/4096);
  slow.Send(kRequest);
  auto slow_stream = streams.Get(0);
  ASSERT_NE(slow_stream, nullptr);
  Peer fast((*server)->port());
  fast.Send(kRequest);
  auto fast_stream = streams.Get(1);
  ASSERT_NE(fast_stream, nullptr);
  std::promise<void> dropped;
  slow_stream->OnGone([&] { dropped.set_value(); });
  // The slow client never reads: its producer never waits, and is told to stop within the
  // kernel's buffers plus the stream's 64 KiB (or the 2 s writing deadline), while the other
  // stream carries on.
  const std::string piece(16 * 1024, 'x');
  std::thread producer([&] {
    for (int i = 0; i < 64 * 1024 && slow_stream->Write(piece); ++i) {
      if (i % 16 == 0) std::this_thread::yield();
    }
  });
  for (int i = 0; i < 50; ++i) {
    const std::string event = "data: " + std::to_string(i) + "\n\n";
    ASSERT_TRUE(fast_stream->Write(event));
    ASSERT_TRUE(fast.ReadUntil(event)) << "event " << i;
  }
  ASSERT_EQ(dropped.get_future().wait_for(std::chrono::milliseconds(kDeadlineMs)),
            std::future_status::ready);
  producer.join();
  EXPECT_TRUE(slow_stream->gone());
  EXPECT_FALSE(fast_stream->gone());
  fast_stream->End();
  EXPECT_TRUE(fast.ReadToEnd());
  EXPECT_THAT(fast.received(), ::testing::EndsWith("0\r\n\r\n"));
}

TEST(HttpStreamTest, StoppingTheServerEndsEveryStream) {
  Streams streams;
  auto server = HttpServer::Start(Options(), streams.handler());
  ASSERT_TRUE(server.ok());
  Peer peer((*server)->port());
  peer.Send(kRequest);
  auto stream = streams.Get(0);
  ASSERT_NE(stream, nullptr);
  ASSERT_TRUE(peer.ReadUntil("\r\n\r\n"));
  (*server)->Stop();
  EXPECT_TRUE(stream->gone());
  EXPECT_FALSE(stream->Write("late"));
  EXPECT_TRUE(peer.ReadToEnd());
}

TEST(HttpStreamTest, AClientThatLeftBeforeTheAnswerBeganIsNoticed) {
  std::promise<HttpResponder> replies;
  auto server = HttpServer::Start(Options(), [&](HttpServerRequest, HttpResponder reply) {
    replies.set_value(std::move(reply));
  });
  ASSERT_TRUE(server.ok());
  auto peer = std::make_unique<Peer>((*server)->port());
  peer->Send(kRequest);
  auto future = replies.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::milliseconds(kDeadlineMs)), std::future_status::ready);
  HttpResponder reply = future.get();
  // The client goes while the handler works (the server is not reading then); its stream's
  // producer learns of it once the answer starts.
  peer.reset();
  auto stream = std::make_shared<HttpBodyStream>();
  std::promise<void> noticed;
  stream->OnGone([&] { noticed.set_value(); });
  HttpServerResponse res;
  res.stream = stream;
  reply(std::move(res));
  ASSERT_EQ(noticed.get_future().wait_for(std::chrono::milliseconds(kDeadlineMs)),
            std::future_status::ready);
  EXPECT_FALSE(stream->Write("x"));
}

TEST(HttpStreamTest, WritesBeyondTheLimitEndTheStreamBeforeAnyClient) {
  HttpBodyStream stream(10);
  int gone = 0;
  stream.OnGone([&] { ++gone; });
  EXPECT_TRUE(stream.Write("12345"));
  EXPECT_TRUE(stream.Write("67890"));
  EXPECT_FALSE(stream.Write("1"));
  EXPECT_TRUE(stream.gone());
  EXPECT_EQ(gone, 1);
  stream.OnGone([&] { ++gone; });  // late: runs at once
  EXPECT_EQ(gone, 2);
  HttpBodyStream ended(10);
  ended.End();
  ended.OnGone([&] { ++gone; });
  ended.MarkGone("closed after the end");
  EXPECT_EQ(gone, 2);  // a stream that ended has no one to tell
}

}  // namespace
}  // namespace kvasir::net
