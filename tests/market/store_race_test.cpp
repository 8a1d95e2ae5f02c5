// The store under real concurrency: claims and receipts raced through several connections to one
// database file (threads, each with its own Store) and through several processes. Only the
// store's transactions keep these right: the HTTP server answers one request at a time, so a race
// through it proves nothing about them.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <atomic>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "market/api.h"
#include "market_fixture.h"
#include "market_test_util.h"

namespace kvasir::market {
namespace {

using kvasir::testing::KeyN;

constexpr int kRacers = 16;

ClaimRequest ClaimOf(int node, int window) {
  ClaimRequest c;
  c.node = kvasir::testing::Hex(KeyN(100 + node));
  c.model = "tiny";
  c.ring = 0;
  c.window = window;
  c.address = "10.0.0.7:7001";
  return c;
}

class StoreRaceTest : public MarketFixture {
 protected:
  // Runs `body(i)` on kRacers threads, each with its own Store on the fixture's database, all
  // released at once.
  void Race(const std::function<void(int, Store*)>& body) {
    std::atomic<int> ready{0};
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < kRacers; ++i) {
      threads.emplace_back([&, i] {
        auto s = Store::Open(db_);
        ASSERT_TRUE(s.ok()) << s.status().message();
        ++ready;
        while (!go.load()) std::this_thread::yield();
        body(i, s->get());
      });
    }
    while (ready.load() < kRacers) std::this_thread::yield();
    go = true;
    for (auto& t : threads) t.join();
  }
};

TEST_F(StoreRaceTest, ExactlyOneOfManyConnectionsWinsAWindow) {
  std::atomic<int> won{0}, lost{0}, other{0};
  Race([&](int i, Store* s) {
    auto r = s->Claim(ClaimOf(i, 1), kT0, 30);
    if (r.ok()) {
      ++won;
    } else if (r.status().code() == StatusCode::kConflict) {
      ++lost;
    } else {
      ++other;
      ADD_FAILURE() << r.status().message();
    }
  });
  EXPECT_EQ(won.load(), 1);
  EXPECT_EQ(lost.load(), kRacers - 1);
  EXPECT_EQ(other.load(), 0);
  EXPECT_EQ(RingJson(kT0)["windows"][1]["state"], "claimed");
  EXPECT_EQ(RingJson(kT0)["epoch"], 1);  // one change, one epoch
}

TEST_F(StoreRaceTest, OneNodeRacingForEveryWindowGetsExactlyOne) {
  std::atomic<int> won{0}, lost{0};
  Race([&](int i, Store* s) {
    auto r = s->Claim(ClaimOf(0, i % 3), kT0, 30);
    if (r.ok() && !r->renewed)
      ++won;
    else if (!r.ok() && r.status().code() == StatusCode::kConflict)
      ++lost;
  });
  EXPECT_EQ(won.load(), 1);
  int held = 0;
  const nlohmann::json ring = RingJson(kT0);
  for (const auto& w : ring["windows"]) held += w.contains("holder") ? 1 : 0;
  EXPECT_EQ(held, 1) << ring;
}

// Twice as many connections as racers above, each trying windows of rings 0 to 3 in an order of
// its own until it holds one: one winner a window, and every conflict names the window's holder at
// the end, another racer (a failure between the connections is run again, never guessed at).
TEST_F(StoreRaceTest, EveryConflictNamesTheRacerThatHoldsTheWindow) {
  ASSERT_TRUE(store_->AddModel(kvasir::testing::TestModel("tiny", 4), true, kT0).ok());
  constexpr int kWindows = 12;
  std::mutex mu;
  std::vector<int> won(2 * kRacers, -1);
  std::vector<std::tuple<int, int, std::string>> refusals;  // racer, window, message
  std::string errors;
  auto claim_until_one = [&](int i, Store* s) {
    std::vector<int> order(kWindows);
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), std::mt19937(static_cast<uint32_t>(i)));
    for (int w : order) {
      ClaimRequest c = ClaimOf(i, w % 3);
      c.ring = w / 3;
      auto r = s->Claim(c, kT0, 30);
      std::lock_guard<std::mutex> lock(mu);
      if (r.ok()) {
        won[static_cast<size_t>(i)] = w;
        return;
      }
      if (r.status().code() == StatusCode::kConflict) {
        refusals.emplace_back(i, w, r.status().message());
      } else {
        errors += r.status().message() + "\n";
      }
    }
  };
  Race([&](int i, Store* s) { claim_until_one(i, s); });
  Race([&](int i, Store* s) { claim_until_one(kRacers + i, s); });
  EXPECT_EQ(errors, "");
  std::vector<int> winners(kWindows, 0);
  for (int w : won) {
    if (w >= 0) ++winners[static_cast<size_t>(w)];
  }
  for (int w = 0; w < kWindows; ++w) EXPECT_EQ(winners[static_cast<size_t>(w)], 1) << w;
  const nlohmann::json map = Map(kT0);
  ASSERT_FALSE(refusals.empty());
  for (const auto& [i, w, message] : refusals) {
    const auto& window = map["models"][0]["rings"][static_cast<size_t>(w / 3)]["windows"]
                            [static_cast<size_t>(w % 3)];
    const std::string holder = window.value("holder", std::string());
    ASSERT_NE(holder, "") << window;
    EXPECT_NE(holder, ClaimOf(i, 0).node);
    const std::string want = fmt::format("window {} of ring {} of 'tiny' is held by node {}", w % 3,
                                         w / 3, holder.substr(0, 8));
    EXPECT_NE(message.find(want), std::string::npos) << "racer " << i << ": " << message;
  }
}

TEST_F(StoreRaceTest, ExactlyOneOfManyProcessesWinsAWindow) {
  // Each child opens the database itself, waits for the start (the pipe closing), claims, and
  // says in its exit status how it went: 0 won, 1 lost the race (409), 2 anything else.
  int go[2];
  ASSERT_EQ(pipe(go), 0);
  std::vector<pid_t> children;
  for (int i = 0; i < kRacers; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(go[1]);
      auto s = Store::Open(db_);
      if (!s.ok()) {
        fprintf(stderr, "racer %d: %s\n", i, s.status().message().c_str());
        _exit(2);
      }
      char c;
      (void)!read(go[0], &c, 1);  // returns at EOF: the parent closed its end
      auto r = (*s)->Claim(ClaimOf(i, 2), kT0, 30);
      if (!r.ok() && r.status().code() != StatusCode::kConflict) {
        fprintf(stderr, "racer %d: %s\n", i, r.status().message().c_str());
      }
      _exit(r.ok() ? 0 : r.status().code() == StatusCode::kConflict ? 1 : 2);
    }
    children.push_back(pid);
  }
  close(go[0]);
  close(go[1]);
  int won = 0, lost = 0, other = 0;
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 3;
    (code == 0 ? won : code == 1 ? lost : other)++;
  }
  EXPECT_EQ(won, 1);
  EXPECT_EQ(lost, kRacers - 1);
  EXPECT_EQ(other, 0);
  EXPECT_EQ(RingJson(kT0)["windows"][2]["state"], "claimed");
}

// Receipts raced against one ring's allowance: each connection reads the allowance and spends
// from it; only the transaction keeps two of them from spending the same rows.
TEST_F(StoreRaceTest, ConcurrentReceiptsNeverSpendMoreThanTheAllowance) {
  const auto ids = FillRing(kT0);
  MakeReady(ids, kT0);
  const double now = kT0 + 3;  // 3000 rows of allowance at 1000 rows/s
  std::vector<std::string> bodies;
  for (uint32_t i = 0; i < 4 * kRacers; ++i) {
    bodies.push_back(kvasir::testing::ReceiptBody(Session(256, 100 + i)));
  }
  std::atomic<int> accepted{0}, refused{0};
  Race([&](int i, Store* s) {
    MarketApi api(s, {});
    for (int k = 0; k < 4; ++k) {
      const auto r = api.Handle(
          kvasir::testing::Plain("POST", "/v1/receipts", bodies[static_cast<size_t>(4 * i + k)]),
          now);
      if (r.status == 200)
        ++accepted;
      else if (r.status == 422)
        ++refused;
      else
        ADD_FAILURE() << r.status << " " << r.body;
    }
  });
  EXPECT_EQ(accepted.load(), 3000 / 256);
  EXPECT_EQ(refused.load(), 4 * kRacers - 3000 / 256);
}

}  // namespace
}  // namespace kvasir::market
