// One server skeleton for the asynchronous services (the relay, the market, the HTTP API): it
// binds (or adopts a listening socket), loads the TLS certificate, accepts on one event-loop
// thread, admits each connection through an AdmissionTable (limits per address, an open and a
// proven pool, eviction, a deadline per stage that shortens under pressure), closes connections
// whose deadline passed (a sweep every `sweep_ms`), and on Stop closes everything and joins its
// thread. What a connection speaks is the user's: a factory makes one ServerConnection per
// admitted socket. net/http_server.h puts HTTP/1.1 on top.
#pragma once

// <utility> first: Boost 1.74's Asio needs it before its headers under GCC 12 in C++20 mode.
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/ssl/context.hpp>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "base/status.h"
#include "net/admission.h"

namespace kvasir::net {

struct ServerOptions {
  std::string name = "server";         // log prefix: "relay", "market"
  std::string listen = "127.0.0.1:0";  // HOST:PORT (port 0 picks a free one; see port())
  // A socket already bound and listening, served (through a duplicate) instead of binding
  // `listen`; the caller keeps its own, so the port stays bound across a stop and a new start.
  int listen_fd = -1;
  std::string tls_cert, tls_key;  // PEM files; both or neither
  AdmissionPolicy admission;
  int sweep_ms = 100;  // how often deadlines are checked
  // Bytes written to a refused connection (plain TCP only) before it is closed: an HTTP 503.
  std::string refusal;
};

struct ServerStats {
  uint64_t accepted = 0;  // admitted connections
  uint64_t refused = 0;   // refused at admission (a limit)
  uint64_t evicted = 0;   // closed to make room for a connection from another address
  uint64_t expired = 0;   // closed at a stage deadline
  uint64_t open = 0;      // in the open pool now
  uint64_t proven = 0;    // in the proven pool now
};

enum class CloseCause : uint8_t { kDeadline, kEvicted, kStopping };
const char* CloseCauseName(CloseCause cause);

// One accepted connection: the user's object, owned by shared_ptr (its pending operations hold
// it). Called on the server's thread only.
class ServerConnection {
 public:
  virtual ~ServerConnection() = default;
  // Starts serving; called once, right after the factory made it.
  virtual void Start() = 0;
  // The server closes it: its stage deadline passed, it was evicted, or the server stops. Closes
  // the socket at once (its pending operations then fail); may be called more than once.
  virtual void Close(CloseCause cause) = 0;
};

class ServerCore;

// A connection's place in its server's table, held by the connection; destroying it frees the
// place. Every call is on the server's thread.
class ServerSlot {
 public:
  ServerSlot(std::shared_ptr<ServerCore> core, ConnId id, std::string ip);
  ServerSlot(ServerSlot&& other) noexcept = default;
  ServerSlot& operator=(ServerSlot&&) = delete;
  ServerSlot(const ServerSlot&) = delete;
  ~ServerSlot();

  // Enters `stage` (its deadline counts from now, or from the current stage's start when
  // `restart_clock` is false).
  void Enter(Stage stage, bool restart_clock = true);
  // Moves to the proven pool when it has room for this address (perhaps evicting another there).
  // Returns whether the connection is in the proven pool now.
  bool Promote();
  // Leaves the table: no more limits or deadlines (the relay's paired edges). Still closed by Stop.
  void Release();
  // Whether it is still in the table (not released, not closed by the server).
  bool counted() const;
  const std::string& ip() const { return ip_; }
  boost::asio::io_context& ioc() const;
  // Wakes Server::WaitFor callers after the user changed a counter of its own.
  void Notify() const;

 private:
  std::shared_ptr<ServerCore> core_;
  ConnId id_ = 0;
  std::string ip_;
};

struct Accepted {
  boost::asio::ip::tcp::socket socket;
  ServerSlot slot;
  boost::asio::ssl::context* tls = nullptr;  // the server's TLS context, or null for plain TCP
};

using ConnectionFactory = std::function<std::shared_ptr<ServerConnection>(Accepted accepted)>;

class Server {
 public:
  // Validates the options, binds, loads the certificate (errors name the file) and starts its
  // thread. `factory` is called on that thread for every admitted connection; it is dropped at
  // Stop, so it may hold what the connections need.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                               ConnectionFactory factory);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  uint16_t port() const;
  bool tls() const;
  ServerStats stats() const;
  // Blocks until `done()` holds or `timeout_ms` passes and returns whether it holds. `done` is
  // evaluated at every change of the server's state (and its users', see ServerSlot::Notify),
  // so a caller waits on events, not on a clock.
  bool WaitFor(const std::function<bool()>& done, int timeout_ms) const;
  // Wakes WaitFor callers after a change of the user's own state. Any thread.
  void Notify() const;
  // Closes every connection and joins the thread. Idempotent.
  void Stop();

 private:
  explicit Server(std::shared_ptr<ServerCore> core) : core_(std::move(core)) {}
  std::shared_ptr<ServerCore> core_;
};

}  // namespace kvasir::net
