// libFuzzer target: what reaches `kvasir serve` in a request body. The first byte picks the
// endpoint (completions, chat completions, tokenize, detokenize); the rest is the body. Accepted
// requests go on to what the server makes of them: the chat layout, the ring's GENERATE (which
// must be encodable or refused, never abort) and the stop filter over the prompt in pieces.
// Any body is also read as a model's answer by the tool call parsers.
// Invariants: a refusal names a status from 400 to 599 and has a message; its error body is JSON.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "ring/messages.h"
#include "serve/request.h"
#include "serve/ring_request.h"
#include "serve/stop_filter.h"
#include "serve/tool_grammar.h"
#include "serve/tool_output.h"

using namespace kvasir;
using namespace kvasir::serve;

namespace {

void CheckRefusal(const ApiError& e) {
  if (e.status < 400 || e.status > 599 || e.message.empty()) std::abort();
  if (nlohmann::json::parse(ErrorBody(e), nullptr, false).is_discarded()) std::abort();
}

void Follow(const CompletionRequest& r) {
  ApiError e;
  auto text = PromptText(r, ChatFamily::kLlama3, &e);
  if (!text) return CheckRefusal(e);
  const ring::GenerateMsg g = ToGenerate(r, *text, 1);
  if (ring::CheckEncodable(g).ok()) (void)ring::EncodeMessage(g);
  GeneratedText out(r.stop);
  for (size_t at = 0; at < text->size() && !out.stopped(); at += 3) {
    (void)out.Push(std::string_view(*text).substr(at, 3));
  }
  (void)out.Finish();
  if (!r.tools.active()) return;
  // Tools: each family's grammar, and its call parser over the prompt in pieces.
  for (ChatFamily f :
       {ChatFamily::kChatMl, ChatFamily::kLlama3, ChatFamily::kMistralV7, ChatFamily::kQwen35}) {
    CompletionRequest copy = r;
    if (!ApplyToolGrammar(f, &copy, &e)) CheckRefusal(e);
    ToolCallParser parser(ToolSyntaxFor(f, copy.tools.forced()), r.tools.tools);
    for (size_t at = 0; at < text->size(); at += 5) {
      (void)parser.Push(std::string_view(*text).substr(at, 5));
    }
    (void)parser.Finish();
  }
}

// The call parsers over any text, in pieces of `step` bytes.
void ParseCalls(std::string_view text, size_t step) {
  for (ChatFamily f :
       {ChatFamily::kChatMl, ChatFamily::kLlama3, ChatFamily::kMistralV3, ChatFamily::kQwen35}) {
    for (bool forced : {false, true}) {
      ToolCallParser parser(ToolSyntaxFor(f, forced), {"f", "get_weather"});
      for (size_t at = 0; at < text.size(); at += step) (void)parser.Push(text.substr(at, step));
      (void)parser.Finish(/*cut=*/step % 2 == 0);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  ParseCalls(body, 1 + data[0] % 7);
  ApiError e;
  switch (data[0] % 4) {
    case 0:
    case 1: {
      const Endpoint ep = data[0] % 4 == 0 ? Endpoint::kCompletions : Endpoint::kChatCompletions;
      auto r = ParseCompletionRequest(body, ep, &e);
      if (r) {
        Follow(*r);
      } else {
        CheckRefusal(e);
      }
      break;
    }
    case 2:
      if (!ParseTokenizeRequest(body, &e)) CheckRefusal(e);
      break;
    default:
      if (!ParseDetokenizeRequest(body, &e)) CheckRefusal(e);
      break;
  }
  return 0;
}
