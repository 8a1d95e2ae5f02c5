#include "market/store.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <regex>
#include <nlohmann/json.hpp>

#include "market/store_rows.h"

namespace kvasir::market {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS models(
  id INTEGER PRIMARY KEY, name TEXT UNIQUE NOT NULL, model_id TEXT NOT NULL, url TEXT NOT NULL,
  n_layer INT NOT NULL, ctx INT NOT NULL, demand_total INT NOT NULL DEFAULT 0, added REAL,
  max_rows_per_s REAL NOT NULL DEFAULT 0, n_windows INT NOT NULL DEFAULT 0,
  n_held INT NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS rings(
  model INT NOT NULL REFERENCES models(id) ON DELETE CASCADE, ring INT NOT NULL,
  epoch INT NOT NULL DEFAULT 0, bucket REAL NOT NULL DEFAULT 0,
  bucket_time REAL NOT NULL DEFAULT 0, bucket_epoch INT NOT NULL DEFAULT -1,
  PRIMARY KEY(model, ring));
CREATE TABLE IF NOT EXISTS windows(
  model INT NOT NULL REFERENCES models(id) ON DELETE CASCADE, ring INT NOT NULL,
  window INT NOT NULL, first INT NOT NULL, last INT NOT NULL, bytes INT NOT NULL,
  memory INT NOT NULL, tensors TEXT NOT NULL, samples TEXT NOT NULL DEFAULT '[]',
  PRIMARY KEY(model, ring, window));
CREATE TABLE IF NOT EXISTS claims(
  id INTEGER PRIMARY KEY AUTOINCREMENT,
  model INT NOT NULL REFERENCES models(id) ON DELETE CASCADE, ring INT NOT NULL,
  window INT NOT NULL, node TEXT NOT NULL, address TEXT NOT NULL, behind_nat INT NOT NULL,
  rate REAL NOT NULL, created REAL NOT NULL, expires REAL NOT NULL, last_beat REAL NOT NULL,
  serving_epoch INT NOT NULL DEFAULT -1, serving_since REAL NOT NULL DEFAULT 0,
  verified_epoch INT NOT NULL DEFAULT -1, verified_at REAL NOT NULL DEFAULT 0,
  check_error TEXT NOT NULL DEFAULT '', proven INT NOT NULL DEFAULT 1,
  proof_nonce TEXT NOT NULL DEFAULT '', proof_picks TEXT NOT NULL DEFAULT '',
  standby INT NOT NULL DEFAULT 0, signed_at INT NOT NULL DEFAULT 0,
  signed_nonces TEXT NOT NULL DEFAULT '',
  UNIQUE(model, ring, window, standby), UNIQUE(node));
CREATE TABLE IF NOT EXISTS strikes(
  node TEXT PRIMARY KEY, count INT NOT NULL, until REAL NOT NULL);
CREATE TABLE IF NOT EXISTS nonces(
  node TEXT NOT NULL, nonce TEXT NOT NULL, expires REAL NOT NULL, PRIMARY KEY(node, nonce));
CREATE TABLE IF NOT EXISTS demand(
  model INT NOT NULL, ring INT NOT NULL, source TEXT NOT NULL, time REAL NOT NULL);
CREATE TABLE IF NOT EXISTS receipts(
  id TEXT PRIMARY KEY, model TEXT NOT NULL, ring INT NOT NULL, tokens INT NOT NULL,
  time REAL NOT NULL, payload BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS receipts_model_time ON receipts(model, time);
CREATE TABLE IF NOT EXISTS credits(
  receipt TEXT NOT NULL REFERENCES receipts(id), line INT NOT NULL, node TEXT NOT NULL,
  first INT NOT NULL, last INT NOT NULL, work INT NOT NULL, credit REAL NOT NULL,
  PRIMARY KEY(receipt, line));
CREATE INDEX IF NOT EXISTS credits_node ON credits(node);
CREATE TABLE IF NOT EXISTS balances(
  node TEXT PRIMARY KEY, credit REAL NOT NULL, work INT NOT NULL, receipts INT NOT NULL);
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value REAL NOT NULL);
CREATE TABLE IF NOT EXISTS audits(
  id INTEGER PRIMARY KEY AUTOINCREMENT, receipt TEXT NOT NULL, line INT NOT NULL,
  node TEXT NOT NULL, tokens INT NOT NULL, root TEXT NOT NULL, positions TEXT NOT NULL,
  work INT NOT NULL, credit REAL NOT NULL, state TEXT NOT NULL, asked REAL NOT NULL,
  deadline REAL NOT NULL, reason TEXT NOT NULL DEFAULT '', revealed TEXT NOT NULL DEFAULT '',
  recompute TEXT NOT NULL DEFAULT '');
CREATE INDEX IF NOT EXISTS audits_receipt ON audits(receipt, line);
CREATE INDEX IF NOT EXISTS audits_node ON audits(node, state);
CREATE INDEX IF NOT EXISTS audits_deadline ON audits(state, deadline);
CREATE TABLE IF NOT EXISTS audit_bans(
  node TEXT PRIMARY KEY, offences INT NOT NULL, until REAL NOT NULL);
CREATE INDEX IF NOT EXISTS claims_expires ON claims(expires);
CREATE INDEX IF NOT EXISTS nonces_expires ON nonces(expires);
CREATE INDEX IF NOT EXISTS demand_time ON demand(time);
)sql";

// Columns added since the first schema: a database made by an older market gets them (with
// their defaults) when it is opened.
struct AddedColumn {
  const char* table;
  const char* name;
  const char* definition;
};
constexpr AddedColumn kAddedColumns[] = {
    {"models", "max_rows_per_s", "REAL NOT NULL DEFAULT 0"},
    {"rings", "bucket", "REAL NOT NULL DEFAULT 0"},
    {"rings", "bucket_time", "REAL NOT NULL DEFAULT 0"},
    {"rings", "bucket_epoch", "INT NOT NULL DEFAULT -1"},
    {"claims", "serving_since", "REAL NOT NULL DEFAULT 0"},
    {"claims", "verified_epoch", "INT NOT NULL DEFAULT -1"},
    {"claims", "verified_at", "REAL NOT NULL DEFAULT 0"},
    {"claims", "check_error", "TEXT NOT NULL DEFAULT ''"},
    {"windows", "samples", "TEXT NOT NULL DEFAULT '[]'"},
    {"claims", "proven", "INT NOT NULL DEFAULT 1"},
    {"claims", "proof_nonce", "TEXT NOT NULL DEFAULT ''"},
    {"claims", "proof_picks", "TEXT NOT NULL DEFAULT ''"},
    {"audits", "recompute", "TEXT NOT NULL DEFAULT ''"},
    {"models", "n_windows", "INT NOT NULL DEFAULT 0"},
    {"models", "n_held", "INT NOT NULL DEFAULT 0"},
    {"claims", "signed_at", "INT NOT NULL DEFAULT 0"},
    {"claims", "signed_nonces", "TEXT NOT NULL DEFAULT ''"},
};

// Standbys (docs/MARKET.md, "Standbys") are claims with a standby number above 0, so a window
// has one serving claim and up to kMaxStandbysPerWindow standbys. A claims table made before them
// has UNIQUE(model, ring, window), which no added column can relax: it is copied into the table of
// the schema above.
Result<bool> AddStandbyColumn(Db* db) {
  KV_ASSIGN_OR_RETURN(auto s, db->Prepare("SELECT 1 FROM pragma_table_info('claims') WHERE name = "
                                          "'standby'"));
  KV_ASSIGN_OR_RETURN(bool has, s.Step());
  if (has) return false;
  constexpr const char* kColumns =
      "id, model, ring, window, node, address, behind_nat, rate, created, expires, last_beat, "
      "serving_epoch, serving_since, verified_epoch, verified_at, check_error, proven, "
      "proof_nonce, proof_picks";
  KV_RETURN_IF_ERROR(db->Exec("DROP INDEX IF EXISTS claims_expires; ALTER TABLE claims RENAME TO "
                              "claims_before_standbys"));
  KV_RETURN_IF_ERROR(db->Exec(kSchema));
  KV_RETURN_IF_ERROR(db->Exec(fmt::format("INSERT INTO claims({0}) SELECT {0} FROM "
                                          "claims_before_standbys; DROP TABLE "
                                          "claims_before_standbys",
                                          kColumns)));
  return true;
}

// After the claims table has its standby column (a table made before it gets it first).
constexpr const char* kStandbyIndex =
    "CREATE INDEX IF NOT EXISTS claims_standby ON claims(standby)";
// models.n_held follows the serving claims (not the standbys), so a claim or a heartbeat learns
// how many windows of its model are uncovered (for the reward rate) without reading every claim
// of the model. A standby promoted to its window's claim counts from then on.
constexpr const char* kSqliteTriggers = R"sql(
CREATE TRIGGER IF NOT EXISTS claims_held_insert AFTER INSERT ON claims WHEN NEW.standby = 0
BEGIN UPDATE models SET n_held = n_held + 1 WHERE id = NEW.model; END;
CREATE TRIGGER IF NOT EXISTS claims_held_delete AFTER DELETE ON claims WHEN OLD.standby = 0
BEGIN UPDATE models SET n_held = n_held - 1 WHERE id = OLD.model; END;
CREATE TRIGGER IF NOT EXISTS claims_held_update AFTER UPDATE OF standby ON claims
WHEN (OLD.standby = 0) <> (NEW.standby = 0) BEGIN
  UPDATE models SET n_held = n_held + (CASE WHEN NEW.standby = 0 THEN 1 ELSE -1 END)
  WHERE id = NEW.model; END;
)sql";
constexpr const char* kPostgresTriggers = R"sql(
CREATE OR REPLACE FUNCTION claims_held() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    IF NEW.standby = 0 THEN UPDATE models SET n_held = n_held + 1 WHERE id = NEW.model; END IF;
  ELSIF TG_OP = 'DELETE' THEN
    IF OLD.standby = 0 THEN UPDATE models SET n_held = n_held - 1 WHERE id = OLD.model; END IF;
  ELSIF (OLD.standby = 0) <> (NEW.standby = 0) THEN
    UPDATE models SET n_held = n_held + (CASE WHEN NEW.standby = 0 THEN 1 ELSE -1 END)
    WHERE id = NEW.model;
  END IF;
  RETURN NULL;
END $$;
CREATE OR REPLACE TRIGGER claims_held AFTER INSERT OR DELETE OR UPDATE OF standby ON claims
  FOR EACH ROW EXECUTE FUNCTION claims_held();
)sql";
// The counts of a database made before them: set from the tables when the columns are added.
constexpr const char* kRecount =
    "UPDATE models SET n_windows = (SELECT count(*) FROM windows w WHERE w.model = models.id), "
    "n_held = (SELECT count(*) FROM claims c WHERE c.model = models.id AND c.standby = 0)";

// The same schema in PostgreSQL's types: 64-bit integers, doubles, bytea, serial ids, and the
// column `window` quoted (a reserved word there).
std::string PostgresSchema() {
  std::string s = kSchema;
  s = std::regex_replace(s, std::regex("INTEGER PRIMARY KEY AUTOINCREMENT|INTEGER PRIMARY KEY"),
                         "BIGSERIAL PRIMARY KEY");
  s = std::regex_replace(s, std::regex("\\bINT\\b"), "BIGINT");
  s = std::regex_replace(s, std::regex("\\bREAL\\b"), "DOUBLE PRECISION");
  s = std::regex_replace(s, std::regex("\\bBLOB\\b"), "BYTEA");
  return std::regex_replace(s, std::regex("\\bwindow\\b"), "\"window\"");
}

// The standby column on a PostgreSQL claims table made before standbys: added, and its
// UNIQUE(model, ring, window) (named by PostgreSQL, so found by its definition) replaced by the
// schema's UNIQUE(model, ring, window, standby). Before the triggers, which name the column.
Status PostgresAddStandbyColumn(Db* db) {
  {
    KV_ASSIGN_OR_RETURN(auto s, db->Prepare("SELECT 1 FROM information_schema.columns WHERE "
                                            "table_name = 'claims' AND column_name = 'standby'"));
    KV_ASSIGN_OR_RETURN(bool has, s.Step());
    if (has) return Status::Ok();
  }
  std::vector<std::string> old;
  {
    // Prepare quotes the column's name (postgres.cpp), even in a literal: the pattern avoids it.
    KV_ASSIGN_OR_RETURN(auto s, db->Prepare("SELECT conname FROM pg_constraint WHERE conrelid = "
                                            "'claims'::regclass AND contype = 'u' AND "
                                            "pg_get_constraintdef(oid) LIKE 'UNIQUE (model, ring, "
                                            "%' AND pg_get_constraintdef(oid) NOT LIKE "
                                            "'%standby%'"));
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      old.push_back(s.Text(0));
    }
  }
  // Exec runs its SQL as written.
  KV_RETURN_IF_ERROR(db->Exec("ALTER TABLE claims ADD COLUMN standby BIGINT NOT NULL DEFAULT 0"));
  for (const std::string& name : old) {
    KV_RETURN_IF_ERROR(db->Exec(fmt::format("ALTER TABLE claims DROP CONSTRAINT \"{}\"", name)));
  }
  return db->Exec("ALTER TABLE claims ADD UNIQUE(model, ring, \"window\", standby)");
}

// Creates the schema on PostgreSQL, or adds to a database made by an older market what it lacks.
Status PostgresUpgrade(Db* db) {
  bool had_counts = false;
  {
    KV_ASSIGN_OR_RETURN(auto s, db->Prepare("SELECT 1 FROM information_schema.columns WHERE "
                                            "table_name = 'models' AND column_name = 'n_held'"));
    KV_ASSIGN_OR_RETURN(had_counts, s.Step());
  }
  KV_RETURN_IF_ERROR(db->Exec(PostgresSchema()));
  KV_RETURN_IF_ERROR(PostgresAddStandbyColumn(db));
  if (had_counts) return db->Exec(kPostgresTriggers);
  for (const AddedColumn& c : kAddedColumns) {
    std::string definition = std::regex_replace(c.definition, std::regex("\\bINT\\b"), "BIGINT");
    definition = std::regex_replace(definition, std::regex("\\bREAL\\b"), "DOUBLE PRECISION");
    KV_RETURN_IF_ERROR(db->Exec(
        fmt::format("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} {}", c.table, c.name, definition)));
  }
  KV_RETURN_IF_ERROR(db->Exec(kPostgresTriggers));
  return db->Exec(kRecount);
}

}  // namespace

const char* const kClaimColumns =
    "c.id, m.name, c.ring, c.window, c.node, c.address, c.behind_nat, c.rate, c.created, "
    "c.expires, c.last_beat, c.serving_epoch, c.serving_since, c.verified_epoch, c.verified_at, "
    "c.check_error, c.proven, c.standby";

ClaimInfo ClaimFromRow(const Stmt& s, int c0) {
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
  c.serving_since = s.Real(c0 + 12);
  c.verified_epoch = s.Int(c0 + 13);
  c.verified_at = s.Real(c0 + 14);
  c.check_error = s.Text(c0 + 15);
  c.proven = s.Int(c0 + 16) != 0;
  c.standby = s.Int(c0 + 17) != 0;
  return c;
}


double RewardRate(int64_t recent_demand, int uncovered_windows, int total_windows) {
  const double d = std::min(4.0, static_cast<double>(recent_demand) / 10.0);
  const double u =
      total_windows > 0 ? static_cast<double>(uncovered_windows) / total_windows : 0.0;
  return std::round((1 + d) * (1 + u) * 1000) / 1000;
}

Result<std::unique_ptr<Store>> Store::Open(const std::string& path) {
  KV_ASSIGN_OR_RETURN(auto db, Db::Open(path));
  if (db->postgres()) {
    // Processes starting together must not create the tables at once (the catalog's own unique
    // keys would refuse one of them).
    KV_RETURN_IF_ERROR(db->Exec("SELECT pg_advisory_lock(7305)"));
    Status made;
    // The schema's statements lock tables that a process already serving writes: a deadlock
    // between them is run again, as a transaction's would be.
    for (int attempt = 1; attempt <= 8; ++attempt) {
      made = PostgresUpgrade(db.get());
      if (made.ok()) made = db->Exec(kStandbyIndex);
      if (made.ok() || !db->TakeRetryable()) break;
      BackOff(attempt);
    }
    KV_RETURN_IF_ERROR(db->Exec("SELECT pg_advisory_unlock(7305)"));
    KV_RETURN_IF_ERROR(made);
    return std::unique_ptr<Store>(new Store(std::move(db)));
  }
  KV_RETURN_IF_ERROR(db->Exec(kSchema));
  bool recount = false;
  for (const AddedColumn& c : kAddedColumns) {
    KV_ASSIGN_OR_RETURN(auto s, db->Prepare(fmt::format("SELECT 1 FROM pragma_table_info('{}') "
                                                        "WHERE name = ?",
                                                        c.table)));
    KV_ASSIGN_OR_RETURN(bool has, s.Bind(1, std::string_view(c.name)).Step());
    if (!has) {
      KV_RETURN_IF_ERROR(
          db->Exec(fmt::format("ALTER TABLE {} ADD COLUMN {} {}", c.table, c.name, c.definition)));
      recount = recount || std::string_view(c.name) == "n_held";
    }
  }
  // A migrated claims table is a new table: its triggers are made after it, and its counts
  // taken again.
  KV_ASSIGN_OR_RETURN(const bool migrated, AddStandbyColumn(db.get()));
  KV_RETURN_IF_ERROR(db->Exec(kStandbyIndex));
  KV_RETURN_IF_ERROR(db->Exec(kSqliteTriggers));
  if (recount || migrated) KV_RETURN_IF_ERROR(db->Exec(kRecount));
  return std::unique_ptr<Store>(new Store(std::move(db)));
}

Result<double> Store::Meta(const char* key) {
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT value FROM meta WHERE key = ?"));
  KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, std::string_view(key)).Step());
  return row ? s.Real(0) : 0.0;
}

Status Store::SetMeta(const char* key, double value) {
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("INSERT INTO meta(key, value) VALUES(?, ?) ON "
                                           "CONFLICT(key) DO UPDATE SET value = excluded.value"));
  return s.Bind(1, std::string_view(key)).Bind(2, value).Run();
}

Status Store::ResumeOnce(double now) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(SetMeta(kMetaResumedAt, now));
  return txn->Commit();
}

Status Store::BumpEpoch(int64_t model_row, int ring) {
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE rings SET epoch = epoch + 1 WHERE model = ? "
                                           "AND ring = ?"));
  return s.Bind(1, model_row).Bind(2, ring).Run();
}

Result<int64_t> Store::ModelRow(const std::string& name) {
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT id FROM models WHERE name = ?"));
  KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, name).Step());
  if (!row) return Error(StatusCode::kNotFound, "no model named '{}'", name);
  return s.Int(0);
}

Status Store::Sweep(double now) {
  // The lease clock: the wall clock, except in a silence (no heartbeat answered for half a
  // lease), when it stops where the silence began for claims made before it, for at most
  // kMaxForgivenSilenceSeconds after the silence began or this market process started.
  double last_beat = 0, resumed_at = 0;
  {
    // Both in one statement: every transaction starts here, and on PostgreSQL each statement is
    // a round trip.
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT (SELECT value FROM meta WHERE key = ?1), "
                                             "(SELECT value FROM meta WHERE key = ?2)"));
    KV_ASSIGN_OR_RETURN(bool row, s.Bind(1, std::string_view(kMetaLastBeat))
                                      .Bind(2, std::string_view(kMetaResumedAt))
                                      .Step());
    if (row && !s.IsNull(0)) last_beat = s.Real(0);
    if (row && !s.IsNull(1)) resumed_at = s.Real(1);
  }
  double lease_clock = now, silence_start = now;
  silent_ = last_beat > 0 && now - last_beat > lease_s_ / 2;
  last_beat_ = last_beat;
  if (silent_) {
    silence_start = last_beat + lease_s_ / 2;
    const double origin = std::max(silence_start, resumed_at);
    lease_clock = silence_start + std::max(0.0, now - origin - kMaxForgivenSilenceSeconds);
  }
  // The lease clock is never ahead of `now`: the first bound lets the index on expires find the
  // claims due without reading the others.
  constexpr const char* kDue =
      "expires <= ?3 AND expires <= CASE WHEN created < ?1 THEN ?2 ELSE ?3 END";
  KV_RETURN_IF_ERROR(WriteRenewalsDue(kDue, silence_start, lease_clock, now));
  {
    // A standby leaving changes no ring's set of serving claims. The standbys are told apart
    // here, not in the query: given `standby = 0`, the planner walked the standby index over
    // every claim (each heartbeat read all 10,000) instead of the few due by the index on expires.
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare(fmt::format("SELECT model, ring, standby FROM claims "
                                                         "WHERE {}",
                                                         kDue)));
    s.Bind(1, silence_start).Bind(2, lease_clock).Bind(3, now);
    std::vector<std::pair<int64_t, int>> gone;
    bool due = false;
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, s.Step());
      if (!row) break;
      due = true;
      if (s.Int(2) == 0) gone.emplace_back(s.Int(0), static_cast<int>(s.Int(1)));
    }
    for (auto [model, ring] : gone) KV_RETURN_IF_ERROR(BumpEpoch(model, ring));
    // Nothing due (the common case): no DELETE to send.
    if (due) {
      KV_ASSIGN_OR_RETURN(auto d, db_->Prepare(fmt::format("DELETE FROM claims WHERE {}", kDue)));
      KV_RETURN_IF_ERROR(d.Bind(1, silence_start).Bind(2, lease_clock).Bind(3, now).Run());
    }
  }
  // Expired nonces at most once a second: one left a second longer refuses nothing (a request's
  // time is checked before its nonce, and a nonce is random).
  if (!(now >= nonce_sweep_at_ && now - nonce_sweep_at_ < 1)) {
    nonce_sweep_at_ = now;
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("DELETE FROM nonces WHERE expires <= ?"));
    KV_RETURN_IF_ERROR(s.Bind(1, now).Run());
  }
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("DELETE FROM demand WHERE time < ?"));
    KV_RETURN_IF_ERROR(s.Bind(1, now - kRecentSeconds).Run());
  }
  // Nobody could report serving during a silence; and deadlines are coarse, so the scan (over
  // every claim) runs at most once a second.
  if (!silent_ && !(now >= evict_scan_at_ && now - evict_scan_at_ < 1)) {
    evict_scan_at_ = now;
    KV_RETURN_IF_ERROR(EvictIdle(now));
  }
  // A window freed (lease, eviction, release) goes to its standbys before any new claimer.
  return PromoteStandbys(now);
}

Status Store::AddModelOnce(const ModelSpec& spec, bool replace, double now) {
  // 0 is allowed (the model earns nothing until it is added again with a bound).
  if (!(spec.max_rows_per_s >= 0) || !std::isfinite(spec.max_rows_per_s)) {
    return Error("model '{}': max_rows_per_s must be a number of token rows per second, not {}",
                 spec.name, spec.max_rows_per_s);
  }
  if (spec.ctx < 1) return Error("model '{}': ctx must be positive, not {}", spec.name, spec.ctx);
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
                                             "ctx, added, max_rows_per_s, n_windows) VALUES(?, ?, "
                                             "?, ?, ?, ?, ?, ?) RETURNING id"));
  int64_t n_windows = 0;
  for (const auto& r : spec.rings) n_windows += static_cast<int64_t>(r.size());
  KV_ASSIGN_OR_RETURN(const bool inserted, ins.Bind(1, spec.name)
                                               .Bind(2, spec.model_id)
                                               .Bind(3, spec.url)
                                               .Bind(4, spec.n_layer)
                                               .Bind(5, spec.ctx)
                                               .Bind(6, now)
                                               .Bind(7, spec.max_rows_per_s)
                                               .Bind(8, n_windows)
                                               .Step());
  if (!inserted) return Error("{}: model '{}': no id returned", db_->path(), spec.name);
  const int64_t model_row = ins.Int(0);
  KV_RETURN_IF_ERROR(ins.Run());  // SQLite commits no statement left halfway
  for (size_t r = 0; r < spec.rings.size(); ++r) {
    KV_ASSIGN_OR_RETURN(auto ring, db_->Prepare("INSERT INTO rings(model, ring) VALUES(?, ?)"));
    KV_RETURN_IF_ERROR(ring.Bind(1, model_row).Bind(2, static_cast<int>(r)).Run());
    for (size_t w = 0; w < spec.rings[r].size(); ++w) {
      const WindowSpec& win = spec.rings[r][w];
      nlohmann::json tensors = nlohmann::json::array();
      for (const auto& t : win.tensors) tensors.push_back({{"name", t.name}, {"sha256", t.sha256}});
      KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("INSERT INTO windows(model, ring, window, first, "
                                               "last, bytes, memory, tensors, samples) VALUES(?, "
                                               "?, ?, ?, ?, ?, ?, ?, ?)"));
      KV_RETURN_IF_ERROR(s.Bind(1, model_row)
                             .Bind(2, static_cast<int>(r))
                             .Bind(3, static_cast<int>(w))
                             .Bind(4, win.first)
                             .Bind(5, win.last)
                             .Bind(6, static_cast<int64_t>(win.bytes))
                             .Bind(7, static_cast<int64_t>(win.memory))
                             .Bind(8, tensors.dump())
                             .Bind(9, SamplesToJson(win.samples))
                             .Run());
    }
  }
  return txn->Commit();
}

Result<std::vector<ModelState>> Store::ReadModels(double now, const std::string& only,
                                                  int only_ring, bool overlay) {
  std::vector<ModelState> models;
  std::vector<int64_t> rows;
  std::vector<std::pair<int64_t, int64_t>> counts;  // windows, held
  {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT id, name, model_id, url, n_layer, ctx, "
                                             "demand_total, max_rows_per_s, n_windows, n_held FROM "
                                             "models WHERE ? = '' OR name = ? ORDER BY name"));
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
      m.max_rows_per_s = s.Real(7);
      counts.emplace_back(s.Int(8), s.Int(9));
      models.push_back(std::move(m));
    }
  }
  for (size_t i = 0; i < models.size(); ++i) {
    ModelState& m = models[i];
    {
      KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT (SELECT count(*) FROM demand WHERE model = "
                                               "?), (SELECT count(*) FROM receipts WHERE model = ? "
                                               "AND time > ?)"));
      KV_ASSIGN_OR_RETURN(bool row,
                          s.Bind(1, rows[i]).Bind(2, m.name).Bind(3, now - kRecentSeconds).Step());
      m.requests_recent = row ? s.Int(0) : 0;
      m.sessions_recent = row ? s.Int(1) : 0;
      m.demand_recent = std::min(m.requests_recent, m.sessions_recent);
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
      // The ring as its own condition (not `?2 < 0 OR ring = ?2`), so the key finds its rows.
      KV_ASSIGN_OR_RETURN(
          auto s, db_->Prepare(fmt::format("SELECT ring, window, first, last, bytes, memory FROM "
                                           "windows WHERE model = ?1{} ORDER BY ring, window",
                                           only_ring >= 0 ? " AND ring = ?2" : "")));
      s.Bind(1, rows[i]);
      if (only_ring >= 0) s.Bind(2, only_ring);
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
      // Every claim left after the sweep is live.
      KV_ASSIGN_OR_RETURN(auto s, db_->Prepare(fmt::format(
                                      "SELECT {} FROM claims c JOIN models m ON m.id = c.model "
                                      "WHERE c.model = ?1{} ORDER BY c.id",
                                      kClaimColumns, only_ring >= 0 ? " AND c.ring = ?2" : "")));
      s.Bind(1, rows[i]);
      if (only_ring >= 0) s.Bind(2, only_ring);
      while (true) {
        KV_ASSIGN_OR_RETURN(bool row, s.Step());
        if (!row) break;
        ClaimInfo c = ClaimFromRow(s, 0);
        if (overlay) Overlay(&c);
        const auto r = static_cast<size_t>(c.ring);
        if (r < m.rings.size() && static_cast<size_t>(c.window) < m.rings[r].windows.size()) {
          WindowState& w = m.rings[r].windows[static_cast<size_t>(c.window)];
          if (c.standby) {
            w.standbys.push_back(std::move(c));
          } else {
            w.claim = std::move(c);
          }
        }
      }
    }
    // Over the whole model, even when only one ring was read.
    const auto [total, held] = counts[i];
    const double rate_now =
        RewardRate(m.demand_recent, static_cast<int>(total - held), static_cast<int>(total));
    for (RingState& r : m.rings) DeriveRing(&r, rate_now);
  }
  return models;
}

void DeriveRing(RingState* ring, double rate_now) {
  RingState& r = *ring;
  r.complete = !r.windows.empty();
  r.serving = r.ready = r.complete;
  r.ready_since = 0;
  for (WindowState& w : r.windows) {
    w.rate = w.claim ? w.claim->rate : rate_now;
    if (!w.claim) {
      r.complete = r.serving = r.ready = false;
      continue;
    }
    const ClaimInfo& c = *w.claim;
    if (c.serving_epoch != r.epoch || !c.proven) r.serving = r.ready = false;
    if (c.checked() && c.verified_epoch != r.epoch) r.ready = false;
    r.ready_since = std::max({r.ready_since, c.serving_since, c.checked() ? c.verified_at : 0.0});
  }
  if (!r.ready) r.ready_since = 0;
}

Result<std::vector<ModelState>> Store::MapOnce(double now) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  KV_ASSIGN_OR_RETURN(auto models, ReadModels(now, ""));
  KV_RETURN_IF_ERROR(txn->Commit());
  return models;
}

Result<std::pair<ModelState, RingState>> Store::PickRingOnce(const std::string& model,
                                                         const std::string& source, double now) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  KV_ASSIGN_OR_RETURN(auto models, ReadModels(now, model));
  if (models.empty()) return Error(StatusCode::kNotFound, "no model named '{}'", model);
  ModelState& m = models[0];
  KV_ASSIGN_OR_RETURN(const int64_t model_row, ModelRow(model));
  const RingState* best = nullptr;
  int64_t best_load = 0;
  int uncovered = 0, claimed = 0, serving = 0;
  for (const RingState& r : m.rings) {
    for (const WindowState& w : r.windows) (w.claim ? claimed : uncovered)++;
    if (r.serving && !r.ready) ++serving;
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
  if (best == nullptr) {
    // Nothing is counted: a request the market cannot answer is not demand anyone can meet, and
    // counting it would let anyone raise a model's reward by asking from many addresses.
    return Error(StatusCode::kUnavailable,
                 "no ring of '{}' is ready: {} of {} windows are uncovered, the rest are claimed "
                 "but not all serving yet{}",
                 model, uncovered, uncovered + claimed,
                 serving > 0 ? fmt::format(" ({} ring(s) serving, waiting for the market's check "
                                           "of their holders)",
                                           serving)
                             : "");
  }
  // One address counts once in a while.
  KV_ASSIGN_OR_RETURN(auto seen, db_->Prepare("SELECT 1 FROM demand WHERE model = ? AND source = "
                                               "? AND time > ?"));
  KV_ASSIGN_OR_RETURN(bool again, seen.Bind(1, model_row)
                                      .Bind(2, source)
                                      .Bind(3, now - kDemandSpacingSeconds)
                                      .Step());
  if (!again) {
    KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("UPDATE models SET demand_total = demand_total + 1 "
                                             "WHERE id = ?"));
    KV_RETURN_IF_ERROR(s.Bind(1, model_row).Run());
    KV_ASSIGN_OR_RETURN(auto d, db_->Prepare("INSERT INTO demand(model, ring, source, time) "
                                             "VALUES(?, ?, ?, ?)"));
    KV_RETURN_IF_ERROR(d.Bind(1, model_row).Bind(2, best->ring).Bind(3, source).Bind(4, now).Run());
  }
  KV_RETURN_IF_ERROR(txn->Commit());
  return std::pair<ModelState, RingState>{m, *best};
}

Result<bool> Store::UseNonceOnce(const std::string& node, const std::string& nonce, double now,
                             double keep_s) {
  // No sweep: a nonce is the first of a request's two transactions, and the second sweeps (a
  // nonce expired but not yet swept is refused as used, which its request's time refuses anyway).
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_ASSIGN_OR_RETURN(const bool fresh, InsertNonce(node, nonce, now, keep_s));
  KV_RETURN_IF_ERROR(txn->Commit());
  return fresh;
}

Result<bool> Store::InsertNonce(const std::string& node, const std::string& nonce, double now,
                                double keep_s) {
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("INSERT INTO nonces(node, nonce, expires) VALUES(?, "
                                           "?, ?) ON CONFLICT DO NOTHING"));
  KV_RETURN_IF_ERROR(s.Bind(1, node).Bind(2, nonce).Bind(3, now + keep_s).Run());
  return db_->Changes() == 1;
}

Result<std::pair<int64_t, int64_t>> Store::CountsOnce(double now) {
  KV_ASSIGN_OR_RETURN(auto txn, Transaction::Begin(db_.get()));
  KV_RETURN_IF_ERROR(Sweep(now));
  KV_ASSIGN_OR_RETURN(auto s, db_->Prepare("SELECT (SELECT count(*) FROM models), (SELECT "
                                           "count(*) FROM claims)"));
  KV_ASSIGN_OR_RETURN(bool row, s.Step());
  std::pair<int64_t, int64_t> counts{0, 0};
  if (row) counts = {s.Int(0), s.Int(1)};
  KV_RETURN_IF_ERROR(txn->Commit());
  return counts;
}

}  // namespace kvasir::market
