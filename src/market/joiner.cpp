#include "market/joiner.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "base/human.h"
#include "base/log.h"
#include "gguf/gguf_file.h"
#include "market/api.h"
#include "market/market_client.h"
#include "market/proof.h"
#include "market/signed_request.h"
#include "market/standby_peers.h"
#include "net/stream.h"
#include "relay/ws_stream.h"

namespace kvasir::market {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxQueuedReceipts = 256;

// The neighbours a stage runs with; a change in any of them means a restart.
struct Neighbours {
  int64_t pred_claim = 0, next_claim = 0;
  std::string pred_via, next_via;
  bool operator==(const Neighbours&) const = default;
};

// What a claim grants (docs/MARKET.md, POST /v1/claims), checked.
struct Grant {
  int64_t claim = 0;
  std::string model, model_id, url;
  int ring = 0, window = 0, first = 0, last = 0, n_layer = 0, ctx = 0;
  double lease_s = 30;
  std::map<std::string, std::string> sha256;
};

Result<Grant> ParseGrant(const json& j) {
  Grant g;
  try {
    g.claim = j.at("claim").get<int64_t>();
    g.model = j.at("model").get<std::string>();
    g.model_id = j.at("model_id").get<std::string>();
    g.url = j.at("url").get<std::string>();
    g.ring = j.at("ring").get<int>();
    g.window = j.at("window").get<int>();
    g.first = j.at("first").get<int>();
    g.last = j.at("last").get<int>();
    g.n_layer = j.at("n_layer").get<int>();
    g.ctx = j.at("ctx").get<int>();
    g.lease_s = j.at("lease_s").get<double>();
    for (const auto& t : j.at("tensors")) {
      g.sha256[t.at("name").get<std::string>()] = t.at("sha256").get<std::string>();
    }
  } catch (const std::exception& e) {
    return Error("the market's claim answer is malformed: {}", e.what());
  }
  if (!ValidName(g.model) || g.first < 0 || g.last <= g.first || g.last > g.n_layer) {
    return Error("the market's claim answer names an impossible window");
  }
  return g;
}

}  // namespace

struct Joiner::Impl {
  JoinOptions o;
  std::shared_ptr<ring::RowStore> rows;  // the stages' row store (set by Create)
  std::optional<MarketClient> client;
  std::optional<net::Listener> listener;
  std::string listen_host;

  std::atomic<bool> stopping{false};
  mutable std::mutex mu;
  std::condition_variable cv;  // heartbeat replies, stop, receipts
  JoinState state;

  // Heartbeats of the current claim (guarded by mu).
  std::optional<json> last_beat;
  bool lost = false;
  bool beat_now = false;
  bool hb_stop = false;
  int64_t serving_epoch = -1;
  std::optional<json> proof;  // the answer to the claim's challenge, sent until it is proven
  json reveals = json::array();  // answers to the market's audits, for the next heartbeat

  std::deque<std::vector<uint8_t>> receipts;  // guarded by mu

  // Sleeps up to `s` seconds, or until Stop().
  void Sleep(double s) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait_for(lock, std::chrono::duration<double>(s), [&] { return stopping.load(); });
  }

  Result<Grant> FindAndClaim();
  void ServeClaim(const Grant& g);
  void HeartbeatLoop(int64_t claim, double interval_s);
  void ReceiptLoop();
  // Answers the challenge of the heartbeat reply `beat`, if it has one, from the slice (the answer
  // goes with the next heartbeat, which is sent at once).
  Status AnswerChallenge(const std::string& slice, const json& beat);
  // Reveals the rows the market's audits in the heartbeat reply `beat` ask for, from the row
  // store (a reveal the store cannot give is answered as a refusal, with the reason).
  json AnswerAudits(const json& beat);
  Result<std::unique_ptr<ring::Stage>> StartStage(const Grant& g, const std::string& slice,
                                                  const json& beat);
  Result<std::unique_ptr<ring::Stage>> StageFromBeat(const Grant& g, const std::string& slice,
                                                     const json& beat);
};

Result<Grant> Joiner::Impl::FindAndClaim() {
  std::string said;  // the last waiting message, so it is logged once per change
  auto say = [&](const std::string& what, bool warn) {
    {
      std::lock_guard<std::mutex> lock(mu);
      state.waiting = what;
    }
    if (what == said) return;
    said = what;
    if (warn) KV_LOG_WARN("join: {}", what);
    else KV_LOG_INFO("join: {}", what);
  };
  std::mt19937_64 rng(std::random_device{}());
  while (!stopping) {
    auto map = client->Get("/v1/map");
    {
      std::lock_guard<std::mutex> lock(mu);
      ++state.maps_read;
    }
    if (!map.ok()) {
      say(fmt::format("cannot read the map: {}; retrying", map.status().message()), true);
      Sleep(o.poll_s);
      continue;
    }
    struct Candidate {
      double reward;
      std::string model;
      int ring, window;
      uint64_t memory;
      size_t standbys = 0;
    };
    std::vector<Candidate> fits;
    uint64_t smallest = 0;
    int uncovered = 0;
    try {
      const bool relay = !map->value("relay", std::string()).empty();
      for (const auto& m : map->at("models")) {
        const std::string name = m.at("name").get<std::string>();
        if (!o.model.empty() && name != o.model) continue;
        for (const auto& r : m.at("rings")) {
          for (const auto& w : r.at("windows")) {
            // A standby wants a held window other than the head's; a claimer an uncovered one.
            const int window = w.at("window").get<int>();
            if ((w.at("state").get<std::string>() == "uncovered") == o.standby) continue;
            if (o.standby && window == 0) continue;
            if (o.behind_nat && (window == 0 || !relay)) continue;
            ++uncovered;
            const uint64_t memory = w.at("memory").get<uint64_t>();
            if (smallest == 0 || memory < smallest) smallest = memory;
            if (memory > o.memory_bytes) continue;
            fits.push_back({w.at("reward").get<double>(), name, r.at("ring").get<int>(), window,
                            memory, w.contains("standbys") ? w.at("standbys").size() : 0});
          }
        }
      }
    } catch (const std::exception& e) {
      say(fmt::format("the market's map is malformed: {}", e.what()), true);
      Sleep(o.poll_s);
      continue;
    }
    if (fits.empty()) {
      if (uncovered > 0) {
        say(fmt::format("no uncovered window fits --memory {} (the smallest of {} needs {}); "
                        "waiting",
                        HumanBytes(o.memory_bytes), uncovered, HumanBytes(smallest)),
            false);
      } else {
        say(o.standby      ? "no held window (but the head's) to stand by for; waiting"
            : o.behind_nat ? "no window a node behind NAT can take is uncovered (the head needs "
                             "an address); waiting"
                           : "every window is held; waiting for one to free up",
            false);
      }
      Sleep(o.poll_s);
      continue;
    }
    std::stable_sort(fits.begin(), fits.end(), [](const Candidate& a, const Candidate& b) {
      // A standby goes where it is needed most: no standby yet, then the fewest.
      if (a.standbys != b.standbys) return a.standbys < b.standbys;
      if (a.reward != b.reward) return a.reward > b.reward;
      if (a.model != b.model) return a.model < b.model;
      if (a.ring != b.ring) return a.ring < b.ring;
      return a.window < b.window;
    });
    for (const Candidate& c : fits) {
      // Nodes that start together spread out instead of all racing for the same window.
      Sleep(std::uniform_real_distribution<double>(0.0, 1.0)(rng));
      if (stopping) break;
      json body = {{"model", c.model}, {"ring", c.ring}, {"window", c.window}};
      if (o.standby) body["standby"] = true;
      if (o.behind_nat) {
        body["behind_nat"] = true;
      } else {
        body["address"] = o.advertise.empty() ? fmt::format(":{}", listener->port()) : o.advertise;
      }
      auto grant = client->PostSigned("/v1/claims", body);
      if (grant.ok()) return ParseGrant(*grant);
      if (grant.status().code() == StatusCode::kConflict) {
        KV_LOG_INFO("join: window {} of ring {} of {} went to another node; trying the next",
                    c.window, c.ring, c.model);
        continue;
      }
      say(fmt::format("claim refused: {}", grant.status().message()), true);
      break;
    }
    Sleep(o.poll_s);
  }
  return Error("stopped");
}

void Joiner::Impl::HeartbeatLoop(int64_t claim, double interval_s) {
  while (true) {
    json body;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (hb_stop) return;
      body = {{"claim", claim}, {"serving_epoch", serving_epoch}};
      if (proof) body["proof"] = *proof;
      if (!reveals.empty()) body["reveals"] = std::exchange(reveals, json::array());
      beat_now = false;
    }
    auto reply = client->PostSigned("/v1/heartbeat", body);
    json answers = reply.ok() ? AnswerAudits(*reply) : json::array();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!answers.empty()) {
        reveals = std::move(answers);
        beat_now = true;  // the reveals go at once
      }
      if (reply.ok()) {
        last_beat = *reply;
      } else if (reply.status().code() == StatusCode::kNotFound ||
                 reply.status().code() == StatusCode::kForbidden) {
        KV_LOG_WARN("join: lost claim {}: {}", claim, reply.status().message());
        lost = true;
      } else {
        KV_LOG_WARN("join: heartbeat failed (the lease runs out unless one gets through): {}",
                    reply.status().message());
      }
    }
    cv.notify_all();
    std::unique_lock<std::mutex> lock(mu);
    if (lost) return;
    cv.wait_for(lock, std::chrono::duration<double>(interval_s),
                [&] { return hb_stop || beat_now; });
  }
}

json Joiner::Impl::AnswerAudits(const json& beat) {
  json out = json::array();
  auto requests = ParseAuditRequests(beat);
  if (!requests.ok()) {
    KV_LOG_WARN("join: the market's audit requests are malformed: {}",
                requests.status().message());
    return out;
  }
  for (const AuditRequest& r : *requests) {
    auto id = FromHex(r.receipt, sizeof(ring::ReceiptId));
    Result<ring::RowReveal> reveal = Error("receipt id '{}' is not 32 hex digits", r.receipt);
    if (id.ok()) {
      ring::ReceiptId rid;
      std::memcpy(rid.data(), id->data(), rid.size());
      reveal = rows->Reveal(rid, r.positions);
    }
    KV_LOG_INFO("join: audit {} of receipt {} ({} positions): {}", r.id, r.receipt,
                r.positions.size(), reveal.ok() ? "revealed" : reveal.status().message());
    out.push_back(AuditAnswerToJson(r.id, reveal));
  }
  return out;
}

Status Joiner::Impl::AnswerChallenge(const std::string& slice, const json& beat) {
  auto it = beat.find("challenge");
  if (it == beat.end()) {
    std::lock_guard<std::mutex> lock(mu);
    proof.reset();
    return Status::Ok();
  }
  std::string nonce_hex;
  std::vector<ProofRange> ranges;
  try {
    nonce_hex = it->at("nonce").get<std::string>();
    for (const auto& r : it->at("ranges")) {
      ranges.push_back({r.at("tensor").get<std::string>(), r.at("offset").get<uint64_t>(),
                        r.at("length").get<uint32_t>()});
    }
  } catch (const std::exception& e) {
    return Error("the market's challenge is malformed: {}", e.what());
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    if (proof && proof->value("nonce", std::string()) == nonce_hex) return Status::Ok();
  }
  KV_ASSIGN_OR_RETURN(std::string nonce, FromHex(nonce_hex, kProofNonceBytes));
  KV_ASSIGN_OR_RETURN(GgufFile file, GgufFile::Open(slice));
  KV_ASSIGN_OR_RETURN(auto digests, market::AnswerChallenge(file, nonce, ranges));
  {
    std::lock_guard<std::mutex> lock(mu);
    proof = json{{"nonce", nonce_hex}, {"digests", digests}};
    beat_now = true;
  }
  cv.notify_all();
  return Status::Ok();
}

void Joiner::Impl::ReceiptLoop() {
  while (true) {
    std::vector<uint8_t> payload;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stopping.load() || !receipts.empty(); });
      if (receipts.empty()) return;
      payload = std::move(receipts.front());
      receipts.pop_front();
    }
    const std::string hex =
        ToHex(std::string_view(reinterpret_cast<const char*>(payload.data()), payload.size()));
    for (int attempt = 0; attempt < 3; ++attempt) {
      auto r = client->Post("/v1/receipts", {{"receipt", hex}});
      std::lock_guard<std::mutex> lock(mu);
      if (r.ok()) {
        ++state.receipts_submitted;
        KV_LOG_DEBUG("join: receipt credited: {}", r->dump().substr(0, 80));
        break;
      }
      if (r.status().code() != StatusCode::kUnavailable && r.status().code() != StatusCode::kTimeout) {
        ++state.receipts_refused;
        KV_LOG_WARN("join: receipt refused: {}", r.status().message());
        break;
      }
      KV_LOG_WARN("join: cannot submit a receipt: {}", r.status().message());
    }
  }
}

Result<std::unique_ptr<ring::Stage>> Joiner::Impl::StartStage(const Grant& g,
                                                              const std::string& slice,
                                                              const json& beat) {
  // The heartbeat answer comes from the network: a field of the wrong type is an error here,
  // never an exception out of the node.
  try {
    return StageFromBeat(g, slice, beat);
  } catch (const std::exception& e) {
    return Error("the market's heartbeat answer is malformed: {}", e.what());
  }
}

Result<std::unique_ptr<ring::Stage>> Joiner::Impl::StageFromBeat(const Grant& g,
                                                                 const std::string& slice,
                                                                 const json& beat) {
  const json& pred = beat.at("pred");
  const json& next = beat.at("next");
  ring::StageOptions s;
  s.model_path = slice;
  s.first = g.first;
  s.last = g.last;
  s.name = fmt::format("{}-r{}-w{}", g.model, g.ring, g.window);
  s.n_threads = o.n_threads;
  s.backend = o.backend;
  s.n_ctx = g.ctx;
  s.key = o.key;
  s.row_store = rows;
  s.test_fault_noise = o.test_fault_noise;
  s.link_timeout_ms = o.link_timeout_ms;
  s.repair_timeout_ms = o.repair_timeout_ms;
  s.standby = beat.value("standby", false);
  KV_ASSIGN_OR_RETURN(s.pred_key, ring::ParsePublicKey(pred.at("node").get<std::string>()));
  KV_ASSIGN_OR_RETURN(s.succ_key, ring::ParsePublicKey(next.at("node").get<std::string>()));
  if (next.contains("via")) {
    KV_ASSIGN_OR_RETURN(s.dial_next, RelayDialHook(next, relay::Role::kPredecessorSide, o.ca_file));
    s.next_via = next.at("via").get<std::string>();
  } else {
    s.next = next.at("address").get<std::string>();
  }
  if (pred.contains("via")) {
    KV_ASSIGN_OR_RETURN(s.dial_pred, RelayDialHook(pred, relay::Role::kSuccessorSide, o.ca_file));
    s.pred_via = pred.at("via").get<std::string>();
  }
  if (g.window == 0) {
    s.on_receipt = [this](std::vector<uint8_t> payload) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (receipts.size() >= kMaxQueuedReceipts) {
          KV_LOG_WARN("join: {} receipts wait for the market; dropping the oldest",
                      receipts.size());
          receipts.pop_front();
        }
        receipts.push_back(std::move(payload));
      }
      cv.notify_all();
    };
  }
  const int fd = ::dup(listener->fd());
  if (fd < 0) return Error("listening socket: dup: {}", std::strerror(errno));
  s.listen_fd = fd;
  if (o.configure_stage) o.configure_stage(&s);
  return ring::Stage::Create(s);
}

void Joiner::Impl::ServeClaim(const Grant& g) {
  KV_LOG_INFO("join: claimed window {} (layers {}:{}) of ring {} of {} as claim {}", g.window,
              g.first, g.last, g.ring, g.model, g.claim);
  {
    std::lock_guard<std::mutex> lock(mu);
    state.claim = g.claim;
    state.waiting.clear();
    state.model = g.model;
    state.ring = g.ring;
    state.window = g.window;
    state.first = g.first;
    state.last = g.last;
    state.serving_epoch = -1;
    last_beat.reset();
    lost = hb_stop = beat_now = false;
    serving_epoch = -1;
    proof.reset();
  }
  std::thread heartbeat([this, &g] { HeartbeatLoop(g.claim, std::min(g.lease_s / 3, o.poll_s)); });

  FetchOptions f;
  f.url = g.url;
  f.first = g.first;
  f.last = g.last;
  f.out_path = (std::filesystem::path(o.cache_dir) /
                fmt::format("{}-{}.{}-{}.gguf", g.model, g.model_id.substr(0, 12), g.first, g.last))
                   .string();
  f.http.ca_file = o.ca_file;
  f.expected_model_id = g.model_id;
  f.sha256 = g.sha256;
  Status fetched = o.ensure_slice ? o.ensure_slice(f) : [&] {
    if (VerifySlice(f.out_path, g.model_id, g.first, g.last, g.sha256).ok()) return Status::Ok();
    FetchSummary summary;
    return FetchSlice(f, &summary);
  }();

  std::unique_ptr<ring::Stage> stage;
  std::thread stage_thread;
  std::atomic<bool> stage_ended{false};
  Neighbours running;
  // The standbys given to the running stage (it dials and accepts them), and every claim among
  // them since it started: a neighbour replaced by one of those is a repair the stage made on
  // its own, not a change that needs a restart.
  NeighbourStandbys standbys_given;
  std::set<int64_t> known_next, known_pred;
  auto stop_stage = [&] {
    if (stage == nullptr) return;
    stage->Stop();
    if (stage_thread.joinable()) stage_thread.join();
    stage.reset();
  };
  if (!fetched.ok()) {
    KV_LOG_ERROR("join: cannot fetch layers {}:{} of {}: {}", g.first, g.last, g.url,
                 fetched.message());
  }
  while (fetched.ok() && !stopping) {
    std::optional<json> beat;
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait_for(lock, std::chrono::duration<double>(std::min(1.0, o.poll_s)));
      if (lost) break;
      beat = last_beat;
    }
    if (!beat) continue;
    if (Status st = AnswerChallenge(f.out_path, *beat); !st.ok()) {
      KV_LOG_ERROR("join: cannot answer the market's challenge: {}", st.message());
    }
    int64_t epoch = -1;
    bool complete = false;
    Neighbours want;
    auto standbys = StandbysFromBeat(*beat, o.ca_file);
    if (!standbys.ok()) {
      KV_LOG_WARN("join: {}", standbys.status().message());
      continue;
    }
    const bool is_standby = beat->value("standby", false);
    try {
      epoch = beat->at("epoch").get<int64_t>();
      complete = beat->at("complete").get<bool>() && beat->at("pred").is_object() &&
                 beat->at("next").is_object();
      if (complete) {
        const json& p = beat->at("pred");
        const json& n = beat->at("next");
        want = {p.at("claim").get<int64_t>(), n.at("claim").get<int64_t>(),
                p.value("via", std::string()), n.value("via", std::string())};
      }
    } catch (const std::exception& e) {
      KV_LOG_WARN("join: the market's heartbeat answer is malformed: {}", e.what());
      continue;
    }
    if (stage != nullptr && complete && !(want == running)) {
      Neighbours moved = running;
      if (want.next_claim != running.next_claim && known_next.count(want.next_claim) > 0) {
        moved.next_claim = want.next_claim;
        moved.next_via = want.next_via;
      }
      if (want.pred_claim != running.pred_claim && known_pred.count(want.pred_claim) > 0) {
        moved.pred_claim = want.pred_claim;
        moved.pred_via = want.pred_via;
      }
      if (moved == want) {
        KV_LOG_INFO(
            "join: a standby took a neighbour's window (claims {} and {} now); the "
            "stage keeps its links",
            want.pred_claim, want.next_claim);
        running = want;
      }
    }
    if (stage != nullptr && (stage_ended || (complete && !(want == running)))) {
      KV_LOG_INFO("join: {}; stopping the stage", stage_ended ? "the stage ended"
                                                              : "the neighbours changed");
      stop_stage();
      stage_ended = false;
    }
    if (stage == nullptr && complete) {
      auto created = StartStage(g, f.out_path, *beat);
      if (!created.ok()) {
        KV_LOG_ERROR("join: cannot start the stage: {}", created.status().message());
        Sleep(o.poll_s);
        continue;
      }
      stage = std::move(created).value();
      running = want;
      standbys_given = {};
      known_next.clear();
      known_pred.clear();
      stage_ended = false;
      ring::Stage* s = stage.get();
      stage_thread = std::thread([s, &stage_ended] {
        Status st = s->Run();
        if (!st.ok()) KV_LOG_ERROR("join: stage: {}", st.message());
        stage_ended = true;
      });
      KV_LOG_INFO("join: serving layers {}:{} between claims {} and {}", g.first, g.last,
                  want.pred_claim, want.next_claim);
      std::lock_guard<std::mutex> lock(mu);
      ++state.stages_started;
    }
    if (stage != nullptr && !(*standbys == standbys_given)) {
      standbys_given = *standbys;
      known_next.insert(standbys->next_claims.begin(), standbys->next_claims.end());
      known_pred.insert(standbys->pred_claims.begin(), standbys->pred_claims.end());
      stage->SetStandbys(standbys->next, standbys->pred);
    }
    // A standby serves its epoch once its stage is up and waiting to be adopted.
    const int64_t serving =
        stage != nullptr && complete && want == running && (stage->linked() || is_standby) ? epoch
                                                                                           : -1;
    bool changed = false;
    {
      std::lock_guard<std::mutex> lock(mu);
      changed = serving != serving_epoch;
      serving_epoch = serving;
      state.serving_epoch = serving;
      if (state.standby && !is_standby) {
        KV_LOG_INFO("join: the standby claim {} is the window's claim now", g.claim);
      }
      state.standby = is_standby;
      if (changed) beat_now = true;
    }
    if (changed) cv.notify_all();
  }
  stop_stage();
  bool was_lost = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    hb_stop = true;
    was_lost = lost;
  }
  cv.notify_all();
  heartbeat.join();
  if (!was_lost) {
    auto r = client->DeleteSigned(fmt::format("/v1/claims/{}", g.claim));
    if (r.ok()) KV_LOG_INFO("join: released claim {}", g.claim);
    else KV_LOG_WARN("join: could not release claim {}: {}", g.claim, r.status().message());
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    state.claim = 0;
    state.serving_epoch = -1;
  }
  // After a failed fetch, give the file server a moment before trying again.
  if (!fetched.ok()) Sleep(5 * o.poll_s);
}

Joiner::Joiner(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Joiner::~Joiner() { Stop(); }

Result<std::unique_ptr<Joiner>> Joiner::Create(JoinOptions o) {
  if (o.key == nullptr) return Error("join: a node key is required");
  if (o.memory_bytes == 0) return Error("join: --memory must be more than 0");
  if (o.cache_dir.empty()) return Error("join: a cache directory is required");
  if (o.poll_s <= 0) return Error("join: the poll interval must be positive");
  auto impl = std::make_unique<Impl>();
  net::HttpRequestOptions http;
  http.ca_file = o.ca_file;
  KV_ASSIGN_OR_RETURN(MarketClient c, MarketClient::Create(o.market_url, o.key, http));
  impl->client.emplace(std::move(c));
  if (!o.advertise.empty()) {
    std::string host;
    uint16_t port = 0;
    if (Status s = net::ParseHostPort(o.advertise, &host, &port); !s.ok()) {
      return Error("--advertise {}: {}", o.advertise, s.message());
    }
  }
  std::string host;
  uint16_t port = 0;
  KV_RETURN_IF_ERROR(net::ParseHostPort(o.behind_nat ? "127.0.0.1:0" : o.listen, &host, &port));
  KV_ASSIGN_OR_RETURN(net::Listener l, net::Listener::Bind(host, port));
  impl->listener.emplace(std::move(l));
  std::error_code ec;
  std::filesystem::create_directories(o.cache_dir, ec);
  if (ec) return Error("{}: cannot create the cache directory: {}", o.cache_dir, ec.message());
  impl->o = std::move(o);
  impl->rows = std::make_shared<ring::RowStore>(impl->o.reveal);
  return std::unique_ptr<Joiner>(new Joiner(std::move(impl)));
}

Status Joiner::Run() {
  Impl& im = *impl_;
  KV_LOG_INFO("join: node {} joins {} ({}, memory {})", ring::ShortKey(im.o.key->public_key()),
              im.client->url(),
              im.o.behind_nat ? "behind NAT: links through the relay"
                              : fmt::format("listening on port {}", im.listener->port()),
              HumanBytes(im.o.memory_bytes));
  std::thread receipts([&im] { im.ReceiptLoop(); });
  while (!im.stopping) {
    auto grant = im.FindAndClaim();
    if (!grant.ok()) {
      if (!im.stopping) {
        KV_LOG_WARN("join: {}", grant.status().message());
        im.Sleep(im.o.poll_s);
      }
      continue;
    }
    im.ServeClaim(*grant);
    if (!im.stopping) im.Sleep(std::min(1.0, im.o.poll_s));
  }
  im.cv.notify_all();
  receipts.join();
  KV_LOG_INFO("join: left the network");
  return Status::Ok();
}

void Joiner::Stop() {
  if (impl_ == nullptr) return;
  impl_->stopping = true;
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->cv.notify_all();
}

uint16_t Joiner::port() const { return impl_->listener->port(); }

JoinState Joiner::state() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->state;
}

}  // namespace kvasir::market
