// The SQLite back end of sql.h.
#include <fmt/format.h>
#include <sqlite3.h>

#include <string>
#include <unordered_map>
#include <vector>

#include "market/sql.h"

namespace kvasir::market {
namespace {

class SqliteDb;

class SqliteStmt final : public StmtImpl {
 public:
  SqliteStmt(SqliteDb* db, sqlite3* raw, sqlite3_stmt* stmt, std::string sql)
      : db_(db), raw_(raw), stmt_(stmt), sql_(std::move(sql)) {}
  ~SqliteStmt() override;
  Status BindInt(int i, int64_t v) override { return Check(sqlite3_bind_int64(stmt_, i, v), i); }
  Status BindReal(int i, double v) override { return Check(sqlite3_bind_double(stmt_, i, v), i); }
  Status BindText(int i, std::string_view v) override {
    return Check(
        sqlite3_bind_text(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT), i);
  }
  Status BindBlob(int i, std::string_view v) override {
    return Check(
        sqlite3_bind_blob(stmt_, i, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT), i);
  }
  Result<bool> Step() override;
  int64_t Int(int col) const override { return sqlite3_column_int64(stmt_, col); }
  double Real(int col) const override { return sqlite3_column_double(stmt_, col); }
  bool IsNull(int col) const override { return sqlite3_column_type(stmt_, col) == SQLITE_NULL; }
  std::string Text(int col) const override {
    const auto* p = static_cast<const char*>(sqlite3_column_blob(stmt_, col));
    const int n = sqlite3_column_bytes(stmt_, col);
    return p == nullptr ? std::string() : std::string(p, static_cast<size_t>(n));
  }

 private:
  Status Check(int rc, int i);
  SqliteDb* db_;
  sqlite3* raw_;
  sqlite3_stmt* stmt_;
  std::string sql_;
};

class SqliteDb final : public Db {
 public:
  SqliteDb(sqlite3* db, std::string path) : Db(std::move(path)), db_(db) {}
  ~SqliteDb() override {
    sqlite3_finalize(data_version_);
    for (auto& [sql, stmts] : cache_) {
      for (sqlite3_stmt* stmt : stmts) sqlite3_finalize(stmt);
    }
    sqlite3_close(db_);
  }
  // Statements are kept once compiled (a store runs the same few hundred again and again): a
  // statement done with is reset and waits here for the next Prepare of the same text.
  Result<Stmt> Prepare(std::string_view sql) override {
    std::string text(sql);
    sqlite3_stmt* stmt = nullptr;
    auto it = cache_.find(text);
    if (it != cache_.end() && !it->second.empty()) {
      stmt = it->second.back();
      it->second.pop_back();
    } else if (sqlite3_prepare_v2(db_, sql.data(), static_cast<int>(sql.size()), &stmt, nullptr) !=
               SQLITE_OK) {
      return Fail(fmt::format("prepare '{}'", sql.substr(0, 60)));
    }
    return Stmt(std::make_unique<SqliteStmt>(this, db_, stmt, std::move(text)));
  }
  void Keep(std::string sql, sqlite3_stmt* stmt) {
    sqlite3_reset(stmt);
    sqlite3_clear_bindings(stmt);
    // Bounded: texts built with values (a LIMIT) are few, but not a fixed set.
    if (cache_.size() >= kMaxCached && cache_.find(sql) == cache_.end()) {
      sqlite3_finalize(stmt);
      return;
    }
    cache_[std::move(sql)].push_back(stmt);
  }
  Status Exec(std::string_view sql) override {
    char* err = nullptr;
    const std::string text(sql);
    if (sqlite3_exec(db_, text.c_str(), nullptr, nullptr, &err) != SQLITE_OK) {
      std::string why = err != nullptr ? err : sqlite3_errmsg(db_);
      sqlite3_free(err);
      return Error("{}: '{}': {}", path_, text.substr(0, 60), why);
    }
    return Status::Ok();
  }
  int64_t Changes() const override { return sqlite3_changes(db_); }
  Status Begin() override { return Exec("BEGIN IMMEDIATE"); }
  Status BeginRead() override { return Exec("BEGIN DEFERRED"); }
  bool postgres() const override { return false; }
  uint64_t ChangeMark() override {
    // data_version moves with other connections' commits (not this one's, unlike the pager's
    // counter, which every write transaction moves, empty or not), the total of changed rows
    // with this connection's writes (trigger rows included). Neither wraps in practice.
    if (data_version_ == nullptr &&
        sqlite3_prepare_v2(db_, "PRAGMA data_version", -1, &data_version_, nullptr) != SQLITE_OK) {
      data_version_ = nullptr;
      return 0;
    }
    uint64_t version = 0;
    if (sqlite3_step(data_version_) == SQLITE_ROW) {
      version = static_cast<uint64_t>(sqlite3_column_int64(data_version_, 0));
    }
    sqlite3_reset(data_version_);
    if (version == 0) return 0;
    return (version << 40) ^ static_cast<uint64_t>(sqlite3_total_changes64(db_));
  }
  // "market.sqlite: <what>: <sqlite's message>".
  Status Fail(std::string_view what) const {
    const int code = sqlite3_extended_errcode(db_);
    // A full disk or a busy database may pass; a corrupt file will not.
    const StatusCode kind = (code & 0xff) == SQLITE_FULL || (code & 0xff) == SQLITE_BUSY ||
                                    (code & 0xff) == SQLITE_IOERR
                                ? StatusCode::kUnavailable
                                : StatusCode::kInvalidInput;
    return Status::Error(fmt::format("{}: {}: {}", path_, what, sqlite3_errmsg(db_)), kind);
  }

 private:
  static constexpr size_t kMaxCached = 512;
  sqlite3* db_;
  std::unordered_map<std::string, std::vector<sqlite3_stmt*>> cache_;
  sqlite3_stmt* data_version_ = nullptr;  // ChangeMark's, compiled once
};

SqliteStmt::~SqliteStmt() { db_->Keep(std::move(sql_), stmt_); }

Status SqliteStmt::Check(int rc, int i) {
  if (rc == SQLITE_OK) return Status::Ok();
  return db_->Fail(fmt::format("bind {} of '{}'", i, sql_));
}

Result<bool> SqliteStmt::Step() {
  const int rc = sqlite3_step(stmt_);
  if (rc == SQLITE_ROW) return true;
  if (rc == SQLITE_DONE) return false;
  return db_->Fail(fmt::format("'{}'", sql_.substr(0, 60)));
}

}  // namespace

Result<std::unique_ptr<Db>> OpenSqlite(const std::string& path) {
  sqlite3* raw = nullptr;
  const int rc =
      sqlite3_open_v2(path.c_str(), &raw,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    std::string why = raw != nullptr ? sqlite3_errmsg(raw) : sqlite3_errstr(rc);
    if (raw != nullptr) sqlite3_close(raw);
    return Error("{}: cannot open the database: {}", path, why);
  }
  auto db = std::make_unique<SqliteDb>(raw, path);
  sqlite3_busy_timeout(raw, 5000);
  sqlite3_extended_result_codes(raw, 1);
  KV_RETURN_IF_ERROR(db->Exec("PRAGMA journal_mode=WAL"));
  // In WAL mode NORMAL syncs at checkpoints, not at every commit: a process killed (kill -9)
  // loses nothing committed, a machine that loses power may lose the last commits (docs/MARKET.md,
  // "The store").
  KV_RETURN_IF_ERROR(db->Exec("PRAGMA synchronous=NORMAL"));
  KV_RETURN_IF_ERROR(db->Exec("PRAGMA foreign_keys=ON"));
  // A heartbeat reads its ring's windows and claims: with 10,000 claims the pages they spread
  // over outgrow SQLite's default 2 MiB cache, and each read became a pread of the file. The
  // file is mapped instead (up to 1 GiB; pages are shared with the kernel's cache), and up to 64
  // MiB of pages are kept.
  KV_RETURN_IF_ERROR(db->Exec("PRAGMA mmap_size=1073741824"));
  KV_RETURN_IF_ERROR(db->Exec("PRAGMA cache_size=-65536"));
  return std::unique_ptr<Db>(std::move(db));
}

bool Db::IsPostgresUrl(std::string_view target) {
  return target.starts_with("postgresql://") || target.starts_with("postgres://");
}

Result<std::unique_ptr<Db>> Db::Open(const std::string& target) {
  return IsPostgresUrl(target) ? OpenPostgres(target) : OpenSqlite(target);
}

Result<std::unique_ptr<Transaction>> Transaction::Begin(Db* db) {
  KV_RETURN_IF_ERROR(db->Begin());
  return std::unique_ptr<Transaction>(new Transaction(db));
}

Result<std::unique_ptr<Transaction>> Transaction::BeginRead(Db* db) {
  KV_RETURN_IF_ERROR(db->BeginRead());
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
