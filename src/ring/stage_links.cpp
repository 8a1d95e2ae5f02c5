// Stage runtime, part 3: dialed links and sending. The dial thread keeps the successor link up
// (SuccessorLink, successor_link.h, whose events come to the compute loop), and the optional
// relayed-predecessor thread keeps one predecessor connection dialed (served as an accepted one,
// stage_accept.cpp). Every link first runs the handshake (ring/handshake.h) within a deadline, then
// HELLO over the encrypted stream.
#include <fmt/format.h>

#include <algorithm>

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

void StageImpl::Refused(const std::string& peer, const Status& why) {
  links_refused_.fetch_add(1);
  if (running_.load()) KV_LOG_WARN("{}: refused {}: {}", options_.name, peer, why.message());
}

bool StageImpl::TrackLink(const std::shared_ptr<Link>& link) {
  std::lock_guard<std::mutex> lock(threads_mu_);
  if (!running_.load()) return false;
  std::erase_if(all_links_, [](const auto& l) { return l.expired(); });
  all_links_.push_back(link);
  return true;
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
  o.auth.also_accept = [this](const PublicKey& k) { return AcceptsStandby(k, true); };
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

void StageImpl::Backoff(int* backoff_ms) {
  const int wait = JitteredBackoffMs(*backoff_ms);
  std::unique_lock<std::mutex> lock(pred_cv_mu_);
  pred_cv_.wait_for(lock, std::chrono::milliseconds(wait), [this] { return !running_.load(); });
  *backoff_ms = std::min(*backoff_ms * 2, kMaxBackoffMs);
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
      s = ServeConnection(std::move(stream).value(), /*pending=*/nullptr);
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
  if (!succ_link_->up()) return false;
  std::vector<uint8_t> frame = EncodeMessage(m);
  const size_t n = frame.size();
  if (!succ_link_->SendFrame(std::move(frame))) return false;
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
