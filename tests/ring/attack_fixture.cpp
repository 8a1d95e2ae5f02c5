#include "attack_fixture.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <fstream>
#include <future>

#include "ring/sampling_wire.h"

namespace kvasir::testing {

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

uint64_t StatusField(pid_t pid, const std::string& field) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string key;
  while (in >> key) {
    if (key == field) {
      uint64_t v = 0;
      in >> v;
      return v;
    }
    std::string rest;
    std::getline(in, rest);
  }
  return 0;
}

bool ResetPeak(pid_t pid) {
  std::ofstream out(fmt::format("/proc/{}/clear_refs", pid));
  out << "5";
  out.close();
  return !out.fail();
}

bool WaitFor(const std::function<bool()>& pred, int ms) {
  const auto end = Clock::now() + std::chrono::milliseconds(ms);
  while (!pred()) {
    if (Clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

bool WaitForText(const std::string& path, const std::string& needle, int ms) {
  const int fd = inotify_init1(IN_CLOEXEC | IN_NONBLOCK);
  if (fd < 0) return false;
  inotify_add_watch(fd, path.c_str(), IN_MODIFY);
  const auto end = Clock::now() + std::chrono::milliseconds(ms);
  bool found = false;
  while (!(found = ReadFileToString(path).find(needle) != std::string::npos)) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
    if (left <= 0) break;
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) > 0) {
      char buf[4096];
      while (::read(fd, buf, sizeof(buf)) > 0) {
      }
    }
  }
  ::close(fd);
  return found;
}

size_t CountOf(const std::string& text, const std::string& needle) {
  size_t n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

HonestRun RunHonestClient(const std::string& head, const std::string& prompt, int n_predict) {
  HonestRun run;
  const auto t0 = Clock::now();
  auto client = ring::RingClient::Connect(head, 10000, kTestRingSecret);
  run.connect_s = SecondsSince(t0);
  if (!client.ok()) {
    run.error = client.status().message();
    return run;
  }
  ring::GenerateMsg req;
  req.prompt = prompt;
  req.sampling = ring::SamplingToWire(Greedy(), static_cast<uint32_t>(n_predict), false);
  const auto sent = Clock::now();
  auto last = sent;
  auto r = (*client)->Generate(req, [&](const ring::TokenMsg& t) {
    const double gap = SecondsSince(last);
    if (run.ids.empty()) {
      run.first_token_s = gap;
    } else {
      run.max_gap_s = std::max(run.max_gap_s, gap);
    }
    last = Clock::now();
    if (t.token.finished && t.token.reason == static_cast<uint8_t>(wire::FinishReason::kEog)) {
      return;
    }
    run.ids.push_back(t.token.id);
  });
  run.ok = r.ok();
  if (!r.ok()) run.error = r.status().message();
  return run;
}

Flood::Flood(int n, std::function<void(int, const std::atomic<bool>&)> attack) {
  for (int i = 0; i < n; ++i) {
    threads_.emplace_back([this, i, attack] { attack(i, running_); });
  }
}

Flood::~Flood() { Stop(); }

void Flood::Stop() {
  running_ = false;
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

AttackRing::AttackRing(const std::string& model, const std::vector<std::string>& extra)
    : model_(model) {
  bound_ = std::make_unique<BoundPorts>(3);
  for (size_t i = 0; i < 3; ++i) ports_.push_back((*bound_)[i]);
  const char* layers[] = {"0:2", "2:4", "4:5"};
  for (int i = 0; i < 3; ++i) {
    std::vector<std::string> source = {"-m",
                                       model_,
                                       "-c",
                                       "512",
                                       "--link-timeout",
                                       std::to_string(kLinkTimeoutS),
                                       "--repair-timeout",
                                       std::to_string(kRepairTimeoutS)};
    source.insert(source.end(), extra.begin(), extra.end());
    const std::vector<std::string> args = StageProcessArgs(
        source, layers[i], bound_->fd(i), ports_[(i + 1) % 3], fmt::format("a{}", i), "info");
    stages_.push_back(std::make_unique<ChildProcess>(args, log_path(i), SIGKILL,
                                                     std::vector<int>{bound_->fd(i)}));
  }
  head_ = fmt::format("127.0.0.1:{}", ports_[0]);
  auto c = ring::RingClient::Connect(head_, 30000, kTestRingSecret);
  EXPECT_TRUE(c.ok()) << c.status().message();
  if (!c.ok()) return;
  Status s = (*c)->WaitReady(30000);
  EXPECT_TRUE(s.ok()) << s.message();
  if (!s.ok()) return;
  expected_ = GenerateLocally(model_, kPrompt, Greedy(), 48, 512);
  ready_ = true;
  // One session through every stage first, so the idle level includes what serving allocates.
  ExpectServes();
  MarkIdle();
}

AttackRing::~AttackRing() = default;

std::string AttackRing::log_path(int i) const { return dir_.File(fmt::format("a{}.log", i)); }

void AttackRing::MarkIdle() {
  idle_.clear();
  for (auto& s : stages_) {
    idle_.push_back(RssOf(s->pid()));
    EXPECT_TRUE(ResetPeak(s->pid())) << "cannot reset the peak RSS of " << s->pid();
  }
}

void AttackRing::ExpectPeakBounded(const std::string& when) {
  for (size_t i = 0; i < stages_.size(); ++i) {
    const uint64_t peak = PeakOf(stages_[i]->pid());
    EXPECT_LT(peak, idle_[i] + kMaxGrowth)
        << when << ": stage " << i << " peaked at " << peak / 1048576.0 << " MiB, idle "
        << idle_[i] / 1048576.0 << " MiB";
    fmt::print(stderr, "[measure] {}: stage {} idle {:.1f} MiB, peak {:.1f} MiB (+{:.1f})\n",
               when, i, idle_[i] / 1048576.0, peak / 1048576.0,
               (static_cast<double>(peak) - static_cast<double>(idle_[i])) / 1048576.0);
  }
}

void AttackRing::ExpectMemoryReturns(const std::string& when, uint64_t slack) {
  for (size_t i = 0; i < stages_.size(); ++i) {
    const pid_t pid = stages_[i]->pid();
    const bool back = WaitFor([&] { return RssOf(pid) < idle_[i] + slack; }, 10000);
    EXPECT_TRUE(back) << when << ": stage " << i << " holds " << RssOf(pid) / 1048576.0
                      << " MiB, idle " << idle_[i] / 1048576.0 << " MiB";
  }
}

void AttackRing::ExpectServes() {
  std::vector<std::future<Generation>> all;
  for (int i = 0; i < 8; ++i) {
    all.push_back(std::async(std::launch::async,
                             [&] { return GenerateOnRing(head_, kPrompt, Greedy(), 48); }));
  }
  for (auto& f : all) EXPECT_EQ(f.get().ids, expected_.ids);
  for (auto& s : stages_) EXPECT_TRUE(s->Alive());
}

double AttackRing::ExpectHonestServedWithin1s(const std::string& when, bool print) {
  const HonestRun run = RunHonestClient(head_, kPrompt, 48);
  EXPECT_TRUE(run.ok) << when << ": " << run.error;
  EXPECT_EQ(run.ids, expected_.ids) << when;
  EXPECT_LT(run.worst(), 1.0) << when << ": connect " << run.connect_s << " s, first token "
                              << run.first_token_s << " s, longest gap " << run.max_gap_s << " s";
  if (print) {
    fmt::print(stderr, "[measure] {}: honest client: connect {:.3f} s, first token {:.3f} s, "
               "longest gap {:.3f} s\n", when, run.connect_s, run.first_token_s, run.max_gap_s);
  }
  return run.worst();
}

}  // namespace kvasir::testing
