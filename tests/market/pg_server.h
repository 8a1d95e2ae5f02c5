// A real PostgreSQL server for the market's tests: initdb and pg_ctl (Debian's postgresql) into a
// fresh directory, listening only on a Unix socket there, run as the `postgres` user when the
// tests run as root (the server refuses root). One server per test process, started on first use
// and stopped (immediately) when the process exits; each test gets a database of its own.
//
// MarketDbTarget() is what the store tests open: a SQLite file in `dir`, or, when the environment
// has KVASIR_MARKET_STORE=postgresql, a fresh database on that server. CMake runs the store tests
// once each way.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>

#include "market/sql.h"
#include "test_assets.h"

namespace kvasir::testing {

class PgServer {
 public:
  // The process's server, started when first asked for; nullptr (with `why`) when it cannot be.
  static PgServer* Shared(std::string* why) {
    static std::string error;
    static std::unique_ptr<PgServer> server = [] {
      auto s = std::unique_ptr<PgServer>(new PgServer());
      error = s->Start();
      return error.empty() ? std::move(s) : nullptr;
    }();
    if (server == nullptr && why != nullptr) *why = error;
    return server.get();
  }
  ~PgServer() { Stop(); }

  // The URL of a new, empty database.
  std::string NewDatabase() {
    static std::atomic<int> n{0};
    const std::string name = "t" + std::to_string(getpid()) + "_" + std::to_string(n++);
    auto db = market::Db::Open(Url("postgres"));
    if (!db.ok() || !(*db)->Exec("CREATE DATABASE " + name).ok()) return "";
    return Url(name);
  }
  std::string Url(const std::string& database) const {
    return "postgresql:///" + database + "?host=" + dir_ + "&port=5432&user=kvasir";
  }

 private:
  PgServer() = default;
  static std::string Bin() {
    std::string best;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/usr/lib/postgresql", ec)) {
      const std::string bin = e.path().string() + "/bin";
      if (std::filesystem::exists(bin + "/initdb") && bin > best) best = bin;
    }
    return best;
  }
  std::string As(const std::string& cmd) const {
    return geteuid() == 0 ? "runuser -u postgres -- " + cmd : cmd;
  }
  std::string Start() {
    bin_ = Bin();
    if (bin_.empty()) return "no PostgreSQL server under /usr/lib/postgresql (apt install postgresql)";
    dir_ = tmp_.path();
    if (geteuid() == 0 && std::system(("chown postgres " + dir_).c_str()) != 0) {
      return "cannot give " + dir_ + " to the postgres user";
    }
    const std::string log = dir_ + "/server.log";
    const std::string init = As(bin_ + "/initdb -D " + dir_ + "/data -U kvasir -A trust --no-sync") +
                             " > " + dir_ + "/initdb.log 2>&1";
    if (std::system(init.c_str()) != 0) return "initdb failed: " + ReadFileToString(dir_ + "/initdb.log");
    const std::string start =
        As(bin_ + "/pg_ctl -D " + dir_ + "/data -l " + log + " -w -t 60 -o \"-c listen_addresses='' " +
           "-c unix_socket_directories=" + dir_ + " -p 5432 -c fsync=off -c max_connections=200\" start") +
        " > /dev/null 2>&1";
    if (std::system(start.c_str()) != 0) return "pg_ctl start failed: " + ReadFileToString(log);
    started_ = true;
    return "";
  }
  void Stop() {
    if (!started_) return;
    started_ = false;
    (void)std::system((As(bin_ + "/pg_ctl -D " + dir_ + "/data -m immediate -w stop") +
                       " > /dev/null 2>&1")
                          .c_str());
  }
  TempDir tmp_;
  std::string bin_, dir_;
  bool started_ = false;
};

inline bool PostgresStore() {
  const char* v = std::getenv("KVASIR_MARKET_STORE");
  return v != nullptr && std::string(v) == "postgresql";
}

// A SQLite file in `dir`, or a fresh PostgreSQL database (see above); "" with `why` when the
// server cannot be had.
inline std::string MarketDbTarget(const TempDir& dir, std::string* why) {
  if (!PostgresStore()) return dir.File("market.sqlite");
  PgServer* pg = PgServer::Shared(why);
  if (pg == nullptr) return "";
  std::string url = pg->NewDatabase();
  if (url.empty() && why != nullptr) *why = "cannot create a database on the test server";
  return url;
}

}  // namespace kvasir::testing
