#include "market/store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>

namespace kvasir::market {
namespace {

constexpr double kRecentSeconds = 600;  // "recent" demand

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS models(
  id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, model_id TEXT NOT NULL, url TEXT NOT NULL,
  n_layer INT NOT NULL, ctx INT NOT NULL, demand_total INT NOT NULL DEFAULT 0, added REAL);
CREATE TABLE IF NOT EXISTS rings(
  model INT NOT NULL REFERENCES models(id) ON DELETE CASCADE, ring INT NOT NULL,
  epoch INT NOT NULL DEFAULT 0, PRIMARY KEY(model, ring));
CREATE TABLE IF NOT EXISTS windows(
  model INT NOT NULL REFERENCES models(id) ON DELETE CASCADE, ring INT NOT NULL,
  window INT NOT NULL, first INT NOT NULL, last INT NOT NULL, bytes INT NOT NULL,
  memory INT NOT NULL, tensors TEXT NOT NULL, PRIMARY KEY(model, ring, window));
CREATE TABLE IF NOT EXISTS claims(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  model INT NOT NULL REFERENCES models(id) ON DELETE CASCADE, ring INT NOT NULL,
  window INT NOT NULL, node TEXT NOT NULL, address TEXT NOT NULL, behind_nat INT NOT NULL,
  rate REAL NOT NULL, created REAL NOT NULL, expires REAL NOT NULL, last_beat REAL NOT NULL,
  serving_epoch INT NOT NULL DEFAULT -1,
  UNIQUE(model, ring, window), UNIQUE(node));
CREATE TABLE IF NOT EXISTS nonces(
  node TEXT NOT NULL, nonce TEXT NOT NULL, expires REAL NOT NULL, PRIMARY KEY(node, nonce));
CREATE TABLE IF NOT EXISTS demand(
  model INT NOT NULL, ring INT NOT NULL, source TEXT NOT NULL, time REAL NOT NULL);
CREATE TABLE IF NOT EXISTS receipts(
  id TEXT PRIMARY KEY, model TEXT NOT NULL, ring INT NOT NULL, tokens INT NOT NULL,
  time REAL NOT NULL, payload BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS credits(
  receipt TEXT NOT NULL REFERENCES receipts(id), line INT NOT NULL, node TEXT NOT NULL,
  first INT NOT NULL, last INT NOT NULL, work INT NOT NULL, credit REAL NOT NULL,
  PRIMARY KEY(receipt, line));
CREATE INDEX IF NOT EXISTS credits_node ON credits(node);
CREATE TABLE IF NOT EXISTS balances(
  node TEXT PRIMARY KEY, credit REAL NOT NULL, work INT NOT NULL, receipts INT NOT NULL);
)sql";

std::string Short(const std::string& hex) { return hex.substr(0, 8); }

ClaimInfo ClaimFrom(const Stmt& s, int c0) {
  // Column order of kClaimColumns.
  ClaimInfo c;
  c.id = s.Int(c0);
  c.model = s.Text(c0 + 1);
  c.ring = static_cast<int>(s.Int(c0 + 2));
  c.window = static_cast<int>(s.Int(c0 + 3));
  c.node = s.Text(c0 + 4);
  c.address = s.Text(c0 + 5);
  c.behind_nat = s.Int(c0 + 6) != 0;
  c.rate = s.Real(c0 + 7);
  c.created = s.Real(c0 + 8);
  c.expires = s.Real(c0 + 9);
  c.last_beat = s.Real(c0 + 10);
  c.serving_epoch = s.Int(c0 + 11);
  return c;
}

constexpr const char* kClaimColumns =
    "c.id, m.name, c.ring, c.window, c.node, c.address, c.behind_nat, c.rate, c.created, "
    "c.expires, c.last_beat, c.serving_epoch";

}  // namespace

double RewardRate(int64_t recent_requests, int uncovered_windows, int total_windows) {
  const double d = std::min(4.0, static_cast<double>(recent_requests) / 10.0);
  const double u =
      total_windows > 0 ? static_cast<double>(uncovered_windows) / total_windows : 0.0;
  return std::round((1 + d) * (1 + u) * 1000) / 1000;
}

Result<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  KV_ASSIGN_OR_RETURN(auto db, Db::Open(path));
  KV_RETURN_IF_ERROR(db->Exec(kSchema));
  return std::unique_ptr<Store>(new Store(std::move(db)));
}

Status Store::BumpEpoch(int64_t model_row, int ring) {
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE rings SET epoch = epoch + 1 WHERE model = ? "
                                           "AND ring = ?"));
  return s.Bind(1, model_row).Bind(2, ring).Run();
}

Status Store::Sweep(double now) {
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT model, ring FROM claims WHERE expires <= ?"));
    s.Bind(1, now);
    std::vector<std::pair<int64_t, int>> gone;
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      gone.emplace_back(s.Int(0), static_cast<int>(s.Int(1)));
    }
    for (auto [model, ring] : gone) KV_RETURN_IF_ERROR(BumpEpoch(model, ring));
  }
  for (const char* sql : {"DELETE FROM claims WHERE expires <= ?",
                          "DELETE FROM nonces WHERE expires <= ?"}) {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare(sql));
    KV_RETURN_IF_ERROR(s.Bind(1, now).Run());
  }
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("DELETE FROM demand WHERE time < ?"));
  return s.Bind(1, now - kRecentSeconds).Run();
}

Status Store::AddModel(const ModelSpec& spec, bool replace, double now) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT id FROM models WHERE name = ?"));
    KV_ASSIGN_OR_RETURN(bool exists, s.Bind(1, spec.name).Step());
    if (exists && !replace) {
      return Error(StatusCode::kConflict, "model '{}' is already registered (--replace to replace it)",
                   spec.name);
    }
    if (exists) {
      const int64_t id = s.Int(0);
      for (const char* sql : {"DELETE FROM claims WHERE model = ?",
                              "DELETE FROM windows WHERE model = ?",
                              "DELETE FROM rings WHERE model = ?", "DELETE FROM models WHERE id = ?"}) {
        KV_ASSIGN_OR_RETURN(auto d, db_->Prepare(sql));
        KV_RETURN_IF_ERROR(d.Bind(1, id).Run());
      }
    }
  }
  KV_ASSIGN_OR_RETURN(auto ins, db_->Prepare("INSERT INTO models(name, model_id, url, n_layer, "
                                             "ctx, added) VALUES(?, ?, ?, ?, ?, ?)"));
  KV_RETURN_IF_ERROR(ins.Bind(1, spec.name)
                         .Bind(2, spec.model_id)
                         .Bind(3, spec.url)
                         .Bind(4, spec.n_layer)
                         .Bind(5, spec.ctx)
                         .Bind(6, now)
                         .Run());
  const int64_t model_row = db_->LastInsertId();
  for (size_t r = 0; r < spec.rings.size(); ++r) {
    KV_ASSIGN_OR_RETURN(auto ring, db_->Prepare("INSERT INTO rings(model, ring) VALUES(?, ?)"));
    KV_RETURN_IF_ERROR(ring.Bind(1, model_row).Bind(2, static_cast<int>(r)).Run());
    for (size_t w = 0; w < spec.rings[r].size(); ++w) {
      const WindowSpec& win = spec.rings[r][w];
      nlohmann::json tensors = nlohmann::json::array();
      for (const auto& t : win.tensors) tensors.push_back({{"name", t.name}, {"sha256", t.sha256}});
      KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("INSERT INTO windows(model, ring, window, first, "
                                               "last, bytes, memory, tensors) VALUES(?, ?, ?, ?, "
                                               "?, ?, ?, ?)"));
      KV_RETURN_IF_ERROR(s.Bind(1, model_row)
                             .Bind(2, static_cast<int>(r))
                             .Bind(3, static_cast<int>(w))
                             .Bind(4, win.first)
                             .Bind(5, win.last)
                             .Bind(6, static_cast<int64_t>(win.bytes))
                             .Bind(7, static_cast<int64_t>(win.memory))
                             .Bind(8, tensors.dump())
                             .Run());
    }
  }
  return txn->Commit();
}

Result<std::vector<ModelState>> Store::ReadModels(double now, const std::string& only) {
  std::vector<ModelState> models;
  std::vector<int64_t> rows;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT id, name, model_id, url, n_layer, ctx, "
                                             "demand_total FROM models WHERE ? = '' OR name = ? "
                                             "ORDER BY name"));
    s.Bind(1, only).Bind(2, only);
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      ModelState m;
      rows.push_back(s.Int(0));
      m.name = s.Text(1);
      m.model_id = s.Text(2);
      m.url = s.Text(3);
      m.n_layer = static_cast<int>(s.Int(4));
      m.ctx = static_cast<int>(s.Int(5));
      m.demand_total = s.Int(6);
      models.push_back(std::move(m));
    }
  }
  for (size_t i = 0; i < models.size(); ++i) {
    ModelState& m = models[i];
    {
      KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT count(*) FROM demand WHERE model = ?"));
      KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, rows[i]).Step());
      m.demand_recent = row ? s.Int(0) : 0;
    }
    {
      KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT ring, epoch FROM rings WHERE model = ? "
                                               "ORDER BY ring"));
      s.Bind(1, rows[i]);
      while (true) {
        KV_ASSIGN_OR_RETURN(bool row, s.Step());
        if (!row) break;
        RingState r;
        r.ring = static_cast<int>(s.Int(0));
        r.epoch = s.Int(1);
        m.rings.push_back(std::move(r));
      }
    }
    {
      KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT ring, window, first, last, bytes, memory "
                                               "FROM windows WHERE model = ? ORDER BY ring, "
                                               "window"));
      s.Bind(1, rows[i]);
      while (true) {
        KV_ASSIGN_OR_RETURN(bool row, s.Step());
        if (!row) break;
        const auto r = static_cast<size_t>(s.Int(0));
        if (r >= m.rings.size()) return Error("{}: window of a ring that does not exist", db_->path());
        WindowState w;
        w.window = static_cast<int>(s.Int(1));
        w.first = static_cast<int>(s.Int(2));
        w.last = static_cast<int>(s.Int(3));
        w.bytes = static_cast<uint64_t>(s.Int(4));
        w.memory = static_cast<uint64_t>(s.Int(5));
        m.rings[r].windows.push_back(std::move(w));
      }
    }
    {
      KV_ASSIGN_OR_RETURN(auto s, db_->Prepare(fmt::format(
                                      "SELECT {} FROM claims c JOIN models m ON m.id = c.model "
                                      "WHERE c.model = ? AND c.expires > ?",
                                      kClaimColumns)));
      s.Bind(1, rows[i]).Bind(2, now);
      while (true) {
        KV_ASSIGN_OR_RETURN(bool row, s.Step());
        if (!row) break;
        ClaimInfo c = ClaimFrom(s, 0);
        const auto r = static_cast<size_t>(c.ring);
        if (r < m.rings.size() && static_cast<size_t>(c.window) < m.rings[r].windows.size()) {
          m.rings[r].windows[static_cast<size_t>(c.window)].claim = std::move(c);
        }
      }
    }
    int total = 0, uncovered = 0;
    for (const RingState& r : m.rings) {
      for (const WindowState& w : r.windows) {
        ++total;
        if (!w.claim) ++uncovered;
      }
    }
    const double rate_now = RewardRate(m.demand_recent, uncovered, total);
    for (RingState& r : m.rings) {
      r.complete = !r.windows.empty();
      r.ready = r.complete;
      for (WindowState& w : r.windows) {
        w.rate = w.claim ? w.claim->rate : rate_now;
        if (!w.claim) r.complete = r.ready = false;
        else if (w.claim->serving_epoch != r.epoch) r.ready = false;
      }
    }
  }
  return models;
}

Result<ClaimInfo> Store::ReadClaim(int64_t claim) {
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare(fmt::format("SELECT {} FROM claims c JOIN models m ON "
                                                       "m.id = c.model WHERE c.id = ?",
                                                       kClaimColumns)));
  KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, claim).Step());
  if (!row) {
    return Error(StatusCode::kNotFound, "claim {} is gone (its lease expired or it was released)",
                 claim);
  }
  return ClaimFrom(s, 0);
}

Result<ClaimGrant> Store::Claim(const ClaimRequest& req, double now, double lease_s) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  KV_ASSIGN_OR_RETURN(auto models, ReadModels(now, req.model));
  if (models.empty()) return Error(StatusCode::kNotFound, "no model named '{}'", req.model);
  ModelState& m = models[0];
  if (req.ring < 0 || static_cast<size_t>(req.ring) >= m.rings.size()) {
    return Error(StatusCode::kNotFound, "model '{}' has rings 0 to {}, not {}", req.model,
                 m.rings.size() - 1, req.ring);
  }
  RingState& ring = m.rings[static_cast<size_t>(req.ring)];
  if (req.window < 0 || static_cast<size_t>(req.window) >= ring.windows.size()) {
    return Error(StatusCode::kNotFound, "ring {} of '{}' has windows 0 to {}, not {}", req.ring,
                 req.model, ring.windows.size() - 1, req.window);
  }
  if (req.window == 0 && req.behind_nat) {
    return Error("window 0 is the head, which clients dial: it needs an address, not behind_nat");
  }
  const WindowState& w = ring.windows[static_cast<size_t>(req.window)];
  ClaimGrant grant;
  if (w.claim && w.claim->node != req.node) {
    return Error(StatusCode::kConflict,
                 "window {} of ring {} of '{}' is held by node {} (lease ends in {:.0f} s)",
                 req.window, req.ring, req.model, Short(w.claim->node), w.claim->expires - now);
  }
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT c.id, m.name, c.ring, c.window FROM claims c "
                                             "JOIN models m ON m.id = c.model WHERE c.node = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, req.node).Step());
    if (row && !(w.claim && w.claim->id == s.Int(0))) {
      return Error(StatusCode::kConflict,
                   "node {} already holds claim {} (window {} of ring {} of '{}'); release it "
                   "first",
                   Short(req.node), s.Int(0), s.Int(3), s.Int(2), s.Text(1));
    }
  }
  int64_t model_row = 0;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT id FROM models WHERE name = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, req.model).Step());
    if (!row) return Error(StatusCode::kNotFound, "no model named '{}'", req.model);
    model_row = s.Int(0);
  }
  int64_t claim_id = 0;
  if (w.claim) {
    grant.renewed = true;
    claim_id = w.claim->id;
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE claims SET expires = ?, last_beat = ?, "
                                             "address = ? WHERE id = ?"));
    KV_RETURN_IF_ERROR(s.Bind(1, now + lease_s).Bind(2, now).Bind(3, req.address).Bind(4, claim_id).Run());
  } else {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("INSERT INTO claims(model, ring, window, node, "
                                             "address, behind_nat, rate, created, expires, "
                                             "last_beat) VALUES(?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"));
    s.Bind(1, model_row)
        .Bind(2, req.ring)
        .Bind(3, req.window)
        .Bind(4, req.node)
        .Bind(5, req.address)
        .Bind(6, req.behind_nat ? 1 : 0)
        .Bind(7, w.rate)
        .Bind(8, now)
        .Bind(9, now + lease_s)
        .Bind(10, now);
    if (Status st = s.Run(); !st.ok()) {
      // Another process took it between our read and our write (UNIQUE constraints).
      return Error(StatusCode::kConflict, "window {} of ring {} of '{}' was just taken: {}",
                   req.window, req.ring, req.model, st.message());
    }
    claim_id = db_->LastInsertId();
    KV_RETURN_IF_ERROR(BumpEpoch(model_row, req.ring));
  }
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT tensors FROM windows WHERE model = ? AND "
                                             "ring = ? AND window = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, model_row).Bind(2, req.ring).Bind(3, req.window).Step());
    if (!row) return Error("{}: window row missing", db_->path());
    const auto tensors = nlohmann::json::parse(s.Text(0), nullptr, false);
    if (tensors.is_discarded() || !tensors.is_array()) {
      return Error("{}: window {} of '{}': tensor list is not valid JSON", db_->path(), req.window,
                   req.model);
    }
    for (const auto& t : tensors) {
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string() ||
          !t.contains("sha256") || !t["sha256"].is_string()) {
        return Error("{}: window {} of '{}': bad tensor entry", db_->path(), req.window, req.model);
      }
      grant.window.tensors.push_back({t["name"].get<std::string>(), t["sha256"].get<std::string>()});
    }
  }
  KV_ASSIGN_OR_RETURN(grant.claim, ReadClaim(claim_id));
  KV_RETURN_IF_ERROR(txn->Commit());
  grant.window.first = w.first;
  grant.window.last = w.last;
  grant.window.bytes = w.bytes;
  grant.window.memory = w.memory;
  grant.model = m;
  grant.model.rings.clear();
  return grant;
}

Result<HeartbeatReply> Store::Heartbeat(const std::string& node, int64_t claim,
                                        int64_t serving_epoch, double now, double lease_s) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  KV_ASSIGN_OR_RETURN(ClaimInfo c, ReadClaim(claim));
  if (c.node != node) {
    return Error(StatusCode::kForbidden, "claim {} belongs to node {}, not {}", claim,
                 Short(c.node), Short(node));
  }
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE claims SET expires = ?, last_beat = ?, "
                                           "serving_epoch = ? WHERE id = ?"));
  KV_RETURN_IF_ERROR(s.Bind(1, now + lease_s).Bind(2, now).Bind(3, serving_epoch).Bind(4, claim).Run());
  KV_ASSIGN_OR_RETURN(auto models, ReadModels(now, c.model));
  if (models.empty() || static_cast<size_t>(c.ring) >= models[0].rings.size()) {
    return Error("{}: claim {} names a ring that does not exist", db_->path(), claim);
  }
  HeartbeatReply reply;
  reply.ring = models[0].rings[static_cast<size_t>(c.ring)];
  KV_ASSIGN_OR_RETURN(reply.claim, ReadClaim(claim));
  KV_RETURN_IF_ERROR(txn->Commit());
  return reply;
}

Status Store::Release(const std::string& node, int64_t claim, double now) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  KV_ASSIGN_OR_RETURN(ClaimInfo c, ReadClaim(claim));
  if (c.node != node) {
    return Error(StatusCode::kForbidden, "claim {} belongs to node {}, not {}", claim,
                 Short(c.node), Short(node));
  }
  int64_t model_row = 0;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT model FROM claims WHERE id = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, claim).Step());
    if (row) model_row = s.Int(0);
  }
  KV_ASSIGN_OR_RETURN(auto d, db_->Prepare("DELETE FROM claims WHERE id = ?"));
  KV_RETURN_IF_ERROR(d.Bind(1, claim).Run());
  KV_RETURN_IF_ERROR(BumpEpoch(model_row, c.ring));
  return txn->Commit();
}

Result<std::vector<ModelState>> Store::Map(double now) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  KV_ASSIGN_OR_RETURN(auto models, ReadModels(now, ""));
  KV_RETURN_IF_ERROR(txn->Commit());
  return models;
}

Result<std::pair<ModelState, RingState>> Store::PickRing(const std::string& model,
                                                         const std::string& source, double now) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  KV_ASSIGN_OR_RETURN(auto models, ReadModels(now, model));
  if (models.empty()) return Error(StatusCode::kNotFound, "no model named '{}'", model);
  ModelState& m = models[0];
  int64_t model_row = 0;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT id FROM models WHERE name = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, model).Step());
    if (row) model_row = s.Int(0);
  }
  // Count the request whether or not a ring is ready (unmet demand raises the reward), but one
  // address only once in a while.
  bool counts = true;
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT 1 FROM demand WHERE model = ? AND source = ? "
                                             "AND time > ?"));
    KV_ASSIGN_OR_RETURN(bool row,
                        s.Bind(1, model_row).Bind(2, source).Bind(3, now - kDemandSpacingSeconds).Step());
    counts = !row;
  }
  if (counts) {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE models SET demand_total = demand_total + 1 "
                                             "WHERE id = ?"));
    KV_RETURN_IF_ERROR(s.Bind(1, model_row).Run());
  }
  const RingState* best = nullptr;
  int64_t best_load = 0;
  int uncovered = 0, claimed = 0;
  for (const RingState& r : m.rings) {
    for (const WindowState& w : r.windows) (w.claim ? claimed : uncovered)++;
    if (!r.ready) continue;
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT count(*) FROM demand WHERE model = ? AND "
                                             "ring = ?"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, model_row).Bind(2, r.ring).Step());
    const int64_t load = row ? s.Int(0) : 0;
    if (best == nullptr || load < best_load) {
      best = &r;
      best_load = load;
    }
  }
  if (counts) {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("INSERT INTO demand(model, ring, source, time) "
                                             "VALUES(?, ?, ?, ?)"));
    KV_RETURN_IF_ERROR(
        s.Bind(1, model_row).Bind(2, best ? best->ring : -1).Bind(3, source).Bind(4, now).Run());
  }
  KV_RETURN_IF_ERROR(txn->Commit());
  if (best == nullptr) {
    return Error(StatusCode::kUnavailable,
                 "no ring of '{}' is ready: {} of {} windows are uncovered, the rest are claimed "
                 "but not all serving yet",
                 model, uncovered, uncovered + claimed);
  }
  return std::pair<ModelState, RingState>{m, *best};
}

Result<bool> Store::UseNonce(const std::string& node, const std::string& nonce, double now,
                             double keep_s) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("INSERT OR IGNORE INTO nonces(node, nonce, expires) "
                                           "VALUES(?, ?, ?)"));
  KV_RETURN_IF_ERROR(s.Bind(1, node).Bind(2, nonce).Bind(3, now + keep_s).Run());
  const bool fresh = db_->Changes() == 1;
  KV_RETURN_IF_ERROR(txn->Commit());
  return fresh;
}

Result<std::pair<int64_t, int64_t>> Store::Counts(double now) {
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT (SELECT count(*) FROM models), (SELECT "
                                           "count(*) FROM claims WHERE expires > ?)"));
  KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, now).Step());
  if (!row) return std::pair<int64_t, int64_t>{0, 0};
  return std::pair<int64_t, int64_t>{s.Int(0), s.Int(1)};
}

}  // namespace kvasir::market
