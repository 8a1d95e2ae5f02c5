// Stage runtime, part 2: accepted connections. The accept thread admits connections through the
// handshake slots (ring/pending_table.h) and gives each a thread that runs the handshake
// (ring/handshake.h) and HELLO within a deadline; then the link is served as the predecessor or as
// a client, whose buffers are charged to the client budget (ring/byte_budget.h). Limits:
// docs/PROTOCOL.md, "Limits".
#include <fmt/format.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <cstring>

#include "base/log.h"
#include "base/watchdog.h"
#include "ring/secure_stream.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {
namespace {

// Frames queued for a client (it is dropped past this).
constexpr size_t kClientQueueBytes = size_t{1} << 20;
// What the kernel may buffer towards one client that does not read.
constexpr int kClientSendBuffer = 64 * 1024;
// A client's messages read and not yet handled by the compute thread; its reader waits beyond.
constexpr size_t kMaxClientMessages = 16;
// What a message waiting in the event queue holds besides its payload.
constexpr size_t kEventOverhead = sizeof(Event);

// "127.0.0.1:5000" -> "127.0.0.1"; "[::1]:5000" -> "::1".
std::string AddressOf(const std::string& peer) {
  const size_t colon = peer.rfind(':');
  std::string host = colon == std::string::npos ? peer : peer.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

// Refuses a connection before its handshake (plaintext ERROR, then close).
void RefuseRaw(net::Stream& s, wire::ErrorCode code, const std::string& why) {
  (void)s.WriteAll(EncodeMessage(ErrorMsg{code, 0, why}));
  s.Shutdown();
}

// The bytes a client's message holds while it waits for the compute thread.
size_t HeldBytes(const Message& m) {
  size_t n = kEventOverhead;
  if (const auto* g = std::get_if<GenerateMsg>(&m)) {
    n += g->prompt.size();
    for (const std::string& stop : g->stops) n += stop.size() + sizeof(std::string);
  } else if (const auto* st = std::get_if<StatsMsg>(&m)) {
    n += st->records.size() * sizeof(wire::StageStats) +
         st->drafts.size() * sizeof(wire::DraftStatsWire) +
         st->repairs.size() * sizeof(wire::RepairStatsWire);
  }
  return n;
}

LinkOptions ClientLinkOptions(const StageOptions& o, uint32_t max_payload,
                              std::shared_ptr<ByteAccount> account) {
  LinkOptions l;
  l.timeout_ms = o.link_timeout_ms;
  l.max_queued_bytes = kClientQueueBytes;
  l.drop_when_full = true;
  l.max_payload = max_payload;
  l.account = std::move(account);
  return l;
}

// The ERROR code that answers a link's failure to receive.
wire::ErrorCode CodeFor(const Status& s) {
  return s.code() == StatusCode::kTooLarge ? wire::ErrorCode::kTooLarge
                                           : wire::ErrorCode::kMalformed;
}

}  // namespace

void StageImpl::TrimLoop() {
  uint64_t trimmed = 0;
  std::unique_lock<std::mutex> lock(trim_mu_);
  while (running_.load()) {
    trim_cv_.wait_for(lock, std::chrono::seconds(1), [this] { return !running_.load(); });
    const uint64_t ended = conns_ended_.load();
    if (ended == trimmed) continue;
    // The allocator keeps what ended connections freed in its per-thread arenas; after a flood
    // that would stay resident for good. Hand whole free pages back, here rather than on a
    // thread anything waits for.
    trimmed = ended;
#ifdef __GLIBC__
    malloc_trim(0);
#endif
  }
}

void StageImpl::Housekeeping() {
  // Never waits for threads_mu_ on the watchdog thread: the next pass comes in 50 ms.
  std::unique_lock<std::mutex> lock(threads_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  const bool pressure = pending_.under_pressure();
  for (uint64_t id : pending_.Expired(Clock::now())) {
    pending_.Remove(id);
    auto it = pending_conns_.find(id);
    if (it == pending_conns_.end()) continue;
    it->second->Cut(pressure ? fmt::format("handshake not completed within {} ms (the stage is "
                                           "flooded with connections)",
                                           options_.pressure_handshake_timeout_ms)
                             : fmt::format("handshake not completed within {} ms",
                                           options_.handshake_timeout_ms));
    pending_conns_.erase(it);
  }
}

void StageImpl::AcceptLoop() {
  while (running_.load()) {
    auto stream = listener_.Accept();
    if (!stream.ok()) {
      if (running_.load()) KV_LOG_WARN("{}: accept: {}", options_.name, stream.status().message());
      return;
    }
    const std::string addr = AddressOf((*stream)->peer());
    std::lock_guard<std::mutex> lock(threads_mu_);
    if (!running_.load()) return;
    auto admission = pending_.Admit(addr, Clock::now());
    for (uint64_t id : admission.evicted) {
      auto it = pending_conns_.find(id);
      if (it == pending_conns_.end()) continue;
      it->second->Cut("closed in its handshake to make room for other connections");
      pending_conns_.erase(it);
    }
    if (!admission.admitted) {
      links_refused_.fetch_add(1);
      KV_LOG_DEBUG("{}: refused {}: {}", options_.name, addr, admission.refusal);
      RefuseRaw(**stream, wire::ErrorCode::kBusy, admission.refusal);
      continue;
    }
    auto pending = std::make_shared<PendingConn>();
    pending->id = admission.id;
    pending->address = addr;
    pending->stream = stream->get();
    pending_conns_[admission.id] = pending;
    ++live_conns_;
    auto raw = std::make_shared<std::unique_ptr<net::Stream>>(std::move(stream).value());
    // Detached: a connection's thread and memory go as soon as it ends. Stop() waits for it.
    std::thread([this, raw, pending]() mutable {
      (void)ServeConnection(std::move(*raw), std::move(pending));
      conns_ended_.fetch_add(1);
      std::lock_guard<std::mutex> done(threads_mu_);
      --live_conns_;
      conns_cv_.notify_all();
    }).detach();
  }
}

Result<std::shared_ptr<Link>> StageImpl::AcceptLink(std::unique_ptr<net::Stream> raw,
                                                    PendingConn* pending, wire::Hello* peer_hello,
                                                    bool* is_client,
                                                    std::shared_ptr<ByteAccount>* account) {
  const bool via_relay = pending == nullptr;
  const std::string peer = via_relay ? "via " + options_.pred_via : "peer " + raw->peer();
  std::shared_ptr<Link> link;
  // Declared after `link`, so it runs before the stream can be destroyed with it.
  struct DetachPending {
    PendingConn* p;
    ~DetachPending() {
      if (p != nullptr) p->Detach();
    }
  } detach{pending};
  net::Stream* raw_ptr = raw.get();
  std::optional<DeadlineGuard> guard;
  guard.emplace(Clock::now() + std::chrono::milliseconds(options_.handshake_timeout_ms),
                [raw_ptr] { raw_ptr->Shutdown(); });
  auto timed_out = [&](Status s) {
    const std::string cut = pending != nullptr ? pending->CutReason() : std::string();
    if (!cut.empty()) return Error(StatusCode::kTimeout, "{}: {}", peer, cut);
    if (guard->expired()) {
      return Error(StatusCode::kTimeout, "{}: handshake not completed within {} ms", peer,
                   options_.handshake_timeout_ms);
    }
    return s;
  };
  auto hs = HandshakeRespond(*raw, stage_auth_, client_auth_);
  if (!hs.ok()) return timed_out(hs.status());
  *is_client = hs->peer_role == wire::Role::kClient;
  if (*is_client) {
    // Anonymous: everything it makes this stage hold is charged to the client budget, and the
    // kernel buffers little for it.
    auto target = std::make_shared<std::weak_ptr<Link>>();
    const std::string name = options_.name;
    const size_t limit = options_.client_buffer_bytes;
    *account = client_budget_->Open([target, name, limit](size_t held) {
      auto l = target->lock();
      if (l == nullptr) return;
      const std::string why = fmt::format(
          "the stage's {} bytes for clients are full, and this client held {} bytes longest",
          limit, held);
      KV_LOG_WARN("{}: dropped client {}: {}", name, l->what(), why);
      l->Fail(wire::ErrorCode::kBusy, why, /*drop_queue=*/true);
    });
    raw->LimitSendBuffer(kClientSendBuffer);
    link = std::make_shared<Link>(
        std::make_unique<SecureStream>(std::move(raw), hs->tx, hs->rx,
                                       sizeof(wire::FrameHeader) + client_max_payload_, *account),
        fmt::format("{} ({})", peer, hs->peer_desc),
        ClientLinkOptions(options_, client_max_payload_, *account));
    *target = link;
  } else {
    link = std::make_shared<Link>(
        std::make_unique<SecureStream>(std::move(raw), hs->tx, hs->rx,
                                       sizeof(wire::FrameHeader) + stage_max_payload_),
        fmt::format("{} ({})", peer, hs->peer_desc),
        StageLinkOptions(options_, stage_max_payload_));
  }
  if (!TrackLink(link)) return Error(StatusCode::kUnavailable, "the stage is stopping");
  auto first = link->Receive();
  if (!first.ok()) {
    link->Fail(CodeFor(first.status()), first.status().message());
    return timed_out(first.status());
  }
  auto* hello = std::get_if<HelloMsg>(&*first);
  if (hello == nullptr) {
    const std::string why = fmt::format("expected HELLO first, got {}", MessageName(*first));
    link->Fail(wire::ErrorCode::kMalformed, why);
    return Error("{}: {}", link->what(), why);
  }
  const wire::Hello& h = hello->hello;
  *peer_hello = h;
  auto refuse = [&](wire::ErrorCode code, const std::string& why) -> Status {
    link->Fail(code, why);
    return Error("{}: {}", link->what(), why);
  };
  const bool hello_client = h.role == static_cast<uint32_t>(wire::Role::kClient);
  if (hello_client != *is_client) {
    return refuse(wire::ErrorCode::kMalformed,
                  "HELLO role does not match the role of the handshake");
  }
  if (*is_client) {
    if (h.protocol_version != wire::kProtocolVersion) {
      return refuse(wire::ErrorCode::kVersion,
                    fmt::format("client speaks protocol {}, this stage speaks {}",
                                h.protocol_version, wire::kProtocolVersion));
    }
    if (!is_head()) {
      return refuse(wire::ErrorCode::kBadRequest,
                    fmt::format("{} holds layers {}:{}; clients connect to the head stage "
                                "(layer 0)",
                                options_.name, options_.first, options_.last));
    }
  } else {
    if (options_.dial_pred && !via_relay) {
      return refuse(wire::ErrorCode::kUnauthenticated,
                    fmt::format("{} takes its predecessor through the relay ({}), not directly",
                                options_.name, options_.pred_via));
    }
    if (Status s = CheckStageHello(h, true); !s.ok()) {
      const auto code = h.protocol_version != wire::kProtocolVersion ? wire::ErrorCode::kVersion
                        : std::memcmp(h.model_id, model_id_.data(), 16) != 0
                            ? wire::ErrorCode::kWrongModel
                            : wire::ErrorCode::kNotAdjacent;
      return refuse(code, s.message());
    }
    // A process older than the predecessor that took its place (it froze, and woke up) is
    // refused while that one is linked; a standby's first predecessor adopts it, which makes it
    // the newest of its window.
    bool pred_linked;
    {
      std::lock_guard<std::mutex> lock(links_mu_);
      pred_linked = pred_ != nullptr;
    }
    if (Status s = pred_gate_.Admit(h.generation, "predecessor", pred_linked); !s.ok()) {
      return refuse(wire::ErrorCode::kBusy, s.message());
    }
    if (options_.standby && !adopted_.load()) {
      generation_.store(NewGeneration(generation_.load()));
    }
  }
  if (*is_client) {
    std::lock_guard<std::mutex> lock(links_mu_);
    if (clients_.size() >= static_cast<size_t>(options_.max_clients)) {
      link->Fail(wire::ErrorCode::kBusy,
                 fmt::format("{} serves at most {} clients at once", options_.name,
                             options_.max_clients));
      return Error(StatusCode::kUnavailable, "{}: too many clients", link->what());
    }
  }
  if (Status s = link->Send(HelloMsg{MyHello()}); !s.ok()) return s;
  guard.reset();
  return link;
}

Status StageImpl::ServeConnection(std::unique_ptr<net::Stream> raw,
                                  std::shared_ptr<PendingConn> pending) {
  const std::string peer = raw->peer();
  wire::Hello h{};
  bool is_client = false;
  std::shared_ptr<ByteAccount> account;
  auto link = AcceptLink(std::move(raw), pending.get(), &h, &is_client, &account);
  if (pending != nullptr) {
    std::lock_guard<std::mutex> lock(threads_mu_);
    pending_.Remove(pending->id);
    pending_conns_.erase(pending->id);
    // The next connection from a predecessor's address may use the reserved slots.
    if (link.ok() && !is_client) pending_.Expect(pending->address);
  }
  if (!link.ok()) {
    // A connection that closed before saying anything is not worth a warning (port scans,
    // `kvasir run` probing for the head), nor one the handshake table cut (a flood would fill
    // the log with them).
    if (pending != nullptr && !pending->CutReason().empty()) {
      links_refused_.fetch_add(1);
      KV_LOG_DEBUG("{}: refused {}: {}", options_.name, peer, link.status().message());
    } else if (link.status().code() != StatusCode::kEndOfStream) {
      Refused(peer, link.status());
    }
    return link.status();
  }
  ServeLink(*link, h, is_client, account);
  return Status::Ok();
}

void StageImpl::ServeLink(std::shared_ptr<Link> link, const wire::Hello& h, bool is_client,
                          const std::shared_ptr<ByteAccount>& account) {
  uint64_t client = 0;
  std::shared_ptr<Link> replaced;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    if (is_client) {
      client = next_client_++;
      clients_[client] = link;
    } else {
      replaced = pred_;
      pred_ = link;
      if (replaced != nullptr) {
        // The sessions that came through the old link end before the new one delivers anything:
        // this event is queued ahead of the new link's first message.
        Event down;
        down.kind = Event::Kind::kPredDown;
        down.reason = "predecessor " + replaced->what() + " replaced by " + link->what();
        Push(std::move(down));
      }
    }
  }
  if (replaced != nullptr) {
    KV_LOG_WARN("{}: predecessor {} replaced by {}", options_.name, replaced->what(),
                link->what());
    replaced->Close();
  }
  if (!is_client && options_.standby && !adopted_.exchange(true)) Push(Event{});
  const std::string peer_name(h.name, strnlen(h.name, sizeof(h.name)));
  if (!is_client) {
    KV_LOG_INFO("{}: link up: predecessor {} ({}, layers {}:{})", options_.name, peer_name,
                link->what(), h.window_first, h.window_last);
  }
  uint64_t seen_in = link->bytes_in();
  while (running_.load()) {
    auto msg = link->Receive();
    if (!msg.ok()) {
      if (!link->closed() && msg.status().code() != StatusCode::kEndOfStream) {
        KV_LOG_WARN("{}: {}", options_.name, msg.status().message());
        link->Fail(CodeFor(msg.status()), msg.status().message());
      } else if (msg.status().code() == StatusCode::kTimeout) {
        KV_LOG_WARN("{}: {}", options_.name, msg.status().message());
      }
      break;
    }
    if (!is_client) {
      bytes_in_.fetch_add(link->bytes_in() - seen_in);
      seen_in = link->bytes_in();
    }
    Event e;
    e.kind = Event::Kind::kMessage;
    e.from_pred = !is_client;
    e.client = client;
    if (is_client) {
      // The message holds memory until the compute thread is done with it.
      e.charge = ByteCharge::ForMessage(account, HeldBytes(*msg));
      if (!e.charge) {
        if (!link->closed()) {
          const std::string why = "the stage's buffers for clients are full";
          KV_LOG_WARN("{}: dropped client {}: {}", options_.name, link->what(), why);
          link->Fail(wire::ErrorCode::kBusy, why, /*drop_queue=*/true);
        }
        break;
      }
    }
    e.msg = std::move(msg).value();
    Push(std::move(e));
    // A client that sends faster than the stage handles its requests waits (TCP holds the rest).
    while (is_client && account->messages() >= kMaxClientMessages && !link->closed() &&
           running_.load()) {
      account->WaitMessagesBelow(kMaxClientMessages, 100);
    }
  }
  bool was_current = false;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    if (is_client) {
      clients_.erase(client);
    } else if (pred_ == link) {
      pred_.reset();
      was_current = true;
    }
  }
  Event e;
  if (is_client) {
    e.kind = Event::Kind::kClientGone;
    e.client = client;
    Push(std::move(e));
  } else if (was_current && running_.load()) {
    KV_LOG_WARN("{}: link down: predecessor {}", options_.name, link->what());
    e.kind = Event::Kind::kPredDown;
    e.reason = "link from predecessor " + link->what() + " down";
    Push(std::move(e));
  }
  // A link that failed closes once its ERROR is out (or after the grace period): the peer learns
  // why. This connection's thread waits for that, so no other thread that drops the last
  // reference (the compute thread) has to.
  if (link->failing()) {
    link->WaitClosed();
  } else {
    link->Close();
  }
}

}  // namespace kvasir::ring
