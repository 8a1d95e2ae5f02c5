// The SQL the market's store runs, over either back end: SQLite (a file, the default) or
// PostgreSQL (`postgresql://...`, libpq). Statements are written once, in the subset both speak:
// positional parameters (`?`, or `?N` for the N-th), `INSERT ... ON CONFLICT`, `RETURNING`, no
// scalar min/max. The PostgreSQL back end rewrites the parameters to `$N` and quotes the column
// `window` (a reserved word there). Every failure is a Status naming the database and the
// statement; nothing here throws or aborts on bad data. A Db is not thread-safe: one per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/status.h"

namespace kvasir::market {

// One back end's prepared statement (sql.cpp's users never see it).
class StmtImpl {
 public:
  virtual ~StmtImpl() = default;
  virtual Status BindInt(int i, int64_t v) = 0;
  virtual Status BindReal(int i, double v) = 0;
  virtual Status BindText(int i, std::string_view v) = 0;
  virtual Status BindBlob(int i, std::string_view v) = 0;
  virtual Result<bool> Step() = 0;
  virtual int64_t Int(int col) const = 0;
  virtual double Real(int col) const = 0;
  virtual std::string Text(int col) const = 0;
  virtual bool IsNull(int col) const = 0;
};

class Stmt {
 public:
  explicit Stmt(std::unique_ptr<StmtImpl> impl) : impl_(std::move(impl)) {}
  Stmt(Stmt&&) noexcept = default;
  Stmt& operator=(Stmt&&) = delete;

  // Parameters are 1-based, in the order of the statement's `?` (or as numbered, `?N`).
  Stmt& Bind(int i, int64_t v) { return Keep(impl_->BindInt(i, v)); }
  Stmt& Bind(int i, int v) { return Bind(i, static_cast<int64_t>(v)); }
  Stmt& Bind(int i, double v) { return Keep(impl_->BindReal(i, v)); }
  Stmt& Bind(int i, std::string_view v) { return Keep(impl_->BindText(i, v)); }
  Stmt& BindBlob(int i, std::string_view v) { return Keep(impl_->BindBlob(i, v)); }

  // Steps once: true with a row, false when done. A failed bind is returned here.
  Result<bool> Step() {
    if (!bind_error_.ok()) return bind_error_;
    if (primed_.has_value()) return *std::exchange(primed_, std::nullopt);
    return impl_->Step();
  }
  // Runs the statement up to its first row now; the next Step answers with that row (Db::RunBatch
  // of a back end that cannot send several statements at once).
  Status Prime() {
    if (primed_.has_value()) return Status::Ok();
    KV_ASSIGN_OR_RETURN(bool row, Step());
    primed_ = row;
    return Status::Ok();
  }
  const Status& bind_status() const { return bind_error_; }
  // The back end's statement, for its Db::RunBatch.
  StmtImpl* impl() { return impl_.get(); }
  // Runs to completion (for statements without rows).
  Status Run() {
    while (true) {
      KV_ASSIGN_OR_RETURN(bool row, Step());
      if (!row) return Status::Ok();
    }
  }

  // Columns are 0-based. A boolean column reads as 0 or 1.
  int64_t Int(int col) const { return impl_->Int(col); }
  double Real(int col) const { return impl_->Real(col); }
  std::string Text(int col) const { return impl_->Text(col); }
  bool IsNull(int col) const { return impl_->IsNull(col); }

 private:
  Stmt& Keep(Status s) {
    if (!s.ok() && bind_error_.ok()) bind_error_ = std::move(s);
    return *this;
  }
  std::unique_ptr<StmtImpl> impl_;
  Status bind_error_;
  std::optional<bool> primed_;  // the first Step's answer, when Prime ran it
};

class Db {
 public:
  // `target` is a SQLite file (created when missing; WAL mode, synchronous=NORMAL, foreign keys
  // on, a 5 s busy timeout) or a `postgresql://` / `postgres://` URL (libpq's syntax).
  static Result<std::unique_ptr<Db>> Open(const std::string& target);
  static bool IsPostgresUrl(std::string_view target);
  virtual ~Db() = default;

  virtual Result<Stmt> Prepare(std::string_view sql) = 0;
  // Runs statements without parameters or rows (schema, pragmas, BEGIN/COMMIT).
  virtual Status Exec(std::string_view sql) = 0;
  // Rows changed by the last statement that finished.
  virtual int64_t Changes() const = 0;
  // Starts a transaction whose reads and writes are as if alone: BEGIN IMMEDIATE on SQLite (the
  // write lock up front), SERIALIZABLE on PostgreSQL (which may fail it later: see Retryable).
  virtual Status Begin() = 0;
  // Starts a transaction that only reads, from one snapshot: on SQLite (WAL) it neither takes nor
  // waits for the write lock, and sees nothing committed after its first read.
  virtual Status BeginRead() { return Begin(); }
  virtual bool postgres() const = 0;
  // Runs `stmts` (prepared on this Db, parameters bound), in order, as one batch: on PostgreSQL in
  // a single round trip (libpq's pipeline mode, with a Begin not sent yet), elsewhere one after
  // the other, each up to its first row. Each one's rows are then read with Step, as if it had
  // run alone. The first failure is returned, and stops the batch there (on PostgreSQL the ones
  // after it are not run; in a transaction, the transaction has failed). Outside a transaction, a
  // batch on PostgreSQL is one transaction of its own: a failure undoes the statements before it.
  virtual Status RunBatch(std::span<Stmt* const> stmts) {
    for (Stmt* s : stmts) KV_RETURN_IF_ERROR(s->Prime());
    return Status::Ok();
  }
  // A mark that differs whenever the database may have changed since it was taken: another
  // connection committed, or this one changed a row (even in a transaction later rolled back).
  // Zero when the back end cannot tell (PostgreSQL): nothing read may then be reused.
  virtual uint64_t ChangeMark() { return 0; }
  // True once after a statement failed because of a concurrent transaction (PostgreSQL's
  // serialization failure or deadlock): the whole transaction may be run again.
  bool TakeRetryable() { return std::exchange(retryable_, false); }
  bool retryable() const { return retryable_; }
  // How messages name the database (a path, or a URL without its password).
  const std::string& path() const { return path_; }

 protected:
  explicit Db(std::string path) : path_(std::move(path)) {}
  bool retryable_ = false;
  std::string path_;
};

// Rolled back when destroyed without Commit().
class Transaction {
 public:
  static Result<std::unique_ptr<Transaction>> Begin(Db* db);
  // Db::BeginRead's: a write in it may fail (on SQLite, SQLITE_BUSY when another connection wrote).
  static Result<std::unique_ptr<Transaction>> BeginRead(Db* db);
  ~Transaction();
  Status Commit();
  // Runs `stmts` and the COMMIT as one batch (Db::RunBatch): on PostgreSQL, the transaction's
  // last writes and its end in one round trip.
  Status CommitAfter(std::vector<Stmt*> stmts) {
    KV_ASSIGN_OR_RETURN(Stmt commit, db_->Prepare("COMMIT"));
    stmts.push_back(&commit);
    KV_RETURN_IF_ERROR(db_->RunBatch(stmts));
    done_ = true;
    return Status::Ok();
  }

 private:
  explicit Transaction(Db* db) : db_(db) {}
  Db* db_;
  bool done_ = false;
};

// The back ends (sqlite.cpp, postgres.cpp).
Result<std::unique_ptr<Db>> OpenSqlite(const std::string& path);
Result<std::unique_ptr<Db>> OpenPostgres(const std::string& url);

}  // namespace kvasir::market
