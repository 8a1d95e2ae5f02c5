// The market's checks of holders (ring_check.h): a holder must prove its node key at the address
// it gave, a head must also name its model and window; liars, impostors, silent and absent peers
// fail within the deadline, and the checker's queue never blocks its caller. Then through the
// API: a ring whose holders lie about serving is never handed to clients.
#include "market/ring_check.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "fake_holder.h"
#include "market/api.h"
#include "market/market_server.h"
#include "market_test_util.h"
#include "test_assets.h"

namespace kvasir::market {
namespace {

using kvasir::testing::FakeHolder;
using kvasir::testing::Hex;
using kvasir::testing::KeyN;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr int kTimeoutMs = 1500;

std::array<uint8_t, 16> TinyModelId() {
  std::array<uint8_t, 16> id{};
  const std::string hex = "0123456789abcdef0123456789abcdef";
  for (size_t i = 0; i < 16; ++i)
    id[i] = static_cast<uint8_t>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return id;
}

CheckJob JobFor(const FakeHolder& h, const ring::NodeKey& key, bool head = false) {
  CheckJob j;
  j.claim = 1;
  j.epoch = 3;
  j.node = Hex(key);
  j.address = h.address();
  j.head = head;
  j.model_id = "0123456789abcdef0123456789abcdef";
  j.last = 2;
  return j;
}

TEST(RingCheckTest, AHolderThatProvesItsKeyAtItsAddressPasses) {
  FakeHolder stage({KeyN(1)});
  Status s = CheckHolder(JobFor(stage, KeyN(1)), kTimeoutMs);
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(RingCheckTest, AnImpostorAtTheAddressFailsNamingBothKeys) {
  FakeHolder impostor({KeyN(9)});
  Status s = CheckHolder(JobFor(impostor, KeyN(1)), kTimeoutMs);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(impostor.address()), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(ring::ShortKey(KeyN(9).public_key())), std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find(ring::ShortKey(KeyN(1).public_key())), std::string::npos)
      << s.message();
}

TEST(RingCheckTest, AHeadMustAnswerHelloWithItsModelAndWindow) {
  FakeHolder::Options o{KeyN(1)};
  o.head = true;
  o.model_id = TinyModelId();
  {
    FakeHolder head(o);
    Status s = CheckHolder(JobFor(head, KeyN(1), true), kTimeoutMs);
    EXPECT_TRUE(s.ok()) << s.message();
  }
  o.model_id[0] ^= 1;
  {
    FakeHolder other_model(o);
    Status s = CheckHolder(JobFor(other_model, KeyN(1), true), kTimeoutMs);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("runs model 0023"), std::string::npos) << s.message();
  }
  o.model_id = TinyModelId();
  o.last = 4;
  {
    FakeHolder other_window(o);
    Status s = CheckHolder(JobFor(other_window, KeyN(1), true), kTimeoutMs);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find("layers 0:4, not its window 0:2"), std::string::npos) << s.message();
  }
  // A stage that is no head does the handshake but not HELLO: the head's check fails on it.
  o.head = false;
  FakeHolder not_head(o);
  EXPECT_FALSE(CheckHolder(JobFor(not_head, KeyN(1), true), kTimeoutMs).ok());
}

TEST(RingCheckTest, SilentAbsentAndMalformedHoldersFailWithinTheDeadline) {
  FakeHolder::Options o{KeyN(1)};
  o.mode = FakeHolder::Mode::kSilent;
  FakeHolder silent(o);
  const auto t0 = Clock::now();
  Status s = CheckHolder(JobFor(silent, KeyN(1)), kTimeoutMs);
  const double took = std::chrono::duration<double>(Clock::now() - t0).count();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("no handshake within 1500 ms"), std::string::npos) << s.message();
  // The deadline is what ends it (the watchdog's period and a loaded machine aside).
  EXPECT_GE(took, 1.4);
  EXPECT_LT(took, 10.0);

  std::string closed_address;
  {
    FakeHolder gone({KeyN(1)});
    closed_address = gone.address();
  }
  CheckJob j = JobFor(silent, KeyN(1));
  j.address = closed_address;
  EXPECT_FALSE(CheckHolder(j, kTimeoutMs).ok());
  j.address = "not an address";
  Status bad = CheckHolder(j, kTimeoutMs);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("not HOST:PORT"), std::string::npos) << bad.message();
}

TEST(RingCheckTest, TheCheckerQueueIsBoundedAndDropsRepeats) {
  FakeHolder::Options o{KeyN(1)};
  o.mode = FakeHolder::Mode::kSilent;
  FakeHolder silent(o);
  std::mutex mu;
  std::vector<Status> outcomes;
  CheckerOptions co;
  co.threads = 1;
  co.max_queued = 4;
  co.timeout_ms = 300;
  co.retry_after_s = 3600;
  RingChecker checker(co, [&](const CheckJob&, const Status& s) {
    std::lock_guard<std::mutex> lock(mu);
    outcomes.push_back(s);
  });
  // 1000 requests for 100 claims against a holder that never answers: Request only queues.
  for (int i = 0; i < 1000; ++i) {
    CheckJob j = JobFor(silent, KeyN(1));
    j.claim = 1 + i % 100;
    checker.Request(j);
  }
  const CheckerStats st = checker.stats();
  EXPECT_EQ(st.requested, 1000u);
  // At most one running and max_queued waiting were taken; every other request was dropped.
  EXPECT_GE(st.dropped, 1000u - 5);
  checker.Stop();
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_LE(outcomes.size(), 5u);
  for (const Status& s : outcomes) EXPECT_FALSE(s.ok());
}

TEST(RingCheckTest, AFailedCheckIsNotRepeatedBeforeItsRetryTime) {
  FakeHolder impostor({KeyN(9)});
  std::atomic<int> runs{0};
  CheckerOptions co;
  co.retry_after_s = 3600;
  RingChecker checker(co, [&](const CheckJob&, const Status&) { ++runs; });
  const CheckJob j = JobFor(impostor, KeyN(1));
  checker.Request(j);
  const auto until = Clock::now() + std::chrono::seconds(20);
  while (runs.load() == 0 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(runs.load(), 1);
  checker.Request(j);  // failed an hour ago at most: dropped
  CheckJob next_epoch = j;
  next_epoch.epoch = 4;  // a new epoch is a new check
  checker.Request(next_epoch);
  while (runs.load() < 2 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  checker.Stop();
  EXPECT_EQ(runs.load(), 2);
  EXPECT_EQ(checker.stats().dropped, 1u);
}

// Through the API with the real checker: three holders that report serving, one of them at an
// address where an impostor answers. The ring is never ready (clients get 503) and the map says
// why; once the right node answers there, it is.
TEST(RingCheckTest, ARingWhoseHolderIsNotWhereItSaysIsNeverReady) {
  kvasir::testing::TempDir dir;
  const std::string db = dir.File("market.sqlite");
  auto opened = Store::Open(db);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  std::unique_ptr<Store> store = std::move(opened).value();
  ASSERT_TRUE(store->AddModel(kvasir::testing::TestModel(), false, UnixNow()).ok());
  CheckerOptions co;
  co.timeout_ms = kTimeoutMs;
  co.retry_after_s = 0;
  auto checker = StartStoreChecker(db, co);
  ASSERT_TRUE(checker.ok()) << checker.status().message();
  MarketApi api(store.get(), {}, checker->get());

  const ring::NodeKey keys[3] = {KeyN(1), KeyN(2), KeyN(3)};
  FakeHolder::Options head{keys[0]};
  head.head = true;
  head.model_id = TinyModelId();
  FakeHolder h0(head);
  FakeHolder h1({keys[1]});
  auto impostor = std::make_unique<FakeHolder>(FakeHolder::Options{KeyN(9)});
  const std::string addresses[3] = {h0.address(), h1.address(), impostor->address()};
  int64_t ids[3];
  for (int w = 0; w < 3; ++w) {
    const double now = UnixNow();
    json body = {{"model", "tiny"}, {"ring", 0}, {"window", w}, {"address", addresses[w]}};
    ApiResponse r =
        api.Handle(kvasir::testing::Signed(keys[w], "POST", "/v1/claims", body.dump(), now), now);
    ASSERT_EQ(r.status, 201) << r.body;
    ids[w] = kvasir::testing::Body(r)["claim"].get<int64_t>();
  }
  auto map = [&] {
    return kvasir::testing::Body(api.Handle(kvasir::testing::Plain("GET", "/v1/map"), UnixNow()));
  };
  const int64_t epoch = map()["models"][0]["rings"][0]["epoch"].get<int64_t>();
  // Every holder heartbeats "serving" until the predicate holds (or 30 s pass).
  auto beat_until = [&](const std::function<bool(const json&)>& done) {
    const auto until = Clock::now() + std::chrono::seconds(30);
    while (Clock::now() < until) {
      for (int w = 0; w < 3; ++w) {
        const double now = UnixNow();
        json body = {{"claim", ids[w]}, {"serving_epoch", epoch}};
        EXPECT_EQ(
            api.Handle(kvasir::testing::Signed(keys[w], "POST", "/v1/heartbeat", body.dump(), now),
                       now)
                .status,
            200);
      }
      if (done(map())) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << map().dump();
    return false;
  };
  ASSERT_TRUE(beat_until([](const json& m) {
    return m["models"][0]["rings"][0]["windows"][2].contains("check_error");
  }));
  json ring = map()["models"][0]["rings"][0];
  EXPECT_TRUE(ring["serving"].get<bool>());
  EXPECT_FALSE(ring["ready"].get<bool>());
  EXPECT_NE(ring["windows"][2]["check_error"].get<std::string>().find("expected node"),
            std::string::npos)
      << ring;
  EXPECT_GE(impostor->handshakes(), 1);
  ApiResponse refused = api.Handle(kvasir::testing::Plain("GET", "/v1/rings/tiny"), UnixNow());
  EXPECT_EQ(refused.status, 503) << refused.body;

  // The real holder of window 2 answers at that address now.
  const std::string taken = impostor->address();
  impostor.reset();
  FakeHolder::Options real{keys[2]};
  auto h2 = std::make_unique<FakeHolder>(real);
  // (It listens on another port: the holder renews its claim with the new address.)
  {
    const double now = UnixNow();
    json body = {{"model", "tiny"}, {"ring", 0}, {"window", 2}, {"address", h2->address()}};
    ASSERT_EQ(
        api.Handle(kvasir::testing::Signed(keys[2], "POST", "/v1/claims", body.dump(), now), now)
            .status,
        200);
  }
  ASSERT_NE(taken, h2->address());
  ASSERT_TRUE(
      beat_until([](const json& m) { return m["models"][0]["rings"][0]["ready"] == true; }));
  ApiResponse ok = api.Handle(kvasir::testing::Plain("GET", "/v1/rings/tiny"), UnixNow());
  EXPECT_EQ(ok.status, 200) << ok.body;
  (*checker)->Stop();
}

}  // namespace
}  // namespace kvasir::market
