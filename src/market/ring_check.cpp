#include "market/ring_check.h"

#include <fmt/format.h>

#include <cstdio>
#include <cstring>

#include "base/log.h"
#include "base/watchdog.h"
#include "market/market_server.h"
#include "market/signed_request.h"
#include "market/store.h"
#include "net/stream.h"
#include "relay/ws_stream.h"
#include "ring/handshake.h"
#include "ring/link.h"
#include "ring/secure_stream.h"

namespace kvasir::market {
namespace {

using Clock = std::chrono::steady_clock;

constexpr size_t kMaxRecent = 4096;
// What the head may send the checker: HELLO (96 bytes) or an ERROR with its message, framed.
// Nothing larger is read, whatever a record or frame header announces.
constexpr uint32_t kMaxCheckPayload = 2048;

// `link` receives the link made over `stream`, owned by the caller so that it outlives the
// caller's deadline guard on the raw stream.
Status CheckHead(std::unique_ptr<net::Stream> stream, const ring::HandshakeResult& hs,
                 const CheckJob& job, Clock::time_point deadline,
                 std::unique_ptr<ring::Link>* link_out) {
  ring::LinkOptions lo;
  lo.timeout_ms = 0;  // the deadline below bounds the wait
  lo.max_payload = kMaxCheckPayload;
  lo.max_queued_bytes = 4096;
  *link_out = std::make_unique<ring::Link>(
      std::make_unique<ring::SecureStream>(std::move(stream), hs.tx, hs.rx,
                                           sizeof(wire::FrameHeader) + kMaxCheckPayload),
      "head " + job.address, lo);
  ring::Link& link = **link_out;
  wire::Hello h{};
  h.protocol_version = wire::kProtocolVersion;
  h.role = static_cast<uint32_t>(wire::Role::kClient);
  std::snprintf(h.name, sizeof(h.name), "market-check");
  KV_RETURN_IF_ERROR(link.Send(ring::HelloMsg{h}));
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  link.SetReceiveDeadline(static_cast<int>(std::max<int64_t>(1, left.count())));
  KV_ASSIGN_OR_RETURN(ring::Message reply, link.Receive());
  link.Close();
  if (auto* e = std::get_if<ring::ErrorMsg>(&reply)) {
    return Error("the head refused a client: {}", e->message);
  }
  auto* hello = std::get_if<ring::HelloMsg>(&reply);
  if (hello == nullptr) return Error("the head answered HELLO with {}", ring::MessageName(reply));
  const wire::Hello& got = hello->hello;
  const std::string model_id =
      ToHex(std::string_view(reinterpret_cast<const char*>(got.model_id), sizeof(got.model_id)));
  if (model_id != job.model_id) {
    return Error("the head runs model {}, not {}", model_id, job.model_id);
  }
  if (got.window_first != 0 || got.window_last != job.last) {
    return Error("the head holds layers {}:{}, not its window 0:{}", got.window_first,
                 got.window_last, job.last);
  }
  return Status::Ok();
}

Result<std::unique_ptr<net::Stream>> Dial(const CheckJob& job, int timeout_ms,
                                          const std::string& relay_ca_file) {
  if (!job.via.empty()) {
    relay::RelayDialOptions o;
    o.ca_file = relay_ca_file;
    o.connect_timeout_ms = timeout_ms;
    o.token = job.token;
    return relay::DialRelayEdge(job.via, relay::Role::kPredecessorSide, {}, o);
  }
  std::string host;
  uint16_t port = 0;
  KV_RETURN_IF_ERROR(net::ParseHostPort(job.address, &host, &port));
  return net::DialTcp(host, port, timeout_ms);
}

}  // namespace

Status CheckHolder(const CheckJob& job, int timeout_ms, const std::string& relay_ca_file) {
  // Errors start with where it was dialed (once: a dial error may name it already).
  const std::string& where = job.via.empty() ? job.address : job.via;
  auto in = [&](Status s) {
    if (s.message().starts_with(where)) return s;
    return Error("{}: {}", where, s.message());
  };
  auto key = ring::ParsePublicKey(job.node);
  if (!key.ok()) return in(key.status());
  const auto deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
  auto stream = Dial(job, timeout_ms, relay_ca_file);
  if (!stream.ok()) return in(stream.status());
  net::Stream* raw = stream->get();
  std::unique_ptr<ring::Link> link;  // declared before the guard, so it outlives the guard
  DeadlineGuard guard(deadline, [raw] { raw->Shutdown(); });
  ring::LinkAuth auth;
  auth.peer_key = *key;
  auto hs = ring::HandshakeInitiate(**stream, wire::Role::kClient, auth);
  if (!hs.ok()) {
    if (guard.expired()) return in(Error("no handshake within {} ms", timeout_ms));
    return in(hs.status());
  }
  if (!job.head) return Status::Ok();
  Status s = CheckHead(std::move(stream).value(), *hs, job, deadline, &link);
  if (!s.ok() && guard.expired()) return in(Error("no HELLO within {} ms", timeout_ms));
  return s.ok() ? s : in(s);
}

RingChecker::RingChecker(CheckerOptions options, Sink sink)
    : o_(std::move(options)), sink_(std::move(sink)) {
  for (int i = 0; i < std::max(1, o_.threads); ++i) threads_.emplace_back([this] { Work(); });
}

RingChecker::~RingChecker() { Stop(); }

void RingChecker::Request(const CheckJob& job) {
  const Key key{job.claim, job.epoch};
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.requested;
    if (stopping_ || busy_.count(key) != 0 || queue_.size() >= o_.max_queued) {
      ++stats_.dropped;
      return;
    }
    if (auto it = recent_.find(key); it != recent_.end()) {
      const double age = std::chrono::duration<double>(Clock::now() - it->second.at).count();
      if (it->second.ok || age < o_.retry_after_s) {
        ++stats_.dropped;
        return;
      }
    }
    busy_[key] = true;
    queue_.push_back(job);
  }
  cv_.notify_one();
}

void RingChecker::Work() {
  while (true) {
    CheckJob job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
    }
    const Status outcome = CheckHolder(job, o_.timeout_ms, o_.relay_ca_file);
    if (outcome.ok()) {
      KV_LOG_INFO("market: checked claim {} ({} at {}) for epoch {}", job.claim,
                  job.node.substr(0, 8), job.via.empty() ? job.address : job.via, job.epoch);
    } else {
      KV_LOG_WARN("market: check of claim {} ({}) failed: {}", job.claim, job.node.substr(0, 8),
                  outcome.message());
    }
    if (sink_) sink_(job, outcome);
    std::lock_guard<std::mutex> lock(mu_);
    const Key key{job.claim, job.epoch};
    busy_.erase(key);
    ++(outcome.ok() ? stats_.passed : stats_.failed);
    if (recent_.size() >= kMaxRecent) recent_.erase(recent_.begin());  // the oldest claim
    recent_[key] = {outcome.ok(), Clock::now()};
  }
}

void RingChecker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

CheckerStats RingChecker::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

Result<std::unique_ptr<RingChecker>> StartStoreChecker(const std::string& db_path,
                                                       CheckerOptions options) {
  KV_ASSIGN_OR_RETURN(auto store, Store::Open(db_path));
  auto shared = std::make_shared<std::pair<std::mutex, std::unique_ptr<Store>>>();
  shared->second = std::move(store);
  return std::make_unique<RingChecker>(
      std::move(options), [shared](const CheckJob& job, const Status& outcome) {
        std::lock_guard<std::mutex> lock(shared->first);
        Status s = shared->second->RecordCheck(job.claim, job.node, job.address, job.epoch, outcome,
                                               UnixNow());
        if (!s.ok()) KV_LOG_WARN("market: cannot record a check: {}", s.message());
      });
}

}  // namespace kvasir::market
