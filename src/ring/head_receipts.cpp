// HeadRole, contribution receipts (docs/PROTOCOL.md, "RECEIPT"), kept by the stage's ReceiptBook.
// After a session's CLOSE_SESSION the head (when it has StageOptions::on_receipt) sends a RECEIPT
// with its own line; every other stage appends its signed line and forwards it (MemberEntry);
// the head checks what comes back and hands it to on_receipt. A receipt is accounting: a bad one
// is dropped with a warning, never fails a session or a link. Runs on the compute thread only.
#include <chrono>
#include <exception>

#include "base/log.h"
#include "ring/head_role.h"
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

void HeadRole::SendReceipt(Session& s) {
  if (!st_.options_.on_receipt || s.rows == 0) return;
  ReceiptBook& receipts = st_.receipts_;
  if (s.client_receipt) {
    auto now = receipts.AwaitClient(s.id, s.client, *s.client_receipt, s.rows, std::move(s.commit),
                                    SteadySeconds() + kClientVouchSeconds);
    if (now) st_.SendNext(ReceiptMsg{std::move(*now)});
    return;
  }
  st_.SendNext(ReceiptMsg{receipts.Start(s.id, s.rows, std::move(s.commit))});
}

void HeadRole::ClientVouched(uint32_t session, uint64_t client, const wire::ClientCount& count) {
  // Behind the session's CLOSE, which went out when the session ended.
  if (auto payload = st_.receipts_.ClientVouched(session, client, count)) {
    st_.SendNext(ReceiptMsg{std::move(*payload)});
  }
}

void HeadRole::SendReceiptsOverdue() {
  for (auto& payload : st_.receipts_.Overdue(SteadySeconds())) {
    st_.SendNext(ReceiptMsg{std::move(payload)});
  }
}

void HeadRole::ReceiptCameBack(ReceiptMsg& m) {
  const StageOptions& options = st_.options_;
  auto r = st_.receipts_.CameBack(m.payload);
  if (!r.ok()) {
    KV_LOG_WARN("{}: {}", options.name, r.status().message());
    return;
  }
  if (!options.on_receipt) return;
  // The callback is someone else's code: whatever it throws stays here.
  try {
    options.on_receipt(std::move(m.payload));
  } catch (const std::exception& e) {
    KV_LOG_WARN("{}: receipt {}: the receipt callback failed: {}", options.name, ReceiptIdHex(*r),
                e.what());
  } catch (...) {
    KV_LOG_WARN("{}: receipt {}: the receipt callback failed", options.name, ReceiptIdHex(*r));
  }
}

}  // namespace kvasir::ring
