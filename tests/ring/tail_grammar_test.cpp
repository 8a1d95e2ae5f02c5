// Grammars and log-probabilities at the last stage: the codec carries them only under their flags
// and refuses what does not add up; the tail draws only tokens the grammar allows (greedy: the most
// likely allowed one), ends the session when the grammar is complete, and reports log-softmax
// values of the logits it samples from; a ring of three stages answers exactly as one stage does.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>

#include "gguf/gguf_file.h"
#include "grammar/json_schema.h"
#include "model/arch/registry.h"
#include "model/layer_window.h"
#include "ring/frame.h"
#include "ring/messages.h"
#include "ring/sampling_wire.h"
#include "ring/tail_sampler.h"
#include "ring/vocab_trie.h"
#include "ring_test_util.h"
#include "tail_test_util.h"
#include "test_assets.h"
#include "tokenizer/tokenizer.h"

namespace kvasir::testing {
namespace {

using ring::GenerateMsg;
using ring::Message;
using ring::OpenSessionMsg;
using ring::SamplingExtra;
using ring::TailSampler;
using ring::TokenMsg;

constexpr const char* kModel = "models/stories260K.gguf";
constexpr const char* kSchema = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "maxItems": 3}
  },
  "required": ["name", "age"],
  "additionalProperties": false
})";

wire::SamplingWire Sampling(float temperature, uint32_t flags, uint32_t max_tokens = 64) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = 7;
  wire::SamplingWire w = ring::SamplingToWire(p, max_tokens, false);
  w.flags |= flags;
  return w;
}

std::string SchemaGrammar() {
  auto schema = grammar::ParseJsonText(kSchema);
  EXPECT_TRUE(schema.ok());
  auto text = grammar::JsonSchemaGrammarText(*schema);
  EXPECT_TRUE(text.ok()) << text.status().message();
  return text.ok() ? *text : "";
}

// The frame of `m` with its payload changed by `edit`, decoded.
template <typename Edit>
Result<Message> DecodeEdited(const Message& m, Edit edit) {
  std::vector<uint8_t> bytes = ring::EncodeMessage(m);
  std::vector<uint8_t> payload(bytes.begin() + sizeof(wire::FrameHeader), bytes.end());
  edit(payload);
  ring::Frame f;
  f.type = static_cast<uint16_t>(ring::MessageType(m));
  f.payload = payload;
  return ring::DecodeMessage(f);
}

TEST(TailGrammarCodecTest, GrammarAndLogprobsTravelUnderTheirFlags) {
  SamplingExtra e;
  e.presence_penalty = 0.5f;
  e.logit_bias = {{3, 1.0f}};
  e.grammar = "root ::= \"yes\" | \"no\"";
  e.top_logprobs = 5;
  const uint32_t flags = wire::kSamplingExtra | wire::kSamplingGrammar | wire::kSamplingLogprobs;
  GenerateMsg g{Sampling(0, flags), "Is it?", {}, true, e};
  auto g2 = RoundTrip(g);
  ASSERT_TRUE(g2.ok()) << g2.status().message();
  const auto& gm = std::get<GenerateMsg>(*g2);
  EXPECT_EQ(gm.extra.grammar, e.grammar);
  EXPECT_EQ(gm.extra.top_logprobs, 5u);
  ASSERT_EQ(gm.extra.logit_bias.size(), 1u);
  EXPECT_EQ(gm.extra.presence_penalty, 0.5f);

  // Without extra sampling, the output part alone.
  SamplingExtra only;
  only.grammar = e.grammar;
  OpenSessionMsg o{9, Sampling(0, wire::kSamplingGrammar), {1, 2, 3}, only};
  auto o2 = RoundTrip(o);
  ASSERT_TRUE(o2.ok()) << o2.status().message();
  const auto& om = std::get<OpenSessionMsg>(*o2);
  EXPECT_EQ(om.prompt, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(om.extra.grammar, e.grammar);
  EXPECT_EQ(om.extra.top_logprobs, 0u);
}

TEST(TailGrammarCodecTest, RefusesWhatDoesNotAddUp) {
  SamplingExtra e;
  e.grammar = "root ::= \"a\"";
  // A grammar without its flag, a flag without a grammar, logprobs without theirs, too many.
  EXPECT_FALSE(ring::CheckEncodable(GenerateMsg{Sampling(0, 0), "x", {}, true, e}).ok());
  EXPECT_FALSE(ring::CheckEncodable(
                   GenerateMsg{Sampling(0, wire::kSamplingGrammar), "x", {}, true, SamplingExtra{}})
                   .ok());
  SamplingExtra lp;
  lp.top_logprobs = 3;
  EXPECT_FALSE(ring::CheckEncodable(GenerateMsg{Sampling(0, 0), "x", {}, true, lp}).ok());
  lp.top_logprobs = wire::kMaxTopLogprobs + 1;
  EXPECT_FALSE(
      ring::CheckEncodable(GenerateMsg{Sampling(0, wire::kSamplingLogprobs), "x", {}, true, lp})
          .ok());
  SamplingExtra big;
  big.grammar.assign(wire::kMaxGrammarBytes + 1, 'a');
  EXPECT_FALSE(
      ring::CheckEncodable(GenerateMsg{Sampling(0, wire::kSamplingGrammar), "x", {}, true, big})
          .ok());

  // Decoding: grammar_bytes larger than what follows, a stray byte, an oversized announcement.
  const OpenSessionMsg o{9, Sampling(0, wire::kSamplingGrammar), {1, 2}, e};
  const size_t out_at = sizeof(wire::OpenSessionBody) + 2 * sizeof(int32_t);
  auto longer = DecodeEdited(o, [&](std::vector<uint8_t>& p) { p[out_at] += 1; });
  ASSERT_FALSE(longer.ok());
  EXPECT_NE(longer.status().message().find("grammar_bytes"), std::string::npos)
      << longer.status().message();
  auto stray = DecodeEdited(o, [](std::vector<uint8_t>& p) { p.push_back(0); });
  EXPECT_FALSE(stray.ok());
  auto huge = DecodeEdited(o, [&](std::vector<uint8_t>& p) {
    const uint32_t n = wire::kMaxGrammarBytes + 1;
    std::memcpy(&p[out_at], &n, sizeof(n));
  });
  ASSERT_FALSE(huge.ok());
  EXPECT_NE(huge.status().message().find("limit"), std::string::npos) << huge.status().message();
  auto unflagged = DecodeEdited(o, [&](std::vector<uint8_t>& p) {
    const uint32_t n = 0;
    std::memcpy(&p[out_at], &n, sizeof(n));
  });
  EXPECT_FALSE(unflagged.ok());
}

TEST(TailGrammarCodecTest, TokenCarriesLogprobsWithTheirPieces) {
  TokenMsg t;
  t.token.session = 4;
  t.token.pos = 11;
  t.token.id = 7;
  t.piece = "cat";
  t.logprobs = {{7, -0.25f, "cat"}, {9, -1.5f, "dog"}, {2, -3.0f, ""}};
  auto r = RoundTrip(t);
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto& m = std::get<TokenMsg>(*r);
  EXPECT_EQ(m.piece, "cat");
  ASSERT_EQ(m.logprobs.size(), 3u);
  EXPECT_EQ(m.logprobs[1].id, 9);
  EXPECT_EQ(m.logprobs[1].logprob, -1.5f);
  EXPECT_EQ(m.logprobs[1].piece, "dog");

  TokenMsg bad = t;
  bad.logprobs[0].logprob = 0.5f;  // not a log-probability
  EXPECT_FALSE(ring::CheckEncodable(bad).ok());
  bad.logprobs.assign(wire::kMaxTopLogprobs + 2, {1, -1.0f, ""});
  EXPECT_FALSE(ring::CheckEncodable(bad).ok());
  auto cut = DecodeEdited(t, [](std::vector<uint8_t>& p) { p.pop_back(); });
  EXPECT_FALSE(cut.ok());
}

// The stories260K vocabulary, as the last stage has it.
struct Vocab {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<ring::VocabTrie> trie;
};

Vocab LoadVocab() {
  Vocab v;
  auto file = GgufFile::Open(AssetPath(kModel));
  EXPECT_TRUE(file.ok()) << file.status().message();
  if (!file.ok()) return v;
  auto tok = Tokenizer::FromGguf(file->header(), AssetPath(kModel));
  EXPECT_TRUE(tok.ok()) << tok.status().message();
  if (!tok.ok()) return v;
  v.tokenizer = std::move(*tok);
  v.trie = std::make_unique<ring::VocabTrie>(v.tokenizer.get());
  return v;
}

// Runs `sampler` on random logits until it finishes; the text of the tokens drawn.
std::string RunOnRandomLogits(TailSampler& sampler, const Tokenizer& tok, uint64_t seed,
                              bool* finished_by_grammar) {
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(tok.n_vocab());
  std::string text;
  for (int pos = 1; pos < 512; ++pos) {
    for (float& l : logits) l = normal(rng);
    auto t = sampler.Sample(1, logits, pos, 4096, [&](int32_t id) { return tok.IsEog(id); });
    EXPECT_TRUE(t.ok()) << t.status().message();
    if (!t.ok()) return text;
    if (!tok.IsEog(t->token.id)) text += tok.TokenToPiece(t->token.id);
    if (t->token.finished) {
      *finished_by_grammar = t->token.reason == static_cast<uint8_t>(wire::FinishReason::kEog);
      return text;
    }
  }
  ADD_FAILURE() << "no end after 512 tokens: " << text;
  return text;
}

void ExpectMatchesSchema(const std::string& text) {
  auto j = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << "not JSON: " << text;
  ASSERT_TRUE(j.is_object()) << text;
  ASSERT_TRUE(j.contains("name") && j["name"].is_string()) << text;
  EXPECT_LE(j["name"].get<std::string>().size(), 12u * 4) << text;
  ASSERT_TRUE(j.contains("age") && j["age"].is_number_integer()) << text;
  EXPECT_GE(j["age"].get<int64_t>(), 0) << text;
  EXPECT_LE(j["age"].get<int64_t>(), 120) << text;
  if (j.contains("pets")) {
    ASSERT_TRUE(j["pets"].is_array()) << text;
    EXPECT_LE(j["pets"].size(), 3u);
    for (const auto& p : j["pets"]) EXPECT_TRUE(p == "cat" || p == "dog") << text;
  }
  for (const auto& [k, v] : j.items()) {
    EXPECT_TRUE(k == "name" || k == "age" || k == "pets") << "unexpected key " << k;
  }
}

TEST(TailGrammarTest, EverySampledAnswerFollowsTheSchema) {
  KV_REQUIRE_ASSET(kModel);
  Vocab v = LoadVocab();
  ASSERT_TRUE(v.trie);
  SamplingExtra e;
  e.grammar = SchemaGrammar();
  for (float temperature : {0.0f, 0.8f, 1.5f}) {
    for (uint64_t seed = 1; seed <= 6; ++seed) {
      wire::SamplingWire w = Sampling(temperature, wire::kSamplingGrammar, 400);
      w.seed = seed;
      w.top_k = 0;  // the whole vocabulary: most draws are refused by the grammar
      auto t = TailSampler::Create(w, {1}, 4096, v.tokenizer->n_vocab(), e, v.trie.get());
      ASSERT_TRUE(t.ok()) << t.status().message();
      bool by_grammar = false;
      const std::string text = RunOnRandomLogits(**t, *v.tokenizer, seed * 31, &by_grammar);
      SCOPED_TRACE(::testing::Message() << "temperature " << temperature << " seed " << seed);
      EXPECT_TRUE(by_grammar) << text;
      ExpectMatchesSchema(text);
    }
  }
}

// Greedy under a grammar is the most likely allowed token: checked against every token's own test.
TEST(TailGrammarTest, GreedyPicksTheMostLikelyAllowedToken) {
  KV_REQUIRE_ASSET(kModel);
  Vocab v = LoadVocab();
  ASSERT_TRUE(v.trie);
  auto trie = v.trie->Get();
  ASSERT_TRUE(trie.ok());
  SamplingExtra e;
  e.grammar = SchemaGrammar();
  auto g = grammar::Grammar::Parse(e.grammar);
  ASSERT_TRUE(g.ok());
  grammar::Recognizer r(*g);
  grammar::Matcher m(&r);
  auto t = TailSampler::Create(Sampling(0, wire::kSamplingGrammar, 400), {1}, 4096,
                               v.tokenizer->n_vocab(), e, v.trie.get());
  ASSERT_TRUE(t.ok());
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(v.tokenizer->n_vocab());
  for (int pos = 1; pos < 400; ++pos) {
    for (float& l : logits) l = normal(rng);
    int32_t best = -1;
    for (int32_t id = 0; id < static_cast<int32_t>(logits.size()); ++id) {
      if ((*trie)->Allows(m, id) && (best < 0 || logits[id] > logits[best])) best = id;
    }
    auto s = (*t)->Sample(1, logits, pos, 4096, [&](int32_t id) { return v.tokenizer->IsEog(id); });
    ASSERT_TRUE(s.ok()) << s.status().message();
    ASSERT_EQ(s->token.id, best) << "step " << pos;
    if (s->token.finished) return;
    ASSERT_TRUE((*trie)->Accept(&m, best));
  }
  FAIL() << "the grammar never ended";
}

TEST(TailGrammarTest, RefusesGrammarsItCannotUse) {
  KV_REQUIRE_ASSET(kModel);
  Vocab v = LoadVocab();
  ASSERT_TRUE(v.trie);
  SamplingExtra e;
  e.grammar = "root ::= value\n";  // 'value' is not defined
  auto bad = TailSampler::Create(Sampling(0, wire::kSamplingGrammar), {1}, 256,
                                 v.tokenizer->n_vocab(), e, v.trie.get());
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("value"), std::string::npos) << bad.status().message();
  e.grammar = "root ::= \"a\"";
  auto no_vocab =
      TailSampler::Create(Sampling(0, wire::kSamplingGrammar), {1}, 256, 512, e, nullptr);
  ASSERT_FALSE(no_vocab.ok());
  EXPECT_NE(no_vocab.status().message().find("vocabulary"), std::string::npos);
}

TEST(TailLogprobsTest, LogSoftmaxOfTheSampledTokenAndTheTopAlternatives) {
  SamplingExtra e;
  e.top_logprobs = 3;
  e.logit_bias = {{4, 2.0f}};
  auto t = TailSampler::Create(Sampling(0, wire::kSamplingLogprobs | wire::kSamplingExtra), {0}, 64,
                               6, e);
  ASSERT_TRUE(t.ok()) << t.status().message();
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, -3.0f};
  auto s = (*t)->Sample(1, logits, 1, 64, [](int32_t) { return false; });
  ASSERT_TRUE(s.ok());
  // The bias makes token 4 the best (3.0); the log-probabilities are those of the biased logits.
  std::vector<double> adjusted(logits.begin(), logits.end());
  adjusted[4] += 2.0;
  double z = 0;
  for (double l : adjusted) z += std::exp(l);
  auto lp = [&](int id) { return adjusted[id] - std::log(z); };
  EXPECT_EQ(s->token.id, 4);
  ASSERT_EQ(s->logprobs.size(), 4u);
  EXPECT_EQ(s->logprobs[0].id, 4);
  EXPECT_NEAR(s->logprobs[0].logprob, lp(4), 1e-6);
  // Then the top three, best first, ties by id.
  EXPECT_EQ(s->logprobs[1].id, 4);
  EXPECT_EQ(s->logprobs[2].id, 1);
  EXPECT_EQ(s->logprobs[3].id, 3);
  EXPECT_NEAR(s->logprobs[2].logprob, lp(1), 1e-6);
  double total = 0;
  for (int id = 0; id < 6; ++id) total += std::exp(lp(id));
  EXPECT_NEAR(total, 1.0, 1e-9);
}

std::string RunRing(const std::string& head, const GenerateMsg& g, wire::FinishReason* reason) {
  auto client = ring::RingClient::Connect(head, 20000, kTestRingSecret);
  EXPECT_TRUE(client.ok()) << client.status().message();
  if (!client.ok()) return "";
  EXPECT_TRUE((*client)->WaitReady(20000).ok());
  std::string text;
  auto r = (*client)->Generate(
      g,
      [&](const TokenMsg& t) {
        text += t.piece;
        return true;
      },
      nullptr);
  EXPECT_TRUE(r.ok()) << r.status().message();
  if (r.ok()) *reason = r->reason;
  return text;
}

// The grammar applies where the token is sampled: a three-stage ring gives the one-stage answer.
TEST(TailGrammarRingTest, ThreeStagesAnswerAsOneAndFollowTheSchema) {
  KV_REQUIRE_ASSET(kModel);
  GenerateMsg g;
  g.prompt = "Once upon a time, a girl named";
  g.sampling = Sampling(0, wire::kSamplingGrammar, 300);
  g.extra.grammar = SchemaGrammar();
  auto one = LocalRing::Start(AssetPath(kModel), 1);
  wire::FinishReason r1{}, r3{};
  const std::string a = RunRing(one->head(), g, &r1);
  one.reset();
  auto three = LocalRing::Start(AssetPath(kModel), 3);
  const std::string b = RunRing(three->head(), g, &r3);
  EXPECT_EQ(a, b);
  EXPECT_EQ(r1, r3);
  EXPECT_EQ(r1, wire::FinishReason::kEog);
  ExpectMatchesSchema(a);
  // Sampled with a seed, too.
  g.sampling = Sampling(0.9f, wire::kSamplingGrammar, 300);
  g.sampling.seed = 1234;
  const std::string c = RunRing(three->head(), g, &r3);
  auto again = LocalRing::Start(AssetPath(kModel), 1);
  const std::string d = RunRing(again->head(), g, &r1);
  EXPECT_EQ(c, d);
  EXPECT_EQ(r1, wire::FinishReason::kEog);
  ExpectMatchesSchema(c);
}

// The log-probabilities a three-stage ring reports are the model's own: the log-softmax of one
// process's logits at each step, for the sampled token and the top five.
TEST(TailLogprobsRingTest, AreTheLogSoftmaxOfOneProcesssLogits) {
  KV_REQUIRE_ASSET(kModel);
  const std::string model = AssetPath(kModel);
  GenerateMsg g;
  g.prompt = "Once upon a time";
  g.sampling = Sampling(0, wire::kSamplingLogprobs, 16);
  g.sampling.flags |= wire::kSamplingIgnoreEog;
  g.extra.top_logprobs = 5;
  auto three = LocalRing::Start(model, 3);
  auto client = ring::RingClient::Connect(three->head(), 20000, kTestRingSecret);
  ASSERT_TRUE(client.ok()) << client.status().message();
  ASSERT_TRUE((*client)->WaitReady(20000).ok());
  std::vector<TokenMsg> tokens;
  auto r = (*client)->Generate(
      g,
      [&](const TokenMsg& t) {
        tokens.push_back(t);
        return true;
      },
      nullptr);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(tokens.size(), 16u);

  // One process, step by step, keeping every row of logits.
  auto file = GgufFile::Open(model);
  ASSERT_TRUE(file.ok());
  auto shared = std::make_shared<const GgufFile>(std::move(file).value());
  auto cfg = LoadModelConfig(*shared);
  ASSERT_TRUE(cfg.ok());
  WindowOptions opt;
  opt.n_ctx = 256;
  auto w = LayerWindow::Load(shared, {0, cfg->n_layer, true, true}, opt);
  ASSERT_TRUE(w.ok()) << w.status().message();
  auto tok = Tokenizer::FromGguf(shared->header(), model);
  ASSERT_TRUE(tok.ok());
  std::vector<int32_t> history = (*tok)->Encode(g.prompt, true, true);
  ASSERT_TRUE((*w)->OpenSequence(0).ok());
  ForwardInput in;
  in.chunks = {{0, 0, static_cast<int>(history.size())}};
  in.tokens = history;
  ForwardOutput out;
  for (const TokenMsg& t : tokens) {
    ASSERT_TRUE((*w)->Forward(in, &out).ok());
    double max = -INFINITY, z = 0;
    for (float l : out.logits) max = std::max<double>(max, l);
    for (float l : out.logits) z += std::exp(l - max);
    auto lp = [&](int32_t id) { return out.logits[id] - max - std::log(z); };
    ASSERT_EQ(t.logprobs.size(), 6u);
    EXPECT_EQ(t.logprobs[0].id, t.token.id);
    EXPECT_NEAR(t.logprobs[0].logprob, lp(t.token.id), 1e-5);
    EXPECT_EQ(t.logprobs[0].piece, t.piece);
    // Greedy: the sampled token is the most likely one.
    EXPECT_EQ(t.logprobs[1].id, t.token.id);
    for (size_t k = 1; k < t.logprobs.size(); ++k) {
      const ring::TokenLogprob& e = t.logprobs[k];
      EXPECT_NEAR(e.logprob, lp(e.id), 1e-5);
      EXPECT_EQ(e.piece, (*tok)->TokenToPiece(e.id));
      if (k > 1) {
        EXPECT_LE(e.logprob, t.logprobs[k - 1].logprob);
      }
    }
    // Nothing outside the top five beats the fifth.
    int better = 0;
    for (int32_t id = 0; id < static_cast<int32_t>(out.logits.size()); ++id) {
      better += lp(id) > t.logprobs[5].logprob + 1e-5;
    }
    EXPECT_LE(better, 4);
    history.push_back(t.token.id);
    in.chunks = {{0, (*w)->SequenceLength(0), 1}};
    in.tokens = std::span<const int32_t>(&history.back(), 1);
  }
}

}  // namespace
}  // namespace kvasir::testing
