// `kvasir join`'s inside (joiner.h), shared by its files and by nothing else: what a claim grants,
// the neighbours a stage runs with, and Joiner::Impl, the node's state between its threads.
// joiner.cpp runs the node (claims, serves, claims again), joiner_claim.cpp finds a window and
// claims it, joiner_beat.cpp keeps the claim (heartbeats, the challenge, audits, receipts), and
// joiner_serve.cpp serves a claim (fetch, the stage and its neighbours).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "market/joiner.h"
#include "market/market_client.h"
#include "net/stream.h"
#include "ring/row_store.h"
#include "ring/stage.h"

namespace kvasir::market {

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

// The claim answer `j`, checked.
Result<Grant> ParseGrant(const nlohmann::json& j);

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
  std::optional<nlohmann::json> last_beat;
  bool lost = false;
  bool beat_now = false;
  bool hb_stop = false;
  int64_t serving_epoch = -1;
  std::optional<nlohmann::json>
      proof;  // the answer to the claim's challenge, sent until it is proven
  nlohmann::json reveals =
      nlohmann::json::array();  // answers to the market's audits, for the next heartbeat

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
  Status AnswerChallenge(const std::string& slice, const nlohmann::json& beat);
  // Reveals the rows the market's audits in the heartbeat reply `beat` ask for, from the row
  // store (a reveal the store cannot give is answered as a refusal, with the reason).
  nlohmann::json AnswerAudits(const nlohmann::json& beat);
  Result<std::unique_ptr<ring::Stage>> StartStage(const Grant& g, const std::string& slice,
                                                  const nlohmann::json& beat);
  Result<std::unique_ptr<ring::Stage>> StageFromBeat(const Grant& g, const std::string& slice,
                                                     const nlohmann::json& beat);
};

}  // namespace kvasir::market
