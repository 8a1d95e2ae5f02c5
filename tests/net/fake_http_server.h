// A scripted HTTP/1.1 server on loopback for tests of misbehaving peers: each connection's request
// head is read, and `reply` decides the raw bytes sent back (which may lie about their length,
// stop early or be garbage) and whether the connection then closes.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ring/transport.h"

namespace kvasir::testing {

struct FakeRequest {
  std::string head;  // request line and headers
  // Range "bytes=A-B" parsed, or first = last = -1.
  long long first = -1, last = -1;
};

class FakeHttpServer {
 public:
  using Reply = std::function<std::string(const FakeRequest&)>;
  explicit FakeHttpServer(Reply reply);
  ~FakeHttpServer();
  uint16_t port() const { return port_; }
  std::string Url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  int requests() const { return requests_.load(); }

  // A 206 reply to `req` for `file`, cut after `send` body bytes when send >= 0.
  static std::string Partial(const FakeRequest& req, const std::string& file, long long send = -1);

 private:
  void Serve();
  Reply reply_;
  ring::Listener listener_;
  uint16_t port_ = 0;
  std::atomic<int> requests_{0};
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kvasir::testing
