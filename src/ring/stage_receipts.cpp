// Stage runtime, part 5: contribution receipts (docs/PROTOCOL.md, "RECEIPT"). After a session's
// CLOSE_SESSION the head (when it has StageOptions::on_receipt) sends a RECEIPT with its own
// line; every other stage appends its signed line and forwards it; the head checks what comes
// back and hands it to on_receipt. A receipt is accounting: a bad one is dropped with a warning,
// never fails a session or a link. Runs on the compute thread only.
#include <sodium.h>

#include <cstring>
#include <exception>

#include "base/log.h"
#include "ring/receipt.h"
#include "ring/stage_impl.h"

namespace kvasir::ring {

void StageImpl::SendReceipt(Session& s) {
  if (!options_.on_receipt || s.rows == 0) return;
  InitCrypto();
  Receipt r;
  randombytes_buf(r.id.data(), r.id.size());
  static_assert(sizeof(model_id_) == sizeof(r.model_id));
  std::memcpy(r.model_id.data(), model_id_.data(), r.model_id.size());
  r.session = s.id;
  const Digest root = s.commit.Root();
  AppendReceiptLine(&r, *options_.key, static_cast<uint32_t>(options_.first),
                    static_cast<uint32_t>(options_.last), s.rows, root);
  row_store_->Put(s.id, std::move(s.commit));
  row_store_->Bind(s.id, root, r.id);
  pending_receipts_.Put(r.id, s.id);
  KV_LOG_DEBUG("{}: session {}: receipt {} sent around ({} rows)", options_.name, s.id,
               ReceiptIdHex(r), s.rows);
  SendNext(ReceiptMsg{EncodeReceipt(r)});
}

void StageImpl::HandleReceipt(ReceiptMsg& m) {
  if (is_head()) {
    ReceiptCameBack(m);
  } else {
    SignAndForwardReceipt(m);
  }
}

void StageImpl::SignAndForwardReceipt(ReceiptMsg& m) {
  auto parsed = ParseReceipt(m.payload);
  if (!parsed.ok()) {
    KV_LOG_WARN("{}: RECEIPT dropped: {}", options_.name, parsed.status().message());
    return;
  }
  Receipt& r = *parsed;
  auto drop = [&](const std::string& why) {
    KV_LOG_WARN("{}: receipt {} for session {} dropped: {}", options_.name, ReceiptIdHex(r),
                r.session, why);
  };
  if (std::memcmp(r.model_id.data(), model_id_.data(), r.model_id.size()) != 0) {
    ModelId theirs;
    std::memcpy(theirs.data(), r.model_id.data(), theirs.size());
    return drop(fmt::format("it names model {}, this stage runs model {}", ModelIdHex(theirs),
                            ModelIdHex(model_id_)));
  }
  if (r.lines.size() >= wire::kMaxReceiptLines) {
    return drop(fmt::format("it already holds {} lines (the limit)", r.lines.size()));
  }
  if (r.lines.back().last != static_cast<uint32_t>(options_.first)) {
    return drop(fmt::format("its last line ends at layer {}, this stage starts at {}",
                            r.lines.back().last, options_.first));
  }
  // Nothing gets this stage's signature on top of lines that do not verify.
  if (Status s = VerifyReceipt(r); !s.ok()) return drop(s.message());
  const std::optional<ClosedRows> closed = closed_rows_.Take(r.session);
  if (!closed.has_value()) {
    return drop("the session did not close here (or closed too long ago)");
  }
  AppendReceiptLine(&r, *options_.key, static_cast<uint32_t>(options_.first),
                    static_cast<uint32_t>(options_.last), closed->rows, closed->root);
  row_store_->Bind(r.session, closed->root, r.id);
  SendNext(ReceiptMsg{EncodeReceipt(r)});
}

void StageImpl::ReceiptCameBack(ReceiptMsg& m) {
  auto parsed = ParseReceipt(m.payload);
  if (!parsed.ok()) {
    KV_LOG_WARN("{}: RECEIPT dropped: {}", options_.name, parsed.status().message());
    return;
  }
  const Receipt& r = *parsed;
  auto drop = [&](const std::string& why) {
    KV_LOG_WARN("{}: receipt {} for session {} dropped: {}", options_.name, ReceiptIdHex(r),
                r.session, why);
  };
  if (!pending_receipts_.contains(r.id)) {
    return drop("this head did not send it around, or it came back before");
  }
  if (Status s = VerifyReceipt(r); !s.ok()) return drop(s.message());
  if (r.lines.front().node != options_.key->public_key()) {
    return drop(fmt::format("its first line is node {}'s, not this head's",
                            ShortKey(r.lines.front().node)));
  }
  const auto n_layer = static_cast<uint32_t>(window_->config().n_layer);
  if (r.lines.back().last != n_layer) {
    return drop(fmt::format("its lines end at layer {}, not at the model's {}", r.lines.back().last,
                            n_layer));
  }
  if (pending_receipts_.Take(r.id) != r.session) {
    return drop("it names another session than the one it was sent for");
  }
  KV_LOG_DEBUG("{}: session {}: receipt {} complete ({} lines)", options_.name, r.session,
               ReceiptIdHex(r), r.lines.size());
  if (!options_.on_receipt) return;
  // The callback is someone else's code: whatever it throws stays here.
  try {
    options_.on_receipt(std::move(m.payload));
  } catch (const std::exception& e) {
    KV_LOG_WARN("{}: receipt {}: the receipt callback failed: {}", options_.name, ReceiptIdHex(r),
                e.what());
  } catch (...) {
    KV_LOG_WARN("{}: receipt {}: the receipt callback failed", options_.name, ReceiptIdHex(r));
  }
}

}  // namespace kvasir::ring
