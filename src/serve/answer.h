// One API request run on the ring and answered: whole, or streamed as Server-Sent Events. Runs on
// a SessionQueue worker. The generated pieces go through GeneratedText (whole characters, stop
// strings held back and cut); a stop string, or a streaming client that goes away, ends the ring
// session at once (RingClient's CLOSE_SESSION, which frees it on every stage).
//
// A streamed answer begins (HTTP 200) with the first token, so a refusal before it (a prompt over
// the context, a ring that is down) is still an error status; a failure after it arrives as an
// SSE event {"error": {...}} before the stream ends.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>

#include "net/http_server.h"
#include "ring/messages.h"
#include "serve/api_error.h"
#include "serve/metrics.h"
#include "serve/openai_json.h"
#include "serve/request.h"
#include "serve/ring_access.h"
#include "serve/tool_output.h"

namespace kvasir::serve {

struct AnswerJob {
  CompletionRequest request;
  ring::GenerateMsg generate;
  AnswerMeta meta;
  // With tools: how the answer is read back into calls (finish_reason "tool_calls").
  std::optional<ToolSyntax> tool_syntax;
  net::HttpResponder reply;  // exactly once
  std::chrono::steady_clock::time_point arrived;
};

struct AnswerLimits {
  size_t stream_buffer_bytes = size_t{1} << 20;  // per streamed answer (HttpBodyStream)
};

void RunAnswer(AnswerJob& job, RingAccess& ring, Metrics& metrics, const AnswerLimits& limits);

// The HTTP answer for `e`: its status, the OpenAI error body, Retry-After when it has one.
net::HttpServerResponse ErrorResponse(const ApiError& e);

// What a ring's refusal or failure is to the API client: a prompt over the context 400
// (context_length_exceeded, naming `input_param`), another refusal 400, a busy head 429, anything
// else (a link down, no token in time) 503.
ApiError RingError(const Status& status, const std::string& input_param);

}  // namespace kvasir::serve
