// Stage runtime, part 2: links. The accept thread takes connections (predecessor and clients),
// the dial thread keeps the successor link up, and the optional relayed-predecessor thread keeps
// one predecessor connection dialed. Every connection first runs the handshake (ring/handshake.h)
// within a deadline, then HELLO over the encrypted stream; only then does a frame become an event
// for the compute loop.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "base/log.h"
#include "base/watchdog.h"
#include "ring/secure_stream.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {
namespace {

constexpr int kMinBackoffMs = 100;
constexpr int kMaxBackoffMs = 5000;
// A link that stayed up this long resets the backoff; one that drops sooner keeps doubling it,
// so two stages fighting over one place (a second copy started by mistake) redial slowly.
constexpr auto kStableLink = std::chrono::seconds(10);
// Frames queued for a neighbour (backpressure: Send waits) and for a client (dropped past it).
constexpr size_t kStageQueueBytes = size_t{128} << 20;
constexpr size_t kClientQueueBytes = size_t{4} << 20;

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

LinkOptions StageLinkOptions(const StageOptions& o) {
  LinkOptions l;
  l.timeout_ms = o.link_timeout_ms;
  l.max_queued_bytes = kStageQueueBytes;
  return l;
}

LinkOptions ClientLinkOptions(const StageOptions& o) {
  LinkOptions l;
  l.timeout_ms = o.link_timeout_ms;
  l.max_queued_bytes = kClientQueueBytes;
  l.drop_when_full = true;
  return l;
}

}  // namespace

void StageImpl::Refused(const std::string& peer, const Status& why) {
  links_refused_.fetch_add(1);
  if (running_.load()) KV_LOG_WARN("{}: refused {}: {}", options_.name, peer, why.message());
}

bool StageImpl::TrackLink(const std::shared_ptr<Link>& link) {
  std::lock_guard<std::mutex> lock(threads_mu_);
  if (!running_.load()) return false;
  std::erase_if(all_links_, [](const auto& l) { return l->closed(); });
  all_links_.push_back(link);
  return true;
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
    // Reap connections that have ended, so a long-lived stage does not accumulate them.
    std::erase_if(all_links_, [](const auto& l) { return l->closed(); });
    for (auto it = conn_threads_.begin(); it != conn_threads_.end();) {
      if (it->done->load()) {
        it->thread.join();
        it = conn_threads_.erase(it);
      } else {
        ++it;
      }
    }
    int& from_addr = pending_by_addr_[addr];
    if (pending_ >= options_.max_pending || from_addr >= options_.max_pending_per_address) {
      const std::string why =
          pending_ >= options_.max_pending
              ? fmt::format("too many connections in their handshake ({})", pending_)
              : fmt::format("too many connections in their handshake from {} ({})", addr,
                            from_addr);
      if (from_addr == 0) pending_by_addr_.erase(addr);
      links_refused_.fetch_add(1);
      KV_LOG_DEBUG("{}: refused {}: {}", options_.name, addr, why);
      RefuseRaw(**stream, wire::ErrorCode::kBusy, why);
      continue;
    }
    ++pending_;
    ++from_addr;
    auto done = std::make_shared<std::atomic<bool>>(false);
    auto raw = std::make_shared<std::unique_ptr<net::Stream>>(std::move(stream).value());
    // ServeConnection releases the pending slot when the handshake is over, either way.
    conn_threads_.push_back({std::thread([this, raw, done, addr] {
                               (void)ServeConnection(std::move(*raw), addr);
                               done->store(true);
                             }),
                             done});
  }
}

Result<std::shared_ptr<Link>> StageImpl::AcceptLink(std::unique_ptr<net::Stream> raw,
                                                    bool via_relay, wire::Hello* peer_hello,
                                                    bool* is_client) {
  const std::string peer = via_relay ? "via " + options_.pred_via : "peer " + raw->peer();
  std::shared_ptr<Link> link;
  net::Stream* raw_ptr = raw.get();
  std::optional<DeadlineGuard> guard;
  guard.emplace(Clock::now() + std::chrono::milliseconds(options_.handshake_timeout_ms),
                [raw_ptr] { raw_ptr->Shutdown(); });
  auto timed_out = [&](Status s) {
    if (guard->expired()) {
      return Error(StatusCode::kTimeout, "{}: handshake not completed within {} ms", peer,
                   options_.handshake_timeout_ms);
    }
    return s;
  };
  auto hs = HandshakeRespond(*raw, stage_auth_, client_auth_);
  if (!hs.ok()) return timed_out(hs.status());
  *is_client = hs->peer_role == wire::Role::kClient;
  link = std::make_shared<Link>(
      std::make_unique<SecureStream>(std::move(raw), hs->tx, hs->rx,
                                     sizeof(wire::FrameHeader) + wire::kMaxPayload),
      fmt::format("{} ({})", peer, hs->peer_desc),
      *is_client ? ClientLinkOptions(options_) : StageLinkOptions(options_));
  if (!TrackLink(link)) return Error(StatusCode::kUnavailable, "the stage is stopping");
  auto first = link->Receive();
  if (!first.ok()) {
    link->Fail(wire::ErrorCode::kMalformed, first.status().message());
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
                                  const std::string& pending_addr) {
  const bool via_relay = pending_addr.empty();
  const std::string peer = raw->peer();
  wire::Hello h{};
  bool is_client = false;
  auto link = AcceptLink(std::move(raw), via_relay, &h, &is_client);
  if (!via_relay) {
    std::lock_guard<std::mutex> lock(threads_mu_);
    --pending_;
    if (--pending_by_addr_[pending_addr] <= 0) pending_by_addr_.erase(pending_addr);
  }
  if (!link.ok()) {
    // A connection that closed before saying anything is not worth a warning (port scans,
    // `kvasir run` probing for the head).
    if (link.status().code() != StatusCode::kEndOfStream) Refused(peer, link.status());
    return link.status();
  }
  ServeLink(*link, h, is_client);
  return Status::Ok();
}

void StageImpl::ServeLink(std::shared_ptr<Link> link, const wire::Hello& h, bool is_client) {
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
        link->Fail(wire::ErrorCode::kMalformed, msg.status().message());
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
    e.msg = std::move(msg).value();
    Push(std::move(e));
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
  link->Close();
}

void StageImpl::Backoff(int* backoff_ms) {
  thread_local std::mt19937 rng{std::random_device{}()};
  // Full jitter around the current step: [0.5, 1.5) x backoff, so stages that lost a link at
  // the same moment do not redial in lockstep.
  const int wait = std::uniform_int_distribution<int>(*backoff_ms / 2, *backoff_ms * 3 / 2)(rng);
  std::unique_lock<std::mutex> lock(links_mu_);
  succ_cv_.wait_for(lock, std::chrono::milliseconds(wait), [this] { return !running_.load(); });
  *backoff_ms = std::min(*backoff_ms * 2, kMaxBackoffMs);
}

Result<std::shared_ptr<Link>> StageImpl::OpenSuccessorLink(std::unique_ptr<net::Stream> raw) {
  net::Stream* raw_ptr = raw.get();
  std::shared_ptr<Link> link;
  std::optional<DeadlineGuard> guard;
  guard.emplace(Clock::now() + std::chrono::milliseconds(options_.handshake_timeout_ms),
                [raw_ptr] { raw_ptr->Shutdown(); });
  auto timed_out = [&](Status s) {
    if (guard->expired()) {
      return Error(StatusCode::kTimeout, "successor {}: handshake not completed within {} ms",
                   succ_desc_, options_.handshake_timeout_ms);
    }
    return s.WithContext("successor " + succ_desc_);
  };
  LinkAuth auth = stage_auth_;
  auth.peer_key = options_.succ_key;
  auto hs = HandshakeInitiate(*raw, wire::Role::kStage, auth);
  if (!hs.ok()) return timed_out(hs.status());
  link = std::make_shared<Link>(
      std::make_unique<SecureStream>(std::move(raw), hs->tx, hs->rx,
                                     sizeof(wire::FrameHeader) + wire::kMaxPayload),
      fmt::format("successor {} ({})", succ_desc_, hs->peer_desc), StageLinkOptions(options_));
  if (!TrackLink(link)) return Error(StatusCode::kUnavailable, "the stage is stopping");
  Status s = link->Send(HelloMsg{MyHello()});
  auto reply = s.ok() ? link->Receive() : Result<Message>(s);
  if (!reply.ok()) return timed_out(reply.status());
  if (auto* e = std::get_if<ErrorMsg>(&*reply)) {
    return Error("successor {} refused the link: {}", succ_desc_, e->message);
  }
  auto* h = std::get_if<HelloMsg>(&*reply);
  if (h == nullptr) {
    return Error("successor {} answered HELLO with {}", succ_desc_, MessageName(*reply));
  }
  KV_RETURN_IF_ERROR(CheckStageHello(h->hello, false).WithContext("successor " + succ_desc_));
  guard.reset();
  return link;
}

void StageImpl::DialLoop() {
  int backoff_ms = kMinBackoffMs;
  bool logged_wait = false;
  std::string last_refusal;
  const std::function<bool()> cancelled = [this] { return !running_.load(); };
  while (running_.load()) {
    auto stream = options_.dial_next ? options_.dial_next(cancelled)
                                     : net::DialTcp(succ_host_, succ_port_, 2000);
    if (!stream.ok()) {
      if (!logged_wait && running_.load()) {
        // A relay's refusal says more than a TCP port that is not open yet (and names the URL).
        if (options_.dial_next) {
          KV_LOG_INFO("{}: waiting for successor: {}", options_.name, stream.status().message());
        } else {
          KV_LOG_INFO("{}: waiting for successor {}", options_.name, succ_desc_);
        }
        logged_wait = true;
      }
      Backoff(&backoff_ms);
      continue;
    }
    auto opened = OpenSuccessorLink(std::move(stream).value());
    if (!opened.ok()) {
      // Once per reason: a refusal repeats on every retry until something changes.
      if (running_.load() && opened.status().message() != last_refusal) {
        KV_LOG_WARN("{}: {}", options_.name, opened.status().message());
        last_refusal = opened.status().message();
      }
      if (opened.status().code() != StatusCode::kEndOfStream) links_refused_.fetch_add(1);
      Backoff(&backoff_ms);
      continue;
    }
    std::shared_ptr<Link> link = *opened;
    const auto up_since = Clock::now();
    logged_wait = false;
    last_refusal.clear();
    KV_LOG_INFO("{}: link up: {}", options_.name, link->what());
    {
      std::lock_guard<std::mutex> lock(links_mu_);
      succ_ = link;
    }
    Event up;
    up.kind = Event::Kind::kSuccUp;
    Push(std::move(up));
    // The successor only sends errors back; read until the link ends.
    std::string why = "closed";
    while (running_.load()) {
      auto msg = link->Receive();
      if (!msg.ok()) {
        why = msg.status().message();
        break;
      }
      if (auto* e = std::get_if<ErrorMsg>(&*msg)) {
        KV_LOG_WARN("{}: successor reports: {}", options_.name, e->message);
      }
    }
    link->Close();
    {
      std::lock_guard<std::mutex> lock(links_mu_);
      succ_.reset();
    }
    if (running_.load()) {
      KV_LOG_WARN("{}: link down: successor {}: {}", options_.name, succ_desc_, why);
      Event e;
      e.kind = Event::Kind::kSuccDown;
      e.reason = "link to successor " + succ_desc_ + " down";
      Push(std::move(e));
    }
    if (Clock::now() - up_since >= kStableLink) backoff_ms = kMinBackoffMs;
    Backoff(&backoff_ms);
  }
}

void StageImpl::PredDialLoop() {
  int backoff_ms = kMinBackoffMs;
  std::string last_failure;  // each new reason is logged once, not every retry
  const std::function<bool()> cancelled = [this] { return !running_.load(); };
  while (running_.load()) {
    auto stream = options_.dial_pred(cancelled);
    Status s = stream.status();
    const auto started = Clock::now();
    if (stream.ok()) {
      // Serve it on this thread: one relayed predecessor connection at a time.
      s = ServeConnection(std::move(stream).value(), /*pending_addr=*/"");
      if (s.ok() && Clock::now() - started >= kStableLink) {
        backoff_ms = kMinBackoffMs;
        last_failure.clear();
      }
    }
    if (!s.ok() && running_.load() && s.message() != last_failure) {
      KV_LOG_INFO("{}: waiting for predecessor: {}", options_.name, s.message());
      last_failure = s.message();
    }
    Backoff(&backoff_ms);
  }
}

bool StageImpl::SendNext(const Message& m) {
  if (Status s = CheckEncodable(m); !s.ok()) {
    KV_LOG_WARN("{}: cannot send {} on: {}", options_.name, MessageName(m), s.message());
    uint32_t session = 0;
    if (const auto* h = std::get_if<HiddenMsg>(&m)) session = h->session;
    if (const auto* o = std::get_if<OpenSessionMsg>(&m)) session = o->session;
    if (const auto* t = std::get_if<TokenMsg>(&m)) session = t->token.session;
    if (session != 0) FailSession(session, wire::ErrorCode::kTooLarge, s.message());
    return false;
  }
  std::shared_ptr<Link> succ;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    succ = succ_;
  }
  if (succ == nullptr) return false;
  std::vector<uint8_t> frame = EncodeMessage(m);
  const size_t n = frame.size();
  if (!succ->SendFrame(std::move(frame)).ok()) {
    succ->Close();
    return false;
  }
  bytes_out_.fetch_add(n);
  return true;
}

void StageImpl::SendToClient(uint64_t client, const Message& m) {
  std::shared_ptr<Link> link;
  {
    std::lock_guard<std::mutex> lock(links_mu_);
    auto it = clients_.find(client);
    if (it != clients_.end()) link = it->second;
  }
  // A client that does not read is closed by its link (bounded queue); the compute loop never
  // waits for a client.
  if (link == nullptr) return;
  if (Status s = link->Send(m); !s.ok()) {
    if (!link->closed() || s.code() == StatusCode::kTooLarge) {
      KV_LOG_WARN("{}: dropped client {}: {}", options_.name, client, s.message());
    }
    link->Close();
  }
}

}  // namespace kvasir::ring
