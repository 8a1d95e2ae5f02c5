// Batches of statements (sql.h, Db::RunBatch), on the store the tests run against (SQLite, or
// PostgreSQL with KVASIR_MARKET_STORE=postgresql, where a batch is one pipeline): each statement
// reads as if it had run alone; a failure stops the batch, fails its transaction and leaves the
// connection usable; a transaction's last writes and its COMMIT go together.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "market/sql.h"
#include "pg_server.h"
#include "test_assets.h"

namespace kvasir::market {
namespace {

class SqlBatchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    target_ = kvasir::testing::MarketDbTarget(dir_, &why);
    if (target_.empty()) KV_SKIP_OR_FAIL("PostgreSQL: " + why);
    db_ = Connect();
    ASSERT_NE(db_, nullptr);
    ASSERT_TRUE(db_->Exec("CREATE TABLE t(k BIGINT PRIMARY KEY, v TEXT NOT NULL)").ok());
  }
  std::unique_ptr<Db> Connect() {
    auto db = Db::Open(target_);
    EXPECT_TRUE(db.ok()) << db.status().message();
    return db.ok() ? std::move(db).value() : nullptr;
  }
  Stmt Prepare(Db* db, const std::string& sql) {
    auto s = db->Prepare(sql);
    EXPECT_TRUE(s.ok()) << s.status().message();
    return std::move(s).value();
  }
  // The values of t, in key order, as `db` sees them.
  std::vector<std::string> Values(Db* db) {
    Stmt s = Prepare(db, "SELECT v FROM t ORDER BY k");
    std::vector<std::string> out;
    while (true) {
      auto row = s.Step();
      EXPECT_TRUE(row.ok()) << row.status().message();
      if (!row.ok() || !*row) break;
      out.push_back(s.Text(0));
    }
    return out;
  }

  kvasir::testing::TempDir dir_;
  std::string target_;
  std::unique_ptr<Db> db_;
};

TEST_F(SqlBatchTest, EachStatementReadsAsIfItRanAloneInOrder) {
  Stmt a = Prepare(db_.get(), "INSERT INTO t(k, v) VALUES(?, ?) RETURNING k");
  Stmt b = Prepare(db_.get(), "INSERT INTO t(k, v) VALUES(?, ?)");
  Stmt all = Prepare(db_.get(), "SELECT k, v FROM t ORDER BY k");
  Stmt count = Prepare(db_.get(), "SELECT count(*) FROM t WHERE k > ?");
  Stmt none = Prepare(db_.get(), "SELECT v FROM t WHERE k = ?");
  a.Bind(1, 7).Bind(2, "seven");
  b.Bind(1, 3).Bind(2, "three");
  count.Bind(1, 4);
  none.Bind(1, 99);
  ASSERT_TRUE(db_->RunBatch({{&a, &b, &all, &count, &none}}).ok());
  auto row = a.Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ(a.Int(0), 7);
  // Later statements see the rows the earlier ones wrote.
  std::vector<std::pair<int64_t, std::string>> rows;
  while (true) {
    auto r = all.Step();
    ASSERT_TRUE(r.ok()) << r.status().message();
    if (!*r) break;
    rows.emplace_back(all.Int(0), all.Text(1));
  }
  EXPECT_EQ(rows, (std::vector<std::pair<int64_t, std::string>>{{3, "three"}, {7, "seven"}}));
  row = count.Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ(count.Int(0), 1);
  row = none.Step();
  ASSERT_TRUE(row.ok());
  EXPECT_FALSE(*row);
  // The same statements again: prepared once, run again with new parameters.
  Stmt again = Prepare(db_.get(), "SELECT count(*) FROM t WHERE k > ?");
  again.Bind(1, 0);
  ASSERT_TRUE(db_->RunBatch({{&again}}).ok());
  row = again.Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ(again.Int(0), 2);
}

TEST_F(SqlBatchTest, AFailureStopsTheBatchFailsItsTransactionAndTheConnectionGoesOn) {
  {
    auto txn = Transaction::Begin(db_.get());
    ASSERT_TRUE(txn.ok());
    Stmt first = Prepare(db_.get(), "INSERT INTO t(k, v) VALUES(?, ?)");
    Stmt bad = Prepare(db_.get(), "INSERT INTO t(k, v) VALUES(?, 'twice')");
    Stmt after = Prepare(db_.get(), "SELECT count(*) FROM t");
    first.Bind(1, 1).Bind(2, "one");
    bad.Bind(1, 1);
    const Status s = db_->RunBatch({{&first, &bad, &after}});
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("INSERT INTO t(k, v) VALUES"), std::string::npos) << s.message();
    (void)db_->TakeRetryable();
    // Nothing after the failure ran (on SQLite it never was); the transaction rolls back.
    auto row = after.Step();
    if (db_->postgres()) {
      ASSERT_TRUE(row.ok());
      EXPECT_FALSE(*row);
    }
  }
  EXPECT_TRUE(Values(db_.get()).empty());
  // A statement the database cannot prepare: refused by Prepare (SQLite) or by the batch
  // (PostgreSQL, where it is prepared in the pipeline, after one prepared there with success).
  auto bad = db_->Prepare("SELECT no_such_column FROM t");
  if (bad.ok()) {
    Stmt fine = Prepare(db_.get(), "SELECT count(*) FROM t WHERE k < ?");
    fine.Bind(1, 100);
    const Status s = db_->RunBatch({{&fine, &*bad}});
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("no_such_column"), std::string::npos) << s.message();
    // The one prepared before the failure is known to the connection, under its name.
    Stmt reuse = Prepare(db_.get(), "SELECT count(*) FROM t WHERE k < ?");
    reuse.Bind(1, 100);
    ASSERT_TRUE(db_->RunBatch({{&reuse}}).ok());
    auto n = reuse.Step();
    ASSERT_TRUE(n.ok() && *n);
    EXPECT_EQ(reuse.Int(0), 0);
  } else {
    EXPECT_NE(bad.status().message().find("no_such_column"), std::string::npos);
  }
  // A batch whose statements are new to the connection after one whose preparation failed.
  Stmt x = Prepare(db_.get(), "INSERT INTO t(k, v) VALUES(?, 'x')");
  Stmt y = Prepare(db_.get(), "SELECT v FROM t WHERE k = ?");
  x.Bind(1, 5);
  y.Bind(1, 5);
  ASSERT_TRUE(db_->RunBatch({{&x, &y}}).ok());
  auto row = y.Step();
  ASSERT_TRUE(row.ok() && *row);
  EXPECT_EQ(y.Text(0), "x");
  EXPECT_EQ(Values(db_.get()), std::vector<std::string>{"x"});
}

TEST_F(SqlBatchTest, CommitAfterWritesAndCommitsTogether) {
  std::unique_ptr<Db> other = Connect();
  ASSERT_NE(other, nullptr);
  {
    auto txn = Transaction::Begin(db_.get());
    ASSERT_TRUE(txn.ok());
    Stmt read = Prepare(db_.get(), "SELECT count(*) FROM t");
    ASSERT_TRUE(db_->RunBatch({{&read}}).ok());
    Stmt w1 = Prepare(db_.get(), "INSERT INTO t(k, v) VALUES(1, 'a')");
    Stmt w2 = Prepare(db_.get(), "INSERT INTO t(k, v) VALUES(2, 'b')");
    ASSERT_TRUE((*txn)->CommitAfter({&w1, &w2}).ok());
  }
  // Committed (another connection sees both), and the Transaction rolled nothing back.
  EXPECT_EQ(Values(other.get()), (std::vector<std::string>{"a", "b"}));
  // A commit that fails (a duplicate key) leaves nothing behind.
  {
    auto txn = Transaction::Begin(db_.get());
    ASSERT_TRUE(txn.ok());
    Stmt w = Prepare(db_.get(), "INSERT INTO t(k, v) VALUES(3, 'c')");
    Stmt dup = Prepare(db_.get(), "INSERT INTO t(k, v) VALUES(1, 'again')");
    EXPECT_FALSE((*txn)->CommitAfter({&w, &dup}).ok());
    (void)db_->TakeRetryable();
  }
  EXPECT_EQ(Values(other.get()), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(Values(db_.get()), (std::vector<std::string>{"a", "b"}));
}

}  // namespace
}  // namespace kvasir::market
