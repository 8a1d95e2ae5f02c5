// A scripted HTTP/1.1 server on loopback for tests of misbehaving peers: each connection (served
// on its own thread) has its request head read, and either `reply` decides the raw bytes sent
// back (which may lie about their length, stop early or be garbage), or a `Handler` writes them
// itself, as slowly as it likes. The connection then closes.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "net/stream.h"

namespace kvasir::testing {

struct FakeRequest {
  std::string head;  // request line and headers
  // Range "bytes=A-B" parsed, or first = last = -1.
  long long first = -1, last = -1;
  // The value of header `name` (case-insensitive), "" when absent.
  std::string Header(std::string_view name) const;
};

// Extra reply header lines for Partial(), each ending in "\r\n" ("ETag: \"v1\"\r\n").
struct FakeFile {
  std::string bytes;
  std::string headers = "ETag: \"fake\"\r\n";
};

class FakeHttpServer {
 public:
  using Reply = std::function<std::string(const FakeRequest&)>;
  // The connection a Handler writes to.
  class Conn {
   public:
    // False once the client has gone.
    bool Write(std::string_view bytes);
    // Waits `d`, or less when the server is being destroyed (then false).
    bool Pause(std::chrono::milliseconds d);

   private:
    friend class FakeHttpServer;
    Conn(FakeHttpServer* server, net::Stream* stream) : server_(server), stream_(stream) {}
    FakeHttpServer* server_;
    net::Stream* stream_;
  };
  using Handler = std::function<void(const FakeRequest&, Conn&)>;

  explicit FakeHttpServer(Reply reply);
  explicit FakeHttpServer(Handler handler);
  ~FakeHttpServer();
  uint16_t port() const { return port_; }
  std::string Url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  // Requests whose head arrived so far.
  int requests() const { return requests_.load(); }
  // Waits until `n` requests have arrived or `timeout` passed; returns requests().
  int WaitForRequests(int n, std::chrono::milliseconds timeout);

  // A 206 reply to `req` for `file`, cut after `send` body bytes when send >= 0.
  static std::string Partial(const FakeRequest& req, const std::string& file, long long send = -1);
  // The same for a file with its own validator headers (none, weak or strong ETag,
  // Last-Modified), and If-Range honoured the way RFC 9110 says: when the request's If-Range is
  // not exactly one of this file's validators (a weak ETag never matches), the whole file is sent
  // with 200.
  static std::string Serve(const FakeRequest& req, const FakeFile& file);

 private:
  void Accept();
  void ServeOne(std::unique_ptr<net::Stream> stream);
  Handler handler_;
  net::Listener listener_;
  uint16_t port_ = 0;
  std::atomic<int> requests_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::vector<net::Stream*> open_;  // connections being served, shut down on destruction
  std::vector<std::thread> workers_;
  std::thread thread_;
};

}  // namespace kvasir::testing
