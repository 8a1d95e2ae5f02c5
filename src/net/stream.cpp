#include "net/stream.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace kvasir::net {
namespace {

void SetSocketOptions(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
}

std::string AddrToString(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {0};
  uint16_t port = 0;
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
    port = ntohs(a->sin_port);
    return fmt::format("{}:{}", host, port);
  }
  const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
  inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
  port = ntohs(a->sin6_port);
  return fmt::format("[{}]:{}", host, port);
}

class TcpStream final : public Stream {
 public:
  TcpStream(int fd, std::string peer) : fd_(fd), peer_(std::move(peer)) { SetSocketOptions(fd); }
  ~TcpStream() override { ::close(fd_); }

  Status WriteAll(std::span<const uint8_t> bytes) override {
    size_t done = 0;
    while (done < bytes.size()) {
      ssize_t n = ::send(fd_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Error("{}: send failed: {}", peer_, std::strerror(errno));
      }
      done += static_cast<size_t>(n);
    }
    return Status::Ok();
  }

  Result<size_t> ReadSome(std::span<uint8_t> buffer) override {
    while (true) {
      ssize_t n = ::recv(fd_, buffer.data(), buffer.size(), 0);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno == EINTR) continue;
      return Error("{}: receive failed: {}", peer_, std::strerror(errno));
    }
  }

  void Shutdown() override { ::shutdown(fd_, SHUT_RDWR); }
  void Linger(int timeout_ms, size_t max_bytes) override;
  std::string peer() const override { return peer_; }
  void LimitSendBuffer(int bytes) override {
    setsockopt(fd_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  }

 private:
  int fd_;
  std::string peer_;
};

void TcpStream::Linger(int timeout_ms, size_t max_bytes) {
  // A peer that has stopped sending for this long has nothing more in flight worth waiting for.
  constexpr int64_t kQuietMs = 50;
  ::shutdown(fd_, SHUT_WR);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  uint8_t sink[16384];
  size_t dropped = 0;
  while (dropped < max_bytes) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    pollfd p{fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left.count(), kQuietMs)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    const ssize_t n = ::recv(fd_, sink, sizeof(sink), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // the peer closed, or the stream was shut down meanwhile
    dropped += static_cast<size_t>(n);
  }
  ::shutdown(fd_, SHUT_RDWR);
}

Result<addrinfo*> Resolve(const std::string& host, uint16_t port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (passive) hints.ai_flags = AI_PASSIVE;
  addrinfo* res = nullptr;
  const std::string port_str = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port_str.c_str(), &hints, &res);
  if (rc != 0) return Error("cannot resolve '{}': {}", host, gai_strerror(rc));
  return res;
}

}  // namespace

Status ParseHostPort(const std::string& text, std::string* host, uint16_t* port) {
  size_t colon = text.rfind(':');
  if (colon == std::string::npos || colon + 1 == text.size()) {
    return Error("'{}' is not HOST:PORT", text);
  }
  std::string h = text.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  const std::string p = text.substr(colon + 1);
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(p.c_str(), &end, 10);
  if (errno != 0 || end == p.c_str() || *end != '\0' || v < 0 || v > 65535) {
    return Error("'{}': port '{}' is not a number from 0 to 65535", text, p);
  }
  *host = h.empty() ? "0.0.0.0" : h;
  *port = static_cast<uint16_t>(v);
  return Status::Ok();
}

bool IsLoopbackHost(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

Listener::~Listener() {
  Close();
  if (fd_ >= 0) ::close(fd_);
  if (wake_[0] >= 0) ::close(wake_[0]);
  if (wake_[1] >= 0) ::close(wake_[1]);
}

Listener::Listener(Listener&& other) noexcept { *this = std::move(other); }

Listener& Listener::operator=(Listener&& other) noexcept {
  std::swap(fd_, other.fd_);
  std::swap(adopted_, other.adopted_);
  const bool closed = closed_.load();
  closed_ = other.closed_.load();
  other.closed_ = closed;
  std::swap(wake_[0], other.wake_[0]);
  std::swap(wake_[1], other.wake_[1]);
  std::swap(port_, other.port_);
  std::swap(host_, other.host_);
  return *this;
}

namespace {

// The port and numeric host a socket is bound to.
Status LocalAddress(int fd, uint16_t* port, std::string* host) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Error("getsockname failed: {}", std::strerror(errno));
  }
  char text[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<sockaddr_in*>(&ss);
    *port = ntohs(a->sin_port);
    inet_ntop(AF_INET, &a->sin_addr, text, sizeof(text));
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
    *port = ntohs(a->sin6_port);
    inet_ntop(AF_INET6, &a->sin6_addr, text, sizeof(text));
  } else {
    return Error("not an IP socket (address family {})", ss.ss_family);
  }
  *host = text;
  return Status::Ok();
}

}  // namespace

Result<Listener> Listener::Adopt(int fd) {
  int listening = 0, type = 0;
  socklen_t len = sizeof(listening);
  if (fd < 0 || getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0) {
    return Error("fd {} is not an open socket: {}", fd, fd < 0 ? "negative" : std::strerror(errno));
  }
  len = sizeof(type);
  getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len);
  if (listening == 0 || type != SOCK_STREAM) {
    return Error("fd {} is not a listening TCP socket", fd);
  }
  Listener l;
  Status where = LocalAddress(fd, &l.port_, &l.host_);
  if (!where.ok()) return where.WithContext(fmt::format("fd {}", fd));
  if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0) {
    return Error("fd {}: cannot set close-on-exec: {}", fd, std::strerror(errno));
  }
  if (::pipe2(l.wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Error("cannot create a pipe: {}", std::strerror(errno));
  }
  l.fd_ = fd;
  l.adopted_ = true;
  return l;
}

int Listener::Release() {
  const int fd = fd_;
  fd_ = -1;
  closed_ = true;
  return fd;
}

Result<Listener> Listener::Bind(const std::string& host, uint16_t port) {
  KV_ASSIGN_OR_RETURN(addrinfo * res, Resolve(host, port, true));
  Listener l;
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) continue;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    // The kernel's whole accept queue (capped by net.core.somaxconn): a flood of connections
    // that overflows a short queue drops honest SYNs, and each costs its client a 1 s retransmit.
    if (::bind(fd, ai->ai_addr, ai->ai_addrlen) == 0 && ::listen(fd, SOMAXCONN) == 0) {
      l.fd_ = fd;
      break;
    }
    last_error = std::strerror(errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  if (l.fd_ < 0) return Error("cannot listen on {}:{}: {}", host, port, last_error);
  KV_RETURN_IF_ERROR(LocalAddress(l.fd_, &l.port_, &l.host_));
  if (::pipe2(l.wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    return Error("cannot create a pipe: {}", std::strerror(errno));
  }
  return l;
}

Result<std::unique_ptr<Stream>> Listener::Accept() {
  while (true) {
    if (fd_ < 0 || closed_.load()) return Error("listener closed");
    pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    int rc = ::poll(fds, 2, -1);
    if (rc < 0) {
      if (errno == EINTR) continue;
      return Error("poll failed: {}", std::strerror(errno));
    }
    if (fds[1].revents != 0) return Error("listener closed");
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int c = ::accept4(fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_CLOEXEC);
    if (c < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EAGAIN) continue;
      return Error("accept failed: {}", std::strerror(errno));
    }
    return std::unique_ptr<Stream>(std::make_unique<TcpStream>(c, AddrToString(ss)));
  }
}

void Listener::Close() {
  if (closed_.exchange(true)) return;
  if (wake_[1] >= 0) {
    const char b = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_[1], &b, 1);
  }
  // Stop accepting now (new connections are refused); the descriptor itself is closed by the
  // destructor, once no Accept() can be using it. Not an adopted socket: it may be a dup() of one
  // its owner keeps listening on (`kvasir join` restarting a stage on the same port), and a
  // shutdown would reach the owner's too; the wake pipe alone ends Accept().
  if (fd_ >= 0 && !adopted_) ::shutdown(fd_, SHUT_RDWR);
}

Result<std::unique_ptr<Stream>> DialTcp(const std::string& host, uint16_t port, int timeout_ms) {
  KV_ASSIGN_OR_RETURN(addrinfo * res, Resolve(host, port, false));
  std::string last_error = "no address";
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd =
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) continue;
    int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
    if (rc != 0 && errno == EINPROGRESS) {
      pollfd p{fd, POLLOUT, 0};
      const int ready = ::poll(&p, 1, timeout_ms);
      if (ready == 1) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        rc = err == 0 ? 0 : -1;
        errno = err;
      } else {
        rc = -1;
        if (ready == 0) errno = ETIMEDOUT;
      }
    }
    if (rc == 0) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
      freeaddrinfo(res);
      return std::unique_ptr<Stream>(
          std::make_unique<TcpStream>(fd, fmt::format("{}:{}", host, port)));
    }
    last_error = std::strerror(errno == 0 ? ETIMEDOUT : errno);
    ::close(fd);
  }
  freeaddrinfo(res);
  return Error("cannot connect to {}:{}: {}", host, port, last_error);
}

}  // namespace kvasir::net
