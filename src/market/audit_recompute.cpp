// The recompute half of the Store's audits (docs/MARKET.md, "Recomputation"): the reveals that
// matched their commitments, handed to the auditor (audit/auditor.h), and its verdicts. A reveal
// whose recomputed outputs fall outside the tolerance fails its audit as a bad reveal does.
#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "base/log.h"
#include "market/store.h"
#include "market/store_rows.h"

namespace kvasir::market {

using nlohmann::json;

Result<std::vector<RecomputeJob>> Store::PendingRecomputes(const std::string& model, int limit) {
  std::vector<RecomputeJob> jobs;
  std::vector<std::pair<int64_t, std::string>> unreadable;  // audit, why
  {
    KV_ASSIGN_OR_RETURN(
        auto s,
        db_->Prepare(fmt::format(
            "SELECT a.id, a.node, a.receipt, a.line, a.revealed, c.first, c.last FROM audits a "
            "JOIN receipts r ON r.id = a.receipt JOIN credits c ON c.receipt = a.receipt AND "
            "c.line = a.line WHERE a.state IN ('passed', 'disputed') AND a.recompute = '' AND "
            "r.model = ? ORDER BY a.id LIMIT {}",
            std::max(1, limit))));
    s.Bind(1, model);
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
      auto answers = parsed.is_discarded()
                         ? Result<std::vector<AuditAnswer>>(Error("it is not JSON"))
                         : ParseAuditAnswers(json{{"reveals", json::array({parsed})}});
      if (!answers.ok() || answers->size() != 1) {
        unreadable.emplace_back(
            j.audit, answers.ok() ? std::string("it holds no reveal") : answers.status().message());
        continue;
      }
      j.reveal = std::move((*answers)[0].reveal);
      jobs.push_back(std::move(j));
    }
  }
  // A stored reveal that does not parse cannot be recomputed: its audit fails (as a reveal that
  // cannot be checked does), and the others go on.
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  for (const auto& [id, why] : unreadable) {
    KV_RETURN_IF_ERROR(
        RecordRecompute(id, "", fmt::format("its stored reveal does not parse: {}", why), now));
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
    // The dispute is settled: this one lied about the boundary, its neighbour did not.
    if (held) KV_RETURN_IF_ERROR(ReleaseDisputeOf(id));
  }
  return txn->Commit();
}

Status Store::ReleaseDisputeOf(int64_t id) {
  std::string receipt, reason;
  int64_t line = 0;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT receipt, line FROM audits WHERE id = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, id).Step());
    if (!row) return Error("{}: audit {} is gone", db_->path(), id);
    receipt = s.Text(0);
    line = s.Int(1);
  }
  // FailAudit replaced this audit's reason; the neighbour's still names the two lines.
  const std::string pair = fmt::format("lines {} and {} of receipt {} disagree", line - 1, line,
                                       receipt),
                    pair_after = fmt::format("lines {} and {} of receipt {} disagree", line,
                                             line + 1, receipt);
  struct Other {
    int64_t id, work;
    std::string node;
    double credit;
  };
  std::vector<Other> others;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT id, node, work, credit, reason, line FROM "
                                             "audits WHERE receipt = ? AND state = 'disputed' AND "
                                             "(line = ? OR line = ?)"));
    s.Bind(1, receipt).Bind(2, line - 1).Bind(3, line + 1);
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      const std::string why = s.Text(4);
      if (why.rfind(s.Int(5) < line ? pair : pair_after, 0) != 0) continue;
      others.push_back({s.Int(0), s.Int(2), s.Text(1), s.Real(3)});
    }
  }
  for (const Other& o : others) {
    KV_ASSIGN_OR_RETURN(auto u, db_->Prepare("UPDATE audits SET state = 'passed', reason = ? "
                                             "WHERE id = ?"));
    KV_RETURN_IF_ERROR(u.Bind(1, fmt::format("the dispute was settled: audit {} of the other "
                                             "line failed its recomputation",
                                             id))
                           .Bind(2, o.id)
                           .Run());
    KV_ASSIGN_OR_RETURN(auto b, db_->Prepare("UPDATE balances SET credit = credit + ?, work = "
                                             "work + ? WHERE node = ?"));
    KV_RETURN_IF_ERROR(b.Bind(1, o.credit).Bind(2, o.work).Bind(3, o.node).Run());
    KV_LOG_INFO(
        "market: audit {} of node {}: dispute settled by audit {}; {:.0f} credit given back", o.id,
        Short(o.node), id, o.credit);
  }
  return Status::Ok();
}

}  // namespace kvasir::market
