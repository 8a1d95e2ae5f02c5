// The admission policy as a pure function of the table and the clock: caps per address, the place
// a newcomer takes when a pool is full, deadlines that shorten under pressure, and the proven pool
// that the open pool's flood cannot reach.
#include "net/admission.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

namespace kvasir::net {
namespace {

using ::testing::HasSubstr;

AdmissionPolicy Policy(int max_total, int per_address, int pressure_from) {
  AdmissionPolicy p;
  p.open = {max_total, per_address, pressure_from};
  p.proven = {max_total, per_address, pressure_from};
  p.timeout(Stage::kSilent) = {10000, 1000};
  p.timeout(Stage::kReading) = {10000, 4000};
  p.timeout(Stage::kIdle) = {30000, 1000};
  p.timeout(Stage::kWriting) = {10000, 4000};
  p.timeout(Stage::kClosing) = {1000, 1000};
  p.timeout(Stage::kWaiting) = {30000, 30000};
  return p;
}

// Admits `n` connections from `address` with ids from `*next`, at `now`; returns how many got in.
int AdmitMany(AdmissionTable* t, ConnId* next, const std::string& address, int n, Millis now) {
  int in = 0;
  for (int i = 0; i < n; ++i) in += t->Admit((*next)++, address, now).admitted ? 1 : 0;
  return in;
}

TEST(AdmissionTest, AConnectionFromAnAddressAtItsCapIsRefused) {
  AdmissionTable t(Policy(100, 3, 50));
  ConnId id = 1;
  EXPECT_EQ(AdmitMany(&t, &id, "10.0.0.1", 3, 0), 3);
  const Admission a = t.Admit(id++, "10.0.0.1", 0);
  EXPECT_FALSE(a.admitted);
  EXPECT_FALSE(a.evicted);
  EXPECT_THAT(a.why, HasSubstr("10.0.0.1 holds 3 connections"));
  EXPECT_TRUE(t.Admit(id++, "10.0.0.2", 0).admitted);
  EXPECT_EQ(t.Count(Pool::kOpen), 4);
}

TEST(AdmissionTest, ANewcomerTakesThePlaceOfTheMostEvictableConnectionOfTheBiggestHolder) {
  AdmissionTable t(Policy(6, 10, 6));
  ConnId id = 1;
  // 10.0.0.1 holds four: 1 (silent, oldest), 2 (reading), 3 (idle), 4 (silent); 10.0.0.2 two.
  ASSERT_EQ(AdmitMany(&t, &id, "10.0.0.1", 4, 0), 4);
  ASSERT_EQ(AdmitMany(&t, &id, "10.0.0.2", 2, 0), 2);
  t.SetStage(2, Stage::kReading, 5);
  t.SetStage(3, Stage::kIdle, 7);
  t.SetStage(4, Stage::kSilent, 2);
  Admission a = t.Admit(id++, "10.0.0.9", 10);
  ASSERT_TRUE(a.admitted);
  EXPECT_EQ(a.evicted, ConnId{3}) << "an idle connection goes before silent and reading ones";
  EXPECT_EQ(a.evicted_address, "10.0.0.1");
  a = t.Admit(id++, "10.0.0.8", 11);
  ASSERT_TRUE(a.admitted);
  EXPECT_EQ(a.evicted, ConnId{1}) << "then the oldest silent one";
  EXPECT_FALSE(t.Contains(1));
  EXPECT_EQ(t.CountFrom(Pool::kOpen, "10.0.0.1"), 2);
  EXPECT_EQ(t.Count(Pool::kOpen), 6);
}

TEST(AdmissionTest, HoldersOfNearlyEqualShareDoNotEvictEachOther) {
  AdmissionTable t(Policy(6, 10, 6));
  ConnId id = 1;
  ASSERT_EQ(AdmitMany(&t, &id, "10.0.0.1", 3, 0), 3);
  ASSERT_EQ(AdmitMany(&t, &id, "10.0.0.2", 3, 0), 3);
  // 10.0.0.2 reconnecting in a loop cannot take 10.0.0.1's places, nor churn its own.
  Admission a = t.Admit(id++, "10.0.0.2", 1);
  EXPECT_FALSE(a.admitted);
  EXPECT_FALSE(a.evicted);
  EXPECT_THAT(a.why, HasSubstr("full"));
  t.Remove(1);  // 10.0.0.1 now holds 2, 10.0.0.2 three: one more than 10.0.0.1 is not enough
  ASSERT_TRUE(t.Admit(id++, "10.0.0.1", 2).admitted);  // a free place
  EXPECT_FALSE(t.Admit(id++, "10.0.0.1", 2).admitted);
  // Anyone holding nothing gets in.
  EXPECT_TRUE(t.Admit(id++, "10.0.0.3", 3).admitted);
}

TEST(AdmissionTest, AConnectionBeingAnsweredIsNeverEvicted) {
  AdmissionTable t(Policy(3, 10, 3));
  ConnId id = 1;
  ASSERT_EQ(AdmitMany(&t, &id, "10.0.0.1", 3, 0), 3);
  for (ConnId c = 1; c <= 3; ++c) t.SetStage(c, Stage::kHandling, 1);
  EXPECT_FALSE(t.Admit(id++, "10.0.0.2", 2).admitted);
  t.SetStage(2, Stage::kWriting, 3);
  const Admission a = t.Admit(id++, "10.0.0.2", 4);
  ASSERT_TRUE(a.admitted);
  EXPECT_EQ(a.evicted, ConnId{2});
  EXPECT_EQ(t.DeadlineOf(1), std::nullopt) << "no deadline while the server works";
}

TEST(AdmissionTest, SilentConnectionsGetTheShortDeadlineUnderPressure) {
  AdmissionTable t(Policy(8, 8, 4));
  ConnId id = 1;
  ASSERT_EQ(AdmitMany(&t, &id, "10.0.0.1", 3, 100), 3);
  EXPECT_FALSE(t.Pressed(Pool::kOpen));
  EXPECT_EQ(t.DeadlineOf(1), Millis{100 + 10000});
  EXPECT_TRUE(t.TakeExpired(100 + 9999).empty());
  ASSERT_TRUE(t.Admit(id++, "10.0.0.2", 200).admitted);  // the fourth: pressure
  EXPECT_TRUE(t.Pressed(Pool::kOpen));
  EXPECT_EQ(t.DeadlineOf(1), Millis{100 + 1000});
  EXPECT_EQ(t.DeadlineOf(4), Millis{200 + 1000});
  const auto expired = t.TakeExpired(1100);
  std::set<ConnId> ids;
  for (const auto& x : expired) {
    ids.insert(x.id);
    EXPECT_EQ(x.stage, Stage::kSilent);
  }
  EXPECT_EQ(ids, (std::set<ConnId>{1, 2, 3}));
  EXPECT_EQ(t.Count(Pool::kOpen), 1);
  // Pressure is gone with them: the fourth is back on its normal deadline.
  EXPECT_EQ(t.DeadlineOf(4), Millis{200 + 10000});
}

TEST(AdmissionTest, ARequestThatBeganSilentKeepsItsClock) {
  AdmissionTable t(Policy(8, 8, 8));
  ASSERT_TRUE(t.Admit(1, "10.0.0.1", 0).admitted);
  t.SetStage(1, Stage::kReading, 9000, /*restart_clock=*/false);
  EXPECT_EQ(t.DeadlineOf(1), Millis{10000});
  t.SetStage(1, Stage::kIdle, 9500);  // answered: the idle clock starts now
  EXPECT_EQ(t.DeadlineOf(1), Millis{9500 + 30000});
}

TEST(AdmissionTest, ProvenConnectionsAreOutOfTheOpenPoolsReach) {
  AdmissionTable t(Policy(4, 4, 2));
  ConnId id = 1;
  ASSERT_TRUE(t.Admit(id++, "10.0.0.1", 0).admitted);
  t.SetStage(1, Stage::kIdle, 0);
  ASSERT_TRUE(t.Promote(1).admitted);
  EXPECT_EQ(t.PoolOf(1), Pool::kProven);
  // A flood from three addresses fills the open pool and keeps reconnecting.
  for (int round = 0; round < 50; ++round) {
    for (const char* a : {"10.6.6.1", "10.6.6.2", "10.6.6.3"}) (void)t.Admit(id++, a, round);
    (void)t.TakeExpired(round);
  }
  EXPECT_EQ(t.Count(Pool::kOpen), 4);
  EXPECT_TRUE(t.Pressed(Pool::kOpen));
  EXPECT_TRUE(t.Contains(1));
  EXPECT_FALSE(t.Pressed(Pool::kProven));
  EXPECT_EQ(t.DeadlineOf(1), Millis{30000}) << "the open pool's pressure does not shorten it";
  EXPECT_EQ(t.Promote(1).admitted, true) << "promoting twice is harmless";
  EXPECT_EQ(t.Count(Pool::kProven), 1);
}

TEST(AdmissionTest, PromotionFollowsTheSameRulesInTheProvenPool) {
  AdmissionPolicy p = Policy(10, 10, 10);
  p.proven = {3, 2, 3};
  AdmissionTable t(p);
  ConnId id = 1;
  ASSERT_EQ(AdmitMany(&t, &id, "10.0.0.1", 4, 0), 4);
  ASSERT_EQ(AdmitMany(&t, &id, "10.0.0.2", 2, 0), 2);
  EXPECT_TRUE(t.Promote(1).admitted);
  EXPECT_TRUE(t.Promote(2).admitted);
  const Admission capped = t.Promote(3);
  EXPECT_FALSE(capped.admitted) << "at its cap of 2 in the proven pool";
  EXPECT_EQ(t.PoolOf(3), Pool::kOpen);
  EXPECT_TRUE(t.Promote(5).admitted);  // 10.0.0.2: the proven pool is full now (3)
  // 10.0.0.2 holds 1 there, 10.0.0.1 two: not two more, so no eviction.
  EXPECT_FALSE(t.Promote(6).admitted);
  t.Remove(5);
  EXPECT_TRUE(t.Promote(6).admitted);
  EXPECT_EQ(t.Count(Pool::kProven), 3);
  EXPECT_EQ(t.Count(Pool::kOpen), 2);
}

TEST(AdmissionTest, AHandfulOfAddressesCannotKeepANewcomerOut) {
  AdmissionTable t(Policy(512, 64, 256));
  ConnId id = 1;
  // Nine addresses reconnect whatever is closed, as fast as they can.
  std::vector<std::string> flood;
  for (int i = 2; i <= 10; ++i) flood.push_back("127.0.0." + std::to_string(i));
  Millis now = 0;
  for (int round = 0; round < 200; ++round, now += 5) {
    for (const auto& a : flood) {
      for (int k = 0; k < 8; ++k) (void)t.Admit(id++, a, now);
    }
    (void)t.TakeExpired(now);
    if (round % 10 == 9) {  // an honest client from another address, now and then
      const ConnId mine = id++;
      const Admission a = t.Admit(mine, "192.0.2." + std::to_string(round), now);
      ASSERT_TRUE(a.admitted) << "round " << round << ": " << a.why;
      t.Remove(mine);  // answered and gone
    }
  }
  (void)t.Admit(id++, flood[0], now);  // the place the last client left is taken again
  EXPECT_EQ(t.Count(Pool::kOpen), 512);
  EXPECT_LE(t.CountFrom(Pool::kOpen, "127.0.0.2"), 64);
}

TEST(AdmissionTest, AdmissionKeyGroupsAnIpv6Slash64AndUnmapsIpv4) {
  EXPECT_EQ(AdmissionKey("192.0.2.7"), "192.0.2.7");
  EXPECT_EQ(AdmissionKey("::ffff:192.0.2.7"), "192.0.2.7");
  EXPECT_EQ(AdmissionKey("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
  EXPECT_EQ(AdmissionKey("2001:db8:1:2:ffff:ffff:ffff:ffff"), "2001:db8:1:2::/64");
  EXPECT_NE(AdmissionKey("2001:db8:1:3::1"), AdmissionKey("2001:db8:1:2::1"));
  EXPECT_EQ(AdmissionKey("?"), "?");
}

TEST(AdmissionTest, ValidatePolicyNamesTheBrokenLimit) {
  AdmissionPolicy p = Policy(8, 8, 4);
  EXPECT_TRUE(ValidatePolicy(p).ok());
  p.open.max_per_address = 0;
  EXPECT_THAT(ValidatePolicy(p).message(), HasSubstr("open pool"));
  p = Policy(8, 8, 4);
  p.proven.pressure_from = 9;
  EXPECT_THAT(ValidatePolicy(p).message(), HasSubstr("proven pool: pressure from 9"));
  p = Policy(8, 8, 4);
  p.timeout(Stage::kIdle).pressed_ms = -1;
  EXPECT_THAT(ValidatePolicy(p).message(), HasSubstr("stage idle"));
}

}  // namespace
}  // namespace kvasir::net
