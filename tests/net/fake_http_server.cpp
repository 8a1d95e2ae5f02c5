#include "fake_http_server.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

namespace kvasir::testing {

FakeHttpServer::FakeHttpServer(Reply reply)
    : reply_(std::move(reply)), listener_(std::move(ring::Listener::Bind("127.0.0.1", 0).value())) {
  port_ = listener_.port();
  thread_ = std::thread([this] { Serve(); });
}

FakeHttpServer::~FakeHttpServer() {
  stop_ = true;
  listener_.Close();
  thread_.join();
}

void FakeHttpServer::Serve() {
  while (!stop_.load()) {
    auto conn = listener_.Accept();
    if (!conn.ok()) return;
    std::unique_ptr<ring::Stream> s = std::move(conn).value();
    // One request per connection: read the head, answer, close.
    std::string head;
    uint8_t buf[4096];
    while (head.find("\r\n\r\n") == std::string::npos && head.size() < 65536) {
      auto n = s->ReadSome(buf);
      if (!n.ok() || *n == 0) break;
      head.append(reinterpret_cast<const char*>(buf), *n);
    }
    if (head.find("\r\n\r\n") == std::string::npos) continue;
    FakeRequest req;
    req.head = head;
    const size_t r = head.find("Range: bytes=");
    if (r != std::string::npos) {
      std::sscanf(head.c_str() + r, "Range: bytes=%lld-%lld", &req.first, &req.last);
    }
    ++requests_;
    const std::string out = reply_(req);
    (void)s->WriteAll(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(out.data()), out.size()));
    s->Shutdown();
  }
}

std::string FakeHttpServer::Partial(const FakeRequest& req, const std::string& file,
                                    long long send) {
  const long long size = static_cast<long long>(file.size());
  const long long first = req.first;
  const long long last = std::min(req.last, size - 1);
  const long long len = last - first + 1;
  std::string out = "HTTP/1.1 206 Partial Content\r\nContent-Type: application/octet-stream\r\n";
  out += "Content-Range: bytes " + std::to_string(first) + "-" + std::to_string(last) + "/" +
         std::to_string(size) + "\r\n";
  out += "Content-Length: " + std::to_string(len) + "\r\nETag: \"fake\"\r\nConnection: close\r\n\r\n";
  out += file.substr(static_cast<size_t>(first),
                     static_cast<size_t>(send >= 0 ? std::min(send, len) : len));
  return out;
}

}  // namespace kvasir::testing
