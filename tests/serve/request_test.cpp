// Parsing and checking of the API's requests: every field read with its type and range, defaults
// as `kvasir generate` has them, and every refusal naming its field in OpenAI's error shape.
#include "serve/request.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>

namespace kvasir::serve {
namespace {

using ::testing::HasSubstr;

CompletionRequest Parse(const std::string& body, Endpoint e = Endpoint::kCompletions) {
  ApiError error;
  auto r = ParseCompletionRequest(body, e, &error);
  EXPECT_TRUE(r.has_value()) << error.param << ": " << error.message;
  return r.value_or(CompletionRequest{});
}

ApiError Refusal(const std::string& body, Endpoint e = Endpoint::kCompletions) {
  ApiError error;
  auto r = ParseCompletionRequest(body, e, &error);
  EXPECT_FALSE(r.has_value()) << body;
  return error;
}

TEST(RequestTest, ACompletionTakesEveryField) {
  const CompletionRequest r = Parse(R"({
    "model": "m", "prompt": "Once upon", "max_tokens": 32, "temperature": 0.5, "top_p": 0.9,
    "top_k": 7, "min_p": 0.1, "seed": 42, "stop": ["\n", "The end"], "presence_penalty": 0.5,
    "frequency_penalty": -0.5, "repeat_penalty": 1.1, "repeat_last_n": 16,
    "logit_bias": {"13": -100, "7": 2.5}, "n": 1, "user": "u1", "stream": true,
    "stream_options": {"include_usage": true}, "ignore_eos": true, "echo": false,
    "logprobs": null, "best_of": 1, "suffix": ""})");
  EXPECT_EQ(r.endpoint, Endpoint::kCompletions);
  EXPECT_EQ(r.model, "m");
  EXPECT_EQ(r.prompt, "Once upon");
  EXPECT_EQ(r.max_tokens, 32);
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.9f);
  EXPECT_EQ(r.sampling.top_k, 7);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.1f);
  EXPECT_EQ(r.sampling.seed, 42u);
  EXPECT_EQ(r.stop, (std::vector<std::string>{"\n", "The end"}));
  EXPECT_FLOAT_EQ(r.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(r.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(r.sampling.repeat_penalty, 1.1f);
  EXPECT_EQ(r.sampling.repeat_last_n, 16);
  ASSERT_EQ(r.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(r.sampling.logit_bias[0], (std::pair<int32_t, float>{13, -100.0f}));
  EXPECT_EQ(r.sampling.logit_bias[1], (std::pair<int32_t, float>{7, 2.5f}));
  EXPECT_EQ(r.user, "u1");
  EXPECT_TRUE(r.stream);
  EXPECT_TRUE(r.include_usage);
  EXPECT_TRUE(r.ignore_eos);
}

TEST(RequestTest, AbsentAndNullFieldsTakeTheDefaultsOfKvasirGenerate) {
  const CompletionRequest r =
      Parse(R"({"prompt": "x", "temperature": null, "stop": null, "seed": null})");
  EXPECT_FLOAT_EQ(r.sampling.temperature, 0.8f);
  EXPECT_FLOAT_EQ(r.sampling.top_p, 0.95f);
  EXPECT_EQ(r.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(r.sampling.min_p, 0.05f);
  EXPECT_FLOAT_EQ(r.sampling.repeat_penalty, 1.0f);
  EXPECT_FALSE(r.sampling.seed.has_value());
  EXPECT_FALSE(r.max_tokens.has_value());
  EXPECT_TRUE(r.stop.empty());
  EXPECT_FALSE(r.stream);
  EXPECT_EQ(r.model, "");
}

TEST(RequestTest, APromptIsAStringOrAListOfOne) {
  EXPECT_EQ(Parse(R"({"prompt": ["one"]})").prompt, "one");
  EXPECT_EQ(Refusal(R"({"prompt": ["one", "two"]})").param, "prompt");
  const ApiError ids = Refusal(R"({"prompt": [1, 2, 3]})");
  EXPECT_EQ(ids.param, "prompt");
  EXPECT_EQ(ids.code, "unsupported_parameter");
  EXPECT_EQ(Refusal(R"({"prompt": 7})").code, "invalid_type");
  const ApiError missing = Refusal(R"({"max_tokens": 3})");
  EXPECT_EQ(missing.param, "prompt");
  EXPECT_EQ(missing.code, "missing_required_parameter");
}

TEST(RequestTest, ChatMessagesTakeTextInStringsOrParts) {
  const CompletionRequest r = Parse(R"({"messages": [
      {"role": "developer", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}, {"type": "text", "text": "there"}]},
      {"role": "assistant", "content": null},
      {"role": "user", "content": "Go"}], "max_completion_tokens": 9, "max_tokens": 100})",
                                    Endpoint::kChatCompletions);
  ASSERT_EQ(r.messages.size(), 4u);
  EXPECT_EQ(r.messages[0].role, "system");
  EXPECT_EQ(r.messages[1].content, "Hi\nthere");
  EXPECT_EQ(r.messages[2].content, "");
  EXPECT_EQ(r.max_tokens, 9) << "max_completion_tokens wins";
}

TEST(RequestTest, ChatRefusalsNameTheMessageField) {
  const Endpoint chat = Endpoint::kChatCompletions;
  EXPECT_EQ(Refusal(R"({"messages": []})", chat).param, "messages");
  EXPECT_EQ(Refusal(R"({"messages": [{"content": "x"}]})", chat).param, "messages[0].role");
  EXPECT_EQ(Refusal(R"({"messages": [{"role": "robot", "content": "x"}]})", chat).param,
            "messages[0].role");
  const ApiError function =
      Refusal(R"({"messages": [{"role": "function", "content": "x"}]})", chat);
  EXPECT_EQ(function.param, "messages[0].role");
  EXPECT_EQ(function.code, "unsupported_parameter");
  EXPECT_EQ(Refusal(R"({"messages": [{"role": "user", "content": [{"type": "image_url",
      "image_url": {"url": "x"}}]}]})",
                    chat)
                .param,
            "messages[0].content[0].type");
  EXPECT_EQ(Refusal(R"({"messages": [{"role": "user", "content": 3}]})", chat).param,
            "messages[0].content");
  EXPECT_EQ(
      Refusal(R"({"messages": [{"role": "user", "content": "x", "name": "bob"}]})", chat).param,
      "messages[0].name");
  EXPECT_EQ(Refusal(R"({"messages": [{"role": "user", "content": "x", "mood": 1}]})", chat).param,
            "messages[0].mood");
  // A completion's field is not a chat field, and the reverse.
  EXPECT_EQ(
      Refusal(R"({"messages": [{"role": "user", "content": "x"}], "prompt": "y"})", chat).code,
      "unknown_parameter");
  EXPECT_EQ(Refusal(R"({"prompt": "y", "messages": []})").param, "messages");
}

TEST(RequestTest, ValuesOutOfRangeAreRefusedByName) {
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": "x", "temperature": 2.5})", "temperature"},
           {R"({"prompt": "x", "temperature": "hot"})", "temperature"},
           {R"({"prompt": "x", "top_p": 0})", "top_p"},
           {R"({"prompt": "x", "top_k": -1})", "top_k"},
           {R"({"prompt": "x", "top_k": 1.5})", "top_k"},
           {R"({"prompt": "x", "min_p": 1.5})", "min_p"},
           {R"({"prompt": "x", "max_tokens": 0})", "max_tokens"},
           {R"({"prompt": "x", "presence_penalty": 3})", "presence_penalty"},
           {R"({"prompt": "x", "frequency_penalty": -2.01})", "frequency_penalty"},
           {R"({"prompt": "x", "repeat_penalty": 0})", "repeat_penalty"},
           {R"({"prompt": "x", "seed": "abc"})", "seed"},
           {R"({"prompt": "x", "stream": "yes"})", "stream"},
           {R"({"prompt": "x", "stop": 5})", "stop"},
           {R"({"prompt": "x", "stop": ["a", 5]})", "stop[1]"},
           {R"({"prompt": "x", "logit_bias": {"abc": 1}})", "logit_bias"},
           {R"({"prompt": "x", "logit_bias": {"-3": 1}})", "logit_bias"},
           {R"({"prompt": "x", "logit_bias": {"5": 101}})", "logit_bias.5"},
           {R"({"prompt": "x", "stream_options": {"include_usage": 1}})",
            "stream_options.include_usage"},
           {R"({"prompt": "x", "model": 3})", "model"},
       }) {
    const ApiError e = Refusal(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << ": " << e.message;
    EXPECT_EQ(e.type, "invalid_request_error");
    EXPECT_THAT(e.message, HasSubstr(param.substr(0, param.find_first_of("[."))));
  }
}

TEST(RequestTest, WhatIsNotSupportedYetIsRefusedByName) {
  for (const auto& [body, param] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": "x", "n": 2})", "n"},
           {R"({"prompt": "x", "echo": true})", "echo"},
           {R"({"prompt": "x", "suffix": "end"})", "suffix"},
           {R"({"prompt": "x", "best_of": 3})", "best_of"},
           {R"({"prompt": "x", "tools": [{"type": "function"}]})", "tools"},
           {R"({"prompt": "x", "tool_choice": "auto"})", "tool_choice"},
       }) {
    const ApiError e = Refusal(body);
    EXPECT_EQ(e.param, param) << body;
    EXPECT_EQ(e.code, "unsupported_parameter") << body;
    EXPECT_THAT(e.message, HasSubstr("not supported yet"));
  }
  // The neutral values are fine.
  Parse(R"({"prompt": "x", "tools": [], "tool_choice": "none", "parallel_tool_calls": false,
            "response_format": {"type": "text"}, "logprobs": 0})");
}

TEST(RequestTest, LogprobsAsEachEndpointAsksForThem) {
  const CompletionRequest c = Parse(R"({"prompt": "x", "logprobs": 3})");
  EXPECT_TRUE(c.logprobs.enabled);
  EXPECT_EQ(c.logprobs.top, 3);
  EXPECT_FALSE(Parse(R"({"prompt": "x", "logprobs": 0})").logprobs.enabled);
  const CompletionRequest chat =
      Parse(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true,
                "top_logprobs": 4})",
            Endpoint::kChatCompletions);
  EXPECT_TRUE(chat.logprobs.enabled);
  EXPECT_EQ(chat.logprobs.top, 4);
  EXPECT_FALSE(Parse(R"({"messages": [{"role": "user", "content": "x"}], "logprobs": false})",
                     Endpoint::kChatCompletions)
                   .logprobs.enabled);
  for (const auto& [body, endpoint, param] :
       std::vector<std::tuple<std::string, Endpoint, std::string>>{
           {R"({"prompt": "x", "logprobs": 21})", Endpoint::kCompletions, "logprobs"},
           {R"({"prompt": "x", "logprobs": true})", Endpoint::kCompletions, "logprobs"},
           {R"({"prompt": "x", "top_logprobs": 2})", Endpoint::kCompletions, "top_logprobs"},
           {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": 2})",
            Endpoint::kChatCompletions, "logprobs"},
           {R"({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})",
            Endpoint::kChatCompletions, "top_logprobs"},
           {R"({"messages": [{"role": "user", "content": "x"}], "logprobs": true,
                "top_logprobs": 21})",
            Endpoint::kChatCompletions, "top_logprobs"},
       }) {
    EXPECT_EQ(Refusal(body, endpoint).param, param) << body;
  }
}

TEST(RequestTest, JsonOutputIsCompiledToAGrammarInTheSchemasOrder) {
  const CompletionRequest obj =
      Parse(R"({"prompt": "x", "response_format": {"type": "json_object"}})");
  EXPECT_EQ(obj.response_format.kind, ResponseFormat::Kind::kJsonObject);
  EXPECT_THAT(obj.response_format.grammar, HasSubstr("root"));
  // Properties come in the order they are written (z before a), not sorted.
  const CompletionRequest schema = Parse(R"({"prompt": "x", "response_format": {
      "type": "json_schema", "json_schema": {"name": "p", "strict": true, "schema": {
        "type": "object", "properties": {"zeta": {"type": "string"}, "alpha": {"type": "integer"}},
        "required": ["zeta", "alpha"], "additionalProperties": false}}}})");
  EXPECT_EQ(schema.response_format.kind, ResponseFormat::Kind::kJsonSchema);
  const std::string& g = schema.response_format.grammar;
  ASSERT_NE(g.find("zeta"), std::string::npos) << g;
  ASSERT_NE(g.find("alpha"), std::string::npos) << g;
  EXPECT_LT(g.find("zeta"), g.find("alpha")) << g;
  // llama-server's GBNF field.
  const CompletionRequest gbnf =
      Parse(R"({"prompt": "x", "grammar": "root ::= \"yes\" | \"no\""})");
  EXPECT_EQ(gbnf.response_format.kind, ResponseFormat::Kind::kGrammar);
  EXPECT_EQ(gbnf.response_format.grammar, "root ::= \"yes\" | \"no\"");
  // Text stays free.
  EXPECT_TRUE(Parse(R"({"prompt": "x", "response_format": {"type": "text"}})")
                  .response_format.grammar.empty());
}

TEST(RequestTest, OutputConstraintsThatCannotBeHonouredAreRefusedByName) {
  for (const auto& [body, param, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {R"({"prompt": "x", "response_format": {"type": "xml"}})", "response_format.type",
            "xml"},
           {R"({"prompt": "x", "response_format": {"type": "json_schema", "json_schema": {
               "schema": {"type": "integer", "multipleOf": 3}}}})",
            "response_format", "multipleOf"},
           {R"({"prompt": "x", "response_format": {"type": "json_schema"}})", "response_format",
            "json_schema"},
           {R"({"prompt": "x", "grammar": "root ::= vaule"})", "grammar", "vaule"},
           {R"({"prompt": "x", "grammar": "root ::= \"a\"",
               "response_format": {"type": "json_object"}})",
            "grammar", "one of them"},
       }) {
    const ApiError e = Refusal(body);
    EXPECT_EQ(e.status, 400) << body;
    EXPECT_EQ(e.param, param) << body << ": " << e.message;
    EXPECT_THAT(e.message, HasSubstr(says)) << body;
  }
}

TEST(RequestTest, UnknownFieldsAreRefused) {
  const ApiError e = Refusal(R"({"prompt": "x", "temprature": 0.5})");
  EXPECT_EQ(e.param, "temprature");
  EXPECT_EQ(e.code, "unknown_parameter");
}

TEST(RequestTest, BodiesThatAreNotAJsonObjectAreRefused) {
  for (const std::string& body :
       std::vector<std::string>{"", "{", "[1, 2]", "\"text\"", "{\"prompt\": \"x\",}",
                                "{\"prompt\": \"\xff\"}", std::string(100000, '[')}) {
    const ApiError e = Refusal(body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "invalid_json") << body.substr(0, 20);
    EXPECT_EQ(e.param, "");
  }
  // Nested past the limit inside a string is only text.
  Parse(R"({"prompt": ")" + std::string(1000, '[') + R"("})");
}

TEST(RequestTest, TokenizeAndDetokenizeTakeLlamaServersShapes) {
  ApiError e;
  auto t =
      ParseTokenizeRequest(R"({"content": "Hi", "add_special": true, "with_pieces": true})", &e);
  ASSERT_TRUE(t.has_value()) << e.message;
  EXPECT_EQ(t->content, "Hi");
  EXPECT_TRUE(t->add_special);
  EXPECT_TRUE(t->with_pieces);
  EXPECT_TRUE(t->parse_special);
  EXPECT_FALSE(ParseTokenizeRequest(R"({"text": "Hi"})", &e).has_value());
  EXPECT_EQ(e.param, "text");
  EXPECT_FALSE(ParseTokenizeRequest(R"({})", &e).has_value());
  EXPECT_EQ(e.param, "content");
  auto d = ParseDetokenizeRequest(R"({"tokens": [1, 403, 407]})", &e);
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, (std::vector<int32_t>{1, 403, 407}));
  EXPECT_FALSE(ParseDetokenizeRequest(R"({"tokens": [1, -2]})", &e).has_value());
  EXPECT_EQ(e.param, "tokens[1]");
  EXPECT_FALSE(ParseDetokenizeRequest(R"({"tokens": "1 2"})", &e).has_value());
  EXPECT_EQ(e.param, "tokens");
}

}  // namespace
}  // namespace kvasir::serve
