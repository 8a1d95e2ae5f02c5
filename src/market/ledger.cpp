// The ledger half of the Store: crediting receipts and reading balances (docs/MARKET.md,
// "POST /v1/receipts", "Credit is bounded", "GET /v1/balances"). Every count that earns credit is
// bounded by what a real ring could have run, and every sum is checked for overflow.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "market/store.h"
#include "market/store_rows.h"

namespace kvasir::market {
namespace {

constexpr uint64_t kMaxStoredInt = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());

// a + b, or an error naming `what` when it leaves [0, INT64_MAX] (SQLite's integers).
Result<uint64_t> CheckedAdd(uint64_t a, uint64_t b, const std::string& what) {
  uint64_t sum = 0;
  if (__builtin_add_overflow(a, b, &sum) || sum > kMaxStoredInt) {
    return Error("{}: {} + {} overflows", what, a, b);
  }
  return sum;
}

// Why a ring is not ready, naming the first window that keeps it from being so.
std::string NotReadyReason(const RingState& ring) {
  for (const WindowState& w : ring.windows) {
    if (!w.claim) return fmt::format("window {} is uncovered", w.window);
    if (!w.claim->proven) {
      return fmt::format("window {}'s holder {} has not proved that it holds the window's bytes",
                         w.window, Short(w.claim->node));
    }
    if (w.claim->serving_epoch != ring.epoch) {
      return fmt::format("window {}'s holder {} does not serve epoch {}", w.window,
                         Short(w.claim->node), ring.epoch);
    }
    if (w.claim->checked() && w.claim->verified_epoch != ring.epoch) {
      return fmt::format("the market has not checked window {}'s holder {} at {}{}", w.window,
                         Short(w.claim->node), w.claim->address,
                         w.claim->check_error.empty() ? "" : ": " + w.claim->check_error);
    }
  }
  return "it is not complete";
}

}  // namespace

Result<ReceiptRecord> Store::CreditReceiptOnce(const std::string& receipt_id,
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
  // A session runs at most its context of rows on every stage.
  if (rec.tokens > static_cast<uint64_t>(std::max(0, model->ctx))) {
    return Error("line 0: {} token rows, but a session of '{}' runs at most its context of {}",
                 rec.tokens, model->name, model->ctx);
  }
  int expect_first = 0;
  for (size_t i = 0; i < shares.size(); ++i) {
    const ReceiptShare& sh = shares[i];
    const WindowState& w = ring->windows[i];
    // The holder signs, or a proven standby of the window that took its place in a repair (the
    // sessions it served before the market gave it the window).
    const ClaimInfo* signer = w.claim && w.claim->node == sh.node ? &*w.claim : nullptr;
    for (const ClaimInfo& c : w.standbys) {
      if (signer == nullptr && c.node == sh.node && c.proven) signer = &c;
    }
    if (signer == nullptr) {
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
    if (__builtin_mul_overflow(sh.tokens, static_cast<uint64_t>(sh.last - sh.first), &line.work) ||
        line.work > kMaxStoredInt) {
      return Error("line {}: {} tokens x {} layers overflows", i, sh.tokens, sh.last - sh.first);
    }
    line.credit = static_cast<double>(line.work) * signer->rate;
    if (!std::isfinite(line.credit) || line.credit < 0) {
      return Error("line {}: credit {} x {} is not a finite amount", i, line.work, signer->rate);
    }
    rec.lines.push_back(line);
  }
  if (expect_first != model->n_layer) {
    return Error("the windows end at layer {}, not at the model's {}", expect_first,
                 model->n_layer);
  }
  // Only a ring whose every holder reached `serving` (and passed the market's check) before the
  // session earns, and no faster than it can run: its allowance grows by max_rows_per_s for
  // every second it has been ready, keeping at most kCreditBurstSeconds of it unused.
  if (!ring->ready) {
    return Error("ring {} of '{}' is not ready ({}): only sessions of a ready ring earn credit",
                 ring->ring, model->name, NotReadyReason(*ring));
  }
  if (!(model->max_rows_per_s > 0)) {
    return Error("model '{}' has no bound on its rows per second (registered by an older "
                 "market): register it again with `kvasir market add-model --replace`",
                 model->name);
  }
  KV_ASSIGN_OR_RETURN(const int64_t model_row, ModelRow(model->name));
  double allowance = 0;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT bucket, bucket_time, bucket_epoch FROM rings "
                                             "WHERE model = ? AND ring = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, model_row).Bind(2, ring->ring).Step());
    if (!row) return Error("{}: ring {} of '{}' has no row", db_->path(), ring->ring, model->name);
    const bool same_epoch = s.Int(2) == ring->epoch;
    const double kept = same_epoch ? s.Real(0) : 0;
    const double since = std::max(same_epoch ? s.Real(1) : 0, ring->ready_since);
    const double cap = std::max(static_cast<double>(model->ctx),
                                model->max_rows_per_s * kCreditBurstSeconds);
    allowance = std::min(cap, kept + model->max_rows_per_s * std::max(0.0, now - since));
  }
  if (static_cast<double>(rec.tokens) > allowance) {
    return Error("ring {} of '{}' has been ready for {:.1f} s and runs at most {:.0f} token rows "
                 "a second: it can have run {:.0f} more rows, not {}",
                 ring->ring, model->name, now - ring->ready_since, model->max_rows_per_s,
                 std::floor(allowance), rec.tokens);
  }
  if (verify) KV_RETURN_IF_ERROR(verify());
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE rings SET bucket = ?, bucket_time = ?, "
                                             "bucket_epoch = ? WHERE model = ? AND ring = ?"));
    KV_RETURN_IF_ERROR(s.Bind(1, allowance - static_cast<double>(rec.tokens))
                           .Bind(2, now)
                           .Bind(3, ring->epoch)
                           .Bind(4, model_row)
                           .Bind(5, ring->ring)
                           .Run());
  }
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
    // The balance is summed here, checked, rather than by SQLite (whose integers turn into
    // inexact reals on overflow).
    uint64_t work = 0, receipts = 0;
    double credit = 0;
    {
      KV_ASSIGN_OR_RETURN(auto b, db_->Prepare("SELECT credit, work, receipts FROM balances "
                                               "WHERE node = ?"));
      KV_ASSIGN_OR_RETURN(bool row, b.Bind(1, l.node).Step());
      if (row) {
        credit = b.Real(0);
        work = static_cast<uint64_t>(std::max<int64_t>(0, b.Int(1)));
        receipts = static_cast<uint64_t>(std::max<int64_t>(0, b.Int(2)));
      }
    }
    const std::string who = fmt::format("balance of node {}", Short(l.node));
    KV_ASSIGN_OR_RETURN(work, CheckedAdd(work, l.work, who + ": work"));
    KV_ASSIGN_OR_RETURN(receipts, CheckedAdd(receipts, 1, who + ": receipts"));
    credit += l.credit;
    if (!std::isfinite(credit)) return Error("{}: credit is no longer a finite amount", who);
    KV_ASSIGN_OR_RETURN(auto b, db_->Prepare("INSERT INTO balances(node, credit, work, receipts) "
                                             "VALUES(?, ?, ?, ?) ON CONFLICT(node) DO UPDATE SET "
                                             "credit = excluded.credit, work = excluded.work, "
                                             "receipts = excluded.receipts"));
    KV_RETURN_IF_ERROR(b.Bind(1, l.node)
                           .Bind(2, credit)
                           .Bind(3, static_cast<int64_t>(work))
                           .Bind(4, static_cast<int64_t>(receipts))
                           .Run());
  }
  KV_RETURN_IF_ERROR(CreateAudits(rec, shares, now));
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
  KV_RETURN_IF_ERROR(ReadAuditCounts(&out));
  return out;
}

Result<std::vector<ReceiptRecord>> Store::Receipts(const std::string& node, int limit) {
  std::vector<ReceiptRecord> out;
  {
    KV_ASSIGN_OR_RETURN(
        auto s, db_->Prepare("SELECT id, model, ring, tokens, time FROM receipts WHERE ? = '' OR "
                             "id IN (SELECT receipt FROM credits WHERE node = ?) ORDER BY time "
                             "DESC, id LIMIT ?"));
    s.Bind(1, node).Bind(2, node).Bind(3, node.empty() ? int64_t{limit} : INT64_MAX);
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
