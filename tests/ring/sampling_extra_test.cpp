// Extra sampling (wire::kSamplingExtra: presence and frequency penalties, logit biases): the codec
// carries it only under its flag and refuses what does not add up, every stage's check names the
// field at fault, and the tail applies it in llama.cpp's order, while a request without it samples
// exactly as before.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "ring/frame.h"
#include "ring/messages.h"
#include "ring/sampling_wire.h"
#include "ring/tail_sampler.h"

namespace kvasir::ring {
namespace {

wire::SamplingWire Greedy(uint32_t flags = wire::kSamplingExtra) {
  SamplingParams p;
  p.temperature = 0;
  wire::SamplingWire w = SamplingToWire(p, 8, false);
  w.flags |= flags;
  return w;
}

SamplingExtra Extra() {
  SamplingExtra e;
  e.presence_penalty = 0.5f;
  e.frequency_penalty = -0.25f;
  e.logit_bias = {{3, 10.0f}, {7, -100.0f}};
  return e;
}

Message RoundTrip(const Message& m) {
  EXPECT_TRUE(CheckEncodable(m).ok()) << CheckEncodable(m).message();
  std::vector<uint8_t> bytes = EncodeMessage(m);
  FrameDecoder dec;
  dec.Feed(bytes);
  auto frame = dec.Next();
  EXPECT_TRUE(frame.ok() && frame->has_value());
  auto decoded = DecodeMessage(**frame);
  EXPECT_TRUE(decoded.ok()) << decoded.status().message();
  return std::move(decoded).value();
}

void ExpectSameExtra(const SamplingExtra& a, const SamplingExtra& b) {
  EXPECT_EQ(a.presence_penalty, b.presence_penalty);
  EXPECT_EQ(a.frequency_penalty, b.frequency_penalty);
  ASSERT_EQ(a.logit_bias.size(), b.logit_bias.size());
  for (size_t i = 0; i < a.logit_bias.size(); ++i) {
    EXPECT_EQ(a.logit_bias[i].id, b.logit_bias[i].id);
    EXPECT_EQ(a.logit_bias[i].bias, b.logit_bias[i].bias);
  }
}

TEST(SamplingExtraCodecTest, GenerateAndOpenSessionCarryItUnderTheFlag) {
  GenerateMsg g{Greedy(), "Once", {"\n"}, true, Extra()};
  const auto g2 = std::get<GenerateMsg>(RoundTrip(g));
  EXPECT_EQ(g2.prompt, "Once");
  EXPECT_EQ(g2.stops, std::vector<std::string>{"\n"});
  ExpectSameExtra(g.extra, g2.extra);

  OpenSessionMsg o{5, Greedy(), {1, 2, 3}, Extra()};
  const auto o2 = std::get<OpenSessionMsg>(RoundTrip(o));
  EXPECT_EQ(o2.prompt, (std::vector<int32_t>{1, 2, 3}));
  ExpectSameExtra(o.extra, o2.extra);

  // The flag with nothing in it still carries the (empty) extra block.
  OpenSessionMsg empty{6, Greedy(), {1}, {}};
  const auto e2 = std::get<OpenSessionMsg>(RoundTrip(empty));
  EXPECT_TRUE(e2.extra.logit_bias.empty());
}

TEST(SamplingExtraCodecTest, WithoutTheFlagTheMessageIsAsBefore) {
  OpenSessionMsg o{5, Greedy(0), {1, 2, 3}, {}};
  EXPECT_EQ(EncodeMessage(o).size(),
            sizeof(wire::FrameHeader) + sizeof(wire::OpenSessionBody) + 3 * sizeof(int32_t));
  // Extra values without the flag would be lost on the way: refused before encoding.
  OpenSessionMsg lost{5, Greedy(0), {1}, Extra()};
  EXPECT_NE(CheckEncodable(lost).message().find("without the kSamplingExtra flag"),
            std::string::npos);
}

// The bytes of an OPEN_SESSION of `ids` with the flag, then `extra_bytes` as they are.
Frame OpenFrame(const std::vector<uint8_t>& extra_bytes, uint32_t flags = wire::kSamplingExtra) {
  wire::OpenSessionBody b{};
  b.session = 1;
  b.n_prompt = 1;
  b.sampling = Greedy(flags);
  Frame f{static_cast<uint16_t>(wire::MsgType::kOpenSession), {}};
  // [body | one prompt id (zero) | extra_bytes]
  f.payload.assign(sizeof(b) + 4 + extra_bytes.size(), 0);
  std::memcpy(f.payload.data(), &b, sizeof(b));
  if (!extra_bytes.empty()) {
    std::memcpy(f.payload.data() + sizeof(b) + 4, extra_bytes.data(), extra_bytes.size());
  }
  return f;
}

std::vector<uint8_t> ExtraBytes(uint32_t n_logit_bias, size_t biases_sent, uint32_t reserved = 0) {
  wire::SamplingExtraWire e{};
  e.n_logit_bias = n_logit_bias;
  e.reserved = reserved;
  std::vector<uint8_t> out(sizeof(e) + biases_sent * sizeof(wire::LogitBiasWire));
  std::memcpy(out.data(), &e, sizeof(e));
  return out;
}

TEST(SamplingExtraCodecTest, RefusesExtraBytesThatDoNotAddUp) {
  auto error = [](const Frame& f) {
    auto r = DecodeMessage(f);
    return r.ok() ? std::string("(decoded)") : r.status().message();
  };
  EXPECT_EQ(error(OpenFrame(ExtraBytes(2, 2))), "(decoded)");
  EXPECT_NE(error(OpenFrame({1, 2, 3})).find("remain of its 16"), std::string::npos);
  EXPECT_NE(error(OpenFrame(ExtraBytes(2, 1))).find("n_logit_bias 2 needs 16"), std::string::npos);
  EXPECT_NE(error(OpenFrame(ExtraBytes(wire::kMaxLogitBias + 1, 0))).find("exceeds the limit"),
            std::string::npos);
  EXPECT_NE(error(OpenFrame(ExtraBytes(0, 0, 7))).find("reserved"), std::string::npos);
  // Without the flag, bytes after the prompt are not extra sampling but a malformed message.
  EXPECT_NE(error(OpenFrame(ExtraBytes(0, 0), 0)).find("tail is"), std::string::npos);
}

TEST(SamplingExtraCheckTest, EveryValueIsCheckedByName) {
  EXPECT_TRUE(CheckSamplingExtra(Extra(), 16).ok());
  auto message = [](SamplingExtra e, int n_vocab = 16) {
    return CheckSamplingExtra(e, n_vocab).message();
  };
  SamplingExtra e = Extra();
  e.presence_penalty = std::numeric_limits<float>::quiet_NaN();
  EXPECT_NE(message(e).find("presence_penalty"), std::string::npos);
  e = Extra();
  e.frequency_penalty = 2.5f;
  EXPECT_NE(message(e).find("frequency_penalty"), std::string::npos);
  e = Extra();
  EXPECT_NE(message(e, 5).find("token 7 is outside the vocabulary"), std::string::npos);
  e.logit_bias[0].bias = std::numeric_limits<float>::infinity();
  EXPECT_NE(message(e).find("the bias of token 3"), std::string::npos);
  e = Extra();
  e.logit_bias.push_back({3, 1.0f});
  EXPECT_NE(message(e).find("token 3 appears twice"), std::string::npos);
  // A stage that predates the flag refuses it rather than sample without what it carries; one
  // that knows it checks the bits beyond.
  wire::SamplingWire w = Greedy();
  EXPECT_TRUE(CheckSamplingWire(w).ok());
  w.flags |= 16;  // past kSamplingLogprobs
  EXPECT_NE(CheckSamplingWire(w).message().find("unknown bits"), std::string::npos);
  EXPECT_FALSE(CheckSessionRequest(Greedy(), std::vector<int32_t>{1}, 8, 5, Extra()).ok());
}

TEST(SamplingExtraTailTest, ABiasDecidesAGreedyPick) {
  SamplingExtra e;
  e.logit_bias = {{1, 5.0f}, {2, -100.0f}};
  auto t = TailSampler::Create(Greedy(), {0}, 64, 4, e);
  ASSERT_TRUE(t.ok()) << t.status().message();
  const std::vector<float> logits = {0.0f, 1.0f, 4.0f, 2.0f};
  auto b = (*t)->Sample(1, logits, 1, 64, [](int32_t) { return false; });
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->token.id, 1);        // 1 + 5 beats 4 - 100 and 2
  EXPECT_EQ(b->token.logit, 1.0f);  // the raw logit travels, not the biased one
}

TEST(SamplingExtraTailTest, PenaltiesCountTheWindowAfterTheRepeatPenalty) {
  // History {2, 2, 3}: token 2 is there twice, 3 once.
  SamplingExtra e;
  e.frequency_penalty = 1.0f;
  e.presence_penalty = 0.5f;
  wire::SamplingWire w = Greedy();
  w.repeat_penalty = 2.0f;
  auto t = TailSampler::Create(w, {2, 2, 3}, 64, 4, e);
  ASSERT_TRUE(t.ok());
  // 2: 6 / 2 - 2 * 1 - 0.5 = 0.5; 3: 3 / 2 - 1 - 0.5 = 0; 1 untouched at 0.75: it wins.
  const std::vector<float> logits = {0.0f, 0.75f, 6.0f, 3.0f};
  EXPECT_EQ((*t)->Sample(1, logits, 3, 64, [](int32_t) { return false; })->token.id, 1);
  // Without the frequency penalty token 2 keeps 2.5 and wins.
  e.frequency_penalty = 0;
  auto u = TailSampler::Create(w, {2, 2, 3}, 64, 4, e);
  ASSERT_TRUE(u.ok());
  EXPECT_EQ((*u)->Sample(1, logits, 3, 64, [](int32_t) { return false; })->token.id, 2);
}

// Extra sampling that changes nothing samples exactly what the plain path samples, seed for seed.
TEST(SamplingExtraTailTest, NeutralExtraSamplesWhatThePlainPathSamples) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.repeat_penalty = 1.3f;
  p.seed = 42;
  wire::SamplingWire plain = SamplingToWire(p, 64, false);
  wire::SamplingWire extra = plain;
  extra.flags |= wire::kSamplingExtra;
  auto a = TailSampler::Create(plain, {1, 2, 3}, 128, 32);
  auto b = TailSampler::Create(extra, {1, 2, 3}, 128, 32, SamplingExtra{});
  ASSERT_TRUE(a.ok() && b.ok());
  std::vector<float> logits(32);
  for (int step = 0; step < 40; ++step) {
    for (int i = 0; i < 32; ++i) logits[i] = std::sin(0.7f * i + 0.3f * step) * 3.0f;
    const auto x = (*a)->Sample(1, logits, 3 + step, 128, [](int32_t) { return false; });
    const auto y = (*b)->Sample(1, logits, 3 + step, 128, [](int32_t) { return false; });
    ASSERT_TRUE(x.ok() && y.ok());
    ASSERT_EQ(x->token.id, y->token.id) << "step " << step;
  }
}

}  // namespace
}  // namespace kvasir::ring
