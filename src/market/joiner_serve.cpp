// `kvasir join`: serving a claim: the window fetched, the stage run with the neighbours and
// standbys the market names, restarted when they change (joiner_impl.h).
#include <fmt/format.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>
#include <thread>

#include "base/log.h"
#include "market/joiner_impl.h"
#include "market/standby_peers.h"
#include "node/slice_cache.h"
#include "relay/ws_stream.h"

namespace kvasir::market {

using nlohmann::json;

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
  if (auto check = beat.find("check"); check != beat.end()) {
    // A standby behind NAT: the market checks its key through this edge (docs/MARKET.md).
    KV_ASSIGN_OR_RETURN(s.dial_check,
                        RelayDialHook(*check, relay::Role::kSuccessorSide, o.ca_file));
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
  // A verified slice kept from before is reused, else the window is fetched (node/slice_cache.h).
  Status fetched = node::EnsureSlice(f);

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
      KV_LOG_INFO("join: {}; stopping the stage",
                  stage_ended ? "the stage ended" : "the neighbours changed");
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
    // Promoted (or never a standby behind NAT): no check edge is named, none is kept dialed.
    if (stage != nullptr && !beat->contains("check")) stage->StopCheckEdge();
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
    if (r.ok())
      KV_LOG_INFO("join: released claim {}", g.claim);
    else
      KV_LOG_WARN("join: could not release claim {}: {}", g.claim, r.status().message());
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    state.claim = 0;
    state.serving_epoch = -1;
  }
  // After a failed fetch, give the file server a moment before trying again.
  if (!fetched.ok()) Sleep(5 * o.poll_s);
}

}  // namespace kvasir::market
