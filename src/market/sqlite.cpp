#include "market/sqlite.h"

#include <fmt/format.h>
#include <sqlite3.h>

namespace kvasir::market {

Stmt::Stmt(Db* db, sqlite3_stmt* stmt, std::string sql)
    : db_(db), stmt_(stmt), sql_(std::move(sql)) {}

Stmt::Stmt(Stmt&& other) noexcept
    : db_(other.db_), stmt_(other.stmt_), sql_(std::move(other.sql_)),
      bind_error_(std::move(other.bind_error_)) {
  other.stmt_ = nullptr;
}

Stmt::~Stmt() {
  if (stmt_ != nullptr) sqlite3_finalize(stmt_);
}

Stmt& Stmt::Bind(int i, int64_t v) {
  if (sqlite3_bind_int64(stmt_, i, v) != SQLITE_OK && bind_error_.ok()) {
    bind_error_ = db_->Fail(fmt::format("bind {} of '{}'", i, sql_));
  }
  return *this;
}

Stmt& Stmt::Bind(int i, double v) {
  if (sqlite3_bind_double(stmt_, i, v) != SQLITE_OK && bind_error_.ok()) {
    bind_error_ = db_->Fail(fmt::format("bind {} of '{}'", i, sql_));
  }
  return *this;
}

Stmt& Stmt::Bind(int i, std::string_view v) {
  if (sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT) !=
          SQLITE_OK &&
      bind_error_.ok()) {
    bind_error_ = db_->Fail(fmt::format("bind {} of '{}'", i, sql_));
  }
  return *this;
}

Stmt& Stmt::BindBlob(int i, std::string_view v) {
  if (sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT) !=
          SQLITE_OK &&
      bind_error_.ok()) {
    bind_error_ = db_->Fail(fmt::format("bind {} of '{}'", i, sql_));
  }
  return *this;
}

Result<bool> Stmt::Step() {
  if (!bind_error_.ok()) return bind_error_;
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return db_->Fail(fmt::format("'{}'", sql_.substr(0, 60)));
}

Status Stmt::Run() {
  while (true) {
    KV_ASSIGN_OR_RETURN(bool row, Step());
    if (!row) return Status::Ok();
  }
}

int64_t Stmt::Int(int col) const { return sqlite3_column_int64(stmt_, col); }
double Stmt::Real(int col) const { return sqlite3_column_double(stmt_, col); }
bool Stmt::IsNull(int col) const { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
std::string Stmt::Text(int col) const {
  const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt_, col));
  const int n = sqlite3_column_bytes(stmt_, col);
  return p == nullptr ? std::string() : std::string(p, static_cast<size_t>(n));
}

Result<std::unique_ptr<Db>> Db::Open(const std::string& path) {
  sqlite3* raw = nullptr;
  const int rc = sqlite3_open_v2(path.c_str(), &raw,
                                 SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX,
                                 nullptr);
  if (rc != SQLITE_OK) {
    std::string why = raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    if (raw != nullptr) sqlite3_close(raw);
    return Error("{}: cannot open the database: {}", path, why);
  }
  std::unique_ptr<Db> db(new Db(raw, path));
  sqlite3_busy_timeout(raw, 5000);
  sqlite3_extended_result_codes(raw, 1);
  KV_RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode=WAL"));
  KV_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=FULL"));
  KV_RETURN_IF_ERROR(db->Exec("PRAGMA foreign_keys=ON"));
  return db;
}

Db::~Db() { sqlite3_close(db_); }

Result<Stmt> Db::Prepare(std::string_view sql) {
  sqlite3_stmt* stmt = nullptr;
  if (sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr) !=
      SQLITE_OK) {
    return Fail(fmt::format("prepare '{}'", sql.substr(0, 60)));
  }
  return Stmt(this, stmt, std::string(sql));
}

Status Db::Exec(std::string_view sql) {
  char* err = nullptr;
  const std::string text(sql);
  if (sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
    std::string why = err != nullptr ? err : sqlite3_errmsg(db_);
    sqlite3_free(err);
    return Error("{}: '{}': {}", path_, text.substr(0, 60), why);
  }
  return Status::Ok();
}

int64_t Db::LastInsertId() const { return sqlite3_last_insert_rowid(db_); }
int Db::Changes() const { return sqlite3_changes(db_); }

Status Db::Fail(std::string_view what) const {
  const int code = sqlite3_extended_errcode(db_);
  // A full disk or a busy database may pass; a corrupt file will not.
  const StatusCode kind = (code & 0xff) == SQLITE_FULL || (code & 0xff) == SQLITE_BUSY ||
                                  (code & 0xff) == SQLITE_IOERR
                              ? StatusCode::kUnavailable
                              : StatusCode::kInvalidInput;
  return Status::Error(fmt::format("{}: {}: {}", path_, what, sqlite3_errmsg(db_)), kind);
}

Result<std::unique_ptr<Transaction>> Transaction::Begin(Db* db) {
  KV_RETURN_IF_ERROR(db->Exec("BEGIN IMMEDIATE"));
  return std::unique_ptr<Transaction>(new Transaction(db));
}

Transaction::~Transaction() {
  if (!done_) (void)db_->Exec("ROLLBACK");
}

Status Transaction::Commit() {
  KV_RETURN_IF_ERROR(db_->Exec("COMMIT"));
  done_ = true;
  return Status::Ok();
}

}  // namespace kvasir::market
