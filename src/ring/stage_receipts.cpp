// Stage runtime, part 5: contribution receipts (docs/PROTOCOL.md, "RECEIPT"), kept by the stage's
// ReceiptBook. After a session's CLOSE_SESSION the head (when it has StageOptions::on_receipt)
// sends a RECEIPT with its own line; every other stage appends its signed line and forwards it;
// the head checks what comes back and hands it to on_receipt. A receipt is accounting: a bad one
// is dropped with a warning, never fails a session or a link. Runs on the compute thread only.
#include <chrono>
#include <exception>

#include "base/log.h"
#include "ring/receipt.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {

namespace {

// How long a head waits for a client's count after the session's last token.
constexpr double kClientVouchSeconds = 5;

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

void StageImpl::SendReceipt(Session& s) {
  if (!options_.on_receipt || s.rows == 0) return;
  if (s.client_receipt) {
    auto now = receipts_.AwaitClient(s.id, s.client, *s.client_receipt, s.rows, std::move(s.commit),
                                     SteadySeconds() + kClientVouchSeconds);
    if (now) SendNext(ReceiptMsg{std::move(*now)});
    return;
  }
  SendNext(ReceiptMsg{receipts_.Start(s.id, s.rows, std::move(s.commit))});
}

void StageImpl::ClientVouched(uint32_t session, uint64_t client, const wire::ClientCount& count) {
  // Behind the session's CLOSE, which went out when the session ended.
  if (auto payload = receipts_.ClientVouched(session, client, count)) {
    SendNext(ReceiptMsg{std::move(*payload)});
  }
}

void StageImpl::SendReceiptsOverdue() {
  for (auto& payload : receipts_.Overdue(SteadySeconds())) SendNext(ReceiptMsg{std::move(payload)});
}

void StageImpl::SignReceipt(ReceiptMsg& m) {
  auto signed_payload = receipts_.Sign(m.payload);
  if (!signed_payload.ok()) {
    KV_LOG_WARN("{}: {}", options_.name, signed_payload.status().message());
    return;
  }
  SendNext(ReceiptMsg{std::move(*signed_payload)});
}

void StageImpl::ReceiptCameBack(ReceiptMsg& m) {
  auto r = receipts_.CameBack(m.payload);
  if (!r.ok()) {
    KV_LOG_WARN("{}: {}", options_.name, r.status().message());
    return;
  }
  if (!options_.on_receipt) return;
  // The callback is someone else's code: whatever it throws stays here.
  try {
    options_.on_receipt(std::move(m.payload));
  } catch (const std::exception& e) {
    KV_LOG_WARN("{}: receipt {}: the receipt callback failed: {}", options_.name, ReceiptIdHex(*r),
                e.what());
  } catch (...) {
    KV_LOG_WARN("{}: receipt {}: the receipt callback failed", options_.name, ReceiptIdHex(*r));
  }
}

}  // namespace kvasir::ring
