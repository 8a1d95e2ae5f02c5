// A connection flood for the server tests: connections from several loopback source addresses
// (127.0.0.2, 127.0.0.3, ...: every 127/8 address is local on Linux) that send at most a few
// bytes and then say nothing, each reopened as soon as the server closes or refuses it, as the
// floods of silent connections do. One thread with epoll drives them all.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace kvasir::testing {

struct FloodOptions {
  uint16_t port = 0;                 // on 127.0.0.1
  std::vector<std::string> sources;  // local addresses to connect from
  int per_source = 16;               // connections each source keeps open
  std::string first_bytes;           // sent once connected (e.g. a WebSocket upgrade); then silent
};

class ConnectionFlood {
 public:
  explicit ConnectionFlood(FloodOptions options);
  ~ConnectionFlood();
  ConnectionFlood(const ConnectionFlood&) = delete;
  ConnectionFlood& operator=(const ConnectionFlood&) = delete;

  // Connections established and not yet closed by the server, now.
  int held() const { return held_.load(); }
  uint64_t opened() const { return opened_.load(); }  // connections established so far
  // Of those, closed by the server after it took them (a deadline, an eviction)...
  uint64_t closed() const { return closed_.load(); }
  // ... and refused at once (an HTTP 503 and a close).
  uint64_t refused() const { return refused_.load(); }
  // Waits until `done()` holds (checked whenever a connection opens or closes) or the timeout.
  bool WaitFor(const std::function<bool()>& done, int timeout_ms) const;
  // Closes every connection and stops reopening. Idempotent.
  void Stop();

  // "127.0.0.2" .. "127.0.0.<1+n>".
  static std::vector<std::string> LoopbackSources(int n, int first = 2);

 private:
  struct Conn {
    int fd = -1;
    int source = 0;
    bool connected = false;
    bool refused = false;  // the server answered 503
  };
  void Run();
  void Open(size_t index);
  void Lost(size_t index);
  void Changed();

  FloodOptions o_;
  std::vector<Conn> conns_;
  int epoll_ = -1;
  int wake_ = -1;  // eventfd that ends Run()
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int> held_{0};
  std::atomic<uint64_t> opened_{0}, closed_{0}, refused_{0};
  std::vector<size_t> retry_;  // connections whose connect failed: reopened at the next turn
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
};

}  // namespace kvasir::testing
