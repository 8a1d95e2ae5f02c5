#include "fake_http_server.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace kvasir::testing {

std::string FakeRequest::Header(std::string_view name) const {
  size_t at = head.find("\r\n");
  while (at != std::string::npos && at + 2 < head.size()) {
    const size_t start = at + 2;
    const size_t end = head.find("\r\n", start);
    if (end == std::string::npos || end == start) break;
    const std::string_view line(head.data() + start, end - start);
    const size_t colon = line.find(':');
    if (colon == name.size() &&
        std::equal(name.begin(), name.end(), line.begin(), [](char a, char b) {
          return std::tolower(static_cast<unsigned char>(a)) ==
                 std::tolower(static_cast<unsigned char>(b));
        })) {
      std::string_view v = line.substr(colon + 1);
      while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      return std::string(v);
    }
    at = end;
  }
  return "";
}

bool FakeHttpServer::Conn::Write(std::string_view bytes) {
  return stream_
      ->WriteAll(
          std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()))
      .ok();
}

bool FakeHttpServer::Conn::Pause(std::chrono::milliseconds d) {
  std::unique_lock<std::mutex> lock(server_->mu_);
  return !server_->cv_.wait_for(lock, d, [&] { return server_->stop_; });
}

FakeHttpServer::FakeHttpServer(Reply reply)
    : FakeHttpServer(Handler([reply = std::move(reply)](const FakeRequest& req, Conn& conn) {
        conn.Write(reply(req));
      })) {}

FakeHttpServer::FakeHttpServer(Handler handler)
    : handler_(std::move(handler)),
      listener_(std::move(net::Listener::Bind("127.0.0.1", 0).value())) {
  port_ = listener_.port();
  thread_ = std::thread([this] { Accept(); });
}

FakeHttpServer::~FakeHttpServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    for (net::Stream* s : open_) s->Shutdown();
  }
  cv_.notify_all();
  listener_.Close();
  thread_.join();
  for (std::thread& t : workers_) t.join();
}

int FakeHttpServer::WaitForRequests(int n, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return requests_.load() >= n || stop_; });
  return requests_.load();
}

void FakeHttpServer::Accept() {
  for (;;) {
    auto conn = listener_.Accept();
    if (!conn.ok()) return;
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    workers_.emplace_back(
        [this, s = std::move(conn).value()]() mutable { ServeOne(std::move(s)); });
  }
}

void FakeHttpServer::ServeOne(std::unique_ptr<net::Stream> s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stop_) return;
    open_.push_back(s.get());
  }
  // One request per connection: read the head, answer, close.
  std::string head;
  uint8_t buf[4096];
  while (head.find("\r\n\r\n") == std::string::npos && head.size() < 65536) {
    auto n = s->ReadSome(buf);
    if (!n.ok() || *n == 0) break;
    head.append(reinterpret_cast<const char*>(buf), *n);
  }
  if (head.find("\r\n\r\n") != std::string::npos) {
    FakeRequest req;
    req.head = head;
    const std::string range = req.Header("Range");
    if (!range.empty()) std::sscanf(range.c_str(), "bytes=%lld-%lld", &req.first, &req.last);
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++requests_;
    }
    cv_.notify_all();
    Conn conn(this, s.get());
    handler_(req, conn);
    s->Shutdown();
  }
  std::lock_guard<std::mutex> lock(mu_);
  open_.erase(std::find(open_.begin(), open_.end(), s.get()));
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
  out +=
      "Content-Length: " + std::to_string(len) + "\r\nETag: \"fake\"\r\nConnection: close\r\n\r\n";
  out += file.substr(static_cast<size_t>(first),
                     static_cast<size_t>(send >= 0 ? std::min(send, len) : len));
  return out;
}

std::string FakeHttpServer::Serve(const FakeRequest& req, const FakeFile& file) {
  FakeRequest headers;
  headers.head = "GET / HTTP/1.1\r\n" + file.headers + "\r\n";
  const std::string etag = headers.Header("ETag");
  const std::string last_modified = headers.Header("Last-Modified");
  const std::string if_range = req.Header("If-Range");
  const bool strong = etag.size() >= 2 && etag.front() == '"';
  const bool current =
      if_range.empty() || (strong && if_range == etag) ||
      (!last_modified.empty() && if_range.front() != '"' && if_range == last_modified);
  const long long size = static_cast<long long>(file.bytes.size());
  if (!current || req.first < 0 || req.first >= size) {
    return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(size) + "\r\n" + file.headers +
           "Connection: close\r\n\r\n" + file.bytes;
  }
  const long long last = std::min(req.last, size - 1);
  const long long len = last - req.first + 1;
  return "HTTP/1.1 206 Partial Content\r\nContent-Range: bytes " + std::to_string(req.first) + "-" +
         std::to_string(last) + "/" + std::to_string(size) +
         "\r\nContent-Length: " + std::to_string(len) + "\r\n" + file.headers +
         "Connection: close\r\n\r\n" +
         file.bytes.substr(static_cast<size_t>(req.first), static_cast<size_t>(len));
}

}  // namespace kvasir::testing
