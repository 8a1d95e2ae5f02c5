// What peers that prove nothing can make a stage hold, part by part: the client budget (who is
// dropped when it is full), the handshake table (who gets a slot), the buffers of the encrypted
// stream and the frame decoder (they grow with the bytes that arrive, never with a header's
// promise), and the frame limits a stage derives from its context.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <random>
#include <thread>

#include "gguf/gguf_file.h"
#include "net/stream.h"
#include "ring/byte_budget.h"
#include "ring/frame.h"
#include "ring/link.h"
#include "ring/link_limits.h"
#include "ring/messages.h"
#include "ring/pending_table.h"
#include "ring/sampling_wire.h"
#include "ring/secure_stream.h"
#include "test_assets.h"
#include "tokenizer/tokenizer.h"

namespace kvasir::ring {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// ---- ByteBudget --------------------------------------------------------------------------------

struct Holder {
  std::shared_ptr<ByteAccount> account;
  std::shared_ptr<size_t> dropped_with = std::make_shared<size_t>(0);
};

Holder Open(ByteBudget& budget) {
  Holder h;
  auto flag = h.dropped_with;
  h.account = budget.Open([flag](size_t held) { *flag = held + 1; });
  return h;
}

TEST(ByteBudgetTest, ChargesWithinTheTotalAreGranted) {
  auto budget = ByteBudget::Create(1000);
  Holder a = Open(*budget), b = Open(*budget);
  EXPECT_TRUE(a.account->Charge(600));
  EXPECT_TRUE(b.account->Charge(400));
  EXPECT_EQ(budget->held(), 1000u);
  a.account->Release(600);
  EXPECT_EQ(budget->held(), 400u);
  b.account.reset();  // an account gives back what it holds when it goes
  EXPECT_EQ(budget->held(), 0u);
  EXPECT_EQ(budget->drops(), 0u);
}

TEST(ByteBudgetTest, TheAccountHoldingLongestIsDroppedFirst) {
  auto budget = ByteBudget::Create(1000);
  Holder oldest = Open(*budget), middle = Open(*budget), young = Open(*budget);
  ASSERT_TRUE(oldest.account->Charge(300));
  ASSERT_TRUE(middle.account->Charge(300));
  ASSERT_TRUE(young.account->Charge(300));
  // 100 bytes are free; a newcomer asking 300 needs one account dropped: the oldest holder.
  Holder newcomer = Open(*budget);
  ASSERT_TRUE(newcomer.account->Charge(300));
  EXPECT_EQ(*oldest.dropped_with, 301u) << "called with the bytes it held";
  EXPECT_EQ(*middle.dropped_with, 0u);
  EXPECT_EQ(*young.dropped_with, 0u);
  EXPECT_TRUE(oldest.account->dropped());
  EXPECT_FALSE(oldest.account->Charge(1)) << "a dropped account gets nothing more";
  EXPECT_EQ(budget->held(), 900u);
  EXPECT_EQ(budget->drops(), 1u);
  // Its late release does not count twice.
  oldest.account->Release(300);
  EXPECT_EQ(budget->held(), 900u);
}

TEST(ByteBudgetTest, AnAccountThatEmptiesStartsOverAsTheYoungest) {
  auto budget = ByteBudget::Create(1000);
  Holder streaming = Open(*budget), stuck = Open(*budget);
  ASSERT_TRUE(streaming.account->Charge(100));
  ASSERT_TRUE(stuck.account->Charge(400));
  // The streaming client's queue drained and filled again: it is now the newer holder.
  streaming.account->Release(100);
  ASSERT_TRUE(streaming.account->Charge(100));
  Holder newcomer = Open(*budget);
  ASSERT_TRUE(newcomer.account->Charge(700));
  EXPECT_NE(*stuck.dropped_with, 0u);
  EXPECT_EQ(*streaming.dropped_with, 0u);
}

TEST(ByteBudgetTest, TheLongestHolderIsRefusedRatherThanDroppingNewerOnes) {
  auto budget = ByteBudget::Create(1000);
  Holder old = Open(*budget), newer = Open(*budget);
  ASSERT_TRUE(old.account->Charge(500));
  ASSERT_TRUE(newer.account->Charge(500));
  EXPECT_FALSE(old.account->Charge(1));
  EXPECT_EQ(*newer.dropped_with, 0u);
  EXPECT_FALSE(Open(*budget).account->Charge(1001)) << "more than the whole budget";
}

TEST(ByteBudgetTest, MessageChargesCountAndRelease) {
  auto budget = ByteBudget::Create(1000);
  Holder a = Open(*budget);
  {
    ByteCharge c1 = ByteCharge::ForMessage(a.account, 200);
    ByteCharge c2 = ByteCharge::ForMessage(a.account, 200);
    ASSERT_TRUE(c1 && c2);
    EXPECT_EQ(a.account->messages(), 2u);
    EXPECT_EQ(budget->held(), 400u);
    ByteCharge moved = std::move(c1);
    EXPECT_FALSE(c1);
    EXPECT_FALSE(ByteCharge::ForMessage(a.account, 700)) << "over the budget: no charge";
    EXPECT_EQ(a.account->messages(), 2u);
  }
  EXPECT_EQ(a.account->messages(), 0u);
  EXPECT_EQ(budget->held(), 0u);
}

TEST(ByteBudgetTest, ConcurrentChargesNeverPassTheTotal) {
  auto budget = ByteBudget::Create(64 * 1024);
  std::vector<std::thread> threads;
  std::atomic<bool> over{false};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(t);
      for (int round = 0; round < 200; ++round) {
        Holder h = Open(*budget);
        size_t mine = 0;
        for (int i = 0; i < 20; ++i) {
          const size_t n = 1 + rng() % 4096;
          if (h.account->Charge(n)) mine += n;
          if (budget->held() > budget->limit()) over = true;
        }
        h.account->Release(mine / 2);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_FALSE(over.load());
  EXPECT_EQ(budget->held(), 0u);
}

// ---- PendingTable ------------------------------------------------------------------------------

PendingTable::Limits SmallTable() {
  PendingTable::Limits l;
  l.slots = 16;
  l.per_address = 4;
  l.reserved = 2;
  l.deadline = milliseconds(5000);
  l.pressure_deadline = milliseconds(1000);
  return l;
}

TEST(PendingTableTest, AnAddressHoldsAtMostItsShare) {
  PendingTable t(SmallTable());
  const auto now = Clock::now();
  for (int i = 0; i < 4; ++i) EXPECT_TRUE(t.Admit("10.0.0.1", now).admitted);
  auto refused = t.Admit("10.0.0.1", now);
  EXPECT_FALSE(refused.admitted);
  EXPECT_NE(refused.refusal.find("10.0.0.1"), std::string::npos) << refused.refusal;
  EXPECT_TRUE(t.Admit("10.0.0.2", now).admitted);
}

TEST(PendingTableTest, AnIpv6Slash64CountsAsOneAddress) {
  EXPECT_EQ(PendingTable::AddressKey("2001:db8:1:2:aaaa::1"), "2001:db8:1:2::/64");
  EXPECT_EQ(PendingTable::AddressKey("2001:db8:1:2:bbbb::9"), "2001:db8:1:2::/64");
  EXPECT_EQ(PendingTable::AddressKey("::ffff:10.1.2.3"), "10.1.2.3");
  EXPECT_EQ(PendingTable::AddressKey("10.1.2.3"), "10.1.2.3");
  PendingTable t(SmallTable());
  const auto now = Clock::now();
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(t.Admit(fmt::format("2001:db8::{}", i + 1), now).admitted);
  }
  EXPECT_FALSE(t.Admit("2001:db8::99", now).admitted);
}

TEST(PendingTableTest, AFullTableMakesRoomFromTheHeaviestAddress) {
  PendingTable t(SmallTable());
  auto now = Clock::now();
  // Three attackers hold 4 each, a fourth holds 2: 14 = slots - reserved.
  std::vector<uint64_t> first_of;
  for (int a = 0; a < 4; ++a) {
    for (int i = 0; i < (a < 3 ? 4 : 2); ++i) {
      auto r = t.Admit(fmt::format("10.0.0.{}", a + 1), now);
      ASSERT_TRUE(r.admitted);
      if (i == 0) first_of.push_back(r.id);
      now += milliseconds(1);
    }
  }
  ASSERT_EQ(t.size(), 14u);
  // A newcomer from elsewhere gets in; the oldest connection of a 4-holder goes.
  auto r = t.Admit("192.168.1.1", now);
  ASSERT_TRUE(r.admitted);
  ASSERT_EQ(r.evicted.size(), 1u);
  EXPECT_EQ(r.evicted[0], first_of[0]);
  EXPECT_EQ(t.size(), 14u);
  // Every newcomer from a fresh address gets in, however many arrive.
  for (int i = 0; i < 40; ++i) {
    now += milliseconds(1);
    EXPECT_TRUE(t.Admit(fmt::format("172.16.0.{}", i + 1), now).admitted);
  }
}

TEST(PendingTableTest, ThePredecessorsAddressHasReservedSlots) {
  PendingTable t(SmallTable());
  const auto now = Clock::now();
  t.Expect("10.9.9.9");
  // Only strangers: 14 slots, then each newcomer replaces one of them.
  for (int i = 0; i < 14; ++i) ASSERT_TRUE(t.Admit(fmt::format("10.0.{}.1", i), now).admitted);
  auto stranger = t.Admit("10.0.99.1", now);
  EXPECT_EQ(stranger.evicted.size(), 1u);
  // The predecessor's address takes a reserved slot without evicting anyone.
  auto pred = t.Admit("10.9.9.9", now);
  ASSERT_TRUE(pred.admitted);
  EXPECT_TRUE(pred.evicted.empty());
  EXPECT_EQ(t.size(), 15u);
}

TEST(PendingTableTest, DeadlinesShortenUnderPressure) {
  PendingTable t(SmallTable());
  const auto now = Clock::now();
  t.Expect("10.9.9.9");
  const uint64_t pred = t.Admit("10.9.9.9", now).id;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 6; ++i) ids.push_back(t.Admit(fmt::format("10.0.0.{}", i + 1), now).id);
  EXPECT_FALSE(t.under_pressure());
  EXPECT_TRUE(t.Expired(now + milliseconds(1500)).empty()) << "7 of 16: the normal 5 s deadline";
  ids.push_back(t.Admit("10.0.0.7", now).id);
  EXPECT_TRUE(t.under_pressure());
  const auto expired = t.Expired(now + milliseconds(1500));
  EXPECT_EQ(expired, ids) << "half full: 1 s, except for the predecessor";
  EXPECT_EQ(t.Expired(now + milliseconds(5000)).size(), 8u);
  for (uint64_t id : ids) t.Remove(id);
  t.Remove(pred);
  EXPECT_EQ(t.size(), 0u);
}

// ---- Buffers grow with the bytes that arrive ---------------------------------------------------

// The receiving half of a connected loopback pair, and the raw sending half.
struct Pair {
  std::unique_ptr<net::Stream> sender, receiver;
};
Pair Connected() {
  auto l = net::Listener::Bind("127.0.0.1", 0);
  EXPECT_TRUE(l.ok());
  auto accepted = std::async(std::launch::async, [&] { return l->Accept(); });
  auto dialed = net::DialTcp("127.0.0.1", l->port(), 2000);
  EXPECT_TRUE(dialed.ok());
  auto got = accepted.get();
  EXPECT_TRUE(got.ok());
  return {std::move(dialed).value(), std::move(got).value()};
}

// Waits up to `ms` for `pred`.
template <typename Pred>
bool WaitFor(Pred pred, int ms = 5000) {
  const auto end = Clock::now() + milliseconds(ms);
  while (!pred()) {
    if (Clock::now() > end) return false;
  }
  return true;
}

TEST(BufferGrowthTest, AnAnnouncedRecordIsNotAllocatedBeforeItsBytesArrive) {
  Pair p = Connected();
  auto budget = ByteBudget::Create(64 << 20);
  Holder h = Open(*budget);
  SessionKey k{};
  SecureStream reader(std::move(p.receiver), k, k, 32 << 20, h.account);
  // Header, then a length announcing 30 MiB, then 100 KiB of it.
  std::vector<uint8_t> head(crypto_secretstream_xchacha20poly1305_HEADERBYTES + 4, 0);
  const uint32_t len = 30u << 20;
  std::memcpy(head.data() + head.size() - 4, &len, 4);
  ASSERT_TRUE(p.sender->WriteAll(head).ok());
  std::vector<uint8_t> part(100 << 10, 0x5a);
  ASSERT_TRUE(p.sender->WriteAll(part).ok());
  auto read = std::async(std::launch::async, [&] {
    uint8_t b[16];
    return reader.ReadSome(b);
  });
  // The reader takes what arrived; what it holds is at most twice that.
  ASSERT_TRUE(WaitFor([&] { return h.account->held() >= part.size(); }));
  EXPECT_LE(h.account->held(), 2 * (head.size() + part.size()) + 8192);
  p.sender->Shutdown();
  auto r = read.get();
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable) << r.status().message();
}

TEST(BufferGrowthTest, ARecordOverTheLinkLimitEndsTheStreamAtItsLength) {
  Pair p = Connected();
  auto budget = ByteBudget::Create(1 << 20);
  Holder h = Open(*budget);
  SessionKey k{};
  SecureStream reader(std::move(p.receiver), k, k, 12000, h.account);
  std::vector<uint8_t> head(crypto_secretstream_xchacha20poly1305_HEADERBYTES + 4, 0);
  const uint32_t len = 64u << 20;
  std::memcpy(head.data() + head.size() - 4, &len, 4);
  ASSERT_TRUE(p.sender->WriteAll(head).ok());
  uint8_t b[16];
  auto r = reader.ReadSome(b);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kTooLarge);
  EXPECT_NE(r.status().message().find("exceeds the 12000-byte limit"), std::string::npos)
      << r.status().message();
  EXPECT_LE(h.account->held(), 8192u);
}

TEST(BufferGrowthTest, AClientStreamHoldsNothingBetweenRecords) {
  Pair p = Connected();
  auto budget = ByteBudget::Create(1 << 20);
  Holder h = Open(*budget);
  SessionKey k1{}, k2{};
  k2[0] = 1;
  SecureStream writer(std::move(p.sender), k1, k2, 1 << 20);
  SecureStream reader(std::move(p.receiver), k2, k1, 1 << 20, h.account);
  std::vector<uint8_t> msg(200 << 10, 7);
  ASSERT_TRUE(writer.WriteAll(msg).ok());
  std::vector<uint8_t> got(msg.size());
  size_t at = 0;
  while (at < got.size()) {
    auto n = reader.ReadSome(std::span<uint8_t>(got).subspan(at));
    ASSERT_TRUE(n.ok());
    at += *n;
  }
  EXPECT_EQ(got, msg);
  // The record was read whole: the next read frees it before waiting for more.
  auto next = std::async(std::launch::async, [&] {
    uint8_t b[4];
    return reader.ReadSome(b);
  });
  EXPECT_TRUE(WaitFor([&] { return h.account->held() == 0; }));
  writer.Shutdown();
  (void)next.get();
}

TEST(BufferGrowthTest, TheDecoderGrowsWithTheBytesFedNotTheHeader) {
  auto budget = ByteBudget::Create(64 << 20);
  Holder h = Open(*budget);
  FrameDecoder d(wire::kMaxPayload, h.account);
  wire::FrameHeader hdr{wire::kMagic, static_cast<uint16_t>(wire::MsgType::kHidden), 0,
                        wire::kMaxPayload, 0};
  d.Feed({reinterpret_cast<const uint8_t*>(&hdr), sizeof(hdr)});
  auto n = d.Next();
  ASSERT_TRUE(n.ok());
  EXPECT_FALSE(n->has_value());
  EXPECT_LE(h.account->held(), 64u) << "64 MiB announced, 16 bytes fed";
  std::vector<uint8_t> drip(1000, 0);
  for (int i = 0; i < 100; ++i) {
    d.Feed(drip);
    ASSERT_TRUE(d.Next().ok());
    EXPECT_LE(h.account->held(), 2 * d.buffered());
  }
}

TEST(BufferGrowthTest, ADecoderWhoseBudgetIsGoneFailsWithTooLarge) {
  auto budget = ByteBudget::Create(4096);
  Holder h = Open(*budget);
  FrameDecoder d(wire::kMaxPayload, h.account);
  std::vector<uint8_t> bytes(5000, 0);
  d.Feed(bytes);
  auto n = d.Next();
  ASSERT_FALSE(n.ok());
  EXPECT_EQ(n.status().code(), StatusCode::kTooLarge);
  EXPECT_EQ(h.account->held(), 0u);
}

// ---- Limits from the context -------------------------------------------------------------------

// A link that refuses a record still being sent reads and drops the rest before it closes: a
// socket closed with bytes unread resets the connection, and the reset can destroy the ERROR the
// peer has not read yet, so the peer would never learn why it was dropped.
TEST(LinkLimitsTest, TheErrorOfARefusedRecordReachesAPeerStillSendingIt) {
  Pair p = Connected();
  LinkOptions o;
  o.max_payload = 4096;
  auto refusing = std::make_unique<Link>(std::move(p.receiver), "predecessor", o);
  Link sending(std::move(p.sender), "successor");
  // 6 MiB: more than the kernel buffers of a loopback connection, so the refusal and the close
  // come while it is still being written.
  std::vector<float> rows(size_t{49152} * 64, 0.5f);
  ASSERT_TRUE(sending.Send(MakeHidden(7, 0, 49152, 64, wire::Dtype::kBF16, 0, rows)).ok());
  auto got = refusing->Receive();
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("exceeds the 4096-byte limit"), std::string::npos)
      << got.status().message();
  refusing->Fail(wire::ErrorCode::kTooLarge, got.status().message());
  refusing->WaitClosed();
  refusing.reset();
  auto reply = sending.Receive();
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  ASSERT_TRUE(std::holds_alternative<ErrorMsg>(*reply)) << MessageName(*reply);
  EXPECT_EQ(std::get<ErrorMsg>(*reply).code, wire::ErrorCode::kTooLarge);
  auto end = sending.Receive();
  ASSERT_FALSE(end.ok());
  EXPECT_EQ(end.status().code(), StatusCode::kEndOfStream) << end.status().message();
}

TEST(LinkLimitsTest, StageLinksTakeWhatTheirContextCanUse) {
  // stories260K: 64 wide; 512 rows of f32 are 128 KiB, an OPEN_SESSION of 2^18 tokens 1 MiB with
  // the most extra sampling and the largest grammar.
  EXPECT_EQ(MaxStagePayload(512, 64),
            sizeof(wire::OpenSessionBody) + (1u << 20) + sizeof(wire::SamplingExtraWire) +
                wire::kMaxLogitBias * sizeof(wire::LogitBiasWire) +
                sizeof(wire::SamplingOutputWire) + wire::kMaxGrammarBytes);
  // A wide model with a long context reaches the protocol's limit.
  EXPECT_EQ(MaxStagePayload(4096, 8192), wire::kMaxPayload);
  EXPECT_EQ(MaxStagePayload(2048, 1024), sizeof(wire::HiddenBody) + 2048u * 1024 * 4);
}

TEST(LinkLimitsTest, APromptOverTheClientLimitCannotFitTheContext) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  auto file = GgufFile::Open(testing::AssetPath("models/stories260K.gguf"));
  ASSERT_TRUE(file.ok());
  auto tok = Tokenizer::FromGguf(file->header(), "stories260K");
  ASSERT_TRUE(tok.ok());
  const int n_ctx = 128;
  const uint32_t limit = MaxPromptBytes(**tok, n_ctx);
  EXPECT_GE(limit, 4u * n_ctx);
  EXPECT_LE(limit, wire::kMaxPromptBytes);
  EXPECT_EQ(MaxClientPayload(limit), sizeof(wire::GenerateBody) + 16 + limit + kMaxClientStopBytes +
                                         sizeof(wire::SamplingExtraWire) +
                                         wire::kMaxLogitBias * sizeof(wire::LogitBiasWire) +
                                         sizeof(wire::SamplingOutputWire) + wire::kMaxGrammarBytes);
  // Texts just over the limit, of the kinds that pack most bytes into a token, never fit.
  std::mt19937 rng(1);
  for (int trial = 0; trial < 50; ++trial) {
    std::string text;
    while (text.size() <= limit) {
      const int32_t id = static_cast<int32_t>(rng() % (*tok)->n_vocab());
      text += trial % 2 == 0 ? (*tok)->TokenToPiece(id) : std::string(1, 'a' + rng() % 26);
    }
    EXPECT_GE((*tok)->Encode(text, true, true).size(), static_cast<size_t>(n_ctx))
        << "a prompt of " << text.size() << " bytes fits a context of " << n_ctx;
  }
}

TEST(SessionChecksTest, EveryFieldIsNamed) {
  wire::SamplingWire ok = SamplingToWire(SamplingParams{}, 8, false);
  const std::vector<int32_t> prompt = {1, 2, 3};
  EXPECT_TRUE(CheckSessionRequest(ok, prompt, 64, 100).ok());
  auto expect = [&](wire::SamplingWire w, std::vector<int32_t> p, int n_ctx,
                    const std::string& field) {
    Status s = CheckSessionRequest(w, p, n_ctx, 100);
    ASSERT_FALSE(s.ok()) << field;
    EXPECT_NE(s.message().find(field), std::string::npos) << s.message();
  };
  auto with = [&](auto set) {
    wire::SamplingWire w = ok;
    set(w);
    return w;
  };
  expect(with([](auto& w) { w.temperature = std::numeric_limits<float>::quiet_NaN(); }), prompt, 64,
         "temperature");
  expect(with([](auto& w) { w.repeat_penalty = -1; }), prompt, 64, "repeat_penalty");
  expect(with([](auto& w) { w.repeat_last_n = -5; }), prompt, 64, "repeat_last_n");
  expect(with([](auto& w) { w.top_k = std::numeric_limits<int32_t>::min(); }), prompt, 64, "top_k");
  expect(with([](auto& w) { w.top_p = 2; }), prompt, 64, "top_p");
  expect(with([](auto& w) { w.min_p = -0.5f; }), prompt, 64, "min_p");
  expect(with([](auto& w) { w.max_tokens = 0; }), prompt, 64, "max_tokens");
  expect(with([](auto& w) { w.flags = 0x80; }), prompt, 64, "flags");
  expect(ok, {}, 64, "n_prompt");
  expect(ok, prompt, 3, "context");
  expect(ok, {1, 100, 2}, 64, "prompt token 1 is 100, outside the vocabulary");
}

}  // namespace
}  // namespace kvasir::ring
