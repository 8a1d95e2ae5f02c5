// Contribution receipts on rings of real stages (stories260K): the head's callback gets one
// complete, verified receipt per session, with every stage's line; a head without a callback
// sends none; and heads and stages drop receipts they must not sign or pass on, without harm to
// their links.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <future>
#include <set>
#include <stdexcept>

#include "model/arch/registry.h"
#include "model/model_id.h"
#include "ring/handshake.h"
#include "ring/receipt.h"
#include "ring/row_store.h"
#include "ring/sampling_wire.h"
#include "ring/secure_stream.h"
#include "ring_test_util.h"
#include "test_assets.h"
#include "tokenizer/tokenizer.h"

namespace kvasir {
namespace {

using ring::ParseReceipt;
using ring::Receipt;
using ring::ReceiptMsg;
using testing::FakeNeighbours;
using testing::LocalRing;

std::string Model() { return testing::AssetPath("models/stories260K.gguf"); }

ModelId TheModelId() {
  auto file = GgufFile::Open(Model());
  EXPECT_TRUE(file.ok());
  auto id = ComputeModelId(file->header(), Model());
  EXPECT_TRUE(id.ok());
  return id.ok() ? *id : ModelId{};
}

// The payloads a head hands to its on_receipt, as they arrive.
class Receipts {
 public:
  // `then_throw`: the callback throws after taking each receipt (the stage must not mind).
  std::function<void(std::vector<uint8_t>)> Callback(bool then_throw = false) {
    return [this, then_throw](std::vector<uint8_t> payload) {
      {
        std::lock_guard lock(mu_);
        got_.push_back(std::move(payload));
      }
      cv_.notify_all();
      if (then_throw) throw std::runtime_error("the market is down");
    };
  }
  // Every payload so far, once there are at least `n` or `ms` passed.
  std::vector<std::vector<uint8_t>> WaitFor(size_t n, int ms) {
    std::unique_lock lock(mu_);
    cv_.wait_for(lock, std::chrono::milliseconds(ms), [&] { return got_.size() >= n; });
    return got_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::vector<uint8_t>> got_;
};

// One greedy request through the head.
ring::GenerateResult Ask(const std::string& head, const std::string& prompt, int n_predict) {
  auto client = ring::RingClient::Connect(head, 20000, testing::kTestRingSecret);
  EXPECT_TRUE(client.ok()) << client.status().message();
  if (!client.ok()) return {};
  ring::GenerateMsg req;
  req.prompt = prompt;
  req.sampling = ring::SamplingToWire(testing::Greedy(), static_cast<uint32_t>(n_predict), false);
  auto r = (*client)->Generate(req, [](const ring::TokenMsg&) {});
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? *r : ring::GenerateResult{};
}

// STATS travels the ring behind every receipt already sent: once it is back, each receipt of the
// sessions before it has come around (or was dropped). Returns the ring's records.
std::vector<wire::StageStats> Flush(const std::string& head) {
  auto c = ring::RingClient::Connect(head, 20000, testing::kTestRingSecret);
  EXPECT_TRUE(c.ok()) << c.status().message();
  if (!c.ok()) return {};
  auto stats = (*c)->Stats();
  EXPECT_TRUE(stats.ok()) << stats.status().message();
  return stats.ok() ? *stats : std::vector<wire::StageStats>{};
}

int PromptTokens(const std::string& prompt) {
  auto file = GgufFile::Open(Model());
  EXPECT_TRUE(file.ok());
  auto tok = Tokenizer::FromGguf(file->header(), Model());
  EXPECT_TRUE(tok.ok());
  return tok.ok() ? static_cast<int>((*tok)->Encode(prompt, true, true).size()) : -1;
}

// A client link to the head at `port` (authenticating it by the ring secret), HELLO exchanged.
std::unique_ptr<ring::Link> RawRingClient(uint16_t port) {
  auto raw = net::DialTcp("127.0.0.1", port, 5000);
  EXPECT_TRUE(raw.ok()) << raw.status().message();
  if (!raw.ok()) return nullptr;
  ring::LinkAuth auth;
  auth.ring_secret = testing::kTestRingSecret;
  auto hs = ring::HandshakeInitiate(**raw, wire::Role::kClient, auth);
  EXPECT_TRUE(hs.ok()) << hs.status().message();
  if (!hs.ok()) return nullptr;
  auto link = std::make_unique<ring::Link>(
      std::make_unique<ring::SecureStream>(std::move(raw).value(), hs->tx, hs->rx, 1 << 20),
      "client");
  wire::Hello hello{};
  hello.protocol_version = wire::kProtocolVersion;
  hello.role = static_cast<uint32_t>(wire::Role::kClient);
  EXPECT_TRUE(link->Send(ring::HelloMsg{hello}).ok());
  auto reply = link->Receive();
  EXPECT_TRUE(reply.ok() && std::holds_alternative<ring::HelloMsg>(*reply));
  return link;
}

uint16_t PortOf(const std::string& host_port) {
  std::string host;
  uint16_t port = 0;
  EXPECT_TRUE(net::ParseHostPort(host_port, &host, &port).ok());
  return port;
}

// One session on three stages: exactly one receipt, with the three stages' lines in ring order,
// windows tiling [0, 5), every signature good, and every stage reporting the rows it ran: the
// prompt's tokens plus each generated token fed back, that is n_prompt + n_generated - 1 (the
// last token is sampled but never run).
TEST(RingReceiptTest, ThreeStagesSignOneReceiptPerSession) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  Receipts receipts;
  std::vector<ring::PublicKey> keys(3);
  auto ring = LocalRing::Start(Model(), 3, wire::Dtype::kF32, 256, /*chunk=*/3, 256,
                               [&](int i, ring::StageOptions& o) {
                                 keys[i] = o.key->public_key();
                                 if (i == 0) o.on_receipt = receipts.Callback();
                               });
  ASSERT_NE(ring, nullptr);
  const std::string prompt = "Once upon a time";
  const ring::GenerateResult result = Ask(ring->head(), prompt, 8);
  EXPECT_EQ(result.reason, wire::FinishReason::kMaxTokens);
  EXPECT_EQ(result.n_generated, 8);
  EXPECT_EQ(result.n_prompt, PromptTokens(prompt));
  ASSERT_EQ(receipts.WaitFor(1, 20000).size(), 1u);
  const std::vector<wire::StageStats> stats = Flush(ring->head());
  const auto got = receipts.WaitFor(2, 0);
  ASSERT_EQ(got.size(), 1u) << "one receipt per session";

  auto r = ParseReceipt(got[0]);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(ring::VerifyReceipt(*r).ok()) << ring::VerifyReceipt(*r).message();
  const ModelId model_id = TheModelId();
  EXPECT_TRUE(std::equal(model_id.begin(), model_id.end(), r->model_id.begin()));
  EXPECT_NE(r->session, 0u);
  const uint64_t rows = static_cast<uint64_t>(result.n_prompt + result.n_generated - 1);
  ASSERT_EQ(r->lines.size(), 3u);
  uint32_t next_first = 0;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(r->lines[i].node, keys[i]) << "line " << i << " is stage " << i << "'s";
    EXPECT_EQ(r->lines[i].first, next_first) << i;
    next_first = r->lines[i].last;
    EXPECT_EQ(r->lines[i].tokens, rows) << i;
  }
  EXPECT_EQ(next_first, 5u) << "the windows tile the model's 5 layers";
  // What each window actually ran, by the stages' own statistics.
  ASSERT_EQ(stats.size(), 3u);
  for (const auto& s : stats) EXPECT_EQ(s.rows, rows) << s.name;
}

// The widened f32 values of a revealed hidden row.
std::vector<float> Widen(const ring::RowSide& side) {
  ring::HiddenMsg h;
  h.dtype = side.kind == ring::RowKind::kF16 ? wire::Dtype::kF16 : wire::Dtype::kF32;
  h.n_tokens = 1;
  h.n_embd = static_cast<uint32_t>(side.bytes.size() / wire::DtypeSize(h.dtype));
  h.data = side.bytes;
  std::vector<float> out;
  ring::HiddenToF32(h, &out);
  return out;
}

std::vector<uint8_t> TokenBytes(int32_t id) {
  std::vector<uint8_t> b(4);
  std::memcpy(b.data(), &id, 4);
  return b;
}

// Every stage's line commits to the rows its window took in and gave out, and every stage
// reveals any position of the session from its row store, checked against its line alone. The
// reveals chain: what a stage sent (f16 on the wire) is what the next one took in, the head took
// in the prompt and then each token the last stage sampled, and only sampled positions carry a
// token out of the last stage.
TEST(RingReceiptTest, EveryLineCommitsToRowsItsStageReveals) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  Receipts receipts;
  std::vector<std::shared_ptr<ring::RowStore>> stores;
  for (int i = 0; i < 3; ++i) {
    stores.push_back(std::make_shared<ring::RowStore>(ring::RowStoreOptions{}));
  }
  auto ring = LocalRing::Start(Model(), 3, wire::Dtype::kF16, 256, /*chunk=*/3, 256,
                               [&](int i, ring::StageOptions& o) {
                                 o.row_store = stores[i];
                                 if (i == 0) o.on_receipt = receipts.Callback();
                               });
  ASSERT_NE(ring, nullptr);
  const std::string prompt = "Once upon a time";
  const ring::GenerateResult result = Ask(ring->head(), prompt, 8);
  ASSERT_EQ(receipts.WaitFor(1, 20000).size(), 1u);
  auto r = ParseReceipt(receipts.WaitFor(1, 0)[0]);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->lines.size(), 3u);
  const uint64_t n = r->lines[0].tokens;
  ASSERT_EQ(n, static_cast<uint64_t>(result.n_prompt + result.n_generated - 1));
  std::vector<uint64_t> all(n);
  for (uint64_t i = 0; i < n; ++i) all[i] = i;
  std::vector<ring::RowReveal> reveals;
  for (size_t s = 0; s < 3; ++s) {
    auto rev = stores[s]->Reveal(r->id, all);
    ASSERT_TRUE(rev.ok()) << s << ": " << rev.status().message();
    ASSERT_TRUE(ring::CheckReveal(*rev, r->lines[s].rows_root, n).ok())
        << s << ": " << ring::CheckReveal(*rev, r->lines[s].rows_root, n).message();
    EXPECT_EQ(rev->root, r->lines[s].rows_root);
    reveals.push_back(std::move(rev).value());
  }
  EXPECT_NE(r->lines[0].rows_root, r->lines[1].rows_root);
  for (uint64_t p = 0; p < n; ++p) {
    const ring::PositionRows& head = reveals[0].positions[p].rows;
    const ring::PositionRows& mid = reveals[1].positions[p].rows;
    const ring::PositionRows& tail = reveals[2].positions[p].rows;
    EXPECT_EQ(head.pos, p);
    EXPECT_EQ(head.in.kind, ring::RowKind::kToken);
    EXPECT_EQ(head.out.kind, ring::RowKind::kF16);
    EXPECT_EQ(head.out.bytes.size(), 64u * 2) << "stories260K's 64 values, f16";
    EXPECT_EQ(Widen(head.out), Widen(mid.in)) << "position " << p;
    EXPECT_EQ(mid.in.kind, ring::RowKind::kF32);
    EXPECT_EQ(Widen(mid.out), Widen(tail.in)) << "position " << p;
    const bool sampled = p + 1 >= static_cast<uint64_t>(result.n_prompt);
    if (!sampled) {
      EXPECT_EQ(tail.out.kind, ring::RowKind::kNone) << p;
      continue;
    }
    ASSERT_EQ(tail.out.kind, ring::RowKind::kToken) << p;
    if (p + 1 < n) {
      EXPECT_EQ(tail.out.bytes, reveals[0].positions[p + 1].rows.in.bytes)
          << "the head ran the token sampled at " << p;
    }
  }
  // Positions the head had from the prompt are the prompt's tokens: the first is BOS.
  auto file = GgufFile::Open(Model());
  ASSERT_TRUE(file.ok());
  auto tok = Tokenizer::FromGguf(file->header(), Model());
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> ids = (*tok)->Encode(prompt, true, true);
  for (size_t p = 0; p < ids.size(); ++p) {
    EXPECT_EQ(reveals[0].positions[p].rows.in.bytes, TokenBytes(ids[p])) << p;
  }
}

// A one-stage ring: the head's successor is itself, and the receipt is its line alone.
TEST(RingReceiptTest, OneStageRingSignsItsOwnReceipt) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  Receipts receipts;
  ring::PublicKey key{};
  auto ring = LocalRing::Start(Model(), 1, wire::Dtype::kF32, 256, 64, 256,
                               [&](int, ring::StageOptions& o) {
                                 key = o.key->public_key();
                                 o.on_receipt = receipts.Callback();
                               });
  ASSERT_NE(ring, nullptr);
  const ring::GenerateResult result = Ask(ring->head(), "The cat sat", 5);
  const auto got = receipts.WaitFor(1, 20000);
  ASSERT_EQ(got.size(), 1u);
  auto r = ParseReceipt(got[0]);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(ring::VerifyReceipt(*r).ok());
  ASSERT_EQ(r->lines.size(), 1u);
  EXPECT_EQ(r->lines[0].node, key);
  EXPECT_EQ(r->lines[0].first, 0u);
  EXPECT_EQ(r->lines[0].last, 5u);
  EXPECT_EQ(r->lines[0].tokens, static_cast<uint64_t>(result.n_prompt + result.n_generated - 1));
}

// A client that leaves mid-generation still gets its session a receipt, and the stages agree on
// the rows although some may have been in flight when the session closed.
TEST(RingReceiptTest, ASessionTheClientClosesGetsAnAgreeingReceipt) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  Receipts receipts;
  auto ring = LocalRing::Start(Model(), 3, wire::Dtype::kF32, 2048, 64, 256,
                               [&](int i, ring::StageOptions& o) {
                                 if (i == 0) o.on_receipt = receipts.Callback();
                               });
  ASSERT_NE(ring, nullptr);
  auto client = RawRingClient(PortOf(ring->head()));
  ASSERT_NE(client, nullptr);
  ring::GenerateMsg req;
  req.prompt = "Once upon a time";
  req.sampling = ring::SamplingToWire(testing::Greedy(), 1500, /*ignore_eog=*/true);
  ASSERT_TRUE(client->Send(req).ok());
  int tokens = 0;
  while (tokens < 3) {
    auto m = client->Receive();
    ASSERT_TRUE(m.ok()) << m.status().message();
    const auto* t = std::get_if<ring::TokenMsg>(&*m);
    ASSERT_NE(t, nullptr) << ring::MessageName(*m);
    if (++tokens == 3) {
      ASSERT_TRUE(client->Send(ring::CloseMsg{t->token.session, 6}).ok());
    }
  }
  const auto got = receipts.WaitFor(1, 20000);
  ASSERT_EQ(got.size(), 1u);
  auto r = ParseReceipt(got[0]);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_TRUE(ring::VerifyReceipt(*r).ok());
  ASSERT_EQ(r->lines.size(), 3u);
  const uint64_t n_prompt = static_cast<uint64_t>(PromptTokens(req.prompt));
  EXPECT_GE(r->lines[0].tokens, n_prompt + 2) << "the prompt and the two tokens fed back";
  EXPECT_LT(r->lines[0].tokens, n_prompt + 1500);
  for (const auto& line : r->lines) EXPECT_EQ(line.tokens, r->lines[0].tokens);
  client->Close();
}

// Two sessions at once: two receipts, with distinct ids and sessions, each complete.
TEST(RingReceiptTest, ConcurrentSessionsGetDistinctReceipts) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  Receipts receipts;
  auto ring = LocalRing::Start(Model(), 3, wire::Dtype::kF32, 256, 64, 256,
                               [&](int i, ring::StageOptions& o) {
                                 if (i == 0) o.on_receipt = receipts.Callback();
                               });
  ASSERT_NE(ring, nullptr);
  auto a = std::async(std::launch::async, [&] { return Ask(ring->head(), "The cat sat", 6); });
  auto b = std::async(std::launch::async,
                      [&] { return Ask(ring->head(), "Lily and Ben went to the park", 10); });
  const ring::GenerateResult ra = a.get(), rb = b.get();
  ASSERT_EQ(receipts.WaitFor(2, 20000).size(), 2u);
  Flush(ring->head());
  const auto got = receipts.WaitFor(3, 0);
  ASSERT_EQ(got.size(), 2u);
  std::set<std::string> ids;
  std::set<uint32_t> sessions;
  std::multiset<uint64_t> rows;
  for (const auto& payload : got) {
    auto r = ParseReceipt(payload);
    ASSERT_TRUE(r.ok()) << r.status().message();
    EXPECT_TRUE(ring::VerifyReceipt(*r).ok());
    ASSERT_EQ(r->lines.size(), 3u);
    EXPECT_EQ(r->lines[0].tokens, r->lines[2].tokens);
    ids.insert(ring::ReceiptIdHex(*r));
    sessions.insert(r->session);
    rows.insert(r->lines[0].tokens);
  }
  EXPECT_EQ(ids.size(), 2u);
  EXPECT_EQ(sessions.size(), 2u);
  EXPECT_EQ(rows, (std::multiset<uint64_t>{uint64_t(ra.n_prompt + ra.n_generated - 1),
                                           uint64_t(rb.n_prompt + rb.n_generated - 1)}));
}

// Layers [2, 5) played by the test around a real head [0, 2): PING, CLOSE_SESSION and STATS go
// back to the head, every sampling HIDDEN gets a final TOKEN (a session ends after its prompt),
// and each RECEIPT goes to `on_receipt`, which decides what the head gets back.
class RestOfRing {
 public:
  RestOfRing(FakeNeighbours* fake, std::function<void(const ReceiptMsg&)> on_receipt)
      : fake_(fake), on_receipt_(std::move(on_receipt)), thread_([this] { Loop(); }) {}
  ~RestOfRing() {
    stop_ = true;
    thread_.join();
  }

 private:
  void Loop() {
    ring::Link& pred = fake_->pred();
    while (!stop_) {
      auto m = fake_->inbox().Next(50);
      if (!m) continue;
      if (auto* h = std::get_if<ring::HiddenMsg>(&*m)) {
        if ((h->flags & wire::kHiddenSample) == 0) continue;
        ring::TokenMsg t;
        t.token.session = h->session;
        t.token.pos = h->pos0 + h->n_tokens;
        t.token.id = 100;
        t.token.finished = 1;
        t.token.reason = static_cast<uint8_t>(wire::FinishReason::kMaxTokens);
        (void)pred.Send(t);
      } else if (auto* r = std::get_if<ReceiptMsg>(&*m)) {
        on_receipt_(*r);
      } else if (std::holds_alternative<ring::PingMsg>(*m) ||
                 std::holds_alternative<ring::CloseMsg>(*m) ||
                 std::holds_alternative<ring::StatsMsg>(*m)) {
        (void)pred.Send(*m);
      }
    }
  }

  FakeNeighbours* fake_;
  std::function<void(const ReceiptMsg&)> on_receipt_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

ring::StageOptions HeadOptions() {
  ring::StageOptions o;
  o.model_path = Model();
  o.first = 0;
  o.last = 2;
  o.name = "head";
  o.n_ctx = 64;
  o.cache_bytes = 0;  // every session runs its whole prompt: its line counts all of it
  return o;
}

// A head without on_receipt sends no RECEIPT, and a client may not send one.
TEST(RingReceiptTest, HeadWithoutCallbackSendsNone) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  auto fake = FakeNeighbours::Start(HeadOptions(), testing::FakeStageHello(Model(), 2, 5));
  ASSERT_NE(fake, nullptr);
  std::atomic<int> seen{0};
  RestOfRing rest(fake.get(), [&](const ReceiptMsg&) { seen++; });
  const std::string head = fmt::format("127.0.0.1:{}", fake->stage().port());
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(Ask(head, "Once upon a time", 4).reason, wire::FinishReason::kMaxTokens);
  }
  Flush(head);
  EXPECT_EQ(seen.load(), 0);

  auto client = RawRingClient(fake->stage().port());
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Send(ReceiptMsg{{1, 2, 3}}).ok());
  auto reply = client->Receive();
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  auto* err = std::get_if<ring::ErrorMsg>(&*reply);
  ASSERT_NE(err, nullptr) << ring::MessageName(*reply);
  EXPECT_EQ(err->code, wire::ErrorCode::kBadRequest);
  EXPECT_NE(err->message.find("unexpected RECEIPT"), std::string::npos) << err->message;
  client->Close();
}

// What comes back to a head with on_receipt: only a complete receipt it started, each signature
// good, reaches the callback, once. Garbage, a receipt that stops short of the last layer, a
// tampered line, an unknown id and a replay are dropped; the links stay up, and a callback that
// throws harms nothing.
TEST(RingReceiptTest, HeadHandsOnOnlyCompleteReceiptsItStarted) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  Receipts receipts;
  ring::StageOptions o = HeadOptions();
  o.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
  o.on_receipt = receipts.Callback(/*then_throw=*/true);
  auto fake = FakeNeighbours::Start(o, testing::FakeStageHello(Model(), 2, 5));
  ASSERT_NE(fake, nullptr);
  std::mutex mu;
  std::vector<Receipt> sent_round;  // what the head sent, as it arrived here
  std::vector<std::vector<uint8_t>> good;
  RestOfRing rest(fake.get(), [&](const ReceiptMsg& m) {
    auto r = ParseReceipt(m.payload);
    ASSERT_TRUE(r.ok()) << r.status().message();
    ring::Link& pred = fake->pred();
    const uint64_t rows = r->lines[0].tokens;
    Receipt done = *r;
    ring::AppendReceiptLine(&done, fake->key(), 2, 5, rows, ring::Digest{});
    Receipt tampered = done;
    tampered.lines[1].tokens += 1;
    Receipt unknown = *r;
    unknown.id[0] ^= 1;
    ring::AppendReceiptLine(&unknown, fake->key(), 2, 5, rows, ring::Digest{});
    for (const std::vector<uint8_t>& payload :
         {std::vector<uint8_t>{1, 2, 3}, m.payload, ring::EncodeReceipt(tampered),
          ring::EncodeReceipt(unknown), ring::EncodeReceipt(done), ring::EncodeReceipt(done)}) {
      ASSERT_TRUE(pred.Send(ReceiptMsg{payload}).ok());
    }
    std::lock_guard lock(mu);
    sent_round.push_back(*r);
    good.push_back(ring::EncodeReceipt(done));
  });
  const std::string head = fmt::format("127.0.0.1:{}", fake->stage().port());
  const std::string prompt = "Once upon a time";
  for (int i = 1; i <= 2; ++i) {
    const ring::GenerateResult result = Ask(head, prompt, 4);
    EXPECT_EQ(result.n_generated, 1) << "the fake ends each session at its first token";
    Flush(head);
    const auto got = receipts.WaitFor(i + 1, 0);
    ASSERT_EQ(got.size(), static_cast<size_t>(i));
    std::lock_guard lock(mu);
    ASSERT_EQ(sent_round.size(), static_cast<size_t>(i));
    const Receipt& r = sent_round.back();
    ASSERT_EQ(r.lines.size(), 1u) << "the head starts a receipt with its own line";
    EXPECT_EQ(r.lines[0].node, o.key->public_key());
    EXPECT_EQ(r.lines[0].first, 0u);
    EXPECT_EQ(r.lines[0].last, 2u);
    EXPECT_EQ(r.lines[0].tokens, static_cast<uint64_t>(PromptTokens(prompt)));
    EXPECT_EQ(got.back(), good.back()) << "the complete receipt, byte for byte";
  }
}

// A stage (layers [2, 5), the fakes around it playing [0, 2)) signs a receipt only for a session
// that closed there, for its model, over lines that verify and end where its window starts; it
// drops anything else without closing its link.
TEST(RingReceiptTest, StageSignsOnlyReceiptsOfSessionsClosedThere) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  ring::StageOptions o;
  o.model_path = Model();
  o.first = 2;
  o.last = 5;
  o.name = "tail";
  o.n_ctx = 64;
  o.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
  auto fake = FakeNeighbours::Start(o, testing::FakeStageHello(Model(), 0, 2));
  ASSERT_NE(fake, nullptr);
  ring::Link& pred = fake->pred();
  auto until_stats = [&] {  // what the stage sent on until a STATS came through
    std::vector<ring::Message> got;
    EXPECT_TRUE(pred.Send(ring::StatsMsg{}).ok());
    for (auto m = fake->inbox().Next(10000); m; m = fake->inbox().Next(10000)) {
      if (std::holds_alternative<ring::StatsMsg>(*m)) return got;
      got.push_back(std::move(*m));
    }
    ADD_FAILURE() << "no STATS came through";
    return got;
  };
  // The stage takes its successor link once our HELLO reached it; until then it drops.
  bool through = false;
  for (int i = 0; i < 100 && !through; ++i) {
    ASSERT_TRUE(pred.Send(ring::StatsMsg{}).ok());
    for (auto m = fake->inbox().Next(100); m && !through; m = fake->inbox().Next(0)) {
      through = std::holds_alternative<ring::StatsMsg>(*m);
    }
  }
  ASSERT_TRUE(through);

  constexpr uint32_t kSession = 21;
  constexpr uint32_t kRows = 6;
  ring::OpenSessionMsg open;
  open.session = kSession;
  open.sampling = ring::SamplingToWire(testing::Greedy(), 4, false);
  open.prompt = {1, 2, 3, 4, 5, 6};
  ASSERT_TRUE(pred.Send(open).ok());
  std::vector<float> rows(size_t{kRows} * 64, 0.125f);
  ASSERT_TRUE(pred.Send(ring::MakeHidden(kSession, 0, kRows, 64, wire::Dtype::kF32,
                                         wire::kHiddenSample, rows))
                  .ok());
  ASSERT_TRUE(pred.Send(ring::CloseMsg{kSession, 2}).ok());

  const ModelId model_id = TheModelId();
  auto receipt = [&](uint32_t session, uint32_t last) {
    Receipt r;
    r.session = session;
    r.id[0] = static_cast<uint8_t>(session);
    std::copy(model_id.begin(), model_id.end(), r.model_id.begin());
    ring::AppendReceiptLine(&r, fake->key(), 0, last, kRows, ring::Digest{});
    return r;
  };
  Receipt wrong_model = receipt(kSession, 2);
  wrong_model.model_id[3] ^= 1;
  wrong_model.lines.clear();
  ring::AppendReceiptLine(&wrong_model, fake->key(), 0, 2, kRows, ring::Digest{});
  Receipt forged = receipt(kSession, 2);
  forged.lines[0].tokens = 600;
  const Receipt good = receipt(kSession, 2);
  for (const std::vector<uint8_t>& payload :
       {std::vector<uint8_t>(47, 0), ring::EncodeReceipt(receipt(99, 2)),
        ring::EncodeReceipt(wrong_model), ring::EncodeReceipt(forged),
        ring::EncodeReceipt(receipt(kSession, 1)), ring::EncodeReceipt(good),
        ring::EncodeReceipt(good)}) {
    ASSERT_TRUE(pred.Send(ReceiptMsg{payload}).ok());
  }
  std::vector<Receipt> signed_on;
  for (const ring::Message& m : until_stats()) {
    EXPECT_FALSE(std::holds_alternative<ring::ErrorMsg>(m)) << ring::MessageName(m);
    if (const auto* r = std::get_if<ReceiptMsg>(&m)) {
      auto parsed = ParseReceipt(r->payload);
      ASSERT_TRUE(parsed.ok()) << parsed.status().message();
      signed_on.push_back(*parsed);
    }
  }
  ASSERT_EQ(signed_on.size(), 1u) << "only the good receipt, once";
  const Receipt& r = signed_on[0];
  EXPECT_TRUE(ring::VerifyReceipt(r).ok()) << ring::VerifyReceipt(r).message();
  ASSERT_EQ(r.lines.size(), 2u);
  EXPECT_EQ(r.lines[0].signature, good.lines[0].signature);
  EXPECT_EQ(r.lines[1].node, o.key->public_key());
  EXPECT_EQ(r.lines[1].first, 2u);
  EXPECT_EQ(r.lines[1].last, 5u);
  EXPECT_EQ(r.lines[1].tokens, kRows) << "the rows its HIDDEN frames brought";
}

}  // namespace
}  // namespace kvasir
