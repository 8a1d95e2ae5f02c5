// The recompute half of the Store's audits (docs/MARKET.md, "Recomputation"): the reveals that
// matched their commitments, handed to the auditor (audit/auditor.h), and its verdicts. A reveal
// whose recomputed outputs fall outside the tolerance fails its audit as a bad reveal does.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "market/store.h"
#include "market/store_rows.h"

namespace kvasir::market {

using nlohmann::json;

Result<std::vector<RecomputeJob>> Store::PendingRecomputes(const std::string& model, int limit) {
  KV_ASSIGN_OR_RETURN(
      auto s,
      db_->Prepare(fmt::format(
          "SELECT a.id, a.node, a.receipt, a.line, a.revealed, c.first, c.last FROM audits a JOIN "
          "receipts r ON r.id = a.receipt JOIN credits c ON c.receipt = a.receipt AND c.line = "
          "a.line WHERE a.state IN ('passed', 'disputed') AND a.recompute = '' AND r.model = ? "
          "ORDER BY a.id LIMIT {}",
          std::max(1, limit))));
  s.Bind(1, model);
  std::vector<RecomputeJob> jobs;
  while (true) {
    KV_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    RecomputeJob j;
    j.audit = s.Int(0);
    j.node = s.Text(1);
    j.receipt = s.Text(2);
    j.line = s.Int(3);
    j.model = model;
    j.first = static_cast<int>(s.Int(5));
    j.last = static_cast<int>(s.Int(6));
    const json parsed = json::parse(s.Text(4), nullptr, false);
    auto answers = ParseAuditAnswers(json{{"reveals", json::array({parsed})}});
    if (parsed.is_discarded() || !answers.ok() || answers->size() != 1) {
      return Error("{}: audit {}: its stored reveal does not parse", db_->path(), j.audit);
    }
    j.reveal = std::move((*answers)[0].reveal);
    jobs.push_back(std::move(j));
  }
  return jobs;
}

Status Store::RecordRecompute(int64_t id, const std::string& note, const std::string& failure,
                              double now) {
  return Retry([&] { return RecordRecomputeOnce(id, note, failure, now); });
}

Status Store::RecordRecomputeOnce(int64_t id, const std::string& note, const std::string& failure,
                                  double now) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  std::string node, state, recompute;
  int64_t work = 0;
  double credit = 0;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT node, state, recompute, work, credit FROM "
                                             "audits WHERE id = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, id).Step());
    if (!row) return Error(StatusCode::kNotFound, "audit {} does not exist", id);
    node = s.Text(0);
    state = s.Text(1);
    recompute = s.Text(2);
    work = s.Int(3);
    credit = s.Real(4);
  }
  if (!recompute.empty() || (state != "passed" && state != "disputed")) return txn->Commit();
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE audits SET recompute = ? WHERE id = ?"));
    KV_RETURN_IF_ERROR(s.Bind(1, failure.empty() ? note : "failed: " + failure).Bind(2, id).Run());
  }
  if (!failure.empty()) {
    // A disputed line's credit is held already (taken from the balance): it is not taken twice.
    const bool held = state == "disputed";
    KV_RETURN_IF_ERROR(FailAudit(id, node, held ? 0 : work, held ? 0 : credit,
                                 "the recomputed window disagrees: " + failure, now));
  }
  return txn->Commit();
}

}  // namespace kvasir::market
