// The Store's public methods: each one transaction, run again when a concurrent transaction of
// another connection made it fail (sql.h, Db::TakeRetryable).
#include <algorithm>
#include <chrono>
#include <random>
#include <thread>

#include "market/store.h"

namespace kvasir::market {

void Store::BackOff(int attempt) {
  thread_local std::mt19937 rng(std::random_device{}());
  const int max_us = std::min(50000, 500 * attempt);
  std::this_thread::sleep_for(
      std::chrono::microseconds(std::uniform_int_distribution<int>(0, max_us)(rng)));
}

Status Store::Resume(double now) {
  return Retry([&] { return ResumeOnce(now); });
}
Status Store::AddModel(const ModelSpec& spec, bool replace, double now) {
  return Retry([&] { return AddModelOnce(spec, replace, now); });
}
Result<ClaimGrant> Store::Claim(const ClaimRequest& request, double now, double lease_s) {
  return Retry([&] { return ClaimOnce(request, now, lease_s); });
}
Result<HeartbeatReply> Store::Heartbeat(const std::string& node, int64_t claim,
                                        int64_t serving_epoch, double now, double lease_s,
                                        const ProofAnswer* proof, const RequestNonce* nonce) {
  auto reply =
      Retry([&] { return HeartbeatOnce(node, claim, serving_epoch, now, lease_s, proof, nonce); });
  // The renewal is answered: a flush that fails leaves it waiting for the next one. With a
  // background flush, its own thread writes them (EnableBackgroundFlush).
  if (!background_flush() && LeaseFlushDue(now)) (void)FlushLeases(now);
  return reply;
}
Status Store::Release(const std::string& node, int64_t claim, double now) {
  return Retry([&] { return ReleaseOnce(node, claim, now); });
}
Result<std::vector<ModelState>> Store::Map(double now) {
  return Retry([&] { return MapOnce(now); });
}
Result<std::pair<ModelState, RingState>> Store::PickRing(const std::string& model,
                                                         const std::string& source, double now) {
  return Retry([&] { return PickRingOnce(model, source, now); });
}
Status Store::RecordCheck(int64_t claim, const std::string& node, const std::string& address,
                          int64_t epoch, const Status& outcome, double now) {
  return Retry([&] { return RecordCheckOnce(claim, node, address, epoch, outcome, now); });
}
Result<bool> Store::UseNonce(const std::string& node, const std::string& nonce, double now,
                             double keep_s) {
  return Retry([&] { return UseNonceOnce(node, nonce, now, keep_s); });
}
Result<ReceiptRecord> Store::CreditReceipt(const std::string& receipt_id,
                                           const std::string& model_id,
                                           const std::vector<ReceiptShare>& shares,
                                           const std::string& payload, double now,
                                           const std::function<Status()>& verify) {
  return Retry(
      [&] { return CreditReceiptOnce(receipt_id, model_id, shares, payload, now, verify); });
}
Result<std::pair<int64_t, int64_t>> Store::Counts(double now) {
  return Retry([&] { return CountsOnce(now); });
}

}  // namespace kvasir::market
