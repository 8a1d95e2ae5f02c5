// relay_load: load and latency for `kvasir relay`, from a process of its own (the relay runs in
// another). Each edge is one predecessor-side and one successor-side connection dialed with the
// stages' own client (relay::DialRelayEdge).
//   latency:    one edge; the predecessor sends a message of --bytes, the successor echoes it; the
//               round trip crosses the relay twice. --direct does the same over plain loopback TCP,
//               the baseline the relay's added latency is measured against.
//   throughput: --edges edges; every predecessor streams messages of --bytes to its successor for
//               --seconds; aggregate and per-edge rates.
// Example: relay_load --relay ws://127.0.0.1:8443 --secret-file s --mode latency --seconds 5
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "net/stream.h"
#include "relay/edge_token.h"
#include "relay/ws_stream.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvasir::Result;
using kvasir::Status;
using kvasir::net::Stream;

Status ReadExactly(Stream& s, uint8_t* p, size_t n) {
  while (n > 0) {
    auto got = s.ReadSome({p, n});
    if (!got.ok()) return got.status();
    if (*got == 0) return kvasir::Error("closed");
    p += *got;
    n -= *got;
  }
  return Status::Ok();
}

struct Pair {
  std::unique_ptr<Stream> pred, succ;
};

Result<Pair> Open(const std::string& relay, const std::string& id, const std::string& secret) {
  std::span<const uint8_t> key(reinterpret_cast<const uint8_t*>(secret.data()), secret.size());
  kvasir::relay::RelayDialOptions o;
  o.connect_timeout_ms = 20000;
  Pair p;
  // Both dials block until paired only on the relay side; dial them from two threads anyway.
  Result<std::unique_ptr<Stream>> succ = kvasir::Error("unset");
  std::thread t([&] {
    succ = kvasir::relay::DialRelayEdge(relay + "/edge/" + id, kvasir::relay::Role::kSuccessorSide,
                                        key, o);
  });
  auto pred = kvasir::relay::DialRelayEdge(relay + "/edge/" + id,
                                           kvasir::relay::Role::kPredecessorSide, key, o);
  t.join();
  if (!pred.ok()) return pred.status();
  if (!succ.ok()) return succ.status();
  p.pred = std::move(pred).value();
  p.succ = std::move(succ).value();
  return p;
}

Result<Pair> OpenDirect() {
  auto l = kvasir::net::Listener::Bind("127.0.0.1", 0);
  if (!l.ok()) return l.status();
  Result<std::unique_ptr<Stream>> succ = kvasir::Error("unset");
  std::thread t([&] { succ = l->Accept(); });
  auto pred = kvasir::net::DialTcp("127.0.0.1", l->port(), 5000);
  t.join();
  if (!pred.ok()) return pred.status();
  if (!succ.ok()) return succ.status();
  return Pair{std::move(pred).value(), std::move(succ).value()};
}

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

int Latency(Pair& p, size_t bytes, double seconds, const char* what) {
  std::atomic<bool> stop{false};
  std::thread echo([&] {
    std::vector<uint8_t> buf(bytes);
    while (!stop.load()) {
      if (!ReadExactly(*p.succ, buf.data(), bytes).ok()) return;
      if (!p.succ->WriteAll(buf).ok()) return;
    }
  });
  std::vector<uint8_t> out(bytes, 7), in(bytes);
  std::vector<double> us;
  const auto end = Clock::now() + std::chrono::duration<double>(seconds);
  for (int i = 0; Clock::now() < end; ++i) {
    const auto t0 = Clock::now();
    if (Status s = p.pred->WriteAll(out); !s.ok()) {
      std::fprintf(stderr, "relay_load: write: %s\n", s.message().c_str());
      return 1;
    }
    if (Status s = ReadExactly(*p.pred, in.data(), bytes); !s.ok()) {
      std::fprintf(stderr, "relay_load: read: %s\n", s.message().c_str());
      return 1;
    }
    if (i >= 20) us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  stop = true;
  p.pred->Shutdown();
  p.succ->Shutdown();
  echo.join();
  std::printf("%-8s round trips %zu  bytes %zu  p50 %.1f us  p90 %.1f us  p99 %.1f us\n", what,
              us.size(), bytes, Pct(us, 0.5), Pct(us, 0.9), Pct(us, 0.99));
  return 0;
}

int Throughput(const std::string& relay, const std::string& secret, int edges, size_t bytes,
               double seconds) {
  std::vector<Pair> pairs;
  for (int e = 0; e < edges; ++e) {
    auto p = Open(relay, "load-" + std::to_string(::getpid()) + "-" + std::to_string(e), secret);
    if (!p.ok()) {
      std::fprintf(stderr, "relay_load: edge %d: %s\n", e, p.status().message().c_str());
      return 1;
    }
    pairs.push_back(std::move(p).value());
  }
  std::atomic<bool> stop{false};
  std::vector<std::atomic<uint64_t>> got(edges);
  std::vector<std::thread> threads;
  for (int e = 0; e < edges; ++e) {
    threads.emplace_back([&, e] {
      std::vector<uint8_t> buf(bytes, 1);
      while (!stop.load() && pairs[e].pred->WriteAll(buf).ok()) {
      }
    });
    threads.emplace_back([&, e] {
      std::vector<uint8_t> buf(1 << 16);
      while (true) {
        auto n = pairs[e].succ->ReadSome(buf);
        if (!n.ok() || *n == 0) return;
        got[e] += *n;
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds * 0.2));  // warm up
  std::vector<uint64_t> start(edges);
  for (int e = 0; e < edges; ++e) start[e] = got[e].load();
  const auto t0 = Clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<double> rates;
  double total = 0;
  for (int e = 0; e < edges; ++e) {
    const double r = static_cast<double>(got[e].load() - start[e]) / dt;
    rates.push_back(r);
    total += r;
  }
  stop = true;
  for (auto& p : pairs) {
    p.pred->Shutdown();
    p.succ->Shutdown();
  }
  for (auto& t : threads) t.join();
  std::printf("edges %d  message %zu B  %.1f s: total %.1f MiB/s (%.0f messages/s); per edge min %.2f "
              "median %.2f max %.2f MiB/s\n",
              edges, bytes, dt, total / (1 << 20), total / static_cast<double>(bytes),
              Pct(rates, 0) / (1 << 20), Pct(rates, 0.5) / (1 << 20), Pct(rates, 0.999) / (1 << 20));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Latency and load for kvasir relay", "relay_load"};
  std::string relay, secret_file, mode = "latency";
  int edges = 64;
  size_t bytes = 8240;  // one f32 hidden state of a 2048-wide model plus its frame header
  double seconds = 5;
  bool direct = false;
  app.add_option("--relay", relay, "ws://HOST:PORT or wss://HOST:PORT of the relay");
  app.add_option("--secret-file", secret_file, "ring secret");
  app.add_option("--mode", mode, "latency or throughput")->capture_default_str();
  app.add_option("--edges", edges, "edges (throughput)")->capture_default_str();
  app.add_option("--bytes", bytes, "message size")->capture_default_str();
  app.add_option("--seconds", seconds, "duration")->capture_default_str();
  app.add_flag("--direct", direct, "latency over plain loopback TCP instead (the baseline)");
  CLI11_PARSE(app, argc, argv);
  std::string secret;
  if (!secret_file.empty()) {
    auto s = kvasir::relay::ReadSecretFile(secret_file);
    if (!s.ok()) {
      std::fprintf(stderr, "relay_load: %s\n", s.status().message().c_str());
      return 1;
    }
    secret = *s;
  }
  if (mode == "latency") {
    auto p = direct ? OpenDirect() : Open(relay, "lat-" + std::to_string(::getpid()), secret);
    if (!p.ok()) {
      std::fprintf(stderr, "relay_load: %s\n", p.status().message().c_str());
      return 1;
    }
    return Latency(*p, bytes, seconds, direct ? "direct" : "relayed");
  }
  if (mode == "throughput") return Throughput(relay, secret, edges, bytes, seconds);
  std::fprintf(stderr, "relay_load: --mode must be latency or throughput\n");
  return 2;
}
