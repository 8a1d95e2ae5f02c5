// The PostgreSQL back end of sql.h, over libpq. Parameters go as text with the type they were
// bound as (bigint, double precision, text), blobs as binary bytea; rows come back as text.
#include <fmt/format.h>
#include <libpq-fe.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "market/sql.h"

namespace kvasir::market {
namespace {

// Parameter types (pg_type OIDs): each parameter is sent with the type it was bound as.
constexpr unsigned kInt8Oid = 20, kTextOid = 25, kFloat8Oid = 701, kByteaOid = 17;

// `?N` -> `$N`, each bare `?` -> `$N` numbered as SQLite does, and the column `window` quoted. The
// store's SQL has no `?` or `window` inside string literals.
std::string Translate(std::string_view sql) {
  std::string out;
  int next = 0;
  for (size_t i = 0; i < sql.size(); ++i) {
    const char c = sql[i];
    if (c == '?') {
      size_t j = i + 1;
      while (j < sql.size() && sql[j] >= '0' && sql[j] <= '9') ++j;
      // As SQLite numbers them: a bare `?` is one more than the largest number so far.
      const int n =
          j > i + 1 ? std::atoi(std::string(sql.substr(i + 1, j - i - 1)).c_str()) : next + 1;
      next = std::max(next, n);
      out += '$' + std::to_string(n);
      i = j - 1;
      continue;
    }
    auto word = [&](size_t at) {
      return at < sql.size() &&
             (std::isalnum(static_cast<unsigned char>(sql[at])) != 0 || sql[at] == '_');
    };
    if (c == 'w' && sql.substr(i, 6) == "window" && !word(i + 6) && (i == 0 || !word(i - 1))) {
      out += "\"window\"";
      i += 5;
      continue;
    }
    out += c;
  }
  return out;
}

class PgDb;

class PgStmt final : public StmtImpl {
 public:
  PgStmt(PgDb* db, std::string sql) : db_(db), sql_(std::move(sql)) {}
  ~PgStmt() override { PQclear(result_); }
  Status BindInt(int i, int64_t v) override { return Set(i, std::to_string(v), kInt8Oid); }
  Status BindReal(int i, double v) override { return Set(i, fmt::format("{}", v), kFloat8Oid); }
  Status BindText(int i, std::string_view v) override { return Set(i, std::string(v), kTextOid); }
  Status BindBlob(int i, std::string_view v) override { return Set(i, std::string(v), kByteaOid); }
  Result<bool> Step() override;
  // Sends the statement into the connection's pipeline (PgDb::RunBatch), preparing it there first
  // when this connection has not yet.
  Status Send(std::vector<std::string>* prepared_now);
  // The statement's outcome, as the pipeline gave it back: taken over (PQclear'd with the
  // statement); an error is returned.
  Status Take(PGresult* r);
  // Marks the statement as run, without rows, until the pipeline gives it its result (Take): a
  // statement of a failed batch never runs on its own.
  void Abort() {
    ran_ = true;
    PQclear(result_);
    result_ = nullptr;
    row_ = -1;
    rows_ = 0;
  }
  const std::string& sql() const { return sql_; }
  int64_t Int(int col) const override {
    const char* v = PQgetvalue(result_, row_, col);
    if (v[0] == 't' && v[1] == '\0') return 1;  // a boolean
    return std::strtoll(v, nullptr, 10);
  }
  double Real(int col) const override {
    return std::strtod(PQgetvalue(result_, row_, col), nullptr);
  }
  std::string Text(int col) const override {
    return std::string(PQgetvalue(result_, row_, col),
                       static_cast<size_t>(PQgetlength(result_, row_, col)));
  }
  bool IsNull(int col) const override { return PQgetisnull(result_, row_, col) != 0; }

 private:
  Status Set(int i, std::string v, unsigned type) {
    if (i < 1 || i > 64) return Error("parameter {} of '{}': out of range", i, sql_.substr(0, 60));
    if (static_cast<size_t>(i) > values_.size()) {
      values_.resize(static_cast<size_t>(i));
      types_.resize(static_cast<size_t>(i));
    }
    values_[static_cast<size_t>(i - 1)] = std::move(v);
    types_[static_cast<size_t>(i - 1)] = type;
    return Status::Ok();
  }
  // libpq's view of the bound parameters (pointing into values_).
  struct Params {
    std::vector<const char*> values;
    std::vector<int> lengths, formats;
    std::vector<unsigned> types;
  };
  Params Bound() const {
    Params p;
    p.values.resize(values_.size());
    p.lengths.resize(values_.size());
    p.formats.resize(values_.size());
    p.types = types_;
    for (size_t i = 0; i < values_.size(); ++i) {
      p.values[i] = values_[i] ? values_[i]->data() : nullptr;
      p.lengths[i] = values_[i] ? static_cast<int>(values_[i]->size()) : 0;
      p.formats[i] = types_[i] == kByteaOid ? 1 : 0;  // bytea as raw bytes, the rest as text
    }
    return p;
  }
  PgDb* db_;
  std::string sql_;
  std::vector<std::optional<std::string>> values_;
  std::vector<unsigned> types_;
  PGresult* result_ = nullptr;
  int row_ = -1, rows_ = 0;
  bool ran_ = false;
};

class PgDb final : public Db {
 public:
  PgDb(PGconn* conn, std::string name) : Db(std::move(name)), conn_(conn) {}
  ~PgDb() override { PQfinish(conn_); }
  Result<Stmt> Prepare(std::string_view sql) override {
    return Stmt(std::make_unique<PgStmt>(this, Translate(sql)));
  }
  Status Exec(std::string_view sql) override {
    if (!pending_.empty()) {
      // A transaction that sent nothing yet ends without a round trip; anything else goes in
      // one simple query with its BEGIN (and SET LOCALs).
      if (sql == "COMMIT" || sql == "ROLLBACK") {
        pending_.clear();
        return Status::Ok();
      }
      pending_ += "; ";
      pending_ += sql;
      if (sql.starts_with("SET LOCAL ")) return Status::Ok();
      return StartPending();
    }
    return Run(sql);
  }
  int64_t Changes() const override { return changes_; }
  // Sent when the transaction's first statement is (Exec above, StartPending): a heartbeat's
  // BEGIN and its SET LOCAL go in one round trip, and a transaction that sent nothing ends
  // without one.
  Status Begin() override {
    pending_ = "BEGIN ISOLATION LEVEL SERIALIZABLE";
    return Status::Ok();
  }
  bool postgres() const override { return true; }
  Status RunBatch(std::span<Stmt* const> stmts) override;

  PGconn* conn() { return conn_; }
  void set_changes(int64_t n) { changes_ = n; }
  // Sends what Begin and Exec left waiting, if anything.
  Status StartPending() {
    if (pending_.empty()) return Status::Ok();
    return Run(std::exchange(pending_, {}));
  }
  // The name of the server-side statement prepared for `sql` with these parameter types on this
  // connection (prepared on first use: one round trip, then no parsing or planning per run); ""
  // for statements run unprepared (schema and other utility statements).
  Result<std::string> PreparedName(const std::string& sql, const std::vector<unsigned>& types) {
    if (!Cacheable(sql)) return std::string();
    std::string key = PreparedKey(sql, types);
    if (auto it = prepared_.find(key); it != prepared_.end()) return it->second;
    std::string name = "k" + std::to_string(prepared_.size());
    PGresult* r =
        PQprepare(conn_, name.c_str(), sql.c_str(), static_cast<int>(types.size()), types.data());
    Status s = Check(r, sql);
    PQclear(r);
    KV_RETURN_IF_ERROR(s);
    prepared_.emplace(std::move(key), name);
    return name;
  }
  static std::string PreparedKey(const std::string& sql, const std::vector<unsigned>& types) {
    std::string key = sql;
    for (unsigned t : types) key += "\x1f" + std::to_string(t);
    return key;
  }
  // For a pipeline (PgStmt::Send): the name `sql` has or will have on this connection, and
  // whether it must be prepared first; "" for a statement run unprepared.
  std::pair<std::string, bool> PipelineName(const std::string& sql,
                                            const std::vector<unsigned>& types,
                                            const std::vector<std::string>& prepared_now) {
    if (!Cacheable(sql)) return {"", false};
    const std::string key = PreparedKey(sql, types);
    if (auto it = prepared_.find(key); it != prepared_.end()) return {it->second, false};
    // Named after those prepared before and those this pipeline prepares before it.
    for (size_t i = 0; i < prepared_now.size(); ++i) {
      if (prepared_now[i] == key) return {"k" + std::to_string(prepared_.size() + i), false};
    }
    return {"k" + std::to_string(prepared_.size() + prepared_now.size()), true};
  }
  // Once the pipeline's preparations succeeded: kept, in the order they were named.
  void KeepPrepared(const std::vector<std::string>& keys) {
    const size_t base = prepared_.size();
    for (size_t i = 0; i < keys.size(); ++i)
      prepared_.emplace(keys[i], "k" + std::to_string(base + i));
  }
  // OK for a result that succeeded; otherwise the error, marking a retryable one.
  Status Check(PGresult* r, std::string_view sql) {
    const ExecStatusType st = PQresultStatus(r);
    if (st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK) return Status::Ok();
    const char* state = r != nullptr ? PQresultErrorField(r, PG_DIAG_SQLSTATE) : nullptr;
    const std::string code = state != nullptr ? state : "";
    // 40001 serialization_failure, 40P01 deadlock_detected: run the transaction again. So also
    // for a unique (23505) or exclusion (23P01) violation inside a transaction, which PostgreSQL
    // reports instead of a serialization failure when a concurrent transaction inserted the key
    // after this one's snapshot without this one having read it through that index; run again,
    // the transaction sees the row and answers from it (who holds the window).
    const bool in_transaction = PQtransactionStatus(conn_) == PQTRANS_INERROR;
    if (code == "40001" || code == "40P01" ||
        (in_transaction && (code == "23505" || code == "23P01"))) {
      retryable_ = true;
    }
    // Connection trouble and too many clients may pass; anything else is the statement's fault.
    const bool passing = code.starts_with("08") || code == "53300" || code == "57P01" ||
                         PQstatus(conn_) != CONNECTION_OK;
    std::string why = r != nullptr ? PQresultErrorMessage(r) : PQerrorMessage(conn_);
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    if (PQstatus(conn_) != CONNECTION_OK) {
      PQreset(conn_);
      prepared_.clear();  // a new session has none of them
      pending_.clear();
    }
    return Status::Error(
        fmt::format("{}: '{}': {}", path_, sql.substr(0, 60), why),
        passing || retryable_ ? StatusCode::kUnavailable : StatusCode::kInvalidInput);
  }

 private:
  Status Run(std::string_view sql) {
    PGresult* r = PQexec(conn_, std::string(sql).c_str());
    Status s = Check(r, sql);
    PQclear(r);
    return s;
  }
  static bool Cacheable(std::string_view sql) {
    for (std::string_view verb : {"SELECT ", "INSERT ", "UPDATE ", "DELETE ", "WITH "}) {
      if (sql.starts_with(verb)) return true;
    }
    return false;
  }
  PGconn* conn_;
  int64_t changes_ = 0;
  std::string pending_;                                    // BEGIN (and SET LOCALs) not sent yet
  std::unordered_map<std::string, std::string> prepared_;  // SQL + types -> statement name
};

Result<bool> PgStmt::Step() {
  if (!ran_) {
    ran_ = true;
    Params p = Bound();
    KV_RETURN_IF_ERROR(db_->StartPending());
    auto name = db_->PreparedName(sql_, p.types);
    if (!name.ok()) return name.status();
    PGresult* r = nullptr;
    const int n = static_cast<int>(p.values.size());
    if (name->empty()) {
      r = PQexecParams(db_->conn(), sql_.c_str(), n, p.types.data(), p.values.data(),
                       p.lengths.data(), p.formats.data(), 0);
    } else {
      r = PQexecPrepared(db_->conn(), name->c_str(), n, p.values.data(), p.lengths.data(),
                         p.formats.data(), 0);
    }
    KV_RETURN_IF_ERROR(Take(r));
  }
  if (row_ + 1 >= rows_) {
    row_ = rows_;
    return false;
  }
  ++row_;
  return true;
}

Status PgStmt::Take(PGresult* r) {
  ran_ = true;
  PQclear(result_);
  result_ = r;
  row_ = -1;
  rows_ = 0;
  KV_RETURN_IF_ERROR(db_->Check(result_, sql_));
  rows_ = PQntuples(result_);
  const char* n = PQcmdTuples(result_);
  db_->set_changes(n != nullptr && n[0] != '\0' ? std::strtoll(n, nullptr, 10) : 0);
  return Status::Ok();
}

Status PgStmt::Send(std::vector<std::string>* prepared_now) {
  Params p = Bound();
  const int n = static_cast<int>(p.values.size());
  auto [name, prepare] = db_->PipelineName(sql_, p.types, *prepared_now);
  PGconn* conn = db_->conn();
  if (prepare) {
    if (PQsendPrepare(conn, name.c_str(), sql_.c_str(), n, p.types.data()) == 0) {
      return Error(StatusCode::kUnavailable, "{}: '{}': {}", db_->path(), sql_.substr(0, 60),
                   PQerrorMessage(conn));
    }
    prepared_now->push_back(PgDb::PreparedKey(sql_, p.types));
  }
  const int sent = name.empty()
                       ? PQsendQueryParams(conn, sql_.c_str(), n, p.types.data(), p.values.data(),
                                           p.lengths.data(), p.formats.data(), 0)
                       : PQsendQueryPrepared(conn, name.c_str(), n, p.values.data(),
                                             p.lengths.data(), p.formats.data(), 0);
  if (sent == 0) {
    return Error(StatusCode::kUnavailable, "{}: '{}': {}", db_->path(), sql_.substr(0, 60),
                 PQerrorMessage(conn));
  }
  return Status::Ok();
}

Status PgDb::RunBatch(std::span<Stmt* const> stmts) {
  for (Stmt* s : stmts) KV_RETURN_IF_ERROR(s->bind_status());
  // What a pipeline sends, in order: the transaction's BEGIN and SET LOCALs not sent yet, then
  // each statement, after its preparation where this connection has none yet.
  struct Sent {
    PgStmt* stmt = nullptr;  // null: a BEGIN / SET LOCAL, or a preparation
    std::string sql;
    bool prepare = false;
  };
  std::vector<Sent> sent;
  std::vector<std::string> prepared_now;
  if (PQenterPipelineMode(conn_) == 0) {
    return Error(StatusCode::kUnavailable, "{}: cannot start a pipeline: {}", path_,
                 PQerrorMessage(conn_));
  }
  Status failed;
  auto fail = [&](Status s) {
    if (failed.ok()) failed = std::move(s);
  };
  size_t from = 0;
  const std::string pending = std::exchange(pending_, {});
  while (from < pending.size()) {
    // One statement at a time: a pipeline sends no multi-statement string.
    size_t end = pending.find("; ", from);
    if (end == std::string::npos) end = pending.size();
    const std::string one = pending.substr(from, end - from);
    from = end + 2;
    if (PQsendQueryParams(conn_, one.c_str(), 0, nullptr, nullptr, nullptr, nullptr, 0) == 0) {
      fail(Error(StatusCode::kUnavailable, "{}: '{}': {}", path_, one, PQerrorMessage(conn_)));
      break;
    }
    sent.push_back({nullptr, one, false});
  }
  for (Stmt* s : stmts) static_cast<PgStmt*>(s->impl())->Abort();
  for (size_t i = 0; failed.ok() && i < stmts.size(); ++i) {
    auto* st = static_cast<PgStmt*>(stmts[i]->impl());
    const size_t before = prepared_now.size();
    if (Status s = st->Send(&prepared_now); !s.ok()) {
      fail(std::move(s));
      break;
    }
    if (prepared_now.size() > before) sent.push_back({nullptr, st->sql(), true});
    sent.push_back({st, st->sql(), false});
  }
  if (PQpipelineSync(conn_) == 0) {
    fail(Error(StatusCode::kUnavailable, "{}: pipeline: {}", path_, PQerrorMessage(conn_)));
  }
  // Every result, up to the sync, is read even after a failure, so the connection is ready for
  // the next statement. The first error is checked once out of the pipeline, where the
  // transaction's state tells whether it is worth running again (Check).
  PGresult* error = nullptr;
  std::string error_sql;
  size_t n_prepared = 0;  // the preparations that succeeded: those before any failure
  for (const Sent& s : sent) {
    PGresult* r = PQgetResult(conn_);
    if (r == nullptr) break;  // the connection failed: nothing more comes
    const ExecStatusType st = PQresultStatus(r);
    const bool ok = st == PGRES_COMMAND_OK || st == PGRES_TUPLES_OK;
    if (!ok && st != PGRES_PIPELINE_ABORTED && error == nullptr) {
      error = r;
      error_sql = s.sql;
      r = nullptr;
    }
    if (ok && s.prepare) ++n_prepared;
    if (s.stmt != nullptr) {
      if (ok) {
        (void)s.stmt->Take(r);
      } else {
        PQclear(r);
      }
    } else {
      PQclear(r);
    }
    while (PGresult* extra = PQgetResult(conn_)) PQclear(extra);  // the end of this one's results
  }
  // The sync's own result.
  while (PGresult* r = PQgetResult(conn_)) {
    const bool sync = PQresultStatus(r) == PGRES_PIPELINE_SYNC;
    PQclear(r);
    if (sync) break;
  }
  (void)PQexitPipelineMode(conn_);
  prepared_now.resize(n_prepared);
  KeepPrepared(prepared_now);
  if (error != nullptr) {
    Status s = Check(error, error_sql);
    PQclear(error);
    fail(std::move(s));
  } else if (failed.ok() && PQstatus(conn_) != CONNECTION_OK) {
    fail(Check(nullptr, "pipeline"));
  }
  if (!failed.ok() && PQstatus(conn_) == CONNECTION_OK &&
      PQpipelineStatus(conn_) != PQ_PIPELINE_OFF) {
    // A send that failed midway left the pipeline open: the connection is reset.
    PQreset(conn_);
    prepared_.clear();
  }
  return failed;
}

// The URL without its password, for messages.
std::string Redacted(const std::string& url) {
  const size_t scheme = url.find("://");
  const size_t at = url.find('@');
  if (scheme == std::string::npos || at == std::string::npos) return url;
  const size_t colon = url.find(':', scheme + 3);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon) + ":***" + url.substr(at);
}

}  // namespace

Result<std::unique_ptr<Db>> OpenPostgres(const std::string& url) {
  PGconn* conn = PQconnectdb(url.c_str());
  const std::string name = Redacted(url);
  if (conn == nullptr || PQstatus(conn) != CONNECTION_OK) {
    std::string why = conn != nullptr ? PQerrorMessage(conn) : "out of memory";
    while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) why.pop_back();
    if (conn != nullptr) PQfinish(conn);
    return Status::Error(fmt::format("{}: cannot connect: {}", name, why),
                         StatusCode::kUnavailable);
  }
  // Notices ("relation already exists, skipping") are not the market's log.
  PQsetNoticeProcessor(
      conn, [](void*, const char*) {}, nullptr);
  auto db = std::make_unique<PgDb>(conn, name);
  // No statement waits longer than this for a row another process holds.
  KV_RETURN_IF_ERROR(db->Exec("SET lock_timeout = '5s'"));
  return std::unique_ptr<Db>(std::move(db));
}

}  // namespace kvasir::market
