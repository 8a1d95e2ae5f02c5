#include "ring/client.h"

#include <fmt/format.h>
#include <sodium.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/watchdog.h"
#include "ring/receipt.h"
#include "ring/secure_stream.h"

namespace kvasir::ring {
namespace {
using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

// The kind of failure an ERROR from the ring is, for callers that branch on it.
StatusCode CodeOf(wire::ErrorCode code) {
  switch (code) {
    case wire::ErrorCode::kBadRequest:
    case wire::ErrorCode::kMalformed:
      return StatusCode::kInvalidInput;
    case wire::ErrorCode::kTooLarge:
      return StatusCode::kTooLarge;
    case wire::ErrorCode::kBusy:
      return StatusCode::kConflict;
    case wire::ErrorCode::kUnauthenticated:
      return StatusCode::kUnauthenticated;
    case wire::ErrorCode::kTimeout:
      return StatusCode::kTimeout;
    default:
      return StatusCode::kUnavailable;
  }
}

constexpr size_t kEndedKept = 64;
}  // namespace

Result<std::unique_ptr<RingClient>> RingClient::Connect(const std::string& head, int timeout_ms,
                                                        const std::string& ring_secret) {
  ClientOptions o;
  o.connect_timeout_ms = timeout_ms;
  o.ring_secret = ring_secret;
  return Connect(head, o);
}

Result<std::unique_ptr<RingClient>> RingClient::Connect(const std::string& head,
                                                        const ClientOptions& options) {
  std::string host;
  uint16_t port = 0;
  KV_RETURN_IF_ERROR(net::ParseHostPort(head, &host, &port));
  if (!options.head_key.has_value() && options.ring_secret.empty()) {
    if (!options.insecure) {
      return Error(StatusCode::kUnauthenticated,
                   "nothing to authenticate the head {} with: give --head-key KEY, "
                   "--ring-secret-file F or a manifest with node keys (--insecure only for a "
                   "head on loopback)",
                   head);
    }
    if (!net::IsLoopbackHost(host)) {
      return Error("--insecure reaches heads on loopback only, not {}", head);
    }
  }
  LinkAuth auth;
  auth.peer_key = options.head_key;
  auth.ring_secret = options.ring_secret;
  auth.insecure = options.insecure;
  auth.client_secret = options.client_secret;
  const auto deadline = Clock::now() + std::chrono::milliseconds(options.connect_timeout_ms);
  Status last = Error("timed out");
  int backoff_ms = 50;
  while (true) {
    auto stream = net::DialTcp(host, port, 2000);
    if (stream.ok()) {
      net::Stream* raw = stream->get();
      std::unique_ptr<Link> link;  // declared before the guard, so it outlives the guard
      DeadlineGuard guard(Clock::now() + std::chrono::seconds(10), [raw] { raw->Shutdown(); });
      auto hs = HandshakeInitiate(**stream, wire::Role::kClient, auth);
      if (!hs.ok()) {
        // A head that answered but failed its proof will fail it again: do not retry.
        if (hs.status().code() == StatusCode::kUnauthenticated || guard.expired()) {
          return hs.status();
        }
        last = hs.status();
      } else {
        LinkOptions lo;
        lo.timeout_ms = options.link_timeout_ms;
        link = std::make_unique<Link>(
            std::make_unique<SecureStream>(std::move(stream).value(), hs->tx, hs->rx,
                                           sizeof(wire::FrameHeader) + wire::kMaxPayload),
            fmt::format("head {} ({})", head, hs->peer_desc), lo);
        wire::Hello h{};
        h.protocol_version = wire::kProtocolVersion;
        h.role = static_cast<uint32_t>(wire::Role::kClient);
        std::snprintf(h.name, sizeof(h.name), "client");
        Status sent = link->Send(HelloMsg{h});
        link->SetReceiveDeadline(10000);
        Result<Message> reply = sent.ok() ? link->Receive() : Result<Message>(sent);
        if (!reply.ok()) {
          // The head cut the connection before its HELLO: it sheds pending connections when many
          // arrive at once (docs/PROTOCOL.md, "Limits"). That passes: try again.
          last = reply.status();
        } else {
          if (auto* e = std::get_if<ErrorMsg>(&*reply)) {
            return Error("{} refused the client: {}", head, e->message);
          }
          auto* hello = std::get_if<HelloMsg>(&*reply);
          if (hello == nullptr) {
            return Error("{} answered HELLO with {}", head, MessageName(*reply));
          }
          auto client = std::unique_ptr<RingClient>(new RingClient(std::move(link), options));
          client->head_hello_ = hello->hello;
          return client;
        }
      }
    } else {
      last = stream.status();
    }
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(backoff_ms));
    backoff_ms = std::min(backoff_ms * 2, 500);
  }
  return Error(StatusCode::kUnavailable, "cannot reach the ring's head: {}", last.message());
}

Result<GenerateResult> RingClient::Generate(const GenerateMsg& request,
                                            const std::function<void(const TokenMsg&)>& on_token) {
  return Generate(
      request,
      [&](const TokenMsg& t) {
        on_token(t);
        return true;
      },
      nullptr);
}

bool RingClient::Ended(uint32_t session) const {
  return std::find(ended_.begin(), ended_.end(), session) != ended_.end();
}

void RingClient::NoteEnded(uint32_t session) {
  ended_.push_back(session);
  if (ended_.size() > kEndedKept) ended_.pop_front();
}

std::optional<CloseMsg> RingClient::Vouch(uint32_t session, wire::FinishReason reason, int n_prompt,
                                          int received, GenerateResult* r) {
  if (options_.client_key == nullptr || !r->receipt_id) return std::nullopt;
  // The rows the ring ran for the session as the client sees them: every prompt token and every
  // token received but the last (a session that ends on its last token never feeds it back).
  const int64_t rows = static_cast<int64_t>(n_prompt) + received - 1;
  if (rows <= 0) return std::nullopt;
  std::array<uint8_t, 16> model_id;
  std::memcpy(model_id.data(), head_hello_.model_id, model_id.size());
  const ClientCount c = SignClientCount(*options_.client_key, *r->receipt_id, model_id, session,
                                        static_cast<uint64_t>(rows));
  CloseMsg close{session, static_cast<uint8_t>(reason), wire::ClientCount{}};
  std::memcpy(close.count->client_key, c.client.data(), sizeof(close.count->client_key));
  close.count->tokens = c.tokens;
  std::memcpy(close.count->signature, c.signature.data(), sizeof(close.count->signature));
  r->vouched = c.tokens;
  return close;
}

Status RingClient::EndSession(uint32_t session, std::optional<CloseMsg> close) {
  NoteEnded(session);
  const uint64_t nonce = next_nonce_++;
  if (!close) close = CloseMsg{session, static_cast<uint8_t>(wire::FinishReason::kClientClosed)};
  KV_RETURN_IF_ERROR(link_->Send(*close));
  KV_RETURN_IF_ERROR(link_->Send(PingMsg{false, {nonce, 0}}));
  // The head answers in order: its PONG comes after every token it sent before the CLOSE.
  while (true) {
    link_->SetReceiveDeadline(options_.token_timeout_ms);
    KV_ASSIGN_OR_RETURN(Message m, link_->Receive());
    if (auto* p = std::get_if<PingMsg>(&m); p != nullptr && p->pong && p->body.nonce == nonce) {
      return Status::Ok();
    }
  }
}

Result<GenerateResult> RingClient::Generate(const GenerateMsg& request,
                                            const std::function<bool(const TokenMsg&)>& on_token,
                                            const std::atomic<bool>* cancel) {
  GenerateResult r;
  const auto t0 = Clock::now();
  if (options_.client_key != nullptr) {
    GenerateMsg vouching = request;
    randombytes_buf(vouching.receipt_id.emplace().data(), 16);
    r.receipt_id = vouching.receipt_id;
    KV_RETURN_IF_ERROR(link_->Send(vouching));
  } else {
    KV_RETURN_IF_ERROR(link_->Send(request));
  }
  uint32_t session = 0;
  int received = 0;  // TOKEN messages of the session
  auto cancelled = [&] { return cancel != nullptr && cancel->load(); };
  while (true) {
    link_->SetReceiveDeadline(options_.token_timeout_ms);
    auto next = link_->Receive();
    if (!next.ok()) {
      if (next.status().code() == StatusCode::kTimeout && link_->closed()) {
        return Error(StatusCode::kTimeout, "the ring sent no token for {:.1f} s ({})",
                     options_.token_timeout_ms / 1e3, next.status().message());
      }
      return next.status().code() == StatusCode::kEndOfStream
                 ? next.status().WithCode(StatusCode::kUnavailable)
                 : next.status();
    }
    Message m = std::move(next).value();
    if (auto* e = std::get_if<ErrorMsg>(&m)) {
      if (e->session != 0 && Ended(e->session)) continue;  // a late word on an ended session
      if (e->session == 0 || session == 0 || e->session == session) {
        if (session != 0) NoteEnded(session);
        return Status::Error(fmt::format("the ring ended the request: {}", e->message),
                             CodeOf(e->code));
      }
      continue;
    }
    auto* t = std::get_if<TokenMsg>(&m);
    if (t == nullptr || Ended(t->token.session)) continue;
    if (session == 0) {
      session = t->token.session;
      r.ttft_ms = MsSince(t0);
      r.n_prompt = static_cast<int>(t->token.n_prompt);
      if (t->n_cached) r.n_cached = static_cast<int>(*t->n_cached);
    }
    if (t->token.session != session) continue;
    r.n_generated++;
    ++received;
    const bool go_on = on_token(*t);
    if (t->token.finished) {
      NoteEnded(session);
      r.reason = static_cast<wire::FinishReason>(t->token.reason);
      if (r.reason == wire::FinishReason::kStopString && t->piece.empty()) r.n_generated--;
      // The count goes with a CLOSE, and the PONG behind it says the head has taken it (the link
      // may close as soon as this returns).
      if (auto close = Vouch(session, r.reason, r.n_prompt, received, &r)) {
        KV_RETURN_IF_ERROR(EndSession(session, std::move(close)));
      }
      break;
    }
    if (!go_on || cancelled()) {
      KV_RETURN_IF_ERROR(EndSession(
          session, Vouch(session, wire::FinishReason::kClientClosed, r.n_prompt, received, &r)));
      r.reason = wire::FinishReason::kClientClosed;
      break;
    }
  }
  r.total_ms = MsSince(t0);
  return r;
}

Status RingClient::WaitReady(int timeout_ms) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    auto stats = Stats();
    if (stats.ok()) return Status::Ok();
    if (Clock::now() >= deadline) {
      return Error("the ring did not close within {} ms: {}", timeout_ms, stats.status().message());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

Result<std::vector<wire::StageStats>> RingClient::Stats() {
  KV_ASSIGN_OR_RETURN(StatsMsg m, StatsMessage());
  return std::move(m.records);
}

Result<StatsMsg> RingClient::StatsMessage() {
  KV_RETURN_IF_ERROR(link_->Send(StatsMsg{}));
  while (true) {
    link_->SetReceiveDeadline(options_.token_timeout_ms);
    KV_ASSIGN_OR_RETURN(Message m, link_->Receive());
    if (auto* s = std::get_if<StatsMsg>(&m)) return std::move(*s);
    if (auto* e = std::get_if<ErrorMsg>(&m)) return Error("stats: {}", e->message);
  }
}

}  // namespace kvasir::ring
