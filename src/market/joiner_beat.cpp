// `kvasir join`: keeping a claim: heartbeats, the challenge, the audits and receipts
// (joiner_impl.h).
#include <fmt/format.h>

#include <chrono>

#include "base/log.h"
#include "gguf/gguf_file.h"
#include "market/api.h"
#include "market/joiner_impl.h"
#include "market/proof.h"
#include "market/signed_request.h"

namespace kvasir::market {

using nlohmann::json;

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
    KV_LOG_WARN("join: the market's audit requests are malformed: {}", requests.status().message());
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
      if (r.status().code() != StatusCode::kUnavailable &&
          r.status().code() != StatusCode::kTimeout) {
        ++state.receipts_refused;
        KV_LOG_WARN("join: receipt refused: {}", r.status().message());
        break;
      }
      KV_LOG_WARN("join: cannot submit a receipt: {}", r.status().message());
    }
  }
}

}  // namespace kvasir::market
