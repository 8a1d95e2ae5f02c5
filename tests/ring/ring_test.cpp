// Rings of stages in one process over loopback TCP: the ring's output equals the single-process
// output, sessions run concurrently, and bad peers are refused without harming the ring.
#include <gtest/gtest.h>

#include <cmath>
#include <future>

#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "model/model_id.h"
#include "net/stream.h"
#include "ring/frame.h"
#include "ring/link.h"
#include "ring/messages.h"
#include "ring/secure_stream.h"
#include "ring_test_util.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::GenerateLocally;
using testing::GenerateOnRing;
using testing::LocalRing;

using testing::Greedy;

struct RingCase {
  std::string model;
  int n_stages;
};

class RingEqualsLocalTest : public ::testing::TestWithParam<RingCase> {};

// Greedy tokens of a ring with an f32 boundary are exactly those of one process.
TEST_P(RingEqualsLocalTest, GreedyTokensMatchSingleProcess) {
  const RingCase c = GetParam();
  KV_REQUIRE_ASSET("models/" + c.model);
  const std::string model = AssetPath("models/" + c.model);
  for (const char* prompt : {"Once upon a time", "Lily wanted to see the big red ball."}) {
    const auto local = GenerateLocally(model, prompt, Greedy(), 24);
    auto ring = LocalRing::Start(model, c.n_stages);
    ASSERT_NE(ring, nullptr);
    const auto got = GenerateOnRing(ring->head(), prompt, Greedy(), 24);
    EXPECT_EQ(got.ids, local.ids) << c.model << " on " << c.n_stages << " stages: " << prompt;
    EXPECT_EQ(got.logits, local.logits) << "an f32 boundary keeps the logits bit for bit";
    EXPECT_EQ(got.text, local.text);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, RingEqualsLocalTest,
    ::testing::Values(RingCase{"stories260K.gguf", 1}, RingCase{"stories260K.gguf", 2},
                      RingCase{"stories260K.gguf", 3}, RingCase{"stories260K.gguf", 5},
                      RingCase{"stories260K-q8_0.gguf", 2}, RingCase{"stories260K-q8_0.gguf", 5},
                      RingCase{"stories260K-q4_0.gguf", 3}, RingCase{"llama-2-tiny-random.gguf", 1},
                      RingCase{"synth-qwen2-q8_0.gguf", 1}, RingCase{"synth-qwen2-q8_0.gguf", 2},
                      // Hybrid DeltaNet/attention with experts: windows [0,4) [4,8) end on the
                      // attention layers; [0,2) [2,5) [5,8) start and end on DeltaNet layers;
                      // one layer per stage has windows of each kind alone.
                      RingCase{"synth-qwen35moe-f32.gguf", 2},
                      RingCase{"synth-qwen35moe-f32.gguf", 3},
                      RingCase{"synth-qwen35moe-f32.gguf", 8}),
    [](const auto& info) {
      std::string s = info.param.model.substr(0, info.param.model.size() - 5);
      for (char& ch : s) {
        if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
      }
      return s + "_" + std::to_string(info.param.n_stages) + "_stages";
    });

// Small prefill chunks (prompt split over several HIDDEN frames) change nothing.
TEST(RingTest, ChunkedPrefillMatchesSingleProcess) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string model = AssetPath("models/stories260K.gguf");
  const char* prompt = "Lily wanted to see the big red ball in the park. She asked her mom.";
  const auto local = GenerateLocally(model, prompt, Greedy(), 16);
  auto ring = LocalRing::Start(model, 3, wire::Dtype::kF32, 256, /*chunk=*/3);
  ASSERT_NE(ring, nullptr);
  const auto got = GenerateOnRing(ring->head(), prompt, Greedy(), 16);
  EXPECT_EQ(got.ids, local.ids);
  EXPECT_EQ(got.logits, local.logits);
}

// An f16 boundary rounds each hop's hidden state. Tolerance: after one rounding per hop (relative
// 2^-11 on each element), the logits of stories260K move by less than 0.02 (measured 1e-3..5e-3),
// far below its smallest top-1 margin of 0.13 on these prompts, so greedy tokens are unchanged.
TEST(RingTest, F16BoundaryStaysWithinTolerance) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string model = AssetPath("models/stories260K.gguf");
  auto file = GgufFile::Open(model);
  ASSERT_TRUE(file.ok());
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  WindowOptions opt;
  opt.n_ctx = 64;
  auto whole = LayerWindow::Load(shared, {0, 5, true, true}, opt);
  auto a = LayerWindow::Load(shared, {0, 2, true, false}, opt);
  auto b = LayerWindow::Load(shared, {2, 5, false, true}, opt);
  ASSERT_TRUE(whole.ok() && a.ok() && b.ok());
  const std::vector<int32_t> ids = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376};
  const int n = static_cast<int>(ids.size());
  for (auto* w : {whole->get(), a->get(), b->get()}) ASSERT_TRUE(w->OpenSequence(0).ok());
  ForwardOutput ref, mid, out;
  ASSERT_TRUE((*whole)->Forward({{{0, 0, n}}, ids, {}, true}, &ref).ok());
  ASSERT_TRUE((*a)->Forward({{{0, 0, n}}, ids, {}, false}, &mid).ok());
  for (auto dtype : {wire::Dtype::kF16, wire::Dtype::kBF16}) {
    auto h = ring::MakeHidden(1, 0, n, 64, dtype, 0, mid.hidden);
    std::vector<float> rounded;
    ring::HiddenToF32(h, &rounded);
    (*b)->CloseSequence(0);
    ASSERT_TRUE((*b)->OpenSequence(0).ok());
    ASSERT_TRUE((*b)->Forward({{{0, 0, n}}, {}, rounded, true}, &out).ok());
    double max_abs = 0;
    for (size_t i = 0; i < ref.logits.size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(static_cast<double>(ref.logits[i]) - out.logits[i]));
    }
    const double tolerance = dtype == wire::Dtype::kF16 ? 0.02 : 0.2;
    std::printf("boundary %s: max |logit difference| %.3g\n",
                dtype == wire::Dtype::kF16 ? "f16" : "bf16", max_abs);
    EXPECT_LT(max_abs, tolerance);
    EXPECT_GT(max_abs, 0.0);  // the rounding really happened
  }
  auto ring = LocalRing::Start(model, 3, wire::Dtype::kF16);
  ASSERT_NE(ring, nullptr);
  const auto got = GenerateOnRing(ring->head(), "Once upon a time", Greedy(), 24);
  const auto local = GenerateLocally(model, "Once upon a time", Greedy(), 24);
  EXPECT_EQ(got.ids, local.ids);
  EXPECT_NE(got.logits, local.logits) << "the f16 boundary rounded nothing";
}

// Eight clients at once, each with its own prompt and seed, each get exactly their own
// single-process output.
void ExpectConcurrentSessionsMatch(const std::string& model_name, int n_stages) {
  const std::string model = AssetPath("models/" + model_name);
  const std::vector<std::string> prompts = {
      "Once upon a time", "The cat sat", "Tom had a red ball", "One day, a bird",
      "Lily and Ben went to the park", "The sun was hot", "A little dog", "Mom said"};
  auto ring = LocalRing::Start(model, n_stages);
  ASSERT_NE(ring, nullptr);
  std::vector<std::future<testing::Generation>> futures;
  std::vector<SamplingParams> params(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    params[i].temperature = 0.8f;
    params[i].seed = 1000 + i;
    futures.push_back(std::async(std::launch::async, [&, i] {
      return GenerateOnRing(ring->head(), prompts[i], params[i], 32);
    }));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto got = futures[i].get();
    const auto local = GenerateLocally(model, prompts[i], params[i], 32);
    EXPECT_EQ(got.ids, local.ids) << "session " << i << ": " << prompts[i];
    EXPECT_EQ(got.logits, local.logits) << "batched with others, bit for bit: " << prompts[i];
  }
}

TEST(RingTest, ConcurrentSessionsEachMatchSingleProcess) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  ExpectConcurrentSessionsMatch("stories260K.gguf", 3);
}

// The same on the hybrid MoE model: sessions batched together share experts, never states.
TEST(RingTest, ConcurrentSessionsOnHybridMoeEachMatchSingleProcess) {
  KV_REQUIRE_ASSET("models/synth-qwen35moe-f32.gguf");
  ExpectConcurrentSessionsMatch("synth-qwen35moe-f32.gguf", 3);
}

// Tight batches: prompt chunks of at most 4 rows (cut equal: 9 tokens are 3 + 3 + 3), at most 6
// rows per Forward, so two chunks of a session would fit one batch. A session's chunks must run in
// order, one per batch, even when a later chunk would fit a batch that an earlier one did not.
TEST(RingTest, ChunksOfASessionNeverOvertakeEachOther) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string model = AssetPath("models/stories260K.gguf");
  auto ring = LocalRing::Start(model, 2, wire::Dtype::kF32, 256, /*chunk=*/4,
                               /*max_batch_rows=*/6);
  ASSERT_NE(ring, nullptr);
  const std::vector<std::string> prompts = {"The cat sat on the mat and the dog",
                                            "Once upon a time there was a big red ball",
                                            "Tom and Lily went to the park to play",
                                            "A little bird sang in the tall green tree"};
  std::vector<std::future<testing::Generation>> futures;
  for (const auto& p : prompts) {
    futures.push_back(std::async(std::launch::async,
                                 [&, p] { return GenerateOnRing(ring->head(), p, Greedy(), 12); }));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(futures[i].get().ids, GenerateLocally(model, prompts[i], Greedy(), 12).ids)
        << prompts[i];
  }
}

// Peers that speak badly, before the handshake (plaintext) and after it (encrypted): each gets
// an ERROR frame and a closed link, and the ring keeps serving.
TEST(RingTest, BadPeersAreRefusedAndTheRingKeepsServing) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string model = AssetPath("models/stories260K.gguf");
  auto ring = LocalRing::Start(model, 2);
  ASSERT_NE(ring, nullptr);
  std::string host;
  uint16_t port = 0;
  ASSERT_TRUE(net::ParseHostPort(ring->head(), &host, &port).ok());

  // handshake: run it (as a stage holding the ring secret) before sending `bytes`.
  auto expect_refused = [&](const std::vector<uint8_t>& bytes, wire::ErrorCode code,
                            const std::string& needle, bool handshake) {
    auto stream = net::DialTcp(host, port, 2000);
    ASSERT_TRUE(stream.ok());
    std::unique_ptr<net::Stream> s = std::move(stream).value();
    if (handshake) {
      ring::LinkAuth auth;
      auth.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
      auth.ring_secret = testing::kTestRingSecret;
      auto hs = ring::HandshakeInitiate(*s, wire::Role::kStage, auth);
      ASSERT_TRUE(hs.ok()) << hs.status().message();
      s = std::make_unique<ring::SecureStream>(std::move(s), hs->tx, hs->rx, 1 << 20);
    }
    ring::Link link(std::move(s), "test peer");
    ASSERT_TRUE(link.SendFrame(bytes).ok());
    auto reply = link.Receive();
    ASSERT_TRUE(reply.ok()) << reply.status().message();
    auto* err = std::get_if<ring::ErrorMsg>(&*reply);
    ASSERT_NE(err, nullptr) << ring::MessageName(*reply);
    EXPECT_EQ(err->code, code) << err->message;
    EXPECT_NE(err->message.find(needle), std::string::npos) << err->message;
    EXPECT_FALSE(link.Receive().ok());  // then the stage closes the link
  };

  // Garbage instead of a frame.
  expect_refused(std::vector<uint8_t>(64, 0xAB), wire::ErrorCode::kMalformed, "magic", false);
  // A frame header announcing more than a handshake frame may hold (before any proof).
  wire::FrameHeader big{wire::kMagic, static_cast<uint16_t>(wire::MsgType::kHidden), 0,
                        wire::kMaxPayload, 0};
  std::vector<uint8_t> big_bytes(sizeof(big));
  std::memcpy(big_bytes.data(), &big, sizeof(big));
  expect_refused(big_bytes, wire::ErrorCode::kMalformed, "limit", false);
  // Out of order: HIDDEN before the handshake.
  std::vector<float> rows(64, 0.5f);
  expect_refused(ring::EncodeMessage(ring::MakeHidden(1, 0, 1, 64, wire::Dtype::kF32, 0, rows)),
                 wire::ErrorCode::kMalformed, "HANDSHAKE", false);
  // A protocol 1 peer (HELLO first).
  wire::Hello hello{};
  hello.protocol_version = 1;
  expect_refused(ring::EncodeMessage(ring::HelloMsg{hello}), wire::ErrorCode::kVersion,
                 "protocol 1", false);
  // After a good handshake: HIDDEN before HELLO, a wrong version in HELLO, a stage of another
  // model, and a stage whose window is not adjacent.
  expect_refused(ring::EncodeMessage(ring::MakeHidden(1, 0, 1, 64, wire::Dtype::kF32, 0, rows)),
                 wire::ErrorCode::kMalformed, "HELLO", true);
  hello.protocol_version = 99;
  expect_refused(ring::EncodeMessage(ring::HelloMsg{hello}), wire::ErrorCode::kVersion, "99",
                 true);
  hello.protocol_version = wire::kProtocolVersion;
  hello.window_first = 0;
  hello.window_last = 5;
  hello.n_layer = 5;
  expect_refused(ring::EncodeMessage(ring::HelloMsg{hello}), wire::ErrorCode::kWrongModel,
                 "model", true);
  auto file = GgufFile::Open(model);
  ASSERT_TRUE(file.ok());
  auto id = ComputeModelId(file->header(), model);
  ASSERT_TRUE(id.ok());
  std::memcpy(hello.model_id, id->data(), 16);
  hello.window_first = 1;
  hello.window_last = 3;  // the head starts at 0; a predecessor must end at 5
  expect_refused(ring::EncodeMessage(ring::HelloMsg{hello}), wire::ErrorCode::kNotAdjacent,
                 "not adjacent", true);

  // The ring still produces the single-process answer.
  EXPECT_EQ(GenerateOnRing(ring->head(), "Once upon a time", Greedy(), 12).ids,
            GenerateLocally(model, "Once upon a time", Greedy(), 12).ids);
}

// Node keys from a manifest, no ring secret: each stage accepts only the nodes listed next to it.
// A ring whose middle node is not the listed one never closes; with the right node it does.
TEST(RingTest, ManifestNodeKeysAuthenticateNeighbours) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string model = AssetPath("models/stories260K.gguf");
  std::vector<std::shared_ptr<const ring::NodeKey>> keys;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate()));
  }
  auto configure = [&](bool impostor) {
    return [&, impostor](int i, ring::StageOptions& o) {
      o.ring_secret.clear();
      o.key = keys[i];
      if (impostor && i == 1) {
        o.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
      }
      o.pred_key = keys[(i + 2) % 3]->public_key();
      o.succ_key = keys[(i + 1) % 3]->public_key();
    };
  };
  ring::ClientOptions client;
  client.head_key = keys[0]->public_key();
  client.connect_timeout_ms = 10000;
  {
    auto ring = LocalRing::Start(model, 3, wire::Dtype::kF32, 256, 64, 256, configure(true));
    ASSERT_NE(ring, nullptr);
    auto c = ring::RingClient::Connect(ring->head(), client);
    ASSERT_TRUE(c.ok()) << c.status().message();
    EXPECT_FALSE((*c)->WaitReady(1500).ok()) << "a ring with an impostor in rank 1 closed";
  }
  auto ring = LocalRing::Start(model, 3, wire::Dtype::kF32, 256, 64, 256, configure(false));
  ASSERT_NE(ring, nullptr);
  auto c = ring::RingClient::Connect(ring->head(), client);
  ASSERT_TRUE(c.ok()) << c.status().message();
  ASSERT_TRUE((*c)->WaitReady(10000).ok());
  // A client that expects another head refuses it.
  ring::ClientOptions wrong = client;
  wrong.head_key = keys[1]->public_key();
  auto refused = ring::RingClient::Connect(ring->head(), wrong);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kUnauthenticated) << refused.status().message();
}

TEST(RingTest, WindowOutsideTheModelIsRefusedAtStart) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  ring::StageOptions o;
  o.model_path = AssetPath("models/stories260K.gguf");
  o.listen = "127.0.0.1:0";
  o.next = "127.0.0.1:1";
  o.first = 3;
  o.last = 9;
  o.key = std::make_shared<const ring::NodeKey>(ring::NodeKey::Generate());
  o.insecure = true;
  auto s = ring::Stage::Create(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("3:9"), std::string::npos) << s.status().message();
  EXPECT_NE(s.status().message().find("5 layers"), std::string::npos) << s.status().message();
}

}  // namespace
}  // namespace kvasir
