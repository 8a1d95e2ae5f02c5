// heal_load: the pause a client sees when a stage of a ring dies and a hot standby takes its place
// (docs/PROTOCOL.md, "Repair"), against the session's length. For each length L it starts a ring
// of `kvasir stage` processes with an even split of the layers and one standby for the window of
// stage 2, streams `--sessions` greedy sessions, kills stage 2 (SIGKILL, or SIGSTOP with
// --freeze) once every session has L tokens, and prints each session's longest wait between two
// tokens, with the positions replayed and how many of them the surviving stages and the standby
// ran again (the stages' STATS). Usage:
//   heal_load --kvasir build/bin/kvasir -m MODEL --stages 4 --sessions 1,8 --lengths 32,128,512
// (--replay-mb 0: every stage runs every replayed position, as before kept rows).
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <thread>
#include <vector>

#include "net/stream.h"
#include "ring/client.h"
#include "ring/sampling_wire.h"

namespace {

using Clock = std::chrono::steady_clock;

pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) dup2(fd, 2);
    std::vector<char*> argv;
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

void Stop(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGCONT);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
}

struct Options {
  std::string kvasir, model, dir = "/tmp/heal_load";
  int stages = 4, threads = 1;
  std::vector<int> sessions = {1, 8}, lengths = {32, 128, 512};
  double link_timeout = 2;
  bool freeze = false;
  int replay_mb = -1;  // every stage's --replay-mb; -1: the default
};

// What the stages' STATS say of the replay: positions replayed (the head's count, all sessions),
// and of them how many the stages that survived ran again, and the standby.
struct ReplayCounts {
  uint64_t replayed = 0, survivors_ran = 0, standby_ran = 0;
};

ReplayCounts AskReplayCounts(const std::string& head) {
  ReplayCounts c;
  auto client = kvasir::ring::RingClient::Connect(head, 20000, "heal-load-secret-0123456789abcdef");
  if (!client.ok()) return c;
  auto stats = (*client)->StatsMessage();
  if (!stats.ok() || stats->repairs.size() != stats->records.size()) return c;
  for (size_t i = 0; i < stats->records.size(); ++i) {
    const auto& r = stats->repairs[i];
    if (i == 0) c.replayed = r.kept + r.recomputed;
    (std::string(stats->records[i].name) == "standby" ? c.standby_ran : c.survivors_ran) +=
        r.recomputed;
  }
  return c;
}

// One measurement: the pauses of `n` sessions when stage 2 dies after `length` tokens each.
std::vector<double> Measure(const Options& o, int n, int length, ReplayCounts* counts) {
  const std::string secret = o.dir + "/ring.secret";
  std::vector<uint16_t> ports;
  {
    std::vector<kvasir::net::Listener> held;
    for (int i = 0; i <= o.stages; ++i) {
      held.push_back(std::move(kvasir::net::Listener::Bind("127.0.0.1", 0)).value());
      ports.push_back(held.back().port());
    }
  }  // given up: each stage binds its own, and a killed one refuses connections at once
  const int n_layer = 8;
  const uint16_t standby = ports[o.stages];
  std::vector<pid_t> pids;
  auto stage = [&](int i, bool is_standby) {
    const int s = (i + 1) % o.stages;
    std::vector<std::string> args = {
        o.kvasir,
        "stage",
        "-m",
        o.model,
        "--layers",
        fmt::format("{}:{}", i * n_layer / o.stages, (i + 1) * n_layer / o.stages),
        "--listen",
        fmt::format("127.0.0.1:{}", is_standby ? standby : ports[i]),
        "--next",
        fmt::format("127.0.0.1:{}", ports[s]),
        "--name",
        is_standby ? "standby" : fmt::format("s{}", i),
        "-t",
        std::to_string(o.threads),
        "--link-timeout",
        fmt::format("{}", o.link_timeout),
        "--ring-secret-file",
        secret,
        "--key",
        fmt::format("{}/{}{}.key", o.dir, i, is_standby ? "s" : ""),
        "--log-level",
        "warn"};
    if (s == 2) {
      args.push_back("--standby-peers");
      args.push_back(fmt::format("127.0.0.1:{}", standby));
    }
    if (is_standby) args.push_back("--standby");
    if (o.replay_mb >= 0) {
      args.push_back("--replay-mb");
      args.push_back(std::to_string(o.replay_mb));
    }
    pids.push_back(Spawn(args, fmt::format("{}/stage{}{}.log", o.dir, i, is_standby ? "s" : "")));
  };
  for (int i = 0; i < o.stages; ++i) stage(i, false);
  stage(2, true);
  const std::string head = fmt::format("127.0.0.1:{}", ports[0]);
  {
    auto c = kvasir::ring::RingClient::Connect(head, 60000, "heal-load-secret-0123456789abcdef");
    if (!c.ok() || !(*c)->WaitReady(60000).ok()) {
      std::fprintf(stderr, "the ring did not close\n");
      for (pid_t p : pids) Stop(p);
      return {};
    }
  }
  std::vector<double> pauses(static_cast<size_t>(n), 0);
  std::atomic<int> complete{0};  // sessions that got every token
  std::vector<std::atomic<int>> seen(static_cast<size_t>(n));
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      kvasir::ring::ClientOptions opt;
      opt.ring_secret = "heal-load-secret-0123456789abcdef";
      opt.link_timeout_ms = static_cast<int>(o.link_timeout * 1000);
      auto c = kvasir::ring::RingClient::Connect(head, opt);
      if (!c.ok()) return;
      kvasir::ring::GenerateMsg req;
      req.prompt = fmt::format("Session {} once upon a time", i);
      kvasir::SamplingParams p;
      p.temperature = 0;
      req.sampling = kvasir::ring::SamplingToWire(p, static_cast<uint32_t>(length + 24), true);
      Clock::time_point last = Clock::now();
      int got = 0;
      (void)(*c)->Generate(req, [&](const kvasir::ring::TokenMsg&) {
        const auto now = Clock::now();
        if (got > 0) {
          pauses[static_cast<size_t>(i)] =
              std::max(pauses[static_cast<size_t>(i)],
                       std::chrono::duration<double, std::milli>(now - last).count());
        }
        last = now;
        seen[static_cast<size_t>(i)] = ++got;
      });
      if (got == length + 24) complete.fetch_add(1);
      seen[static_cast<size_t>(i)] = length + 1000;
    });
  }
  const auto deadline = Clock::now() + std::chrono::minutes(5);
  while (Clock::now() < deadline &&
         !std::all_of(seen.begin(), seen.end(), [&](auto& s) { return s.load() >= length; })) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  kill(pids[2], o.freeze ? SIGSTOP : SIGKILL);
  for (auto& t : threads) t.join();
  *counts = AskReplayCounts(head);
  for (pid_t p : pids) Stop(p);
  if (complete.load() != n) {
    std::fprintf(stderr, "%d of %d sessions did not get every token (logs in %s)\n",
                 n - complete.load(), n, o.dir.c_str());
    return {};
  }
  return pauses;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"Pause a client sees while a hot standby replaces a dead stage", "heal_load"};
  app.add_option("--kvasir", o.kvasir, "the kvasir binary")->required();
  app.add_option("-m,--model", o.model, "an 8-layer GGUF model")->required();
  app.add_option("--stages", o.stages, "stages in the ring (at least 3)")->capture_default_str();
  app.add_option("-t,--threads", o.threads, "threads per stage")->capture_default_str();
  app.add_option("--sessions", o.sessions, "concurrent sessions, one measurement each")
      ->delimiter(',');
  app.add_option("--lengths", o.lengths, "tokens each session has when the stage dies")
      ->delimiter(',');
  app.add_option("--link-timeout", o.link_timeout, "the stages' --link-timeout")
      ->capture_default_str();
  app.add_flag("--freeze", o.freeze, "SIGSTOP the stage instead of SIGKILL");
  app.add_option("--replay-mb", o.replay_mb,
                 "every stage's --replay-mb (0: a replay runs every position on every stage); "
                 "unset: the stages' default");
  app.add_option("--dir", o.dir, "logs, keys and the ring secret")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (o.stages < 3) return std::fprintf(stderr, "--stages must be at least 3\n"), 2;
  std::filesystem::create_directories(o.dir);
  if (std::FILE* f = std::fopen((o.dir + "/ring.secret").c_str(), "w")) {
    std::fputs("heal-load-secret-0123456789abcdef", f);
    std::fclose(f);
    chmod((o.dir + "/ring.secret").c_str(), 0600);
  }
  std::printf(
      "| sessions | tokens per session at the kill | positions replayed | run again by the "
      "survivors | by the standby | pause median (ms) | pause max (ms) |\n");
  std::printf("|---:|---:|---:|---:|---:|---:|---:|\n");
  for (int n : o.sessions) {
    for (int length : o.lengths) {
      ReplayCounts c;
      std::vector<double> p = Measure(o, n, length, &c);
      if (p.empty()) return 1;
      std::sort(p.begin(), p.end());
      std::printf("| %d | %d | %llu | %llu | %llu | %.0f | %.0f |\n", n, length,
                  static_cast<unsigned long long>(c.replayed),
                  static_cast<unsigned long long>(c.survivors_ran),
                  static_cast<unsigned long long>(c.standby_ran), p[p.size() / 2], p.back());
      std::fflush(stdout);
    }
  }
  return 0;
}
