// A blocking HTTP/1.1 client on a raw TCP socket from a chosen loopback address, for the server
// tests: it sends whatever bytes a test wants (kept-alive requests, half requests, nothing) and
// reads one response at a time. Every read gives up after kDeadlineMs.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <string>

#include "net/loopback_socket.h"

namespace kvasir::testing {

// A blocking TCP client from a chosen loopback address, with every read bounded by kDeadlineMs.
class RawClient {
 public:
  static constexpr int kDeadlineMs = 10000;

  RawClient(uint16_t port, const std::string& source = "127.0.0.1") {
    fd_ = ConnectLoopback(port, kDeadlineMs, &connected_, source);
  }
  ~RawClient() { ::close(fd_); }
  bool connected() const { return connected_; }
  void Send(const std::string& bytes) {
    (void)::send(fd_, bytes.data(), bytes.size(), MSG_NOSIGNAL);
  }
  // One response: the head, then Content-Length bytes of body. "" when the connection ends first.
  std::string ReadResponse() {
    while (true) {
      const size_t head_end = in_.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        size_t length = 0;
        const size_t at = in_.find("Content-Length: ");
        if (at != std::string::npos && at < head_end) length = std::stoul(in_.substr(at + 16));
        if (in_.size() >= head_end + 4 + length) {
          std::string out = in_.substr(0, head_end + 4 + length);
          in_.erase(0, out.size());
          return out;
        }
      }
      if (!Fill()) return "";
    }
  }
  // Reads until the server closes; true if it did (rather than the deadline passing).
  bool ClosedByServer() {
    char buf[512];
    while (true) {
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n == 0) return true;
      if (n < 0) return errno == ECONNRESET;
    }
  }

 private:
  bool Fill() {
    char buf[4096];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    in_.append(buf, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  bool connected_ = false;
  std::string in_;
};

}  // namespace kvasir::testing
