// Stage runtime, part 5: contribution receipts (docs/PROTOCOL.md, "RECEIPT"), kept by the stage's
// ReceiptBook. After a session's CLOSE_SESSION the head (when it has StageOptions::on_receipt)
// sends a RECEIPT with its own line; every other stage appends its signed line and forwards it;
// the head checks what comes back and hands it to on_receipt. A receipt is accounting: a bad one
// is dropped with a warning, never fails a session or a link. Runs on the compute thread only.
#include <exception>

#include "base/log.h"
#include "ring/receipt.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {

void StageImpl::SendReceipt(Session& s) {
  if (!options_.on_receipt || s.rows == 0) return;
  SendNext(ReceiptMsg{receipts_.Start(s.id, s.rows, std::move(s.commit))});
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
