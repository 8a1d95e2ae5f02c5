// The socket every raw test client starts from: connected to a loopback port, reads bounded.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>

#include <cstdint>
#include <string>

namespace kvasir::testing {

// A TCP socket connected to 127.0.0.1:port, from `source` when given and with a receive buffer of
// `rcvbuf` bytes when above 0, every read bounded by `deadline_ms`. *connected says whether the
// connect succeeded; the caller closes the socket either way.
inline int ConnectLoopback(uint16_t port, int deadline_ms, bool* connected,
                           const std::string& source = "", int rcvbuf = 0) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (rcvbuf > 0) ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  timeval tv{deadline_ms / 1000, (deadline_ms % 1000) * 1000};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (!source.empty()) {
    sockaddr_in src{};
    src.sin_family = AF_INET;
    ::inet_pton(AF_INET, source.c_str(), &src.sin_addr);
    ::bind(fd, reinterpret_cast<sockaddr*>(&src), sizeof(src));
  }
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  *connected = ::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  return fd;
}

}  // namespace kvasir::testing
