#include "flood.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <string_view>

namespace kvasir::testing {

ConnectionFlood::ConnectionFlood(FloodOptions options) : o_(std::move(options)) {
  epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = UINT64_MAX;
  ::epoll_ctl(epoll_, EPOLL_CTL_ADD, wake_, &ev);
  conns_.resize(o_.sources.size() * static_cast<size_t>(o_.per_source));
  for (size_t i = 0; i < conns_.size(); ++i) {
    conns_[i].source = static_cast<int>(i / static_cast<size_t>(o_.per_source));
    Open(i);
  }
  thread_ = std::thread([this] { Run(); });
}

ConnectionFlood::~ConnectionFlood() {
  Stop();
  ::close(epoll_);
  ::close(wake_);
}

std::vector<std::string> ConnectionFlood::LoopbackSources(int n, int first) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) {
    const int v = first + i;
    out.push_back("127.0." + std::to_string(v / 256) + "." + std::to_string(v % 256));
  }
  return out;
}

void ConnectionFlood::Changed() {
  { std::lock_guard<std::mutex> lock(mu_); }
  cv_.notify_all();
}

bool ConnectionFlood::WaitFor(const std::function<bool()>& done, int timeout_ms) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::unique_lock<std::mutex> lock(mu_);
  while (!done()) {
    if (cv_.wait_until(lock, deadline) == std::cv_status::timeout) return done();
  }
  return true;
}

void ConnectionFlood::Open(size_t i) {
  Conn& c = conns_[i];
  c.connected = false;
  c.refused = false;
  c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (c.fd < 0) {
    retry_.push_back(i);
    return;
  }
  // The port is chosen at connect() for the whole 4-tuple, so thousands of reopened connections
  // from one source address never run out of ports.
  const int one = 1;
  ::setsockopt(c.fd, IPPROTO_IP, IP_BIND_ADDRESS_NO_PORT, &one, sizeof(one));
  sockaddr_in src{};
  src.sin_family = AF_INET;
  ::inet_pton(AF_INET, o_.sources[static_cast<size_t>(c.source)].c_str(), &src.sin_addr);
  sockaddr_in dst{};
  dst.sin_family = AF_INET;
  dst.sin_port = htons(o_.port);
  dst.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::bind(c.fd, reinterpret_cast<sockaddr*>(&src), sizeof(src)) != 0 ||
      (::connect(c.fd, reinterpret_cast<sockaddr*>(&dst), sizeof(dst)) != 0 &&
       errno != EINPROGRESS)) {
    ::close(c.fd);
    c.fd = -1;
    retry_.push_back(i);
    return;
  }
  epoll_event ev{};
  ev.events = EPOLLOUT | EPOLLIN | EPOLLRDHUP;
  ev.data.u64 = i;
  ::epoll_ctl(epoll_, EPOLL_CTL_ADD, c.fd, &ev);
}

void ConnectionFlood::Lost(size_t i) {
  Conn& c = conns_[i];
  if (c.connected) {
    --held_;
    ++(c.refused ? refused_ : closed_);
  }
  ::epoll_ctl(epoll_, EPOLL_CTL_DEL, c.fd, nullptr);
  ::close(c.fd);
  c.fd = -1;
  c.connected = false;
  Changed();
  if (!stop_) Open(i);
}

void ConnectionFlood::Run() {
  std::vector<epoll_event> events(256);
  char sink[4096];
  auto next_retry = std::chrono::steady_clock::now();
  while (!stop_) {
    // A failed connect (a full backlog) is retried 10 ms later, not in a tight loop.
    const int n = ::epoll_wait(epoll_, events.data(), static_cast<int>(events.size()),
                               retry_.empty() ? -1 : 10);
    if (!retry_.empty() && std::chrono::steady_clock::now() >= next_retry) {
      std::vector<size_t> again;
      again.swap(retry_);
      for (size_t i : again) Open(i);
      next_retry = std::chrono::steady_clock::now() + std::chrono::milliseconds(10);
    }
    for (int k = 0; k < n; ++k) {
      if (events[k].data.u64 == UINT64_MAX) continue;  // woken to stop
      const size_t i = events[k].data.u64;
      Conn& c = conns_[i];
      if (c.fd < 0) continue;
      const uint32_t e = events[k].events;
      if (!c.connected && (e & EPOLLOUT)) {
        int err = 0;
        socklen_t len = sizeof(err);
        ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          Lost(i);
          continue;
        }
        c.connected = true;
        ++held_;
        ++opened_;
        if (!o_.first_bytes.empty()) {
          (void)::send(c.fd, o_.first_bytes.data(), o_.first_bytes.size(), MSG_NOSIGNAL);
        }
        epoll_event ev{};
        ev.events = EPOLLIN | EPOLLRDHUP;
        ev.data.u64 = i;
        ::epoll_ctl(epoll_, EPOLL_CTL_MOD, c.fd, &ev);
        Changed();
        continue;
      }
      if (e & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        // Whatever the server says (a 503, a 101) is read and dropped; its close is a loss.
        const ssize_t r = ::recv(c.fd, sink, sizeof(sink), 0);
        static constexpr std::string_view k503 = "HTTP/1.1 503";
        if (r >= static_cast<ssize_t>(k503.size()) && std::string_view(sink, k503.size()) == k503) {
          c.refused = true;
        }
        if (r > 0 && !(e & (EPOLLRDHUP | EPOLLHUP | EPOLLERR))) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        Lost(i);
      }
    }
  }
}

void ConnectionFlood::Stop() {
  if (stop_.exchange(true)) return;
  const uint64_t one = 1;
  (void)::write(wake_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  for (Conn& c : conns_) {
    if (c.fd >= 0) ::close(c.fd);
    if (c.connected) --held_;
    c.fd = -1;
    c.connected = false;
  }
  Changed();
}

}  // namespace kvasir::testing
