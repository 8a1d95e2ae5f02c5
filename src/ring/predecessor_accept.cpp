// PredecessorSide, part 2: accepted connections. The accept thread admits connections through the
// handshake slots and gives each a thread that runs the handshake and HELLO within a deadline;
// then the link is served as the predecessor or as a client, whose buffers are charged to the
// client budget. Limits: docs/PROTOCOL.md, "Limits".
#include <fmt/format.h>

#include <cstring>
#include <optional>

#include "base/log.h"
#include "ring/predecessor_side.h"
#include "ring/secure_stream.h"

namespace kvasir::ring {
namespace {

using Clock = std::chrono::steady_clock;

// Frames queued for a client (it is dropped past this).
constexpr size_t kClientQueueBytes = size_t{1} << 20;
// What the kernel may buffer towards one client that does not read.
constexpr int kClientSendBuffer = 64 * 1024;
// A client's messages read and not yet handled by the owner; its reader waits beyond.
constexpr size_t kMaxClientMessages = 16;

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

// The bytes a client's message holds while it waits for the owner, besides `overhead`.
size_t HeldBytes(const Message& m, size_t overhead) {
  size_t n = overhead;
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

// The ERROR code that answers a link's failure to receive.
wire::ErrorCode CodeFor(const Status& s) {
  return s.code() == StatusCode::kTooLarge ? wire::ErrorCode::kTooLarge
                                           : wire::ErrorCode::kMalformed;
}

}  // namespace

// An accepted connection still in its handshake. The pending table may cut it (its deadline under
// pressure, or room for others) from the watchdog or the accept thread, while the connection's
// own thread may be about to destroy its stream: `mu` orders the two.
struct PredecessorSide::PendingConn {
  uint64_t id = 0;
  std::string address;
  std::mutex mu;
  net::Stream* stream = nullptr;  // while it may be cut
  std::string cut;                // why it was cut; empty if it was not
  void Cut(const std::string& why) {
    std::lock_guard<std::mutex> lock(mu);
    if (cut.empty()) cut = why;
    if (stream != nullptr) stream->Shutdown();
  }
  void Detach() {
    std::lock_guard<std::mutex> lock(mu);
    stream = nullptr;
  }
  std::string CutReason() {
    std::lock_guard<std::mutex> lock(mu);
    return cut;
  }
};

void PredecessorSide::CutPending(uint64_t id, const std::string& why) {
  auto it = pending_conns_.find(id);
  if (it == pending_conns_.end()) return;
  it->second->Cut(why);
  pending_conns_.erase(it);
}

void PredecessorSide::CutAllPending(const std::string& why) {
  for (auto& [id, conn] : pending_conns_) conn->Cut(why);
}

void PredecessorSide::Housekeeping() {
  // Never waits for threads_mu_ on the watchdog thread: the next pass comes in 50 ms.
  std::unique_lock<std::mutex> lock(threads_mu_, std::try_to_lock);
  if (!lock.owns_lock()) return;
  const bool pressure = pending_.under_pressure();
  for (uint64_t id : pending_.Expired(Clock::now())) {
    pending_.Remove(id);
    CutPending(id, pressure ? fmt::format("handshake not completed within {} ms (the stage is "
                                          "flooded with connections)",
                                          options_.pressure_handshake_timeout_ms)
                            : fmt::format("handshake not completed within {} ms",
                                          options_.handshake_timeout_ms));
  }
}

void PredecessorSide::AcceptLoop() {
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
      CutPending(id, "closed in its handshake to make room for other connections");
    }
    if (!admission.admitted) {
      if (options_.on_refused) options_.on_refused();
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

Status PredecessorSide::CheckPredecessor(const wire::Hello& h, bool via_relay,
                                         wire::ErrorCode* code) {
  *code = wire::ErrorCode::kUnauthenticated;
  if (options_.dial_pred && !via_relay) {
    return Error("{} takes its predecessor through the relay ({}), not directly", options_.name,
                 options_.pred_via);
  }
  if (options_.check_hello) KV_RETURN_IF_ERROR(options_.check_hello(h, code));
  // A process older than the predecessor that took its place (it froze, and woke up) is refused
  // while that one is linked.
  *code = wire::ErrorCode::kBusy;
  return gate_.Admit(h.generation, "predecessor", pred_up());
}

Result<std::shared_ptr<Link>> PredecessorSide::AcceptLink(std::unique_ptr<net::Stream> raw,
                                                          PendingConn* pending,
                                                          wire::Hello* peer_hello, bool* is_client,
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
  auto hs = HandshakeRespond(*raw, options_.stage_auth, options_.client_auth);
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
          "the stage's {} bytes for clients are full, and this client held {} bytes longest", limit,
          held);
      KV_LOG_WARN("{}: dropped client {}: {}", name, l->what(), why);
      l->Fail(wire::ErrorCode::kBusy, why, /*drop_queue=*/true);
    });
    raw->LimitSendBuffer(kClientSendBuffer);
    LinkOptions lo;
    lo.timeout_ms = options_.link_timeout_ms;
    lo.max_queued_bytes = kClientQueueBytes;
    lo.drop_when_full = true;
    lo.max_payload = options_.client_max_payload;
    lo.account = *account;
    link = std::make_shared<Link>(
        std::make_unique<SecureStream>(std::move(raw), hs->tx, hs->rx,
                                       sizeof(wire::FrameHeader) + options_.client_max_payload,
                                       *account),
        fmt::format("{} ({})", peer, hs->peer_desc), lo);
    *target = link;
  } else {
    link = std::make_shared<Link>(
        std::make_unique<SecureStream>(std::move(raw), hs->tx, hs->rx,
                                       sizeof(wire::FrameHeader) + options_.stage_max_payload),
        fmt::format("{} ({})", peer, hs->peer_desc), options_.stage_link);
  }
  if (!Track(link)) return Error(StatusCode::kUnavailable, "the stage is stopping");
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
    if (!options_.accepts_clients) {
      return refuse(wire::ErrorCode::kBadRequest, options_.clients_refusal);
    }
    std::lock_guard<std::mutex> lock(links_mu_);
    if (clients_.size() >= static_cast<size_t>(options_.max_clients)) {
      link->Fail(wire::ErrorCode::kBusy, fmt::format("{} serves at most {} clients at once",
                                                     options_.name, options_.max_clients));
      return Error(StatusCode::kUnavailable, "{}: too many clients", link->what());
    }
  } else {
    wire::ErrorCode code;
    if (Status s = CheckPredecessor(h, via_relay, &code); !s.ok()) {
      return refuse(code, s.message());
    }
    if (options_.on_pred_admitted) options_.on_pred_admitted();
  }
  if (Status s = link->Send(HelloMsg{options_.hello()}); !s.ok()) return s;
  guard.reset();
  return link;
}

Status PredecessorSide::ServeConnection(std::unique_ptr<net::Stream> raw,
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
      if (options_.on_refused) options_.on_refused();
      KV_LOG_DEBUG("{}: refused {}: {}", options_.name, peer, link.status().message());
    } else if (link.status().code() != StatusCode::kEndOfStream) {
      Refused(peer, link.status());
    }
    return link.status();
  }
  ServeLink(*link, h, is_client, account);
  return Status::Ok();
}

void PredecessorSide::ServeLink(std::shared_ptr<Link> link, const wire::Hello& h, bool is_client,
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
      // Told under links_mu_: the old link's messages, told under it too and only while it holds
      // the place, all come before; the new one's all after.
      if (replaced != nullptr && options_.on_pred_down) {
        options_.on_pred_down("predecessor " + replaced->what() + " replaced by " + link->what());
      }
      if (options_.on_pred_up) options_.on_pred_up(h, link->what());
    }
  }
  if (replaced != nullptr) {
    KV_LOG_WARN("{}: predecessor {} replaced by {}", options_.name, replaced->what(), link->what());
    replaced->Close();
  }
  if (is_client && options_.on_client_joined) options_.on_client_joined(client);
  if (!is_client) {
    KV_LOG_INFO("{}: link up: predecessor {} ({}, layers {}:{})", options_.name,
                std::string(h.name, strnlen(h.name, sizeof(h.name))), link->what(), h.window_first,
                h.window_last);
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
    PeerMessage m;
    m.from_pred = !is_client;
    m.client = client;
    if (!is_client) {
      std::lock_guard<std::mutex> lock(links_mu_);
      if (pred_ != link) break;  // replaced: what it still sends is not the ring's any more
      pred_bytes_in_.fetch_add(link->bytes_in() - seen_in);
      seen_in = link->bytes_in();
      m.msg = std::move(msg).value();
      if (options_.on_message) options_.on_message(std::move(m));
      continue;
    }
    // The message holds memory until the owner is done with it.
    m.charge = ByteCharge::ForMessage(account, HeldBytes(*msg, options_.message_overhead));
    if (!m.charge) {
      if (!link->closed()) {
        const std::string why = "the stage's buffers for clients are full";
        KV_LOG_WARN("{}: dropped client {}: {}", options_.name, link->what(), why);
        link->Fail(wire::ErrorCode::kBusy, why, /*drop_queue=*/true);
      }
      break;
    }
    m.msg = std::move(msg).value();
    if (options_.on_message) options_.on_message(std::move(m));
    // A client that sends faster than the stage handles its requests waits (TCP holds the rest).
    while (account->messages() >= kMaxClientMessages && !link->closed() && running_.load()) {
      account->WaitMessagesBelow(kMaxClientMessages, 100);
    }
  }
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    if (is_client) {
      clients_.erase(client);
    } else if (pred_ == link) {
      pred_.reset();
      if (running_.load()) {
        KV_LOG_WARN("{}: link down: predecessor {}", options_.name, link->what());
        if (options_.on_pred_down) {
          options_.on_pred_down("link from predecessor " + link->what() + " down");
        }
      }
    }
  }
  if (is_client && options_.on_client_left) options_.on_client_left(client);
  // A link that failed closes once its ERROR is out (or after the grace period): the peer learns
  // why. This connection's thread waits for that, so no other thread that drops the last
  // reference (the owner's) has to.
  if (link->failing()) {
    link->WaitClosed();
  } else {
    link->Close();
  }
}

}  // namespace kvasir::ring
