// The API server in process, in front of a real three-stage ring of stories260K: answers equal the
// ring's own generation, streams join to the whole answer, stop strings and clients that leave
// end their sessions on every stage, and every refusal has its status and OpenAI's shape.
#include "serve/api_server.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "gguf/gguf_file.h"
#include "http_test_client.h"
#include "ring/sampling_wire.h"
#include "ring_test_util.h"
#include "test_assets.h"

namespace kvasir::serve {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using testing::HttpAnswer;
using testing::TestHttp;

constexpr const char* kModel = "models/stories260K.gguf";
constexpr int kDeadlineMs = 30000;

class ApiServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    KV_REQUIRE_ASSET(kModel);
    ring_ = testing::LocalRing::Start(testing::AssetPath(kModel), 3, wire::Dtype::kF32, 2048);
    ASSERT_NE(ring_, nullptr);
  }

  // Starts the server with `o` (listen and ring filled in here) and waits for the ring.
  void StartServer(ServeOptions o = {}) {
    RingAccessOptions ro;
    ro.head = ring_->head();
    ro.client.ring_secret = testing::kTestRingSecret;
    access_ = RingAccess::Start(ro);
    o.listen = "127.0.0.1:0";
    if (o.model_name == "kvasir") o.model_name = "stories260K";
    auto s = ApiServer::Start(o, access_.get());
    ASSERT_TRUE(s.ok()) << s.status().message();
    server_ = std::move(s).value();
    ASSERT_TRUE(access_->WaitUp(kDeadlineMs)) << access_->why_down();
  }

  void TearDown() override {
    if (access_) access_->Stop();
    if (server_) server_->Stop();
  }

  HttpAnswer Post(const std::string& target, const std::string& body,
                  const std::vector<std::string>& headers = {}) {
    TestHttp c(server_->port());
    c.Send("POST", target, body, headers);
    return c.ReadWhole();
  }

  // Open sessions over every stage, as the ring reports them.
  uint32_t OpenSessions() {
    auto client = ring::RingClient::Connect(ring_->head(), 10000, testing::kTestRingSecret);
    EXPECT_TRUE(client.ok());
    if (!client.ok()) return 999;
    auto stats = (*client)->Stats();
    EXPECT_TRUE(stats.ok());
    uint32_t open = 0;
    if (!stats.ok()) return 999;
    for (const auto& s : *stats) open += s.sessions_open;
    return open;
  }
  // Waits (with a deadline) until no stage holds a session; the ring says so when asked.
  bool EventuallyNoSessions() {
    const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(kDeadlineMs);
    while (OpenSessions() != 0) {
      if (std::chrono::steady_clock::now() > end) return false;
    }
    return true;
  }

  std::unique_ptr<testing::LocalRing> ring_;
  std::unique_ptr<RingAccess> access_;
  std::unique_ptr<ApiServer> server_;
};

std::string StreamedText(const HttpAnswer& a, bool chat) {
  std::string text;
  for (const std::string& d : testing::SseData(a.body)) {
    if (d == "[DONE]") break;
    const json j = json::parse(d);
    if (j["choices"].empty()) continue;
    const json& c = j["choices"][0];
    text += chat ? c["delta"].value("content", "") : c["text"].get<std::string>();
  }
  return text;
}

TEST_F(ApiServerTest, ACompletionIsTheRingsOwnGeneration) {
  StartServer();
  const auto expected =
      testing::GenerateOnRing(ring_->head(), "Once upon a time", testing::Greedy(), 24);
  HttpAnswer a = Post("/v1/completions",
                      R"({"model": "stories260K", "prompt": "Once upon a time", "max_tokens": 24,
                          "temperature": 0})");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(a.headers["content-type"], "application/json");
  const json j = json::parse(a.body);
  EXPECT_EQ(j["choices"][0]["text"], expected.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 24);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);

  // Sampled, with the defaults of `kvasir generate` and a seed: the same draw.
  SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 7;
  const auto sampled = testing::GenerateOnRing(ring_->head(), "The dog", p, 20);
  a = Post("/v1/completions", R"({"prompt": "The dog", "max_tokens": 20, "seed": 7})");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(json::parse(a.body)["choices"][0]["text"], sampled.text);
}

TEST_F(ApiServerTest, StreamedChunksJoinToTheWholeAnswer) {
  ServeOptions o;
  o.chat_family = ChatFamily::kChatMl;
  StartServer(o);
  for (const bool chat : {false, true}) {
    SCOPED_TRACE(chat ? "chat" : "completion");
    const std::string target = chat ? "/v1/chat/completions" : "/v1/completions";
    const std::string input = chat ? R"("messages": [{"role": "user", "content": "Hi"}])"
                                   : R"("prompt": "Once upon a time")";
    const HttpAnswer whole = Post(target, "{" + input + R"(, "max_tokens": 30, "temperature": 0})");
    ASSERT_EQ(whole.status, 200) << whole.body;
    const json w = json::parse(whole.body);
    const std::string text = chat ? w["choices"][0]["message"]["content"].get<std::string>()
                                  : w["choices"][0]["text"].get<std::string>();
    HttpAnswer streamed = Post(target, "{" + input + R"(, "max_tokens": 30,
        "temperature": 0, "stream": true, "stream_options": {"include_usage": true}})");
    ASSERT_EQ(streamed.status, 200) << streamed.body;
    EXPECT_EQ(streamed.headers["content-type"], "text/event-stream");
    EXPECT_EQ(StreamedText(streamed, chat), text);
    const auto events = testing::SseData(streamed.body);
    ASSERT_GE(events.size(), 4u);
    EXPECT_EQ(events.back(), "[DONE]");
    const json usage = json::parse(events[events.size() - 2]);
    EXPECT_TRUE(usage["choices"].empty());
    // The same prompt again: all of it but its last token comes from the prompt cache.
    json counted = usage["usage"];
    EXPECT_EQ(counted["prompt_tokens_details"]["cached_tokens"],
              counted["prompt_tokens"].get<int>() - 1);
    counted["prompt_tokens_details"] = w["usage"]["prompt_tokens_details"];
    EXPECT_EQ(counted, w["usage"]);
    const json last = json::parse(events[events.size() - 3]);
    EXPECT_EQ(last["choices"][0]["finish_reason"], w["choices"][0]["finish_reason"]);
    if (chat) {
      EXPECT_EQ(json::parse(events[0])["choices"][0]["delta"]["role"], "assistant");
    }
  }
}

TEST_F(ApiServerTest, AStopStringIsNotShownAndEndsTheSession) {
  StartServer();
  const auto full =
      testing::GenerateOnRing(ring_->head(), "Once upon a time", testing::Greedy(), 48);
  // A stop string that starts inside the text: a word from its middle, with the space before it.
  const size_t at = full.text.find(' ', full.text.size() / 2);
  ASSERT_NE(at, std::string::npos);
  const size_t end = full.text.find(' ', at + 1);
  const std::string stop = full.text.substr(at, end - at);
  const std::string expected = full.text.substr(0, full.text.find(stop));
  for (const bool stream : {false, true}) {
    const json body = {{"prompt", "Once upon a time"},
                       {"max_tokens", 48},
                       {"temperature", 0},
                       {"stop", {"zzz", stop}},
                       {"stream", stream}};
    const HttpAnswer a = Post("/v1/completions", body.dump());
    ASSERT_EQ(a.status, 200) << a.body;
    std::string text;
    std::string finish;
    if (stream) {
      text = StreamedText(a, false);
      for (const std::string& d : testing::SseData(a.body)) {
        if (d == "[DONE]") continue;
        const json event = json::parse(d);
        const json& f = event["choices"][0]["finish_reason"];
        if (f.is_string()) finish = f;
      }
    } else {
      text = json::parse(a.body)["choices"][0]["text"];
      finish = json::parse(a.body)["choices"][0]["finish_reason"];
    }
    EXPECT_EQ(text, expected) << "stop '" << stop << "'";
    EXPECT_EQ(finish, "stop");
    EXPECT_EQ(OpenSessions(), 0u);
  }
}

TEST_F(ApiServerTest, AClientLeavingMidStreamFreesItsSessionOnEveryStage) {
  StartServer();
  TestHttp c(server_->port());
  c.Send("POST", "/v1/completions",
         R"({"prompt": "Once", "max_tokens": 2000, "ignore_eos": true, "stream": true})");
  auto head = c.ReadHead();
  ASSERT_TRUE(head.has_value());
  ASSERT_EQ(head->status, 200);
  ASSERT_TRUE(c.NextChunk().has_value());
  c.Close();
  EXPECT_TRUE(EventuallyNoSessions());
  // The place on the server is free again: another request runs at once.
  const HttpAnswer a = Post("/v1/completions", R"({"prompt": "Once", "max_tokens": 4})");
  EXPECT_EQ(a.status, 200) << a.body;
}

TEST_F(ApiServerTest, WhenEveryPlaceIsTakenARequestIsRefusedWith429) {
  ServeOptions o;
  o.max_sessions = 1;
  o.max_waiting = 0;
  StartServer(o);
  TestHttp busy(server_->port());
  busy.Send("POST", "/v1/completions",
            R"({"prompt": "Once", "max_tokens": 2000, "ignore_eos": true, "stream": true})");
  ASSERT_TRUE(busy.ReadHead().has_value());
  ASSERT_TRUE(busy.NextChunk().has_value());  // running now
  HttpAnswer a = Post("/v1/completions", R"({"prompt": "Once", "max_tokens": 4})");
  EXPECT_EQ(a.status, 429) << a.body;
  EXPECT_EQ(a.headers["retry-after"], "1");
  EXPECT_EQ(json::parse(a.body)["error"]["code"], "too_many_sessions");
  busy.Close();
  EXPECT_TRUE(EventuallyNoSessions());
}

TEST_F(ApiServerTest, RefusalsHaveTheirStatusAndOpenAisShape) {
  ServeOptions o;
  o.api_key = "0123456789abcdef-key";
  o.max_body_bytes = 4096;
  o.cors_origin = "https://chat.example";
  StartServer(o);
  const std::string auth = "Authorization: Bearer 0123456789abcdef-key";
  struct Case {
    std::string method, target, body;
    std::vector<std::string> headers;
    int status;
    std::string code;
  };
  for (const Case& c : std::vector<Case>{
           {"POST", "/v1/completions", R"({"prompt": "x"})", {}, 401, "invalid_api_key"},
           {"POST",
            "/v1/completions",
            R"({"prompt": "x"})",
            {"Authorization: Bearer 0123456789abcdef-kez"},
            401,
            "invalid_api_key"},
           {"GET", "/metrics", "", {}, 401, "invalid_api_key"},
           {"POST", "/v1/completions", "{bad", {auth}, 400, "invalid_json"},
           {"POST",
            "/v1/completions",
            R"({"prompt": "x", "model": "other"})",
            {auth},
            404,
            "model_not_found"},
           {"POST", "/v1/completions", std::string(5000, ' '), {auth}, 413, "request_too_large"},
           {"GET", "/v1/completions", "", {auth}, 405, "method_not_allowed"},
           {"GET", "/v2/nothing", "", {auth}, 404, "unknown_url"},
           {"POST",
            "/v1/chat/completions",
            R"({"messages": [{"role": "user", "content": "x"}]})",
            {auth},
            400,
            "chat_template_missing"},
       }) {
    SCOPED_TRACE(c.method + " " + c.target + " " + c.body.substr(0, 40));
    TestHttp h(server_->port());
    h.Send(c.method, c.target, c.body, c.headers);
    HttpAnswer a = h.ReadWhole();
    EXPECT_EQ(a.status, c.status) << a.body;
    const json j = json::parse(a.body, nullptr, false);
    ASSERT_TRUE(j.is_object()) << a.body;
    EXPECT_EQ(j["error"]["code"], c.code);
    EXPECT_TRUE(j["error"]["message"].is_string());
    EXPECT_TRUE(j["error"].contains("type") && j["error"].contains("param"));
    if (c.status != 413) {
      EXPECT_EQ(a.headers["access-control-allow-origin"], "https://chat.example");
    }
  }
  // The right key, health without one, and a browser's preflight.
  EXPECT_EQ(Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})", {auth}).status, 200);
  TestHttp health(server_->port());
  health.Send("GET", "/health");
  EXPECT_EQ(health.ReadWhole().status, 200);
  TestHttp pre(server_->port());
  pre.Send("OPTIONS", "/v1/chat/completions", "",
           {"Origin: https://chat.example", "Access-Control-Request-Method: POST"});
  HttpAnswer p = pre.ReadWhole();
  EXPECT_EQ(p.status, 204);
  EXPECT_EQ(p.headers["access-control-allow-origin"], "https://chat.example");
  EXPECT_THAT(p.headers["access-control-allow-headers"], HasSubstr("Authorization"));
}

TEST_F(ApiServerTest, HealthShowsTheStages) {
  StartServer();
  TestHttp h(server_->port());
  h.Send("GET", "/health");
  HttpAnswer a = h.ReadWhole();
  ASSERT_EQ(a.status, 200) << a.body;
  const json j = json::parse(a.body);
  EXPECT_EQ(j["status"], "ok");
  ASSERT_EQ(j["stages"].size(), 3u);
  EXPECT_EQ(j["stages"][0]["layers"], json({0, 1}));
  EXPECT_EQ(j["stages"][2]["layers"], json({3, 5}));
  EXPECT_EQ(j["stages"][1]["backend"], "cpu");
  EXPECT_TRUE(j["stages"][1]["name"].is_string());
}

TEST_F(ApiServerTest, TokenizeAndDetokenizeWithTheModelsVocabulary) {
  auto file = GgufFile::Open(testing::AssetPath(kModel));
  ASSERT_TRUE(file.ok());
  auto tok = Tokenizer::FromGguf(file->header(), kModel);
  ASSERT_TRUE(tok.ok());
  const std::vector<int32_t> ids = (*tok)->Encode("Once upon a time", false, true);
  ServeOptions o;
  o.tokenizer = std::shared_ptr<const Tokenizer>(std::move(tok).value());
  StartServer(o);
  HttpAnswer a = Post("/tokenize", R"({"content": "Once upon a time"})");
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(json::parse(a.body)["tokens"], json(ids));
  a = Post("/tokenize", R"({"content": "Once", "with_pieces": true})");
  EXPECT_EQ(json::parse(a.body)["tokens"][0]["piece"], " Once");
  a = Post("/detokenize", json({{"tokens", ids}}).dump());
  ASSERT_EQ(a.status, 200) << a.body;
  EXPECT_EQ(json::parse(a.body)["content"], " Once upon a time");
  a = Post("/detokenize", R"({"tokens": [1, 999999]})");
  EXPECT_EQ(a.status, 400);
  EXPECT_EQ(json::parse(a.body)["error"]["param"], "tokens[1]");
  // A logit bias outside the vocabulary is refused here, naming the field.
  a = Post("/v1/completions", R"({"prompt": "x", "logit_bias": {"999999": 1}})");
  EXPECT_EQ(a.status, 400);
  EXPECT_EQ(json::parse(a.body)["error"]["param"], "logit_bias");
}

TEST_F(ApiServerTest, SixteenConcurrentStreamsEachGetTheirOwnAnswer) {
  ServeOptions o;
  o.max_sessions = 16;
  StartServer(o);
  const std::vector<std::string> prompts = {"Once upon a time", "The dog", "Lily saw",
                                            "Tom had",          "One day", "The sun",
                                            "A little bird",    "Mom said"};
  std::vector<std::string> expected;
  for (const std::string& p : prompts) {
    expected.push_back(testing::GenerateOnRing(ring_->head(), p, testing::Greedy(), 32).text);
  }
  std::vector<HttpAnswer> got(16);
  std::vector<std::thread> clients;
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      const json body = {{"prompt", prompts[i % prompts.size()]},
                         {"max_tokens", 32},
                         {"temperature", 0},
                         {"stream", true}};
      got[i] = Post("/v1/completions", body.dump());
    });
  }
  for (auto& t : clients) t.join();
  for (int i = 0; i < 16; ++i) {
    EXPECT_EQ(got[i].status, 200) << got[i].body;
    EXPECT_EQ(StreamedText(got[i], false), expected[i % prompts.size()]) << "client " << i;
  }
  EXPECT_EQ(OpenSessions(), 0u);
}

TEST(ApiServerDownTest, HealthIs503UntilTheRingIsUp) {
  // A head that does not exist: a port bound here without listening, so connections are refused.
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a4{};
  a4.sin_family = AF_INET;
  a4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a4), sizeof(a4)), 0);
  socklen_t len = sizeof(a4);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a4), &len), 0);
  RingAccessOptions ro;
  ro.head = "127.0.0.1:" + std::to_string(ntohs(a4.sin_port));
  ro.client.ring_secret = testing::kTestRingSecret;
  ro.connect_timeout_ms = 200;
  auto access = RingAccess::Start(ro);
  ServeOptions o;
  o.listen = "127.0.0.1:0";
  auto server = ApiServer::Start(o, access.get());
  ASSERT_TRUE(server.ok());
  TestHttp h((*server)->port());
  h.Send("GET", "/health");
  HttpAnswer a = h.ReadWhole();
  EXPECT_EQ(a.status, 503);
  EXPECT_EQ(json::parse(a.body)["error"]["code"], "ring_unavailable");
  TestHttp c((*server)->port());
  c.Send("POST", "/v1/completions", R"({"prompt": "x"})");
  a = c.ReadWhole();
  EXPECT_EQ(a.status, 503);
  EXPECT_EQ(a.headers["retry-after"], "1");
  access->Stop();
  (*server)->Stop();
  ::close(fd);
}

}  // namespace
}  // namespace kvasir::serve
