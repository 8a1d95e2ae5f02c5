// A thin RAII layer over SQLite for the market's store: a connection, prepared statements with
// typed binds and columns, and transactions that roll back unless committed. Every failure is a
// Status naming the database and the statement; nothing here throws or aborts on bad data.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "base/status.h"

struct sqlite3;
struct sqlite3_stmt;

namespace kvasir::market {

class Db;

class Stmt {
 public:
  Stmt(Stmt&& other) noexcept;
  Stmt& operator=(Stmt&&) = delete;
  ~Stmt();

  // Parameters are 1-based, in the order of the statement's `?`.
  Stmt& Bind(int i, int64_t v);
  Stmt& Bind(int i, int v) { return Bind(i, static_cast<int64_t>(v)); }
  Stmt& Bind(int i, double v);
  Stmt& Bind(int i, std::string_view v);
  Stmt& BindBlob(int i, std::string_view v);

  // Steps once: true with a row, false when done. Errors are kept and returned by status().
  Result<bool> Step();
  // Runs to completion (for statements without rows).
  Status Run();

  // Columns are 0-based.
  int64_t Int(int col) const;
  double Real(int col) const;
  std::string Text(int col) const;
  bool IsNull(int col) const;

 private:
  friend class Db;
  Stmt(Db* db, sqlite3_stmt* stmt, std::string sql);
  Db* db_;
  sqlite3_stmt* stmt_;
  std::string sql_;
  Status bind_error_;
};

class Db {
 public:
  // Opens (creating when missing) the database at `path`, in WAL mode with synchronous=FULL,
  // foreign keys on and a 5 s busy timeout (another process in a transaction is waited for).
  static Result<std::unique_ptr<Db>> Open(const std::string& path);
  ~Db();
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;

  Result<Stmt> Prepare(std::string_view sql);
  // Runs statements without parameters or rows (schema, pragmas).
  Status Exec(std::string_view sql);
  int64_t LastInsertId() const;
  int Changes() const;
  const std::string& path() const { return path_; }
  // "market.sqlite: <what>: <sqlite's message>".
  Status Fail(std::string_view what) const;

 private:
  Db(sqlite3* db, std::string path) : db_(db), path_(std::move(path)) {}
  sqlite3* db_;
  std::string path_;
};

// BEGIN IMMEDIATE ... COMMIT: the write lock is taken up front, so two writers never deadlock
// halfway. Rolled back when destroyed without Commit().
class Transaction {
 public:
  static Result<std::unique_ptr<Transaction>> Begin(Db* db);
  ~Transaction();
  Status Commit();

 private:
  explicit Transaction(Db* db) : db_(db) {}
  Db* db_;
  bool done_ = false;
};

}  // namespace kvasir::market
