// A blocking HTTP/1.1 client for the API server tests: sends one request, reads the head, then
// the body whole (Content-Length, chunked, or to the close) or chunk by chunk, so a test can read
// a stream's first events and then walk away. Every read gives up after kDeadlineMs.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "net/loopback_socket.h"

namespace kvasir::testing {

struct HttpAnswer {
  int status = 0;
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;
};

class TestHttp {
 public:
  static constexpr int kDeadlineMs = 30000;

  explicit TestHttp(uint16_t port) { fd_ = ConnectLoopback(port, kDeadlineMs, &connected_); }
  ~TestHttp() { Close(); }
  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  bool connected() const { return connected_; }

  void Send(const std::string& method, const std::string& target, const std::string& body = "",
            const std::vector<std::string>& headers = {}) {
    std::string req = method + " " + target + " HTTP/1.1\r\nHost: test\r\n";
    for (const std::string& h : headers) req += h + "\r\n";
    if (!body.empty() || method == "POST") {
      req += "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
             "\r\n";
    }
    req += "\r\n" + body;
    (void)::send(fd_, req.data(), req.size(), MSG_NOSIGNAL);
  }

  // The status line and headers; nullopt when the connection ends first.
  std::optional<HttpAnswer> ReadHead() {
    size_t end;
    while ((end = in_.find("\r\n\r\n")) == std::string::npos) {
      if (!Fill()) return std::nullopt;
    }
    HttpAnswer a;
    const std::string head = in_.substr(0, end);
    in_.erase(0, end + 4);
    a.status = std::atoi(head.c_str() + 9);
    size_t at = head.find("\r\n");
    while (at != std::string::npos) {
      const size_t next = head.find("\r\n", at + 2);
      const std::string line =
          head.substr(at + 2, next == std::string::npos ? next : next - at - 2);
      const size_t colon = line.find(':');
      if (colon != std::string::npos) {
        std::string name = line.substr(0, colon);
        for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        a.headers[name] = line.substr(colon + 2);
      }
      at = next;
    }
    head_ = a;
    return a;
  }

  // The next chunk's data of a chunked body; nullopt after the last (or when the link ends).
  std::optional<std::string> NextChunk() {
    size_t eol;
    while ((eol = in_.find("\r\n")) == std::string::npos) {
      if (!Fill()) return std::nullopt;
    }
    const size_t size = std::stoul(in_.substr(0, eol), nullptr, 16);
    while (in_.size() < eol + 2 + size + 2) {
      if (!Fill()) return std::nullopt;
    }
    std::string data = in_.substr(eol + 2, size);
    in_.erase(0, eol + 2 + size + 2);
    if (size == 0) return std::nullopt;
    return data;
  }

  // Head and whole body.
  HttpAnswer ReadWhole() {
    auto head = ReadHead();
    if (!head) return {};
    HttpAnswer a = *head;
    if (a.headers["transfer-encoding"] == "chunked") {
      while (auto chunk = NextChunk()) a.body += *chunk;
      return a;
    }
    if (a.headers.count("content-length") != 0) {
      const size_t n = std::stoul(a.headers["content-length"]);
      while (in_.size() < n && Fill()) {
      }
      a.body = in_.substr(0, n);
      in_.erase(0, std::min(n, in_.size()));
      return a;
    }
    while (Fill()) {
    }
    a.body = in_;
    in_.clear();
    return a;
  }

 private:
  bool Fill() {
    char buf[8192];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) return false;
    in_.append(buf, static_cast<size_t>(n));
    return true;
  }
  int fd_ = -1;
  bool connected_ = false;
  std::string in_;
  HttpAnswer head_;
};

// The data of each "data: ..." event in an SSE body, in order.
inline std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t at = 0;
  while (true) {
    const size_t end = body.find("\n\n", at);
    if (end == std::string::npos) break;
    const std::string event = body.substr(at, end - at);
    if (event.rfind("data: ", 0) == 0) out.push_back(event.substr(6));
    at = end + 2;
  }
  return out;
}

}  // namespace kvasir::testing
