// kvasir audit: the market's recompute auditor (docs/MARKET.md, "Recomputation"). Beside the
// market processes, on their database, it takes the audits of one model whose reveals matched
// their commitments, runs each revealed window on the CPU over the revealed inputs and fails the
// audits whose outputs differ by more than the tolerance. Loops until SIGINT/SIGTERM, or with
// --once until nothing waits.
#include <fmt/format.h>
#include <signal.h>

#include <cstdio>
#include <ctime>
#include <filesystem>

#include "audit/auditor.h"
#include "base/log.h"
#include "cli/cli_util.h"
#include "cli/commands.h"
#include "cli/ring_options.h"
#include "market/market_server.h"
#include "market/store.h"
#include "node/signals.h"

namespace kvasir::cli {
namespace {

constexpr const char* kCmd = "audit";

}  // namespace

int AuditMain(int argc, char** argv) {
  return Guarded(kCmd, [&]() -> int {
    CLI::App app{"Recompute audited windows of a model on the CPU and fail those that differ.",
                 "kvasir audit"};
    std::string db, model_path, log_level = "info";
    audit::AuditorOptions o;
    double poll_s = 2;
    bool once = false;
    app.add_option("--db", db, "the market's database: a SQLite file, or postgresql://...")
        ->required();
    app.add_option("-m,--model", model_path, "the model's GGUF file (the whole model)")
        ->required()
        ->check(CLI::ExistingFile);
    app.add_option("--name", o.model, "the name it is registered under (default: the file's stem)");
    app.add_option("--tolerance", o.tolerance,
                   "largest relative L2 difference of an output row that passes")
        ->capture_default_str();
    app.add_option("-t,--threads", o.n_threads, "CPU threads")->capture_default_str();
    app.add_option("--poll", poll_s, "seconds between looks for new audits")->capture_default_str();
    app.add_flag("--once", once, "recompute what waits now, print the tally and exit");
    app.add_option("--log-level", log_level, "debug, info, warn, error")->capture_default_str();
    if (auto code = ParseArgs(app, kCmd, argc, argv)) return *code;
    if (Status s = ApplyLogLevel(log_level); !s.ok()) return UsageError(kCmd, s.message());
    if (!(o.tolerance > 0 && o.tolerance < 1)) {
      return UsageError(kCmd, "--tolerance must be above 0 and below 1");
    }
    if (o.n_threads < 1 || o.n_threads > 256) {
      return UsageError(kCmd, "--threads must be from 1 to 256");
    }
    if (!(poll_s >= 0.1 && poll_s <= 3600)) {
      return UsageError(kCmd, "--poll must be from 0.1 to 3600 seconds");
    }
    if (o.model.empty()) o.model = std::filesystem::path(model_path).stem().string();
    if (!market::Db::IsPostgresUrl(db) && !std::filesystem::exists(db)) {
      return Fail(kCmd, fmt::format("{}: no such database", db));
    }
    const sigset_t set = node::BlockStopSignals();
    auto file = OpenGguf(model_path);
    if (!file.ok()) return Fail(kCmd, file.status());
    auto store = market::Store::Open(db);
    if (!store.ok()) return Fail(kCmd, store.status());
    auto auditor = audit::Auditor::Create(store->get(), *file, o, market::UnixNow());
    if (!auditor.ok()) return Fail(kCmd, auditor.status());
    KV_LOG_INFO("audit: model '{}' in {}, tolerance {}", o.model, (*store)->db_name(), o.tolerance);
    while (true) {
      auto n = (*auditor)->RunOnce(market::UnixNow());
      if (!n.ok()) return Fail(kCmd, n.status());
      if (*n > 0) continue;
      if (once) break;
      timespec wait{static_cast<time_t>(poll_s),
                    static_cast<long>((poll_s - static_cast<time_t>(poll_s)) * 1e9)};
      if (sigtimedwait(&set, nullptr, &wait) > 0) break;
    }
    const audit::AuditorStats& st = (*auditor)->stats();
    std::printf(
        "audit: %lld passed, %lld failed, %lld skipped; worst difference passed %.3g "
        "(tolerance %.3g)\n",
        static_cast<long long>(st.passed), static_cast<long long>(st.failed),
        static_cast<long long>(st.skipped), st.worst_passed, o.tolerance);
    return kExitOk;
  });
}

}  // namespace kvasir::cli
