#include "net/server.h"

#include <malloc.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "base/log.h"
#include "net/stream.h"

namespace kvasir::net {

namespace asio = boost::asio;
namespace ssl = boost::asio::ssl;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;

namespace {

// Asio's reactor allocates a small state for every socket it is given and keeps it for reuse when
// the socket closes, never freeing it. Allocated connection by connection during a flood, those
// blocks would sit between the connections' freed memory and keep its pages resident for good.
// Allocating as many as the server may hold here, on the starting thread (another heap arena than
// the loop's) and before any connection, keeps them out of the way, so what a flood's connections
// held can go back to the system after it (GiveBackAfterFlood).
void ReserveSocketStates(asio::io_context& ioc, int n) {
  std::vector<tcp::socket> sockets;
  sockets.reserve(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    tcp::socket s(ioc);
    error_code ec;
    s.open(tcp::v4(), ec);
    if (ec) break;  // out of descriptors: the server will not hold more connections either
    sockets.push_back(std::move(s));
  }
}  // closed here: their states wait in Asio's pool

Millis NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

const char* CloseCauseName(CloseCause cause) {
  switch (cause) {
    case CloseCause::kDeadline:
      return "deadline";
    case CloseCause::kEvicted:
      return "evicted";
    case CloseCause::kStopping:
      return "stopping";
  }
  return "?";
}

class ServerCore : public std::enable_shared_from_this<ServerCore> {
 public:
  explicit ServerCore(const ServerOptions& o) : o(o), table(o.admission) {}

  const ServerOptions o;
  asio::io_context ioc;
  std::optional<ssl::context> tls;
  std::optional<tcp::acceptor> acceptor;
  std::optional<asio::steady_timer> sweep_timer, retry_timer;
  ConnectionFactory factory;
  uint16_t port = 0;
  std::thread thread;
  std::atomic<bool> stopping{false};
  bool stopped = false;  // Stop() ran (caller's thread)

  // Loop thread only.
  AdmissionTable table;
  std::unordered_map<ConnId, std::weak_ptr<ServerConnection>> conns;
  ConnId next_id = 1;
  // Refusals, evictions and expiries since the last summary line (one a second at most).
  uint64_t refused_since_log = 0, evicted_since_log = 0, expired_since_log = 0;
  std::string last_refusal;
  Millis last_log_ms = 0;
  bool flooded = false;     // a pool was under pressure since the last GiveBackAfterFlood
  size_t held_at_trim = 0;  // connections open at the last trim after a flood (0: none due)

  std::atomic<uint64_t> accepted{0}, refused{0}, evicted{0}, expired{0}, open_now{0}, proven_now{0};
  mutable std::mutex mu;
  mutable std::condition_variable changed;

  void Notify() const {
    { std::lock_guard<std::mutex> lock(mu); }
    changed.notify_all();
  }
  // After every change of the table (loop thread).
  void PublishCounts() {
    open_now = static_cast<uint64_t>(table.Count(Pool::kOpen));
    proven_now = static_cast<uint64_t>(table.Count(Pool::kProven));
    if (table.Pressed(Pool::kOpen) || table.Pressed(Pool::kProven)) flooded = true;
    Notify();
  }

  void CloseById(ConnId id, CloseCause cause) {
    auto it = conns.find(id);
    if (it == conns.end()) return;
    if (auto c = it->second.lock()) c->Close(cause);
  }

  void Accept();
  void OnAccepted(tcp::socket socket);
  void Refuse(tcp::socket socket, const std::string& ip, const std::string& why);
  void Sweep();
  void LogSummary(Millis now, bool force);
  void GiveBackAfterFlood();
};

// The connections of a flood leave their memory scattered through the heap, where the allocator
// keeps it. Once the pressure has gone (a quarter of the pressure point left in every pool), the
// free pages go back to the system, so the process returns to its idle size.
// The flood's last connections close after that, and their memory too: the pages go back once
// more each time half of the connections left at the last trim have gone, down to none (a few
// trims, never one per sweep).
void ServerCore::GiveBackAfterFlood() {
  const auto held = static_cast<size_t>(table.Count(Pool::kOpen) + table.Count(Pool::kProven));
  if (!flooded) {
    if (held_at_trim > 0 && held <= held_at_trim / 2) {
      held_at_trim = held;
      ::malloc_trim(0);
    }
    return;
  }
  for (Pool pool : {Pool::kOpen, Pool::kProven}) {
    const PoolLimits& l = pool == Pool::kOpen ? o.admission.open : o.admission.proven;
    if (table.Count(pool) > l.pressure_from / 4) return;
  }
  flooded = false;
  held_at_trim = held;
  ::malloc_trim(0);
}

void ServerCore::Accept() {
  acceptor->async_accept(ioc, [self = shared_from_this()](error_code ec, tcp::socket socket) {
    if (self->stopping.load()) return;
    if (ec) {
      // Out of descriptors or memory: accepting at once would fail again in a tight loop.
      KV_LOG_WARN("{}: accept: {}; accepting again in 50 ms", self->o.name, ec.message());
      self->retry_timer->expires_after(std::chrono::milliseconds(50));
      self->retry_timer->async_wait([self](error_code e) {
        if (!e && !self->stopping.load()) self->Accept();
      });
      return;
    }
    self->OnAccepted(std::move(socket));
    self->Accept();
  });
}

void ServerCore::OnAccepted(tcp::socket socket) {
  error_code ec;
  const auto ep = socket.remote_endpoint(ec);
  const std::string ip = ec ? "?" : ep.address().to_string();
  // Latency-bound messages on every user: no Nagle delay.
  socket.set_option(tcp::no_delay(true), ec);
  const ConnId id = next_id++;
  Admission a = table.Admit(id, AdmissionKey(ip), NowMs());
  if (a.evicted) {
    ++evicted;
    ++evicted_since_log;
    KV_LOG_DEBUG("{}: a connection from {} evicted for one from {}", o.name, a.evicted_address, ip);
    CloseById(*a.evicted, CloseCause::kEvicted);
  }
  if (!a.admitted) return Refuse(std::move(socket), ip, a.why);
  ++accepted;
  auto conn = factory(
      Accepted{std::move(socket), ServerSlot(shared_from_this(), id, ip), tls ? &*tls : nullptr});
  if (conn == nullptr) {  // the user refused it; its slot is gone with it
    PublishCounts();
    return;
  }
  conns[id] = conn;
  PublishCounts();
  conn->Start();
}

void ServerCore::Refuse(tcp::socket socket, const std::string& ip, const std::string& why) {
  ++refused;
  ++refused_since_log;
  last_refusal = fmt::format("{}: {}", ip, why);
  KV_LOG_DEBUG("{}: {} refused: {}", o.name, ip, why);
  error_code ec;
  if (!tls && !o.refusal.empty()) {
    socket.non_blocking(true, ec);
    socket.write_some(asio::buffer(o.refusal), ec);
  }
  socket.close(ec);
  LogSummary(NowMs(), false);
  Notify();
}

void ServerCore::LogSummary(Millis now, bool force) {
  if (refused_since_log + evicted_since_log + expired_since_log == 0) return;
  if (!force && now - last_log_ms < 1000) return;
  KV_LOG_WARN(
      "{}: {} open and {} proven connections; since the last report {} refused, {} "
      "evicted for other addresses, {} closed at a deadline{}{}",
      o.name, table.Count(Pool::kOpen), table.Count(Pool::kProven), refused_since_log,
      evicted_since_log, expired_since_log, table.Pressed(Pool::kOpen) ? " (under pressure)" : "",
      last_refusal.empty() ? "" : "; last refused " + last_refusal);
  refused_since_log = evicted_since_log = expired_since_log = 0;
  last_refusal.clear();
  last_log_ms = now;
}

void ServerCore::Sweep() {
  sweep_timer->expires_after(std::chrono::milliseconds(o.sweep_ms));
  sweep_timer->async_wait([self = shared_from_this()](error_code ec) {
    if (ec || self->stopping.load()) return;
    const Millis now = NowMs();
    const auto expired = self->table.TakeExpired(now);
    // Counted first, so whoever sees a connection close sees the counters that say why.
    self->expired += expired.size();
    self->expired_since_log += expired.size();
    if (!expired.empty()) self->PublishCounts();
    for (const AdmissionTable::Expired& x : expired) {
      KV_LOG_DEBUG("{}: connection {} closed: its {} stage ran past its deadline ({} pool)",
                   self->o.name, x.id, StageName(x.stage), PoolName(x.pool));
      self->CloseById(x.id, CloseCause::kDeadline);
    }
    self->LogSummary(now, false);
    self->GiveBackAfterFlood();
    self->Sweep();
  });
}

ServerSlot::ServerSlot(std::shared_ptr<ServerCore> core, ConnId id, std::string ip)
    : core_(std::move(core)), id_(id), ip_(std::move(ip)) {}

ServerSlot::~ServerSlot() {
  if (core_ == nullptr) return;
  core_->conns.erase(id_);
  if (core_->table.Contains(id_)) {
    core_->table.Remove(id_);
    core_->PublishCounts();
  }
}

void ServerSlot::Enter(Stage stage, bool restart_clock) {
  core_->table.SetStage(id_, stage, NowMs(), restart_clock);
}

bool ServerSlot::Promote() {
  Admission a = core_->table.Promote(id_);
  if (a.evicted) {
    ++core_->evicted;
    ++core_->evicted_since_log;
    core_->CloseById(*a.evicted, CloseCause::kEvicted);
  }
  core_->PublishCounts();
  return a.admitted;
}

void ServerSlot::Release() {
  core_->table.Remove(id_);
  core_->PublishCounts();
}

bool ServerSlot::counted() const { return core_->table.Contains(id_); }
asio::io_context& ServerSlot::ioc() const { return core_->ioc; }
void ServerSlot::Notify() const { core_->Notify(); }

namespace {

// The places of both pools, each one descriptor, and some for the process (logs, the database,
// outgoing dials): raises the soft open-file limit to that, up to the hard limit, so that a flood
// meets the admission limits rather than EMFILE. A hard limit below it is named once.
void EnsureFileLimit(const ServerOptions& o) {
  constexpr rlim_t kSpare = 128;
  const rlim_t want = static_cast<rlim_t>(o.admission.open.max_total) +
                      static_cast<rlim_t>(o.admission.proven.max_total) + kSpare;
  rlimit lim{};
  if (::getrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur >= want) return;
  const rlim_t hard = lim.rlim_max;
  lim.rlim_cur = (hard == RLIM_INFINITY || hard >= want) ? want : hard;
  if (::setrlimit(RLIMIT_NOFILE, &lim) != 0 || lim.rlim_cur < want) {
    KV_LOG_WARN(
        "{}: its {} places need {} open files, and the limit is {} (ulimit -n): a flood "
        "may be refused by the system before the server's own limits",
        o.name, want - kSpare, want, lim.rlim_cur);
  }
}

}  // namespace

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& o, ConnectionFactory factory) {
  if (Status s = ValidatePolicy(o.admission); !s.ok()) return s.WithContext(o.name);
  if (o.sweep_ms < 1) return Error("{}: sweep_ms must be at least 1 (got {})", o.name, o.sweep_ms);
  EnsureFileLimit(o);
  if (o.tls_cert.empty() != o.tls_key.empty()) {
    return Error("--tls-cert and --tls-key go together (got only {})",
                 o.tls_cert.empty() ? "--tls-key" : "--tls-cert");
  }
  auto core = std::make_shared<ServerCore>(o);
  core->factory = std::move(factory);
  if (!o.tls_cert.empty()) {
    core->tls.emplace(ssl::context::tls_server);
    error_code ec;
    core->tls->set_options(ssl::context::default_workarounds | ssl::context::no_sslv2 |
                           ssl::context::no_sslv3 | ssl::context::no_tlsv1 |
                           ssl::context::no_tlsv1_1);
    core->tls->use_certificate_chain_file(o.tls_cert, ec);
    if (ec) return Error("{}: cannot load the certificate: {}", o.tls_cert, ec.message());
    core->tls->use_private_key_file(o.tls_key, ssl::context::pem, ec);
    if (ec) return Error("{}: cannot load the private key: {}", o.tls_key, ec.message());
  }
  core->acceptor.emplace(core->ioc);
  tcp::acceptor& acc = *core->acceptor;
  error_code ec;
  if (o.listen_fd >= 0) {
    const int fd = ::dup(o.listen_fd);
    if (fd < 0) return Error("listening socket {}: {}", o.listen_fd, std::strerror(errno));
    sockaddr_storage sa{};
    socklen_t len = sizeof(sa);
    if (::getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
      ::close(fd);
      return Error("listening socket {}: {}", o.listen_fd, std::strerror(errno));
    }
    acc.assign(sa.ss_family == AF_INET6 ? tcp::v6() : tcp::v4(), fd, ec);
    if (ec) {
      ::close(fd);
      return Error("listening socket {}: {}", o.listen_fd, ec.message());
    }
  } else {
    std::string host;
    uint16_t port = 0;
    KV_RETURN_IF_ERROR(ParseHostPort(o.listen, &host, &port));
    const auto address = asio::ip::make_address(host == "localhost" ? "127.0.0.1" : host, ec);
    if (ec) return Error("--listen {}: '{}' is not an IP address", o.listen, host);
    const tcp::endpoint ep(address, port);
    acc.open(ep.protocol(), ec);
    if (!ec) acc.set_option(asio::socket_base::reuse_address(true), ec);
    if (!ec) acc.bind(ep, ec);
    if (!ec) acc.listen(asio::socket_base::max_listen_connections, ec);
    if (ec) return Error("cannot listen on {}: {}", o.listen, ec.message());
  }
  const auto local = acc.local_endpoint(ec);
  if (ec) return Error("listening socket: {}", ec.message());
  core->port = local.port();
  ReserveSocketStates(core->ioc, o.admission.open.max_total + o.admission.proven.max_total + 64);
  core->sweep_timer.emplace(core->ioc);
  core->retry_timer.emplace(core->ioc);
  core->Accept();
  core->Sweep();
  core->thread = std::thread([core] { core->ioc.run(); });
  return std::unique_ptr<Server>(new Server(core));
}

Server::~Server() { Stop(); }

uint16_t Server::port() const { return core_->port; }
bool Server::tls() const { return core_->tls.has_value(); }

ServerStats Server::stats() const {
  ServerStats s;
  s.accepted = core_->accepted.load();
  s.refused = core_->refused.load();
  s.evicted = core_->evicted.load();
  s.expired = core_->expired.load();
  s.open = core_->open_now.load();
  s.proven = core_->proven_now.load();
  return s;
}

bool Server::WaitFor(const std::function<bool()>& done, int timeout_ms) const {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  std::unique_lock<std::mutex> lock(core_->mu);
  while (!done()) {
    if (core_->changed.wait_until(lock, deadline) == std::cv_status::timeout) return done();
  }
  return true;
}

void Server::Notify() const { core_->Notify(); }

void Server::Stop() {
  if (core_ == nullptr || core_->stopped) return;
  core_->stopped = true;
  core_->stopping = true;
  asio::post(core_->ioc, [core = core_] {
    error_code ignored;
    core->acceptor->close(ignored);
    core->sweep_timer->cancel();
    core->retry_timer->cancel();
    core->LogSummary(NowMs(), true);
    // Close() may end a connection at once, and its slot then leaves `conns`: close a copy.
    std::vector<std::weak_ptr<ServerConnection>> all;
    for (auto& [id, w] : core->conns) all.push_back(w);
    for (auto& w : all) {
      if (auto c = w.lock()) c->Close(CloseCause::kStopping);
    }
  });
  if (core_->thread.joinable()) core_->thread.join();
  // The factory may hold what refers back to this server: drop it with the loop.
  core_->factory = nullptr;
  core_->Notify();
}

}  // namespace kvasir::net
