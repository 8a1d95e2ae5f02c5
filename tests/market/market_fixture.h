// A market as a function (MarketApi over a Store in a temporary database, the checker faked) with
// the steps the market tests take again and again: claims, heartbeats, a ring made ready, receipts.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "market/api.h"
#include "market_test_util.h"
#include "pg_server.h"
#include "test_assets.h"

namespace kvasir::market {

inline constexpr double kT0 = 1.8e9;

class MarketFixture : public ::testing::Test {
 protected:
  void SetUp() override { Open(kvasir::testing::TestModel()); }
  // A fresh database with `model`, and the API with `config` (the lease is what tests vary).
  void Open(const ModelSpec& model, MarketConfig config = {}) {
    std::string why;
    db_ = kvasir::testing::MarketDbTarget(dir_, &why);
    if (db_.empty()) KV_SKIP_OR_FAIL("PostgreSQL: " + why);
    auto s = Store::Open(db_);
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_ = std::move(s).value();
    Status added = store_->AddModel(model, false, kT0);
    ASSERT_TRUE(added.ok()) << added.message();
    MakeApi(std::move(config));
  }
  void MakeApi(MarketConfig c) {
    api_ = std::make_unique<MarketApi>(store_.get(), std::move(c), &checks_);
  }
  // Closes and opens the database again, as a restarted market would.
  void Reopen(MarketConfig c = {}) {
    api_.reset();
    store_.reset();
    auto s = Store::Open(db_);
    ASSERT_TRUE(s.ok()) << s.status().message();
    store_ = std::move(s).value();
    MakeApi(std::move(c));
  }

  ApiResponse Claim(const ring::NodeKey& k, int window, double now, nlohmann::json extra = {},
                    int ring = 0) {
    nlohmann::json body = {
        {"model", "tiny"}, {"ring", ring}, {"window", window}, {"address", ":7001"}};
    for (auto& [key, v] : extra.items()) body[key] = v;
    if (body.contains("behind_nat")) body.erase("address");
    return api_->Handle(kvasir::testing::Signed(k, "POST", "/v1/claims", body.dump(), now), now);
  }
  ApiResponse Beat(const ring::NodeKey& k, int64_t claim, int64_t epoch, double now) {
    return api_->Handle(kvasir::testing::Signed(
                            k, "POST", "/v1/heartbeat",
                            nlohmann::json{{"claim", claim}, {"serving_epoch", epoch}}.dump(), now),
                        now);
  }
  nlohmann::json Map(double now) {
    return kvasir::testing::Body(api_->Handle(kvasir::testing::Plain("GET", "/v1/map"), now));
  }
  nlohmann::json RingJson(double now, int ring = 0) {
    return Map(now)["models"][0]["rings"][static_cast<size_t>(ring)];
  }
  // A claim of window `window` of "tiny"'s ring `ring` by key `k`, as the store takes it.
  ClaimRequest Request(int k, int ring, int window) const {
    ClaimRequest r;
    r.node = kvasir::testing::Hex(keys_[k]);
    r.model = "tiny";
    r.ring = ring;
    r.window = window;
    r.address = "127.0.0.1:7001";
    return r;
  }
  // keys_[key] claims `window` of `ring`, which must be granted; returns the claim id (-1 where
  // it was refused, the failure recorded).
  int64_t ClaimWindow(int key, int window, double now, int ring = 0) {
    const ApiResponse r = Claim(keys_[key], window, now, {}, ring);
    EXPECT_EQ(r.status, 201) << r.body;
    return kvasir::testing::Body(r).value("claim", int64_t{-1});
  }
  // Claims the three windows of `ring` with keys_[3 * ring + w]; returns the claim ids.
  std::vector<int64_t> FillRing(double now, int ring = 0) {
    std::vector<int64_t> ids;
    for (int w = 0; w < 3; ++w) ids.push_back(ClaimWindow(3 * ring + w, w, now, ring));
    return ids;
  }
  // Every holder of `ring` reports serving its epoch at `now` and the checks pass: the ring is
  // ready from `now` on. Returns the epoch.
  int64_t MakeReady(const std::vector<int64_t>& ids, double now, int ring = 0) {
    const int64_t epoch = RingJson(now, ring)["epoch"].get<int64_t>();
    for (size_t w = 0; w < ids.size(); ++w) {
      EXPECT_EQ(Beat(keys_[3 * ring + static_cast<int>(w)], ids[w], epoch, now).status, 200);
    }
    checks_.Answer(store_.get(), now);
    EXPECT_TRUE(RingJson(now, ring)["ready"].get<bool>()) << RingJson(now, ring);
    return epoch;
  }
  ApiResponse Submit(const ring::Receipt& r, double now) {
    return api_->Handle(
        kvasir::testing::Plain("POST", "/v1/receipts", kvasir::testing::ReceiptBody(r)), now);
  }
  static std::string Reason(const ApiResponse& r) {
    auto j = kvasir::testing::Body(r);
    return j.is_discarded() || !j.contains("error") ? std::string("(no error)")
                                                    : j["error"]["message"].get<std::string>();
  }
  // The receipt of session `n` (its id) of `tokens` rows on ring `ring`, signed by its holders.
  ring::Receipt Session(uint64_t tokens, uint32_t n, int ring = 0) {
    ring::Receipt r = kvasir::testing::SignedReceipt({}, tokens);
    r.id.fill(0x5e);
    std::memcpy(r.id.data(), &n, sizeof(n));
    for (int w = 0; w < 3; ++w) {
      ring::AppendReceiptLine(&r, keys_[3 * ring + w], static_cast<uint32_t>(2 * w),
                              static_cast<uint32_t>(2 * w + 2), tokens, ring::Digest{});
    }
    return r;
  }
  // A claim of ring 0 as another process on the database sees it (its store's own connection,
  // leases of 30 s): what was written, not what waits in this store's memory.
  ClaimInfo Row(int64_t claim, double now) {
    auto other = Store::Open(db_);
    EXPECT_TRUE(other.ok()) << other.status().message();
    other.value()->set_lease_s(30);
    auto map = other.value()->Map(now);
    EXPECT_TRUE(map.ok()) << map.status().message();
    for (const WindowState& w : (*map)[0].rings[0].windows) {
      if (w.claim && w.claim->id == claim) return *w.claim;
    }
    return {};
  }
  double TotalCredit(double now) {
    double total = 0;
    auto b =
        kvasir::testing::Body(api_->Handle(kvasir::testing::Plain("GET", "/v1/balances"), now));
    for (const auto& x : b["balances"]) total += x["credit"].get<double>();
    return total;
  }

  kvasir::testing::TempDir dir_;
  std::string db_;  // what the store opens: a SQLite file, or a PostgreSQL URL (pg_server.h)
  std::unique_ptr<Store> store_;
  kvasir::testing::FakeChecks checks_;
  std::unique_ptr<MarketApi> api_;
  ring::NodeKey keys_[7] = {kvasir::testing::KeyN(1), kvasir::testing::KeyN(2),
                            kvasir::testing::KeyN(3), kvasir::testing::KeyN(4),
                            kvasir::testing::KeyN(5), kvasir::testing::KeyN(6),
                            kvasir::testing::KeyN(7)};
};

}  // namespace kvasir::market
