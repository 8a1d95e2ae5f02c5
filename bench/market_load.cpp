// market_load: how many nodes `kvasir market` keeps, from a process of its own (the markets run in
// others). --nodes simulated nodes, each with its own node key, are spread over --threads threads
// (default: one thread per node, at most 64); each claims one window of the model --model (or of
// several: --model a --model b, their windows in that order; registered with at least that many
// windows in all) for each of its nodes, then
// heartbeats for them in turn for --seconds: as fast as the market answers, or with --rate R at R
// heartbeats a second in all (each latency then counts from when its heartbeat was due, so a
// market that falls behind shows it); with --map, a last thread reads GET /v1/map in a loop.
// Several --market URLs (processes on one database) share the nodes: node i talks to URL i mod
// their number. With --gguf (the model's file) each node answers its claim's challenge, as a real
// holder does, so the heartbeats are those of proven claims. Prints the claims per second (all
// nodes claiming at once), the signed heartbeats per second, their median and 99th-percentile
// latency, and the map's. A real node heartbeats every lease/3, at most --poll (2 s) apart.
// Each thread's nodes share that thread's kept-alive connections (one per market), as a node
// keeps its own; the connections opened in all are printed too.
// Example: market_load --market http://127.0.0.1:8080 --model load --nodes 1000 --threads 16
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gguf/gguf_file.h"
#include "market/market_client.h"
#include "market/proof.h"
#include "market/signed_request.h"

namespace {

using Clock = std::chrono::steady_clock;
using kvasir::market::MarketClient;

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))];
}

struct Node {
  std::unique_ptr<MarketClient> client;
  int64_t claim = 0;
};

// Heartbeats once for the challenge and once more with its answer, read from `file`.
bool Prove(Node* n, const kvasir::GgufFile& file) {
  auto beat = n->client->PostSigned("/v1/heartbeat", {{"claim", n->claim}, {"serving_epoch", -1}});
  if (!beat.ok()) {
    std::fprintf(stderr, "market_load: heartbeat: %s\n", beat.status().message().c_str());
    return false;
  }
  if (!beat->contains("challenge")) return true;
  const auto& ch = (*beat)["challenge"];
  std::vector<kvasir::market::ProofRange> ranges;
  for (const auto& r : ch["ranges"]) {
    ranges.push_back(
        {r["tensor"].get<std::string>(), r["offset"].get<uint64_t>(), r["length"].get<uint32_t>()});
  }
  const std::string nonce_hex = ch["nonce"].get<std::string>();
  auto nonce = kvasir::market::FromHex(nonce_hex, kvasir::market::kProofNonceBytes);
  if (!nonce.ok()) return false;
  auto digests = kvasir::market::AnswerChallenge(file, *nonce, ranges);
  if (!digests.ok()) {
    std::fprintf(stderr, "market_load: %s\n", digests.status().message().c_str());
    return false;
  }
  auto proven = n->client->PostSigned("/v1/heartbeat",
                                      {{"claim", n->claim},
                                       {"serving_epoch", -1},
                                       {"proof", {{"nonce", nonce_hex}, {"digests", *digests}}}});
  if (!proven.ok() || proven->contains("challenge")) {
    std::fprintf(stderr, "market_load: the proof was not taken: %s\n",
                 proven.ok() ? proven->dump().c_str() : proven.status().message().c_str());
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Heartbeat and map load on a kvasir market."};
  std::vector<std::string> markets;
  std::vector<std::string> models{"load"};
  std::string gguf;
  int nodes = 16, rings = 1, threads_n = 0;
  double seconds = 5, rate = 0;
  bool map_reader = true;
  app.add_option("--market", markets, "http://HOST:PORT (several: nodes are spread over them)")
      ->required();
  app.add_option("--rate", rate, "heartbeats a second in all (0: as fast as the market answers)");
  app.add_option("--gguf", gguf, "the model's file: answer the claims' challenges with it");
  app.add_option("--model", models,
                 "model to claim windows of (several: their windows in the order given)")
      ->capture_default_str();
  app.add_option("--nodes", nodes, "nodes (threads), one window each")->capture_default_str();
  app.add_option("--rings", rings, "rings of the model to spread the nodes over")
      ->capture_default_str();
  app.add_option("--seconds", seconds, "how long to heartbeat")->capture_default_str();
  app.add_option("--threads", threads_n,
                 "threads the nodes are spread over (0: one per node, "
                 "at most 64)");
  app.add_option("--map", map_reader, "read GET /v1/map in a loop meanwhile (true/false)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);

  std::optional<kvasir::GgufFile> file;
  if (!gguf.empty()) {
    auto f = kvasir::GgufFile::Open(gguf);
    if (!f.ok()) {
      std::fprintf(stderr, "market_load: %s\n", f.status().message().c_str());
      return 2;
    }
    file = std::move(f).value();
  }
  auto reader = MarketClient::Create(markets[0], nullptr);
  if (!reader.ok()) {
    std::fprintf(stderr, "market_load: %s\n", reader.status().message().c_str());
    return 2;
  }
  auto map = reader->Get("/v1/map");
  if (!map.ok()) {
    std::fprintf(stderr, "market_load: %s\n", map.status().message().c_str());
    return 1;
  }
  // Windows to claim: (model, ring, window) of the models, in order.
  struct Window {
    std::string model;
    int ring = 0, window = 0;
  };
  std::vector<Window> windows;
  for (const std::string& name : models) {
    for (const auto& m : (*map)["models"]) {
      if (m["name"] != name) continue;
      for (const auto& r : m["rings"]) {
        for (const auto& w : r["windows"])
          windows.push_back({name, r["ring"].get<int>(), w["window"].get<int>()});
      }
    }
  }
  if (static_cast<int>(windows.size()) < nodes) {
    std::fprintf(stderr, "market_load: the models have %zu windows, fewer than --nodes %d\n",
                 windows.size(), nodes);
    return 1;
  }
  const int n_threads = threads_n > 0 ? std::min(threads_n, nodes) : std::min(nodes, 64);
  std::atomic<bool> go{false}, stop{false};
  std::atomic<int> failed{0}, claimed{0}, proved{0}, connects{0};
  std::vector<std::vector<double>> beats(static_cast<size_t>(n_threads));
  std::vector<double> map_ms;
  std::vector<std::thread> threads;
  const auto claims_t0 = Clock::now();
  std::atomic<int64_t> claims_done_ns{0};
  // Each thread's kept-alive connections, one set per market, shared by its nodes (which all
  // come from one address here, as real nodes would not).
  std::vector<std::vector<MarketClient>> thread_links(static_cast<size_t>(n_threads));
  for (auto& links : thread_links) {
    for (const std::string& m : markets) {
      auto c = MarketClient::Create(m, nullptr);
      if (!c.ok()) {
        std::fprintf(stderr, "market_load: %s\n", c.status().message().c_str());
        return 2;
      }
      links.push_back(std::move(c).value());
    }
  }
  for (int t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<Node> mine;
      const std::vector<MarketClient>& links = thread_links[static_cast<size_t>(t)];
      for (int i = t; i < nodes; i += n_threads) {
        auto key = std::make_shared<const kvasir::ring::NodeKey>(kvasir::ring::NodeKey::Generate());
        auto c = links[static_cast<size_t>(i) % markets.size()].WithKey(key);
        const Window& w = windows[static_cast<size_t>(i)];
        auto grant = c.PostSigned(
            "/v1/claims",
            {{"model", w.model}, {"ring", w.ring}, {"window", w.window}, {"address", ":7000"}});
        if (!grant.ok()) {
          std::fprintf(stderr, "market_load: claim: %s\n", grant.status().message().c_str());
          ++failed;
          continue;
        }
        Node n{std::make_unique<MarketClient>(std::move(c)), (*grant)["claim"].get<int64_t>()};
        mine.push_back(std::move(n));
      }
      if (++claimed == n_threads) {
        claims_done_ns =
            std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - claims_t0).count();
      }
      // After every claim is timed: the proofs, then the heartbeats (once every node proved).
      for (size_t k = 0; file && k < mine.size(); ++k) {
        if (!Prove(&mine[k], *file)) ++failed;
      }
      if (++proved == n_threads) go = true;
      while (!go) std::this_thread::yield();
      // With --rate, this thread's share of it, each heartbeat due at its time.
      const double period = rate > 0 ? n_threads / rate : 0;
      auto due = Clock::now();
      for (size_t k = 0; !stop && !mine.empty(); k = (k + 1) % mine.size()) {
        if (period > 0) {
          due += std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(period));
          std::this_thread::sleep_until(due);
        }
        const auto t0 = period > 0 ? due : Clock::now();
        auto r = mine[k].client->PostSigned("/v1/heartbeat",
                                            {{"claim", mine[k].claim}, {"serving_epoch", -1}});
        if (!r.ok()) {
          ++failed;
          continue;
        }
        beats[static_cast<size_t>(t)].push_back(
            std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
      for (Node& n : mine) (void)n.client->DeleteSigned("/v1/claims/" + std::to_string(n.claim));
      for (const MarketClient& l : links) connects += l.connects();
    });
  }
  std::thread mapper([&] {
    while (!go) std::this_thread::yield();
    while (map_reader && !stop) {
      const auto t0 = Clock::now();
      if (reader->Get("/v1/map").ok()) {
        map_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      }
    }
  });
  while (!go) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // claims done
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  stop = true;
  for (auto& t : threads) t.join();
  mapper.join();
  std::vector<double> all;
  for (const auto& b : beats) all.insert(all.end(), b.begin(), b.end());
  std::printf("%-22s %10s %10s %10s\n", "request", "per second", "p50 ms", "p99 ms");
  std::printf("%-22s %10.0f %10s %10s\n", "POST /v1/claims", nodes / (claims_done_ns / 1e9), "-",
              "-");
  std::printf("%-22s %10.0f %10.2f %10.2f\n", "POST /v1/heartbeat", all.size() / seconds,
              Percentile(all, 0.5), Percentile(all, 0.99));
  std::printf("%-22s %10.0f %10.2f %10.2f\n", "GET /v1/map", map_ms.size() / seconds,
              Percentile(map_ms, 0.5), Percentile(map_ms, 0.99));
  std::printf("nodes %d on %d threads, %zu market(s), failed requests %d, connections %d\n", nodes,
              n_threads, markets.size(), failed.load(), connects.load() + reader->connects());
  return failed > 0 ? 1 : 0;
}
