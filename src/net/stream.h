// Byte streams: the interface every transport implements (TCP here, the relay's WebSocket edge in
// src/relay/ws_stream.h, the encrypted ring stream in src/ring/secure_stream.h), a TCP listener and
// a TCP dialer. A stream moves bytes and knows nothing about frames or messages; src/ring/link.h
// puts the framing on top.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "base/status.h"

namespace kvasir::net {

class Stream {
 public:
  virtual ~Stream() = default;
  // Writes every byte or fails (peer gone, shut down). One writer at a time.
  virtual Status WriteAll(std::span<const uint8_t> bytes) = 0;
  // Reads at least one byte, returning how many; 0 means the peer closed the stream in order.
  // One reader at a time.
  virtual Result<size_t> ReadSome(std::span<uint8_t> buffer) = 0;
  // Ends the stream both ways and wakes a blocked reader or writer. Safe from any thread,
  // repeatable.
  virtual void Shutdown() = 0;
  // Ends a stream whose last bytes were just written so that they reach the peer: stops sending
  // (TCP: a FIN), then reads and drops what the peer still sends, until it closes or falls
  // silent for a moment (50 ms), `max_bytes` were dropped or `timeout_ms` passed, and only then
  // ends the stream both ways. Closing a TCP
  // socket with bytes unread resets the connection, and a reset can destroy what the peer had not
  // read yet (an ERROR explaining why it was dropped). The caller must be the only reader.
  // Transports that cannot half-close just Shutdown().
  virtual void Linger(int /*timeout_ms*/, size_t /*max_bytes*/) { Shutdown(); }
  // "127.0.0.1:5001", for messages.
  virtual std::string peer() const = 0;
  // Caps what the kernel buffers for sending on this stream (TCP: SO_SNDBUF), so a peer that does
  // not read holds at most that much of this host's memory in the kernel. No-op for transports
  // without such a buffer.
  virtual void LimitSendBuffer(int /*bytes*/) {}
};

// Splits "host:port" ("127.0.0.1:5000", "[::1]:5000", "localhost:5000"). Errors name the text.
Status ParseHostPort(const std::string& text, std::string* host, uint16_t* port);

// Whether `host` names the loopback interface: "localhost", 127.0.0.0/8 or ::1.
bool IsLoopbackHost(const std::string& host);

class Listener {
 public:
  ~Listener();
  Listener(Listener&& other) noexcept;
  Listener& operator=(Listener&& other) noexcept;
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Binds and listens on host:port (port 0 picks a free port; see port()).
  static Result<Listener> Bind(const std::string& host, uint16_t port);
  // Takes over `fd`, a socket already bound and listening (inherited from a supervisor such as
  // `kvasir run`, so a port is bound once and never left free for another process to take).
  // Refuses anything else, naming the fd. Close() then only stops Accept(): the socket may be a
  // dup() its owner still listens on, so connections that arrive meanwhile wait in its backlog.
  static Result<Listener> Adopt(int fd);
  // Gives the listening socket up (it is no longer closed by this Listener), e.g. to hand it to
  // a child process or a Stage.
  int Release();
  uint16_t port() const { return port_; }
  // The listening socket, still owned by this Listener (dup() it to hand a copy on).
  int fd() const { return fd_; }
  // The numeric address it listens on ("127.0.0.1", "::1", "0.0.0.0").
  const std::string& host() const { return host_; }
  // Blocks until a connection arrives or Close() is called (then returns an error).
  Result<std::unique_ptr<Stream>> Accept();
  // Stops accepting; wakes a blocked Accept(). Safe from another thread.
  void Close();

 private:
  Listener() = default;
  int fd_ = -1;           // closed only by the destructor, so Accept() never races a close
  bool adopted_ = false;  // from Adopt(): never shut down, only closed (see Close())
  std::atomic<bool> closed_{false};
  int wake_[2] = {-1, -1};  // self-pipe to interrupt poll() in Accept()
  uint16_t port_ = 0;
  std::string host_;
};

// Connects to host:port within `timeout_ms`. TCP_NODELAY is set: frames are small and
// latency-bound.
Result<std::unique_ptr<Stream>> DialTcp(const std::string& host, uint16_t port, int timeout_ms);

}  // namespace kvasir::net
