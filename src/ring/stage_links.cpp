// Stage runtime, part 3: the links and sending. Two parts keep the links and tell their events
// to the compute loop: the predecessor side (PredecessorSide, predecessor_side.h: accepted
// connections, the predecessor and clients, a relayed predecessor) and the successor link
// (SuccessorLink, successor_link.h), kept up by the dial thread. This file gives each what it
// needs of the stage. Every link first runs the handshake (ring/handshake.h) within a deadline,
// then HELLO over the encrypted stream.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

#include "base/log.h"
#include "ring/secure_stream.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {
namespace {

// Frames queued for a neighbour (backpressure: Send waits).
constexpr size_t kStageQueueBytes = size_t{128} << 20;

}  // namespace

LinkOptions StageLinkOptions(const StageOptions& o, uint32_t max_payload) {
  LinkOptions l;
  l.timeout_ms = o.link_timeout_ms;
  l.max_queued_bytes = kStageQueueBytes;
  l.max_payload = max_payload;
  return l;
}

bool StageImpl::TrackLink(const std::shared_ptr<Link>& link) {
  return running_.load() && succ_links_.Add(link);
}

SuccessorLinkOptions StageImpl::SuccessorOptions() {
  SuccessorLinkOptions o;
  o.name = options_.name;
  o.desc = succ_desc_;
  // The successor's addresses in turn, then its window's standbys (stage_standby.cpp).
  o.dial = [this](const std::function<bool()>& cancelled) { return DialSuccessor(cancelled); };
  if (!options_.dial_next) o.log_dial_error = false;
  o.auth = stage_auth_;
  o.auth.peer_key = options_.succ_key;
  o.auth.also_accept = [this](const PublicKey& k) { return AcceptsSuccessorStandby(k); };
  // A successor that does not finish its handshake within the link timeout is as good as down.
  o.handshake_timeout_ms = std::min(options_.handshake_timeout_ms, options_.link_timeout_ms);
  o.max_payload = stage_max_payload_;
  o.link = StageLinkOptions(options_, stage_max_payload_);
  o.hello = MyHello();
  o.check_hello = [this](const wire::Hello& h) {
    KV_RETURN_IF_ERROR(CheckStageHello(h, false));
    return succ_gate_.Admit(h.generation, "successor");
  };
  o.track = [this](const std::shared_ptr<Link>& link) { return TrackLink(link); };
  o.on_change = [this](bool up, const std::string& reason) {
    if (up) succ_linked_once_.store(true);
    Event e;
    e.kind = up ? Event::Kind::kSuccUp : Event::Kind::kSuccDown;
    e.reason = reason;
    Push(std::move(e));
  };
  o.on_refused = [this] { links_refused_.fetch_add(1); };
  return o;
}

PredecessorSideOptions StageImpl::PredecessorOptions() {
  PredecessorSideOptions o;
  o.name = options_.name;
  o.handshake_timeout_ms = options_.handshake_timeout_ms;
  o.pressure_handshake_timeout_ms = options_.pressure_handshake_timeout_ms;
  o.max_pending = options_.max_pending;
  o.max_pending_per_address = options_.max_pending_per_address;
  o.pending_reserved = options_.pending_reserved;
  o.stage_auth = stage_auth_;
  o.stage_auth.peer_key = options_.pred_key;  // as the responder, the peer is the predecessor
  o.client_auth.client_secret = options_.client_secret;
  o.stage_max_payload = stage_max_payload_;
  o.client_max_payload = client_max_payload_;
  o.stage_link = StageLinkOptions(options_, stage_max_payload_);
  o.link_timeout_ms = options_.link_timeout_ms;
  o.accepts_clients = entry_->accepts_clients();
  o.clients_refusal =
      fmt::format("{} holds layers {}:{}; clients connect to the head stage (layer 0)",
                  options_.name, options_.first, options_.last);
  o.max_clients = options_.max_clients;
  o.client_buffer_bytes = options_.client_buffer_bytes;
  o.message_overhead = sizeof(Event);
  o.dial_pred = options_.dial_pred;
  o.pred_via = options_.pred_via;
  o.dial_check = options_.dial_check;
  o.hello = [this] { return MyHello(); };
  o.check_hello = [this](const wire::Hello& h, wire::ErrorCode* code) {
    Status s = CheckStageHello(h, true);
    if (!s.ok()) {
      *code = h.protocol_version != wire::kProtocolVersion         ? wire::ErrorCode::kVersion
              : std::memcmp(h.model_id, model_id_.data(), 16) != 0 ? wire::ErrorCode::kWrongModel
                                                                   : wire::ErrorCode::kNotAdjacent;
    }
    return s;
  };
  // A standby's first predecessor adopts it, which makes it the newest of its window.
  o.on_pred_admitted = [this] {
    if (options_.standby && !adopted_.load()) generation_.store(NewGeneration(generation_.load()));
  };
  o.on_pred_up = [this](const wire::Hello&, const std::string&) {
    if (options_.standby && !adopted_.exchange(true)) Push(Event{});  // MaybeStartDialing
  };
  o.on_pred_down = [this](const std::string& reason) {
    Event e;
    e.kind = Event::Kind::kPredDown;
    e.reason = reason;
    Push(std::move(e));
  };
  o.on_client_left = [this](uint64_t client) {
    Event e;
    e.kind = Event::Kind::kClientGone;
    e.client = client;
    Push(std::move(e));
  };
  o.on_message = [this](PeerMessage m) {
    Event e;
    e.kind = Event::Kind::kMessage;
    e.from_pred = m.from_pred;
    e.client = m.client;
    e.msg = std::move(m.msg);
    e.charge = std::move(m.charge);
    Push(std::move(e));
  };
  o.on_refused = [this] { links_refused_.fetch_add(1); };
  return o;
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
  if (!succ_link_->up()) return false;
  std::vector<uint8_t> frame = EncodeMessage(m);
  const size_t n = frame.size();
  if (!succ_link_->SendFrame(std::move(frame))) return false;
  bytes_out_.fetch_add(n);
  return true;
}

void StageImpl::SendToClient(uint64_t client, const Message& m) {
  pred_side_->SendToClient(client, m);
}

}  // namespace kvasir::ring
