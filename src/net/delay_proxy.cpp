#include "net/delay_proxy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <functional>
#include <optional>
#include <vector>

#include "base/log.h"

namespace kvasir::net {
namespace {

constexpr size_t kReadBytes = 64 * 1024;

struct Chunk {
  DelayClock::time_point release;
  std::vector<uint8_t> bytes;
};

}  // namespace

// One direction of a connection: a reader that stamps each chunk with its release time and a
// writer that sends it then, within the bandwidth cap.
class Pipe {
 public:
  Pipe(Stream* from, Stream* to, const DelayProxyOptions& o, uint64_t seed,
       DelayProxy::Counters* counters)
      : from_(from),
        to_(to),
        max_queued_(o.max_queued_bytes),
        schedule_(o.shape, seed),
        counters_(counters) {
    if (o.shape.bytes_per_s > 0) {
      bucket_.emplace(o.shape.bytes_per_s, o.shape.burst_bytes, DelayClock::now());
    }
  }

  // Returns when the peer closed its side or the connection ends (`stop`).
  void ReadLoop(const std::function<void()>& end_connection) {
    std::vector<uint8_t> buf(kReadBytes);
    while (true) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return stop_ || queued_ < max_queued_; });
        if (stop_) return;
      }
      auto n = from_->ReadSome(buf);
      if (!n.ok() || *n == 0) {
        std::lock_guard<std::mutex> lock(mu_);
        eof_ = true;
        cv_.notify_all();
        // A clean close is delivered after the queued bytes; a failed socket ends everything now.
        if (!n.ok()) break;
        return;
      }
      Chunk c{schedule_.Release(DelayClock::now()),
              std::vector<uint8_t>(buf.begin(), buf.begin() + *n)};
      std::lock_guard<std::mutex> lock(mu_);
      queued_ += *n;
      uint64_t peak = counters_->peak_queued.load();
      while (queued_ > peak && !counters_->peak_queued.compare_exchange_weak(peak, queued_)) {
      }
      chunks_.push_back(std::move(c));
      cv_.notify_all();
    }
    end_connection();
  }

  // Returns when the queue is drained after the peer's close, or the connection ends; either way
  // the connection is then ended.
  void WriteLoop(const std::function<void()>& end_connection) {
    while (WriteOne()) {
    }
    end_connection();
  }

  void Stop() {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    cv_.notify_all();
  }

 private:
  // Sends the next chunk when it is due; false when there is nothing more to send.
  bool WriteOne() {
    Chunk c;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || eof_ || !chunks_.empty(); });
      if (stop_ || chunks_.empty()) return false;
      const DelayClock::time_point due = chunks_.front().release;
      if (cv_.wait_until(lock, due, [&] { return stop_; })) return false;
      c = std::move(chunks_.front());
      chunks_.pop_front();
    }
    // The chunk still counts as queued until it is sent: that is what bounds the memory.
    size_t sent = 0;
    while (sent < c.bytes.size()) {
      size_t piece = c.bytes.size() - sent;
      if (bucket_) {
        piece = bucket_->Piece(piece);
        const DelayClock::time_point ready = bucket_->ReadyAt(piece, DelayClock::now());
        std::unique_lock<std::mutex> lock(mu_);
        if (cv_.wait_until(lock, ready, [&] { return stop_; })) return false;
      }
      // Counted before the write, so a peer that got the bytes finds them counted.
      counters_->bytes += piece;
      if (!to_->WriteAll(std::span<const uint8_t>(c.bytes.data() + sent, piece)).ok()) {
        return false;
      }
      if (bucket_) bucket_->Take(piece, DelayClock::now());
      sent += piece;
    }
    std::lock_guard<std::mutex> lock(mu_);
    queued_ -= c.bytes.size();
    cv_.notify_all();
    return true;
  }

  Stream* from_;
  Stream* to_;
  const uint64_t max_queued_;
  DelaySchedule schedule_;             // the reader's
  std::optional<TokenBucket> bucket_;  // the writer's
  DelayProxy::Counters* counters_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Chunk> chunks_;
  uint64_t queued_ = 0;  // bytes read and not yet sent
  bool eof_ = false;
  bool stop_ = false;
};

class DelayProxy::Connection {
 public:
  Connection(std::unique_ptr<Stream> a, std::unique_ptr<Stream> b, const DelayProxyOptions& o,
             uint64_t id, Counters* counters)
      : a_(std::move(a)),
        b_(std::move(b)),
        forward_(a_.get(), b_.get(), o, 2 * id, counters),
        backward_(b_.get(), a_.get(), o, 2 * id + 1, counters) {
    const auto end = [this] { End(); };
    const auto done = [this] { finished_.fetch_add(1); };
    threads_.emplace_back([this, end, done] {
      forward_.ReadLoop(end);
      done();
    });
    threads_.emplace_back([this, end, done] {
      forward_.WriteLoop(end);
      done();
    });
    threads_.emplace_back([this, end, done] {
      backward_.ReadLoop(end);
      done();
    });
    threads_.emplace_back([this, end, done] {
      backward_.WriteLoop(end);
      done();
    });
  }
  ~Connection() {
    End();
    for (auto& t : threads_) t.join();
  }
  // Wakes every thread of the connection and shuts both sockets down. Safe from any thread.
  void End() {
    forward_.Stop();
    backward_.Stop();
    a_->Shutdown();
    b_->Shutdown();
  }
  bool finished() const { return finished_.load() == 4; }

 private:
  std::unique_ptr<Stream> a_, b_;  // accepted, dialled
  Pipe forward_, backward_;        // a -> b, b -> a
  std::atomic<int> finished_{0};
  std::vector<std::thread> threads_;
};

DelayProxy::DelayProxy(Listener listener) : listener_(std::move(listener)) {}

Result<std::unique_ptr<DelayProxy>> DelayProxy::Start(const DelayProxyOptions& options,
                                                      const std::string& host, uint16_t port) {
  const LinkShape& s = options.shape;
  std::string host_part;
  uint16_t target_port = 0;
  KV_RETURN_IF_ERROR(ParseHostPort(options.target, &host_part, &target_port));
  if (!(s.delay_ms >= 0 && s.delay_ms <= 60000)) {
    return Error("delay proxy: delay {} ms is not in 0..60000", s.delay_ms);
  }
  if (!(s.jitter_ms >= 0 && s.jitter_ms <= 60000)) {
    return Error("delay proxy: jitter {} ms is not in 0..60000", s.jitter_ms);
  }
  if (!(s.bytes_per_s >= 0) || !std::isfinite(s.bytes_per_s)) {
    return Error("delay proxy: bandwidth {} bytes/s must be 0 (no cap) or positive", s.bytes_per_s);
  }
  if (options.max_queued_bytes == 0) return Error("delay proxy: max_queued_bytes must be > 0");
  KV_ASSIGN_OR_RETURN(Listener l, Listener::Bind(host, port));
  std::unique_ptr<DelayProxy> p(new DelayProxy(std::move(l)));
  p->options_ = options;
  p->acceptor_ = std::thread([raw = p.get()] { raw->AcceptLoop(); });
  return p;
}

std::string DelayProxy::address() const {
  const std::string& h = listener_.host();
  return h.find(':') != std::string::npos ? fmt::format("[{}]:{}", h, port())
                                          : fmt::format("{}:{}", h, port());
}

DelayProxyStats DelayProxy::Stats() const {
  return {counters_.connections.load(), counters_.bytes.load(), counters_.peak_queued.load()};
}

void DelayProxy::AcceptLoop() {
  std::string host;
  uint16_t target_port = 0;
  (void)ParseHostPort(options_.target, &host, &target_port);  // checked by Start()
  while (true) {
    auto in = listener_.Accept();
    if (!in.ok()) return;  // closed by Stop()
    auto out = DialTcp(host, target_port, options_.dial_timeout_ms);
    if (!out.ok()) {
      KV_LOG_WARN("delay proxy {}: dropping a connection: {}", address(), out.status().message());
      continue;
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    ReapEnded();
    connections_.push_back(std::make_unique<Connection>(
        std::move(in).value(), std::move(out).value(), options_, next_id_++, &counters_));
    counters_.connections += 1;
  }
}

void DelayProxy::ReapEnded() {
  connections_.remove_if([](const std::unique_ptr<Connection>& c) { return c->finished(); });
}

void DelayProxy::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  listener_.Close();
  if (acceptor_.joinable()) acceptor_.join();
  std::lock_guard<std::mutex> lock(mu_);
  connections_.clear();  // each ends itself and joins its threads
}

DelayProxy::~DelayProxy() { Stop(); }

}  // namespace kvasir::net
