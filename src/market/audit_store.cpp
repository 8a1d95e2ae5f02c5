// The audit half of the Store (docs/MARKET.md, "Audits"): picking credited receipts to audit,
// handing their requests to the holders' heartbeats, checking the reveals against the receipt
// lines' commitments, and the forfeits and bans of holders that fail or refuse.
#include <fmt/format.h>
#include <sodium.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "base/log.h"
#include "market/store.h"
#include "market/store_rows.h"

namespace kvasir::market {
namespace {

using nlohmann::json;

constexpr double kMaxBanSeconds = 86400;

}  // namespace

Status Store::CreateAudits(const ReceiptRecord& rec, const std::vector<ReceiptShare>& shares,
                           double now) {
  if (audit_.rate <= 0) return Status::Ok();
  // A number in [0, n): unpredictable, or from the tests' seed.
  auto draw = [this](uint32_t n) -> uint32_t {
    return audit_.seed == 0 ? randombytes_uniform(n) : static_cast<uint32_t>(audit_rng_() % n);
  };
  // Drawn after the session was credited: nothing a stage saw tells it whether it is audited.
  if (audit_.rate < 1 && draw(1000000) >= audit_.rate * 1e6) return Status::Ok();
  if (shares.empty()) return Status::Ok();
  // The same positions of every line (the ledger made them agree on the token count, at most the
  // model's ctx, so it fits 32 bits): neighbours reveal both sides of their shared boundary.
  const auto n = static_cast<uint32_t>(shares[0].tokens);
  const uint64_t k = std::min<uint64_t>(static_cast<uint64_t>(std::max(1, audit_.positions)), n);
  std::set<uint64_t> picked;
  while (picked.size() < k) picked.insert(draw(n));
  // The prefix the recompute auditor runs the window over (docs/MARKET.md, "Recomputation").
  const uint32_t prefix = std::min<uint32_t>(n, static_cast<uint32_t>(std::max(0, audit_.prefix)));
  for (uint32_t p = 0; p < prefix; ++p) picked.insert(p);
  const json positions(std::vector<uint64_t>(picked.begin(), picked.end()));
  for (size_t i = 0; i < rec.lines.size() && i < shares.size(); ++i) {
    const ReceiptShare& sh = shares[i];
    KV_ASSIGN_OR_RETURN(
        auto s,
        db_->Prepare(
            "INSERT INTO audits(receipt, line, node, tokens, root, positions, work, credit, state, "
            "asked, deadline) VALUES(?, ?, ?, ?, ?, ?, ?, ?, 'asked', ?, ?)"));
    KV_RETURN_IF_ERROR(s.Bind(1, rec.id)
                           .Bind(2, static_cast<int>(i))
                           .Bind(3, sh.node)
                           .Bind(4, static_cast<int64_t>(sh.tokens))
                           .Bind(5, sh.rows_root)
                           .Bind(6, positions.dump())
                           .Bind(7, static_cast<int64_t>(rec.lines[i].work))
                           .Bind(8, rec.lines[i].credit)
                           .Bind(9, now)
                           .Bind(10, now + audit_.reveal_s)
                           .Run());
  }
  return Status::Ok();
}

Status Store::FailAudit(int64_t id, const std::string& node, int64_t work, double credit,
                        const std::string& reason, double now) {
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE audits SET state = 'failed', reason = ? "
                                             "WHERE id = ?"));
    KV_RETURN_IF_ERROR(s.Bind(1, reason).Bind(2, id).Run());
  }
  {
    // The line's credit is forfeited.
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE balances SET credit = credit - ?, work = CASE "
                                             "WHEN work > ? THEN work - ? ELSE 0 "
                                             "END WHERE node = ?"));
    KV_RETURN_IF_ERROR(s.Bind(1, credit).Bind(2, work).Bind(3, work).Bind(4, node).Run());
  }
  int64_t offences = 0;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT offences FROM audit_bans WHERE node = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, node).Step());
    if (row) offences = s.Int(0);
  }
  ++offences;
  const int doublings = static_cast<int>(std::min<int64_t>(offences - 1, 40));
  const double ban = std::min(kMaxBanSeconds, audit_.ban_s * std::ldexp(1.0, doublings));
  {
    KV_ASSIGN_OR_RETURN(
        auto s,
        db_->Prepare(
            "INSERT INTO audit_bans(node, offences, until) VALUES(?, ?, ?) ON CONFLICT(node) DO "
            "UPDATE SET offences = excluded.offences, until = excluded.until"));
    KV_RETURN_IF_ERROR(s.Bind(1, node).Bind(2, offences).Bind(3, now + ban).Run());
  }
  // A banned node holds nothing: its window is free for another.
  std::vector<std::tuple<int64_t, int64_t, int>> held;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT id, model, ring FROM claims WHERE node = ?"));
    s.Bind(1, node);
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      held.emplace_back(s.Int(0), s.Int(1), static_cast<int>(s.Int(2)));
    }
  }
  for (const auto& [claim, model_row, ring_index] : held) {
    KV_ASSIGN_OR_RETURN(auto d, db_->Prepare("DELETE FROM claims WHERE id = ?"));
    KV_RETURN_IF_ERROR(d.Bind(1, claim).Run());
    KV_RETURN_IF_ERROR(BumpEpoch(model_row, ring_index));
  }
  KV_LOG_WARN("market: node {} failed audit {}: {}; {:.0f} credit forfeited, banned for {:.0f} s",
              Short(node), id, reason, credit, ban);
  return Status::Ok();
}

Status Store::ReadAudits(const std::string& node, double now, std::vector<AuditRequest>* out) {
  // Whoever did not answer in time refused, whether or not it is still here.
  struct Overdue {
    int64_t id;
    std::string node;
    int64_t work;
    double credit;
  };
  std::vector<Overdue> overdue;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT id, node, work, credit FROM audits WHERE "
                                             "state = 'asked' AND deadline < ?"));
    s.Bind(1, now);
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      overdue.push_back({s.Int(0), s.Text(1), s.Int(2), s.Real(3)});
    }
  }
  for (const Overdue& o : overdue) {
    KV_RETURN_IF_ERROR(FailAudit(o.id, o.node, o.work, o.credit,
                                 fmt::format("no reveal within {:.0f} s", audit_.reveal_s), now));
  }
  KV_ASSIGN_OR_RETURN(auto s,
                      db_->Prepare(fmt::format("SELECT id, receipt, positions FROM audits WHERE "
                                               "node = ? AND state = 'asked' ORDER BY id "
                                               "LIMIT {}",
                                               kMaxAuditsPerBeat)));
  s.Bind(1, node);
  while (true) {
    KV_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    AuditRequest r;
    r.id = s.Int(0);
    r.receipt = s.Text(1);
    const json positions = json::parse(s.Text(2), nullptr, false);
    if (!positions.is_array())
      return Error("{}: audit {}: positions are not a list", db_->path(), r.id);
    for (const json& p : positions) {
      if (!p.is_number_unsigned())
        return Error("{}: audit {}: a position is not a count", db_->path(), r.id);
      r.positions.push_back(p.get<uint64_t>());
    }
    out->push_back(std::move(r));
  }
  return Status::Ok();
}

Status Store::AnswerAudits(const std::string& node, const std::vector<AuditAnswer>& answers,
                           double now) {
  return Retry([&] { return AnswerAuditsOnce(node, answers, now); });
}

Status Store::AnswerAuditsOnce(const std::string& node, const std::vector<AuditAnswer>& answers,
                               double now) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  for (const AuditAnswer& a : answers) {
    std::string owner, root_hex, positions_text, state, receipt;
    int64_t tokens = 0, work = 0, line = 0;
    double credit = 0;
    {
      KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT node, tokens, root, positions, state, work, "
                                               "credit, receipt, line FROM audits WHERE id = ?"));
      KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, a.id).Step());
      if (!row) return Error(StatusCode::kNotFound, "audit {} does not exist", a.id);
      owner = s.Text(0);
      tokens = s.Int(1);
      root_hex = s.Text(2);
      positions_text = s.Text(3);
      state = s.Text(4);
      work = s.Int(5);
      credit = s.Real(6);
      receipt = s.Text(7);
      line = s.Int(8);
    }
    if (owner != node) {
      return Error(StatusCode::kForbidden, "audit {} is node {}'s, not {}", a.id, Short(owner),
                   Short(node));
    }
    if (state != "asked") continue;  // answered before (or too late): the first outcome stands
    std::string failure;
    if (!a.refusal.empty()) {
      failure = "refused to reveal: " + a.refusal;
    } else {
      std::set<uint64_t> asked, got;
      const json positions = json::parse(positions_text, nullptr, false);
      if (positions.is_array()) {
        for (const json& p : positions) {
          if (p.is_number_unsigned()) asked.insert(p.get<uint64_t>());
        }
      }
      for (const ring::RevealedPosition& p : a.reveal.positions) got.insert(p.index);
      auto root = ring::ParseDigestHex(root_hex);
      if (!root.ok()) return Error("{}: audit {}: {}", db_->path(), a.id, root.status().message());
      if (got != asked || got.size() != a.reveal.positions.size()) {
        failure = "the reveal is not of the positions asked";
      } else if (Status c = ring::CheckReveal(a.reveal, *root, static_cast<uint64_t>(tokens));
                 !c.ok()) {
        failure = c.message();
      }
    }
    if (failure.empty()) {
      KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE audits SET state = 'passed', revealed = ? "
                                               "WHERE id = ?"));
      KV_RETURN_IF_ERROR(s.Bind(1, AuditAnswerToJson(a.id, a.reveal).dump()).Bind(2, a.id).Run());
      KV_RETURN_IF_ERROR(CompareNeighbours(a.id, receipt, line, a.reveal));
    } else {
      KV_RETURN_IF_ERROR(FailAudit(a.id, node, work, credit, failure, now));
    }
  }
  return txn->Commit();
}

Status Store::Dispute(int64_t id, const std::string& node, int64_t work, double credit,
                      const std::string& reason) {
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE audits SET state = 'disputed', reason = ? "
                                             "WHERE id = ?"));
    KV_RETURN_IF_ERROR(s.Bind(1, reason).Bind(2, id).Run());
  }
  KV_ASSIGN_OR_RETURN(
      auto s,
      db_->Prepare(
          "UPDATE balances SET credit = credit - ?, work = CASE WHEN work > ? THEN work - ? ELSE 0 "
          "END WHERE node = ?"));
  KV_RETURN_IF_ERROR(s.Bind(1, credit).Bind(2, work).Bind(3, work).Bind(4, node).Run());
  KV_LOG_WARN("market: audit {} of node {} disputed: {}; {:.0f} credit held", id, Short(node),
              reason, credit);
  return Status::Ok();
}

Status Store::CompareNeighbours(int64_t id, const std::string& receipt, int64_t line,
                                const ring::RowReveal& reveal) {
  for (const int64_t other : {line - 1, line + 1}) {
    int64_t other_id = 0, work = 0;
    std::string node, revealed;
    double credit = 0;
    {
      KV_ASSIGN_OR_RETURN(auto s,
                          db_->Prepare("SELECT id, node, work, credit, revealed FROM audits "
                                       "WHERE receipt = ? AND line = ? AND state = "
                                       "'passed'"));
      KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, receipt).Bind(2, other).Step());
      if (!row) continue;
      other_id = s.Int(0);
      node = s.Text(1);
      work = s.Int(2);
      credit = s.Real(3);
      revealed = s.Text(4);
    }
    const json parsed = json::parse(revealed, nullptr, false);
    auto answers = ParseAuditAnswers(json{{"reveals", json::array({parsed})}});
    if (parsed.is_discarded() || !answers.ok() || answers->size() != 1) {
      return Error("{}: audit {}: its stored reveal does not parse", db_->path(), other_id);
    }
    const ring::RowReveal& theirs = (*answers)[0].reveal;
    // `before` gave out what `after` took in.
    const ring::RowReveal& before = other < line ? theirs : reveal;
    const ring::RowReveal& after = other < line ? reveal : theirs;
    std::string disagree;
    for (const ring::RevealedPosition& b : before.positions) {
      for (const ring::RevealedPosition& a : after.positions) {
        if (a.index == b.index && !ring::SameBoundaryRow(b.rows.out, a.rows.in)) {
          disagree = fmt::format(
              "lines {} and {} of receipt {} disagree at their boundary: at position {} the row "
              "one gave out is not the row the other took in",
              std::min(line, other), std::max(line, other), receipt, a.index);
          break;
        }
      }
      if (!disagree.empty()) break;
    }
    if (disagree.empty()) continue;
    KV_RETURN_IF_ERROR(Dispute(other_id, node, work, credit, disagree));
    int64_t my_work = 0;
    double my_credit = 0;
    std::string my_node;
    {
      KV_ASSIGN_OR_RETURN(auto s,
                          db_->Prepare("SELECT node, work, credit FROM audits WHERE id = ?"));
      KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, id).Step());
      if (!row) return Error("{}: audit {} is gone", db_->path(), id);
      my_node = s.Text(0);
      my_work = s.Int(1);
      my_credit = s.Real(2);
    }
    return Dispute(id, my_node, my_work, my_credit, disagree);
  }
  return Status::Ok();
}

Result<std::optional<std::string>> Store::AuditBan(const std::string& node, double now) {
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT offences, until FROM audit_bans WHERE node = ? "
                                           "AND until > ?"));
  KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, node).Bind(2, now).Step());
  if (!row) return std::optional<std::string>();
  return std::optional<std::string>(
      fmt::format("node {} failed {} audit(s) of its work: it may claim again in {:.0f} s",
                  Short(node), s.Int(0), std::ceil(s.Real(1) - now)));
}

Status Store::ReadAuditCounts(std::vector<Balance>* balances) {
  KV_ASSIGN_OR_RETURN(
      auto s,
      db_->Prepare(
          "SELECT node, SUM(CASE WHEN state = 'passed' THEN 1 ELSE 0 END), SUM(CASE WHEN state = "
          "'failed' THEN 1 ELSE 0 END), SUM(CASE WHEN state = 'disputed' THEN 1 ELSE 0 END) FROM "
          "audits GROUP BY node"));
  std::map<std::string, std::array<int64_t, 3>> counts;
  while (true) {
    KV_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    counts[s.Text(0)] = {s.Int(1), s.Int(2), s.Int(3)};
  }
  for (Balance& b : *balances) {
    if (auto it = counts.find(b.node); it != counts.end()) {
      b.audits_passed = it->second[0];
      b.audits_failed = it->second[1];
      b.audits_disputed = it->second[2];
    }
  }
  return Status::Ok();
}

}  // namespace kvasir::market
