// Stage runtime, part 3: dialed links and sending. The dial thread keeps the successor link up,
// and the optional relayed-predecessor thread keeps one predecessor connection dialed (served as
// an accepted one, stage_accept.cpp). Every link first runs the handshake (ring/handshake.h)
// within a deadline, then HELLO over the encrypted stream.
#include <fmt/format.h>

#include <algorithm>
#include <random>

#include "base/log.h"
#include "ring/secure_stream.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {
namespace {

constexpr int kMinBackoffMs = 100;
constexpr int kMaxBackoffMs = 5000;
// A link that stayed up this long resets the backoff; one that drops sooner keeps doubling it,
// so two stages fighting over one place (a second copy started by mistake) redial slowly.
constexpr auto kStableLink = std::chrono::seconds(10);
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
                                     sizeof(wire::FrameHeader) + stage_max_payload_),
      fmt::format("successor {} ({})", succ_desc_, hs->peer_desc),
      StageLinkOptions(options_, stage_max_payload_));
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
