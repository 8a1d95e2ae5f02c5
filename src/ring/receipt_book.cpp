// ReceiptBook: the receipt lines a stage starts, signs and checks (receipt_book.h).
#include "ring/receipt_book.h"

#include <sodium.h>

#include <algorithm>
#include <cstring>

#include "base/check.h"
#include "base/log.h"
#include "model/model_id.h"
#include "ring/receipt.h"

namespace kvasir::ring {
namespace {

Status Dropped(const Receipt& r, const std::string& why) {
  return Status::Error(
      fmt::format("receipt {} for session {} dropped: {}", ReceiptIdHex(r), r.session, why));
}

Result<Receipt> Parse(std::span<const uint8_t> payload) {
  auto parsed = ParseReceipt(payload);
  if (!parsed.ok())
    return Status::Error(fmt::format("RECEIPT dropped: {}", parsed.status().message()));
  return parsed;
}

}  // namespace

ReceiptBook::ReceiptBook(ReceiptBookOptions options) : options_(std::move(options)) {
  KV_CHECK(options_.key != nullptr, "ReceiptBook without a node key");
  KV_CHECK(options_.row_store != nullptr, "ReceiptBook without a row store");
}

std::vector<uint8_t> ReceiptBook::Start(uint32_t session, uint64_t rows, SessionRows commit) {
  InitCrypto();
  std::array<uint8_t, 16> id;
  randombytes_buf(id.data(), id.size());
  return StartWith(session, rows, std::move(commit), id, std::nullopt);
}

std::optional<std::vector<uint8_t>> ReceiptBook::AwaitClient(uint32_t session, uint64_t client,
                                                             const std::array<uint8_t, 16>& id,
                                                             uint64_t rows, SessionRows commit,
                                                             double deadline) {
  std::optional<std::vector<uint8_t>> now;
  if (awaiting_.size() >= kMaxAwaiting) {
    AwaitingClient& a = awaiting_.front();
    now = StartWith(a.session, a.rows, std::move(a.commit), a.id, std::nullopt);
    awaiting_.pop_front();
  }
  awaiting_.push_back({session, client, id, rows, std::move(commit), deadline});
  return now;
}

std::optional<std::vector<uint8_t>> ReceiptBook::ClientVouched(uint32_t session, uint64_t client,
                                                               const wire::ClientCount& count) {
  auto it = std::find_if(awaiting_.begin(), awaiting_.end(), [&](const AwaitingClient& a) {
    return a.session == session && a.client == client;
  });
  if (it == awaiting_.end()) return std::nullopt;
  Receipt probe;
  probe.id = it->id;
  probe.model_id = options_.model_id;
  probe.session = session;
  ClientCount& c = probe.client.emplace();
  std::memcpy(c.client.data(), count.client_key, c.client.size());
  c.tokens = count.tokens;
  std::memcpy(c.signature.data(), count.signature, c.signature.size());
  std::optional<ClientCount> vouched;
  if (Status v = VerifyClientCount(probe); v.ok() && c.tokens > 0) {
    vouched = c;
  } else {
    KV_LOG_WARN("{}: session {}: the client's count is dropped: {}", options_.name, session,
                v.ok() ? "it is 0" : v.message());
  }
  auto payload = StartWith(session, it->rows, std::move(it->commit), it->id, vouched);
  awaiting_.erase(it);
  return payload;
}

std::vector<std::vector<uint8_t>> ReceiptBook::Overdue(double now) {
  std::vector<std::vector<uint8_t>> out;
  while (!awaiting_.empty() && awaiting_.front().deadline <= now) {
    AwaitingClient& a = awaiting_.front();
    out.push_back(StartWith(a.session, a.rows, std::move(a.commit), a.id, std::nullopt));
    awaiting_.pop_front();
  }
  return out;
}

std::vector<uint8_t> ReceiptBook::StartWith(uint32_t session, uint64_t rows, SessionRows commit,
                                            const std::array<uint8_t, 16>& id,
                                            std::optional<ClientCount> count) {
  Receipt r;
  r.id = id;
  r.client = count;
  r.model_id = options_.model_id;
  r.session = session;
  const Digest root = commit.Root();
  AppendReceiptLine(&r, *options_.key, options_.first, options_.last, rows, root);
  options_.row_store->Put(session, std::move(commit));
  options_.row_store->Bind(session, root, r.id);
  in_flight_.Put(r.id, session);
  KV_LOG_DEBUG("{}: session {}: receipt {} sent around ({} rows)", options_.name, session,
               ReceiptIdHex(r), rows);
  return EncodeReceipt(r);
}

void ReceiptBook::Closed(uint32_t session, uint64_t rows, SessionRows commit) {
  closed_.Put(session, {rows, commit.Root()});  // for the receipt that follows the CLOSE
  options_.row_store->Put(session, std::move(commit));
}

Result<std::vector<uint8_t>> ReceiptBook::Sign(std::span<const uint8_t> payload) {
  auto parsed = Parse(payload);
  if (!parsed.ok()) return parsed.status();
  Receipt& r = *parsed;
  if (r.model_id != options_.model_id) {
    return Dropped(r, fmt::format("it names model {}, this stage runs model {}",
                                  ModelIdHex(r.model_id), ModelIdHex(options_.model_id)));
  }
  if (r.lines.size() >= wire::kMaxReceiptLines) {
    return Dropped(r, fmt::format("it already holds {} lines (the limit)", r.lines.size()));
  }
  if (r.lines.back().last != options_.first) {
    return Dropped(r, fmt::format("its last line ends at layer {}, this stage starts at {}",
                                  r.lines.back().last, options_.first));
  }
  // Nothing gets this stage's signature on top of lines that do not verify.
  if (Status s = VerifyReceipt(r); !s.ok()) return Dropped(r, s.message());
  const std::optional<ClosedRows> closed = closed_.Take(r.session);
  if (!closed.has_value()) {
    return Dropped(r, "the session did not close here (or closed too long ago)");
  }
  AppendReceiptLine(&r, *options_.key, options_.first, options_.last, closed->rows, closed->root);
  options_.row_store->Bind(r.session, closed->root, r.id);
  return EncodeReceipt(r);
}

Result<Receipt> ReceiptBook::CameBack(std::span<const uint8_t> payload) {
  auto parsed = Parse(payload);
  if (!parsed.ok()) return parsed.status();
  const Receipt& r = *parsed;
  if (!in_flight_.contains(r.id)) {
    return Dropped(r, "this head did not send it around, or it came back before");
  }
  if (Status s = VerifyReceipt(r); !s.ok()) return Dropped(r, s.message());
  if (r.lines.front().node != options_.key->public_key()) {
    return Dropped(r, fmt::format("its first line is node {}'s, not this head's",
                                  ShortKey(r.lines.front().node)));
  }
  if (r.lines.back().last != options_.n_layer) {
    return Dropped(r, fmt::format("its lines end at layer {}, not at the model's {}",
                                  r.lines.back().last, options_.n_layer));
  }
  if (in_flight_.Take(r.id) != r.session) {
    return Dropped(r, "it names another session than the one it was sent for");
  }
  KV_LOG_DEBUG("{}: session {}: receipt {} complete ({} lines)", options_.name, r.session,
               ReceiptIdHex(r), r.lines.size());
  return parsed;
}

}  // namespace kvasir::ring
