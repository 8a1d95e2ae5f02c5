#include "ring/link_probe.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <thread>
#include <vector>

#include "ring/wire.h"

namespace kvasir::ring {
namespace {

static_assert(std::endian::native == std::endian::little, "the probe's structs are little-endian");

#pragma pack(push, 1)
struct ProbeHello {
  uint32_t magic;
  uint16_t version;
  uint16_t reserved;
};
static_assert(sizeof(ProbeHello) == 8);

struct ProbeHeader {
  uint32_t type;
  uint32_t reserved;
  uint64_t value;
};
static_assert(sizeof(ProbeHeader) == 16);
#pragma pack(pop)

enum ProbeType : uint32_t { kPing = 1, kPong = 2, kData = 3, kAck = 4, kBye = 5 };

const char *TypeName(uint32_t type) {
  switch (type) {
    case kPing:
      return "ping";
    case kPong:
      return "pong";
    case kData:
      return "data";
    case kAck:
      return "ack";
    case kBye:
      return "bye";
    default:
      return "unknown";
  }
}

constexpr size_t kPieceBytes = size_t{256} << 10;

using Clock = std::chrono::steady_clock;

double MsSince(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

// Shuts the stream down when an armed deadline passes, which wakes the blocked read or write; the
// failing call then reports a timeout. Arm/Disarm only take a lock (no wake-up of the watchdog
// thread while it already sleeps on a deadline), so timing a ping is not disturbed.
class Watchdog {
 public:
  explicit Watchdog(net::Stream &stream) : stream_(stream), thread_([this] { Loop(); }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_one();
    thread_.join();
  }
  void Arm(int timeout_ms) {
    std::lock_guard<std::mutex> lock(mu_);
    deadline_ = Clock::now() + std::chrono::milliseconds(timeout_ms);
    if (!sleeping_on_deadline_) cv_.notify_one();
  }
  void Disarm() {
    std::lock_guard<std::mutex> lock(mu_);
    deadline_ = Clock::time_point::max();
  }
  bool fired() const { return fired_.load(); }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_) {
      if (deadline_ == Clock::time_point::max()) {
        sleeping_on_deadline_ = false;
        cv_.wait(lock);
        continue;
      }
      sleeping_on_deadline_ = true;
      if (Clock::now() >= deadline_) {
        fired_ = true;
        deadline_ = Clock::time_point::max();
        stream_.Shutdown();
        continue;
      }
      const Clock::time_point until = deadline_;
      cv_.wait_until(lock, until);
    }
  }

  net::Stream &stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  Clock::time_point deadline_ = Clock::time_point::max();  // guarded by mu_
  bool sleeping_on_deadline_ = false;                      // guarded by mu_
  bool stop_ = false;                                      // guarded by mu_
  std::atomic<bool> fired_{false};
  std::thread thread_;  // last: starts once the members above exist
};

std::string HexBytes(std::span<const uint8_t> bytes) {
  std::string s;
  for (size_t i = 0; i < bytes.size(); ++i) s += fmt::format("{}{:02x}", i ? " " : "", bytes[i]);
  return s;
}

// A stream whose every read and write is bounded by a timeout; errors name the peer and the step.
class Channel {
 public:
  explicit Channel(net::Stream &stream) : stream_(stream), watchdog_(stream) {}
  const std::string &peer() const { return peer_; }

  // Reads exactly `buf.size()` bytes within `timeout_ms`. `*got` (when set) counts the bytes read,
  // also on failure.
  Status Read(std::span<uint8_t> buf, int timeout_ms, std::string_view what,
              size_t *got = nullptr) {
    size_t done = 0;
    watchdog_.Arm(timeout_ms);
    Status status = Status::Ok();
    while (done < buf.size()) {
      Result<size_t> n = stream_.ReadSome(buf.subspan(done));
      if (!watchdog_.fired() && n.ok() && *n > 0) {
        done += *n;
        continue;
      }
      if (watchdog_.fired()) {
        status = Error("{}: timed out after {} ms waiting for {}", peer_, timeout_ms, what);
      } else if (!n.ok()) {
        status = n.status().WithContext(fmt::format("waiting for {}", what));
      } else {
        status = Error("{}: closed the connection while this side waited for {}", peer_, what);
      }
      break;
    }
    watchdog_.Disarm();
    if (got != nullptr) *got = done;
    return status;
  }

  Status Write(std::span<const uint8_t> bytes, int timeout_ms, std::string_view what) {
    watchdog_.Arm(timeout_ms);
    Status s = stream_.WriteAll(bytes);
    watchdog_.Disarm();
    if (watchdog_.fired()) {
      return Error("{}: timed out after {} ms sending {}", peer_, timeout_ms, what);
    }
    if (!s.ok()) return s.WithContext(fmt::format("sending {}", what));
    return Status::Ok();
  }

  template <typename T>
  Status WriteStruct(const T &v, int timeout_ms, std::string_view what) {
    return Write({reinterpret_cast<const uint8_t *>(&v), sizeof(v)}, timeout_ms, what);
  }
  template <typename T>
  Status ReadStruct(T *v, int timeout_ms, std::string_view what, size_t *got = nullptr) {
    return Read({reinterpret_cast<uint8_t *>(v), sizeof(*v)}, timeout_ms, what, got);
  }

 private:
  net::Stream &stream_;
  std::string peer_ = stream_.peer();
  Watchdog watchdog_;
};

ProbeHello OurHello() { return {kLinkProbeMagic, kLinkProbeVersion, 0}; }

// Reads the peer's hello and checks its magic. `role` is what the peer should be ("server").
Status ReadHello(Channel &ch, ProbeHello *hello, int timeout_ms, std::string_view role,
                 std::string_view hint) {
  size_t got = 0;
  Status s = ch.ReadStruct(hello, timeout_ms, fmt::format("the {}'s hello{}", role, hint), &got);
  const auto *bytes = reinterpret_cast<const uint8_t *>(hello);
  const ProbeHello ours = OurHello();
  const size_t magic_got = std::min(got, sizeof(ours.magic));
  if (std::memcmp(bytes, &ours, magic_got) != 0 || (s.ok() && hello->magic != kLinkProbeMagic)) {
    std::string what =
        fmt::format("is not a kvasir link probe {} (it sent {})", role, HexBytes({bytes, got}));
    if (got >= 4 && hello->magic == wire::kMagic) {
      what = fmt::format("is a kvasir ring stage, not a link probe {}", role);
    }
    return Error("{}: {}", ch.peer(), what);
  }
  return s;
}

Status Expect(const Channel &ch, const ProbeHeader &h, uint32_t type, uint64_t value,
              std::string_view answering) {
  if (h.type != type || h.value != value) {
    return Error("{}: answered {} with {} {} (expected {} {})", ch.peer(), answering,
                 TypeName(h.type), h.value, TypeName(type), value);
  }
  return Status::Ok();
}

// Serves one session; `*past_handshake` tells whether the peer was a probe client at all.
Result<LinkProbeSessionStats> ServeSession(net::Stream &stream, int io_timeout_ms,
                                           bool *past_handshake) {
  Channel ch(stream);
  LinkProbeSessionStats stats;
  stats.peer = ch.peer();
  ProbeHello hello{};
  KV_RETURN_IF_ERROR(ReadHello(ch, &hello, io_timeout_ms, "client", ""));
  // Answer even a client of another version, so that it can say what is wrong.
  KV_RETURN_IF_ERROR(ch.WriteStruct(OurHello(), io_timeout_ms, "the hello"));
  if (hello.version != kLinkProbeVersion) {
    return Error("{}: link probe client speaks version {}, this build speaks {}", ch.peer(),
                 hello.version, kLinkProbeVersion);
  }
  *past_handshake = true;
  std::vector<uint8_t> sink(kPieceBytes);
  while (true) {
    ProbeHeader h{};
    KV_RETURN_IF_ERROR(ch.ReadStruct(&h, io_timeout_ms, "the next message"));
    switch (h.type) {
      case kPing: {
        KV_RETURN_IF_ERROR(ch.WriteStruct(ProbeHeader{kPong, 0, h.value}, io_timeout_ms, "pong"));
        ++stats.pings;
        break;
      }
      case kData: {
        if (h.value > kLinkProbeMaxBytes) {
          return Error("{}: data message of {} bytes (at most {})", ch.peer(), h.value,
                       kLinkProbeMaxBytes);
        }
        for (uint64_t left = h.value; left > 0;) {
          const size_t n = size_t(std::min<uint64_t>(left, sink.size()));
          KV_RETURN_IF_ERROR(
              ch.Read({sink.data(), n}, io_timeout_ms,
                      fmt::format("data ({} of {} bytes received)", h.value - left, h.value)));
          left -= n;
        }
        stats.bytes += h.value;
        KV_RETURN_IF_ERROR(ch.WriteStruct(ProbeHeader{kAck, 0, h.value}, io_timeout_ms, "ack"));
        break;
      }
      case kBye:
        KV_RETURN_IF_ERROR(ch.WriteStruct(ProbeHeader{kBye, 0, 0}, io_timeout_ms, "bye"));
        return stats;
      default:
        return Error("{}: unknown link probe message type {}", ch.peer(), h.type);
    }
  }
}

Status CheckOptions(const LinkProbeOptions &o) {
  if (o.pings < 1) return Error("link probe: pings must be >= 1 (got {})", o.pings);
  if (o.bytes > kLinkProbeMaxBytes) {
    return Error("link probe: {} bytes is more than the {} a server accepts", o.bytes,
                 kLinkProbeMaxBytes);
  }
  if (o.io_timeout_ms < 1 || o.connect_timeout_ms < 1) {
    return Error("link probe: timeouts must be >= 1 ms");
  }
  return Status::Ok();
}

}  // namespace

Result<LinkMeasurement> ProbeLink(net::Stream &stream, const LinkProbeOptions &o) {
  KV_RETURN_IF_ERROR(CheckOptions(o));
  Channel ch(stream);
  const int io = o.io_timeout_ms;
  KV_RETURN_IF_ERROR(ch.WriteStruct(OurHello(), io, "the hello"));
  ProbeHello hello{};
  KV_RETURN_IF_ERROR(
      ReadHello(ch, &hello, io, "server", " (is it a `kvasir profile --link-serve` port?)"));
  if (hello.version != kLinkProbeVersion) {
    return Error("{}: link probe server speaks version {}, this build speaks {}", ch.peer(),
                 hello.version, kLinkProbeVersion);
  }

  LinkMeasurement m;
  std::vector<double> rtts;
  // Ping 0 warms up (first use of the connection and of the peer's code) and is not timed.
  for (int i = 0; i <= o.pings; ++i) {
    const std::string what = fmt::format("pong {}", i);
    const auto t0 = Clock::now();
    KV_RETURN_IF_ERROR(ch.WriteStruct(ProbeHeader{kPing, 0, uint64_t(i)}, io, "a ping"));
    ProbeHeader h{};
    KV_RETURN_IF_ERROR(ch.ReadStruct(&h, io, what));
    if (i > 0) rtts.push_back(MsSince(t0));
    KV_RETURN_IF_ERROR(Expect(ch, h, kPong, uint64_t(i), fmt::format("ping {}", i)));
  }
  std::sort(rtts.begin(), rtts.end());
  m.pings = o.pings;
  m.rtt_ms = rtts[rtts.size() / 2];
  m.rtt_min_ms = rtts.front();
  m.rtt_max_ms = rtts.back();

  if (o.bytes > 0) {
    // Bytes that do not compress, in case the link does (a VPN, a tunnel).
    std::vector<uint8_t> piece(kPieceBytes);
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (auto &b : piece) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      b = uint8_t(x >> 56);
    }
    const auto t0 = Clock::now();
    KV_RETURN_IF_ERROR(ch.WriteStruct(ProbeHeader{kData, 0, o.bytes}, io, "the data header"));
    for (uint64_t left = o.bytes; left > 0;) {
      const size_t n = size_t(std::min<uint64_t>(left, piece.size()));
      KV_RETURN_IF_ERROR(
          ch.Write({piece.data(), n}, io,
                   fmt::format("data ({} of {} bytes sent)", o.bytes - left, o.bytes)));
      left -= n;
    }
    const double send_ms = MsSince(t0);
    ProbeHeader h{};
    const int ack_timeout = int(std::min<double>(io + 2 * send_ms, 24.0 * 3600 * 1000));
    KV_RETURN_IF_ERROR(ch.ReadStruct(&h, ack_timeout, "the acknowledgement of the data"));
    m.transfer_ms = MsSince(t0);
    KV_RETURN_IF_ERROR(Expect(ch, h, kAck, o.bytes, "the data"));
    m.bytes = o.bytes;
    // The acknowledgement costs one round trip on top of the transfer; never let that estimate
    // take more than half of the time measured.
    const double ms = std::max(m.transfer_ms - m.rtt_ms, m.transfer_ms / 2);
    m.bandwidth_mbps = double(o.bytes) * 8.0 / (ms * 1e3);
  }

  KV_RETURN_IF_ERROR(ch.WriteStruct(ProbeHeader{kBye, 0, 0}, io, "bye"));
  ProbeHeader h{};
  KV_RETURN_IF_ERROR(ch.ReadStruct(&h, io, "the server's bye"));
  KV_RETURN_IF_ERROR(Expect(ch, h, kBye, 0, "bye"));
  return m;
}

Result<LinkMeasurement> ProbeLink(const std::string &host, uint16_t port,
                                  const LinkProbeOptions &o) {
  KV_RETURN_IF_ERROR(CheckOptions(o));
  KV_ASSIGN_OR_RETURN(std::unique_ptr<net::Stream> stream,
                      net::DialTcp(host, port, o.connect_timeout_ms));
  return ProbeLink(*stream, o);
}

Result<LinkProbeSessionStats> ServeLinkProbeSession(net::Stream &stream, int io_timeout_ms) {
  bool past_handshake = false;
  return ServeSession(stream, io_timeout_ms, &past_handshake);
}

Result<std::unique_ptr<LinkProbeServer>> LinkProbeServer::Bind(const std::string &host,
                                                               uint16_t port, int io_timeout_ms) {
  KV_ASSIGN_OR_RETURN(net::Listener listener, net::Listener::Bind(host, port));
  return std::unique_ptr<LinkProbeServer>(new LinkProbeServer(std::move(listener), io_timeout_ms));
}

Result<LinkProbeSessionStats> LinkProbeServer::Serve(bool once, const SessionFn &on_session) {
  while (!stopped_.load()) {
    Result<std::unique_ptr<net::Stream>> conn = listener_.Accept();
    if (!conn.ok()) {
      if (stopped_.load()) break;
      return conn.status().WithContext("link probe server");
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = conn->get();
    }
    if (stopped_.load()) (*conn)->Shutdown();  // Stop() ran before current_ was set
    bool past_handshake = false;
    Result<LinkProbeSessionStats> r = ServeSession(**conn, io_timeout_ms_, &past_handshake);
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = nullptr;
    }
    if (on_session) on_session(r);
    if (once && past_handshake) return r;
  }
  return LinkProbeSessionStats{};
}

void LinkProbeServer::Stop() {
  stopped_.store(true);
  listener_.Close();
  std::lock_guard<std::mutex> lock(mu_);
  if (current_ != nullptr) current_->Shutdown();
}

}  // namespace kvasir::ring
