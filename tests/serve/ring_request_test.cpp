// A checked request becomes the ring's GENERATE: every sampling field where the ring's sampling
// reads it, extra sampling under its flag only when asked for, and chat messages laid out by the
// chat family as `kvasir generate --chat` lays them out.
#include "serve/ring_request.h"

#include <gtest/gtest.h>

#include "ring/messages.h"
#include "ring/wire.h"

namespace kvasir::serve {
namespace {

CompletionRequest Parsed(const std::string& body, Endpoint e = Endpoint::kCompletions) {
  ApiError error;
  auto r = ParseCompletionRequest(body, e, &error);
  EXPECT_TRUE(r.has_value()) << error.message;
  return r.value_or(CompletionRequest{});
}

TEST(RingRequestTest, SamplingFieldsMapOntoTheRingsSampling) {
  const CompletionRequest r = Parsed(R"({"prompt": "Once", "temperature": 0.3, "top_p": 0.7,
      "top_k": 5, "min_p": 0.2, "repeat_penalty": 1.2, "repeat_last_n": 8, "seed": 9,
      "max_tokens": 12, "ignore_eos": true})");
  const ring::GenerateMsg g = ToGenerate(r, "Once", 777);
  EXPECT_EQ(g.prompt, "Once");
  EXPECT_TRUE(g.add_special);
  EXPECT_FLOAT_EQ(g.sampling.temperature, 0.3f);
  EXPECT_FLOAT_EQ(g.sampling.top_p, 0.7f);
  EXPECT_EQ(g.sampling.top_k, 5);
  EXPECT_FLOAT_EQ(g.sampling.min_p, 0.2f);
  EXPECT_FLOAT_EQ(g.sampling.repeat_penalty, 1.2f);
  EXPECT_EQ(g.sampling.repeat_last_n, 8);
  EXPECT_EQ(g.sampling.seed, 9u) << "the request's seed, not the server's";
  EXPECT_EQ(g.sampling.max_tokens, 12u);
  EXPECT_EQ(g.sampling.flags, wire::kSamplingIgnoreEog);
  EXPECT_TRUE(g.stops.empty()) << "stop strings stay with the server's filter";
  EXPECT_TRUE(ring::CheckEncodable(g).ok());
}

TEST(RingRequestTest, DefaultsForSeedAndLength) {
  EXPECT_EQ(ToGenerate(Parsed(R"({"prompt": "x"})"), "x", 777).sampling.seed, 777u);
  EXPECT_EQ(ToGenerate(Parsed(R"({"prompt": "x"})"), "x", 1).sampling.max_tokens,
            kDefaultCompletionTokens);
  const CompletionRequest chat =
      Parsed(R"({"messages": [{"role": "user", "content": "x"}]})", Endpoint::kChatCompletions);
  EXPECT_EQ(ToGenerate(chat, "x", 1).sampling.max_tokens, kUntilContextEnds);
}

TEST(RingRequestTest, ExtraSamplingTravelsOnlyWhenAskedFor) {
  const ring::GenerateMsg plain = ToGenerate(Parsed(R"({"prompt": "x"})"), "x", 1);
  EXPECT_EQ(plain.sampling.flags & wire::kSamplingExtra, 0u) << "plain requests suit old rings";
  const ring::GenerateMsg g = ToGenerate(
      Parsed(R"({"prompt": "x", "presence_penalty": 0.5, "logit_bias": {"7": -3}})"), "x", 1);
  EXPECT_NE(g.sampling.flags & wire::kSamplingExtra, 0u);
  EXPECT_FLOAT_EQ(g.extra.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(g.extra.frequency_penalty, 0.0f);
  ASSERT_EQ(g.extra.logit_bias.size(), 1u);
  EXPECT_EQ(g.extra.logit_bias[0].id, 7);
  EXPECT_FLOAT_EQ(g.extra.logit_bias[0].bias, -3.0f);
  EXPECT_TRUE(ring::CheckEncodable(g).ok());
}

TEST(RingRequestTest, AGrammarTravelsUnderItsFlag) {
  const ring::GenerateMsg plain = ToGenerate(Parsed(R"({"prompt": "x"})"), "x", 1);
  EXPECT_EQ(plain.sampling.flags & wire::kSamplingGrammar, 0u);
  const ring::GenerateMsg g =
      ToGenerate(Parsed(R"({"prompt": "x", "response_format": {"type": "json_object"}})"), "x", 1);
  EXPECT_NE(g.sampling.flags & wire::kSamplingGrammar, 0u);
  EXPECT_FALSE(g.extra.grammar.empty());
  EXPECT_EQ(g.sampling.flags & wire::kSamplingExtra, 0u);
  EXPECT_TRUE(ring::CheckEncodable(g).ok());
}

TEST(RingRequestTest, ChatMessagesAreLaidOutByTheFamily) {
  const CompletionRequest chat = Parsed(
      R"({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]})",
      Endpoint::kChatCompletions);
  ApiError e;
  auto text = PromptText(chat, ChatFamily::kChatMl, &e);
  ASSERT_TRUE(text.has_value());
  EXPECT_EQ(*text,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_FALSE(PromptText(chat, std::nullopt, &e).has_value());
  EXPECT_EQ(e.code, "chat_template_missing");
  EXPECT_EQ(e.param, "messages");
  // A completion's prompt is sent as it is, with or without a family.
  EXPECT_EQ(PromptText(Parsed(R"({"prompt": "<|im_start|>x"})"), std::nullopt, &e),
            "<|im_start|>x");
}

}  // namespace
}  // namespace kvasir::serve
