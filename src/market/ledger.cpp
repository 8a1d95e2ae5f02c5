// The ledger half of the Store: crediting receipts and reading balances (docs/MARKET.md,
// "POST /v1/receipts", "GET /v1/balances").
#include <fmt/format.h>

#include "market/store.h"

namespace kvasir::market {
namespace {
std::string Short(const std::string& hex) { return hex.substr(0, 8); }
}  // namespace

Result<ReceiptRecord> Store::CreditReceipt(const std::string& receipt_id,
                                           const std::string& model_id,
                                           const std::vector<ReceiptShare>& shares,
                                           const std::string& payload, double now,
                                           const std::function<Status()>& verify) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT 1 FROM receipts WHERE id = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, receipt_id).Step());
    if (row) return Error("duplicate receipt: {} was credited before", receipt_id);
  }
  if (shares.empty()) return Error("the receipt has no lines");
  KV_ASSIGN_OR_RETURN(auto models, ReadModels(now, ""));
  const ModelState* model = nullptr;
  const RingState* ring = nullptr;
  bool known_model = false;
  for (const ModelState& m : models) {
    if (m.model_id != model_id) continue;
    known_model = true;
    for (const RingState& r : m.rings) {
      if (!r.windows.empty() && r.windows[0].claim && r.windows[0].claim->node == shares[0].node) {
        model = &m;
        ring = &r;
      }
    }
  }
  if (!known_model) return Error("no registered model has id {}", model_id);
  if (ring == nullptr) {
    return Error("line 0: node {} does not hold the head window of any ring of model {}",
                 Short(shares[0].node), model_id);
  }
  if (shares.size() != ring->windows.size()) {
    return Error("the receipt has {} lines but ring {} of '{}' has {} windows (truncated?)",
                 shares.size(), ring->ring, model->name, ring->windows.size());
  }
  ReceiptRecord rec;
  rec.id = receipt_id;
  rec.model = model->name;
  rec.ring = ring->ring;
  rec.tokens = shares[0].tokens;
  rec.time = now;
  int expect_first = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    const ReceiptShare& sh = shares[i];
    const WindowState& w = ring->windows[i];
    if (!w.claim || w.claim->node != sh.node) {
      return Error("line {}: node {} does not hold window {} of ring {} of '{}' ({})", i,
                   Short(sh.node), i, ring->ring, model->name,
                   w.claim ? "held by " + Short(w.claim->node) : std::string("uncovered"));
    }
    if (sh.first != w.first || sh.last != w.last || sh.first != expect_first) {
      return Error("line {}: window [{}, {}) is not the holder's window [{}, {})", i, sh.first,
                   sh.last, w.first, w.last);
    }
    expect_first = sh.last;
    if (sh.tokens < 1) return Error("line {}: token count is 0", i);
    if (sh.tokens != shares[0].tokens) {
      return Error("line {}: {} tokens, but line 0 says {}: the lines must agree", i, sh.tokens,
                   shares[0].tokens);
    }
    CreditLine line;
    line.node = sh.node;
    line.first = sh.first;
    line.last = sh.last;
    line.work = sh.tokens * static_cast<uint64_t>(sh.last - sh.first);
    line.credit = static_cast<double>(line.work) * w.claim->rate;
    rec.lines.push_back(line);
  }
  if (expect_first != model->n_layer) {
    return Error("the windows end at layer {}, not at the model's {}", expect_first,
                 model->n_layer);
  }
  if (verify) KV_RETURN_IF_ERROR(verify());
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("INSERT INTO receipts(id, model, ring, tokens, time, "
                                             "payload) VALUES(?, ?, ?, ?, ?, ?)"));
    KV_RETURN_IF_ERROR(s.Bind(1, rec.id)
                           .Bind(2, rec.model)
                           .Bind(3, rec.ring)
                           .Bind(4, static_cast<int64_t>(rec.tokens))
                           .Bind(5, now)
                           .BindBlob(6, payload)
                           .Run());
  }
  for (size_t i = 0; i < rec.lines.size(); ++i) {
    const CreditLine& l = rec.lines[i];
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("INSERT INTO credits(receipt, line, node, first, "
                                             "last, work, credit) VALUES(?, ?, ?, ?, ?, ?, ?)"));
    KV_RETURN_IF_ERROR(s.Bind(1, rec.id)
                           .Bind(2, static_cast<int>(i))
                           .Bind(3, l.node)
                           .Bind(4, l.first)
                           .Bind(5, l.last)
                           .Bind(6, static_cast<int64_t>(l.work))
                           .Bind(7, l.credit)
                           .Run());
    KV_ASSIGN_OR_RETURN(auto b, db_->Prepare(
                                    "INSERT INTO balances(node, credit, work, receipts) VALUES(?, "
                                    "?, ?, 1) ON CONFLICT(node) DO UPDATE SET credit = credit + "
                                    "excluded.credit, work = work + excluded.work, receipts = "
                                    "receipts + 1"));
    KV_RETURN_IF_ERROR(
        b.Bind(1, l.node).Bind(2, l.credit).Bind(3, static_cast<int64_t>(l.work)).Run());
  }
  KV_RETURN_IF_ERROR(txn->Commit());
  return rec;
}

Result<std::vector<Balance>> Store::Balances() {
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT node, credit, work, receipts FROM balances "
                                           "ORDER BY credit DESC, node"));
  std::vector<Balance> out;
  while (true) {
    KV_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back({s.Text(0), s.Real(1), static_cast<uint64_t>(s.Int(2)), s.Int(3)});
  }
  return out;
}

Result<std::vector<ReceiptRecord>> Store::Receipts(const std::string& node, int limit) {
  std::vector<ReceiptRecord> out;
  {
    KV_ASSIGN_OR_RETURN(
        auto s, db_->Prepare("SELECT id, model, ring, tokens, time FROM receipts WHERE ? = '' OR "
                             "id IN (SELECT receipt FROM credits WHERE node = ?) ORDER BY time "
                             "DESC, id LIMIT ?"));
    s.Bind(1, node).Bind(2, node).Bind(3, node.empty() ? limit : -1);
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      ReceiptRecord r;
      r.id = s.Text(0);
      r.model = s.Text(1);
      r.ring = static_cast<int>(s.Int(2));
      r.tokens = static_cast<uint64_t>(s.Int(3));
      r.time = s.Real(4);
      out.push_back(std::move(r));
    }
  }
  for (ReceiptRecord& r : out) {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT node, first, last, work, credit FROM credits "
                                             "WHERE receipt = ? ORDER BY line"));
    s.Bind(1, r.id);
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      r.lines.push_back({s.Text(0), static_cast<int>(s.Int(1)), static_cast<int>(s.Int(2)),
                         static_cast<uint64_t>(s.Int(3)), s.Real(4)});
    }
  }
  return out;
}

}  // namespace kvasir::market
