// The scheduler's paths over a real ring: prompts at the context's edge, context exhaustion,
// stop strings, a full ring refusing work, and bad work from a neighbour failing only its own
// session.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstring>
#include <condition_variable>
#include <deque>
#include <future>
#include <mutex>
#include <thread>
#include <map>
#include <optional>

#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "model/model_id.h"
#include "net/stream.h"
#include "ring/handshake.h"
#include "ring/link.h"
#include "ring/messages.h"
#include "ring/sampling_wire.h"
#include "ring/secure_stream.h"
#include "ring_test_util.h"
#include "test_assets.h"
#include "tokenizer/tokenizer.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::GenerateLocally;
using testing::LocalRing;

using testing::Greedy;

struct Outcome {
  Status status;
  ring::GenerateResult result;
  std::vector<int32_t> ids;
  std::string text;
};

// One request through the head, with everything the client saw.
Outcome Ask(const std::string& head, const std::string& prompt, int n_predict,
            std::vector<std::string> stops = {},
            const std::function<void(const ring::TokenMsg&)>& each = nullptr,
            bool ignore_eog = false) {
  Outcome o;
  auto client = ring::RingClient::Connect(head, 20000, testing::kTestRingSecret);
  if (!client.ok()) {
    o.status = client.status();
    return o;
  }
  ring::GenerateMsg req;
  req.prompt = prompt;
  req.stops = std::move(stops);
  req.sampling = ring::SamplingToWire(Greedy(), static_cast<uint32_t>(n_predict), ignore_eog);
  auto r = (*client)->Generate(req, [&](const ring::TokenMsg& t) {
    if (each) each(t);
    if (t.token.finished && t.token.reason == static_cast<uint8_t>(wire::FinishReason::kEog)) {
      return;
    }
    o.ids.push_back(t.token.id);
    o.text += t.piece;
  });
  if (r.ok()) {
    o.result = *r;
  } else {
    o.status = r.status();
  }
  return o;
}

std::string Model() { return AssetPath("models/stories260K.gguf"); }

std::unique_ptr<Tokenizer> LoadTokenizer() {
  auto file = GgufFile::Open(Model());
  EXPECT_TRUE(file.ok());
  auto tok = Tokenizer::FromGguf(file->header(), Model());
  EXPECT_TRUE(tok.ok());
  return std::move(tok).value();
}

void ExpectNoSessionsOpen(const std::string& head) {
  auto c = ring::RingClient::Connect(head, 20000, testing::kTestRingSecret);
  ASSERT_TRUE(c.ok());
  auto stats = (*c)->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status().message();
  for (const auto& s : *stats) EXPECT_EQ(s.sessions_open, 0u) << s.name;
}

// A prompt that fills the context is refused with the sizes named; one token less is served and
// ends with a full context after one token, as in one process.
TEST(RingPathsTest, PromptAtTheContextEdge) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  auto tok = LoadTokenizer();
  const std::string prompt = "Once upon a time there was a big red ball";
  const int n = static_cast<int>(tok->Encode(prompt, true, true).size());
  const std::string longer = prompt + " and a dog";
  const int m = static_cast<int>(tok->Encode(longer, true, true).size());
  ASSERT_GT(m, n + 1);
  const int ctx = n + 1;  // room for the prompt and one token
  auto ring = LocalRing::Start(Model(), 2, wire::Dtype::kF32, ctx);
  ASSERT_NE(ring, nullptr);

  for (const auto& [text, len] : {std::pair{longer, m}, std::pair{prompt + " and", n + 1}}) {
    ASSERT_EQ(static_cast<int>(tok->Encode(text, true, true).size()), len) << text;
    Outcome over = Ask(ring->head(), text, 8);
    EXPECT_FALSE(over.status.ok()) << text;
    EXPECT_NE(over.status.message().find(
                  fmt::format("the prompt has {} tokens but the context is {}", len, ctx)),
              std::string::npos)
        << over.status.message();
  }
  Outcome edge = Ask(ring->head(), prompt, 8);
  ASSERT_TRUE(edge.status.ok()) << edge.status.message();
  EXPECT_EQ(edge.result.reason, wire::FinishReason::kContextFull);
  EXPECT_EQ(edge.ids, GenerateLocally(Model(), prompt, Greedy(), 8, ctx).ids);
  EXPECT_EQ(edge.ids.size(), 2u) << "the token at the last position, then the one it samples";
  ExpectNoSessionsOpen(ring->head());
}

// Generation that runs into the context ends with "context full" after the same tokens as one
// process with that context.
TEST(RingPathsTest, ContextExhaustionEndsLikeOneProcess) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  constexpr int kCtx = 40;
  auto ring = LocalRing::Start(Model(), 3, wire::Dtype::kF32, kCtx);
  ASSERT_NE(ring, nullptr);
  Outcome o = Ask(ring->head(), "Once upon a time", 200);
  ASSERT_TRUE(o.status.ok()) << o.status.message();
  const auto local = GenerateLocally(Model(), "Once upon a time", Greedy(), 200, kCtx);
  EXPECT_EQ(o.ids, local.ids);
  EXPECT_EQ(o.result.reason, wire::FinishReason::kContextFull);
  // The last token is sampled from the last position and cannot be fed back.
  EXPECT_EQ(o.result.n_prompt + o.result.n_generated, kCtx + 1);
  ExpectNoSessionsOpen(ring->head());
}

// A stop string ends the session at the head: the client gets the text before the token that
// completed it, the reason says so, and every stage frees the session.
TEST(RingPathsTest, StopStringsEndTheSessionAtTheHead) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  auto tok = LoadTokenizer();
  const auto local = GenerateLocally(Model(), "Once upon a time", Greedy(), 32);
  ASSERT_GE(local.ids.size(), 12u);
  // The stop: the pieces of tokens 8 and 9, so it completes on token 9.
  const std::string stop = tok->TokenToPiece(local.ids[8]) + tok->TokenToPiece(local.ids[9]);
  std::string before;
  size_t n_before = 0;
  for (; n_before < local.ids.size(); ++n_before) {
    const std::string next = before + tok->TokenToPiece(local.ids[n_before]);
    if (next.find(stop) != std::string::npos) break;
    before = next;
  }
  auto ring = LocalRing::Start(Model(), 2);
  ASSERT_NE(ring, nullptr);
  Outcome o = Ask(ring->head(), "Once upon a time", 32, {"never appears", stop});
  ASSERT_TRUE(o.status.ok()) << o.status.message();
  EXPECT_EQ(o.result.reason, wire::FinishReason::kStopString);
  EXPECT_EQ(o.text, before);
  EXPECT_EQ(o.ids.size(), n_before + 1) << "the stopping token is reported, without its text";
  ExpectNoSessionsOpen(ring->head());
}

// With --max-sessions 1 a second request while one runs is refused as busy, naming the limit; once
// the first ends the ring serves again. The first runs long (1500 tokens, end-of-generation
// ignored) so that it is still open when its first token arrives.
TEST(RingPathsTest, AFullRingRefusesAndThenServes) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  auto ring = LocalRing::Start(Model(), 2, wire::Dtype::kF32, 2048, 64, 256,
                               [](int, ring::StageOptions& o) { o.max_sessions = 1; });
  ASSERT_NE(ring, nullptr);
  Outcome second;
  bool asked = false;
  Outcome first = Ask(
      ring->head(), "Once upon a time", 1500, {},
      [&](const ring::TokenMsg&) {
        if (asked) return;
        asked = true;
        second = Ask(ring->head(), "The cat sat", 8);
      },
      /*ignore_eog=*/true);
  ASSERT_TRUE(first.status.ok()) << first.status.message();
  EXPECT_EQ(first.result.n_generated, 1500);
  ASSERT_TRUE(asked);
  EXPECT_FALSE(second.status.ok());
  EXPECT_NE(second.status.message().find("the limit is 1"), std::string::npos)
      << second.status.message();
  Outcome again = Ask(ring->head(), "The cat sat", 8);
  ASSERT_TRUE(again.status.ok()) << again.status.message();
  EXPECT_EQ(again.ids, GenerateLocally(Model(), "The cat sat", Greedy(), 8).ids);
}

// A fake head around one real stage (layers 2:5): it is that stage's predecessor and successor.
// Bad work from it (a HIDDEN of the wrong width, rows at a wrong position) fails only those
// sessions with an ERROR that travels on; a good session in the same burst gets its token, equal
// to one process bit for bit.
TEST(RingPathsTest, BadWorkFromANeighbourFailsOnlyItsSession) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string model = Model();
  auto file = GgufFile::Open(model);
  ASSERT_TRUE(file.ok());
  ring::StageOptions o;
  o.model_path = model;
  o.first = 2;
  o.last = 5;
  o.name = "tail";
  o.n_ctx = 64;
  auto fake = testing::FakeNeighbours::Start(o, testing::FakeStageHello(model, 0, 2));
  ASSERT_NE(fake, nullptr);
  ring::Link& pred = fake->pred();
  testing::Inbox& inbox = fake->inbox();
  // The stage takes its successor link once our HELLO reached it: until a STATS comes through,
  // what it sends on is dropped.
  bool through = false;
  for (int i = 0; i < 100 && !through; ++i) {
    ASSERT_TRUE(pred.Send(ring::StatsMsg{}).ok());
    for (auto m = inbox.Next(100); m && !through; m = inbox.Next(0)) {
      through = std::holds_alternative<ring::StatsMsg>(*m);
    }
  }
  ASSERT_TRUE(through) << "the stage never forwarded to its successor";

  // The boundary of a real prompt, from layers 0:2 in this process.
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  WindowOptions wo;
  wo.n_ctx = 64;
  auto front = LayerWindow::Load(shared, {0, 2, true, false}, wo);
  ASSERT_TRUE(front.ok());
  auto tok = LoadTokenizer();
  const std::vector<int32_t> prompt = tok->Encode("Once upon a time", true, true);
  const int n = static_cast<int>(prompt.size());
  ASSERT_TRUE((*front)->OpenSequence(0).ok());
  ForwardOutput mid;
  ASSERT_TRUE((*front)->Forward({{{0, 0, n}}, prompt, {}, false}, &mid).ok());

  auto open = [&](uint32_t session) {
    ring::OpenSessionMsg m;
    m.session = session;
    m.sampling = ring::SamplingToWire(Greedy(), 4, false);
    m.prompt = prompt;
    ASSERT_TRUE(pred.Send(m).ok());
  };
  open(11);  // good
  open(12);  // HIDDEN of the wrong width
  open(13);  // rows at a position its sequence has not reached
  std::vector<float> narrow(static_cast<size_t>(n) * 32, 0.25f);
  ASSERT_TRUE(pred.Send(ring::MakeHidden(12, 0, n, 32, wire::Dtype::kF32, wire::kHiddenSample,
                                         narrow))
                  .ok());
  ASSERT_TRUE(pred.Send(ring::MakeHidden(13, 5, n, 64, wire::Dtype::kF32, wire::kHiddenSample,
                                         mid.hidden))
                  .ok());
  ASSERT_TRUE(pred.Send(ring::MakeHidden(11, 0, n, 64, wire::Dtype::kF32, wire::kHiddenSample,
                                         mid.hidden))
                  .ok());

  std::map<uint32_t, std::string> errors;
  std::optional<ring::TokenMsg> token;
  for (auto m = inbox.Next(10000); m; m = inbox.Next(10000)) {
    if (auto* e = std::get_if<ring::ErrorMsg>(&*m)) errors[e->session] = e->message;
    if (auto* t = std::get_if<ring::TokenMsg>(&*m)) token = *t;
    if (errors.size() >= 2 && token) break;
  }
  EXPECT_NE(errors[12].find("n_embd 32 does not match this stage's 64"), std::string::npos)
      << errors[12];
  EXPECT_FALSE(errors[13].empty());
  EXPECT_EQ(errors.count(11), 0u) << errors[11];
  ASSERT_TRUE(token.has_value());
  EXPECT_EQ(token->token.session, 11u);
  EXPECT_EQ(token->token.pos, static_cast<uint32_t>(n));
  const auto local = GenerateLocally(model, "Once upon a time", Greedy(), 1, 64);
  ASSERT_EQ(local.ids.size(), 1u);
  EXPECT_EQ(token->token.id, local.ids[0]);
  EXPECT_EQ(token->token.logit, local.logits[0]) << "bit for bit with one process";
}

}  // namespace
}  // namespace kvasir
