// The head after a repair's replay (docs/PROTOCOL.md, "Repair"), on one real head between fake
// neighbours: TOKENs the last stage drew before the replay may still reach the head after the
// replay began (stages past the break finish the rows they had queued, and the probe overtakes
// them). The head must neither stream nor feed any of them, whatever they carry (drafts, a chain
// of kTokenMore, a guessed window with kTokenAhead): the last stage drew them from a state the
// replay threw away. Once the replay's OPEN_SESSION has come back around, the tokens drawn after
// the replay are streamed and fed as in a run never interrupted.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "ring/messages.h"
#include "ring/sampling_wire.h"
#include "ring_test_util.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;

constexpr const char* kModel = "models/stories260K.gguf";  // 5 layers; the head runs 0:2
constexpr const char* kPrompt = "Once upon a time";

// One real head (layers 0:2) whose neighbours are the test, and a client of it.
struct Head {
  std::unique_ptr<testing::FakeNeighbours> fake;
  std::unique_ptr<testing::RawRingClient> client;
  uint32_t session = 0;
  int n_prompt = 0;
  std::vector<int32_t> ids;  // the tokens one process draws after the prompt
};

// The next message the head sends on that satisfies `want`, skipping others (within 10 s).
std::optional<ring::Message> NextSent(Head& h,
                                      const std::function<bool(const ring::Message&)>& want) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) break;
    auto m = h.fake->inbox().Next(static_cast<int>(left.count()));
    if (!m) break;
    if (want(*m)) return m;
  }
  ADD_FAILURE() << "the head did not send what was expected";
  return std::nullopt;
}

// Plays the rest of the ring: the head's probe goes back to it, so it takes that the ring is
// closed (and replays what it holds).
void ReturnProbe(Head& h) {
  auto probe = NextSent(h, [](const ring::Message& m) {
    auto* p = std::get_if<ring::PingMsg>(&m);
    return p != nullptr && !p->pong;
  });
  ASSERT_TRUE(probe.has_value());
  ASSERT_TRUE(h.fake->pred().Send(*probe).ok());
}

// The HIDDEN the head feeds next for its session at or past `pos` (rows it replays are skipped).
std::optional<ring::HiddenMsg> NextFed(Head& h, uint32_t pos) {
  auto m = NextSent(h, [&](const ring::Message& m) {
    auto* hid = std::get_if<ring::HiddenMsg>(&m);
    return hid != nullptr && hid->session == h.session && hid->pos0 >= pos;
  });
  if (!m) return std::nullopt;
  return std::get<ring::HiddenMsg>(*m);
}

ring::TokenMsg Token(uint32_t session, int pos, int32_t id) {
  ring::TokenMsg t;
  t.token.session = session;
  t.token.pos = static_cast<uint32_t>(pos);
  t.token.id = id;
  return t;
}

// The client's next message: a TOKEN, or a failure that names what came instead.
void ExpectClientToken(Head& h, int pos, int32_t id) {
  auto m = h.client->Receive(10000);
  ASSERT_TRUE(m.ok()) << m.status().message();
  if (auto* e = std::get_if<ring::ErrorMsg>(&*m)) FAIL() << "the session failed: " << e->message;
  auto* t = std::get_if<ring::TokenMsg>(&*m);
  ASSERT_NE(t, nullptr) << ring::MessageName(*m);
  EXPECT_EQ(t->token.pos, static_cast<uint32_t>(pos));
  EXPECT_EQ(t->token.id, id);
}

// A head whose session has generated two tokens (the prompt and both fed), then held by a break
// past it and replayed once the probe came around. Returns the replay's OPEN_SESSION, which the
// test sends back when the ring would.
std::unique_ptr<Head> ReplayedHead(ring::OpenSessionMsg* replay) {
  auto h = std::make_unique<Head>();
  const auto local =
      testing::GenerateLocally(AssetPath(kModel), kPrompt, testing::Greedy(), 8, 64, true);
  h->ids = local.ids;
  EXPECT_GE(h->ids.size(), 6u);
  ring::StageOptions o;
  o.model_path = AssetPath(kModel);
  o.first = 0;
  o.last = 2;
  o.name = "head";
  o.n_ctx = 64;
  // The last stage before it and the stage after it hold the same window, 2:5.
  h->fake = testing::FakeNeighbours::Start(o, testing::FakeStageHello(AssetPath(kModel), 2, 5));
  if (h->fake == nullptr) return nullptr;
  ReturnProbe(*h);
  auto client = testing::RawRingClient::Connect(h->fake->stage().port());
  EXPECT_TRUE(client.ok()) << client.status().message();
  if (!client.ok()) return nullptr;
  h->client = std::move(client).value();
  ring::GenerateMsg g;
  g.prompt = kPrompt;
  g.sampling = ring::SamplingToWire(testing::Greedy(), 16, /*ignore_eog=*/true);
  EXPECT_TRUE(h->client->Send(g).ok());
  auto open = NextSent(
      *h, [](const ring::Message& m) { return std::holds_alternative<ring::OpenSessionMsg>(m); });
  if (!open) return nullptr;
  h->session = std::get<ring::OpenSessionMsg>(*open).session;
  h->n_prompt = static_cast<int>(std::get<ring::OpenSessionMsg>(*open).prompt.size());
  ring::Link& pred = h->fake->pred();
  // Two tokens, each streamed and fed (a decode row at its position).
  for (int i = 0; i < 2; ++i) {
    const int pos = h->n_prompt + i;
    EXPECT_TRUE(pred.Send(Token(h->session, pos, h->ids[i])).ok());
    ExpectClientToken(*h, pos, h->ids[i]);
    auto fed = NextFed(*h, static_cast<uint32_t>(pos));
    if (!fed) return nullptr;
    EXPECT_EQ(fed->pos0, static_cast<uint32_t>(pos));
  }
  // A link past the head broke: the stage after it says so toward the head, which holds the
  // session; the ring is repaired and the head's probe comes around again.
  EXPECT_TRUE(pred.Send(ring::ErrorMsg{wire::ErrorCode::kLinkDown, 0, "link down (test)"}).ok());
  ReturnProbe(*h);
  auto open_again = NextSent(*h, [](const ring::Message& m) {
    auto* o = std::get_if<ring::OpenSessionMsg>(&m);
    return o != nullptr && o->replay;
  });
  if (!open_again) return nullptr;
  *replay = std::get<ring::OpenSessionMsg>(*open_again);
  EXPECT_EQ(replay->prompt.size(), static_cast<size_t>(h->n_prompt + 2));
  return h;
}

// After the replay began, `stale` (tokens drawn before it) arrive, then the replay's
// OPEN_SESSION, then the token the last stage draws after the replay: the client's next token is
// that one, and the head feeds only it, as one decode row, at its position.
void CheckStaleTokensDropped(const std::function<std::vector<ring::TokenMsg>(const Head&)>& stale) {
  ring::OpenSessionMsg replay;
  auto h = ReplayedHead(&replay);
  ASSERT_NE(h, nullptr);
  ring::Link& pred = h->fake->pred();
  const int n = h->n_prompt + 2;
  for (const ring::TokenMsg& t : stale(*h)) ASSERT_TRUE(pred.Send(t).ok());
  ASSERT_TRUE(pred.Send(replay).ok());
  ASSERT_TRUE(pred.Send(Token(h->session, n, h->ids[2])).ok());
  ExpectClientToken(*h, n, h->ids[2]);
  auto fed = NextFed(*h, static_cast<uint32_t>(h->n_prompt + 2));
  ASSERT_TRUE(fed.has_value());
  EXPECT_EQ(fed->pos0, static_cast<uint32_t>(n));
  EXPECT_EQ(fed->n_tokens, 1u)
      << "the head fed drafts the last stage did not draw after the replay";
  EXPECT_EQ(fed->flags, wire::kHiddenSample);
  // The session goes on as usual: the next token is streamed and fed.
  ASSERT_TRUE(pred.Send(Token(h->session, n + 1, h->ids[3])).ok());
  ExpectClientToken(*h, n + 1, h->ids[3]);
  fed = NextFed(*h, static_cast<uint32_t>(n + 1));
  ASSERT_TRUE(fed.has_value());
  EXPECT_EQ(fed->pos0, static_cast<uint32_t>(n + 1));
}

// Overlap: a window the last stage guessed before the replay (kTokenAhead), at a position past
// what any stage holds after it.
TEST(ReplayHeadTest, AGuessedWindowDrawnBeforeTheReplayIsNotFed) {
  KV_REQUIRE_ASSET(kModel);
  CheckStaleTokensDropped([](const Head& h) {
    ring::TokenMsg ahead = Token(h.session, h.n_prompt + 3, h.ids[3]);
    ahead.drafts = {h.ids[4], h.ids[5]};
    ahead.ahead = true;
    return std::vector<ring::TokenMsg>{ahead};
  });
}

// Speculation: the token at the position the head waits for, drawn before the replay with drafts
// the last stage (which started the session again, drafting afresh) no longer has pending.
TEST(ReplayHeadTest, DraftsSentBeforeTheReplayAreNotFed) {
  KV_REQUIRE_ASSET(kModel);
  CheckStaleTokensDropped([](const Head& h) {
    ring::TokenMsg t = Token(h.session, h.n_prompt + 2, h.ids[2]);
    t.drafts = {h.ids[3], h.ids[4]};
    return std::vector<ring::TokenMsg>{t};
  });
}

// Speculation: the tokens one verify chunk decided before the replay (kTokenMore, then the last
// with drafts): none is streamed, and nothing past what the replay runs is fed.
TEST(ReplayHeadTest, TokensOfAVerifyChunkBeforeTheReplayAreNotStreamed) {
  KV_REQUIRE_ASSET(kModel);
  CheckStaleTokensDropped([](const Head& h) {
    ring::TokenMsg first = Token(h.session, h.n_prompt + 2, h.ids[2]);
    first.more = true;
    ring::TokenMsg last = Token(h.session, h.n_prompt + 3, h.ids[3]);
    last.drafts = {h.ids[4]};
    ring::TokenMsg ahead = Token(h.session, h.n_prompt + 5, h.ids[5]);
    ahead.drafts = {h.ids[4]};
    ahead.ahead = true;
    return std::vector<ring::TokenMsg>{first, last, ahead};
  });
}

}  // namespace
}  // namespace kvasir
