#include "serve/answer.h"

#include "base/log.h"
#include "base/timing_trace.h"
#include "serve/stop_filter.h"

namespace kvasir::serve {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

const char* FinishReason(wire::FinishReason r) {
  switch (r) {
    case wire::FinishReason::kMaxTokens:
    case wire::FinishReason::kContextFull:
      return "length";
    default:
      return "stop";
  }
}

// The log-probabilities of an answer's tokens, handed out as the text they belong to is.
class TokenLogs {
 public:
  void Add(const ring::TokenMsg& t) {
    if (t.logprobs.empty() || t.piece.empty()) return;  // an end-of-generation token: no text
    TokenLogprobs e;
    e.token = t.piece;
    e.logprob = t.logprobs[0].logprob;
    for (size_t i = 1; i < t.logprobs.size(); ++i) {
      e.top.emplace_back(t.logprobs[i].piece, t.logprobs[i].logprob);
    }
    generated_ += t.piece.size();
    entries_.push_back(std::move(e));
    ends_.push_back(generated_);
  }
  // The entries whose text is now shown, `shown` more bytes having been shown; with `last`, also
  // those whose text is only partly shown.
  LogprobsPart Release(size_t shown, bool last = false) {
    const size_t from = released_;
    shown_ += shown;
    while (released_ < entries_.size() &&
           (ends_[released_] <= shown_ ||
            (last && ends_[released_] - entries_[released_].token.size() < shown_))) {
      ++released_;
    }
    LogprobsPart part;
    part.entries = std::span<const TokenLogprobs>(entries_).subspan(from, released_ - from);
    part.text_offset = from == 0 ? 0 : ends_[from - 1];
    return part;
  }

 private:
  std::vector<TokenLogprobs> entries_;
  std::vector<size_t> ends_;  // [entries] bytes of generated text up to the entry's end
  size_t generated_ = 0, shown_ = 0, released_ = 0;
};

}  // namespace

net::HttpServerResponse ErrorResponse(const ApiError& e) {
  net::HttpServerResponse r;
  r.status = e.status;
  r.content_type = "application/json";
  r.body = ErrorBody(e);
  if (e.retry_after_s > 0) r.headers.emplace_back("Retry-After", std::to_string(e.retry_after_s));
  return r;
}

ApiError RingError(const Status& s, const std::string& input_param) {
  ApiError e;
  e.message = s.message();
  switch (s.code()) {
    case StatusCode::kTooLarge:
      e.code = "context_length_exceeded";
      e.param = input_param;
      break;
    case StatusCode::kInvalidInput:
      e.code = "invalid_value";
      break;
    case StatusCode::kConflict:
      e.status = 429;
      e.type = "rate_limit_error";
      e.code = "ring_busy";
      e.retry_after_s = 1;
      break;
    default:
      e.status = 503;
      e.type = "server_error";
      e.code = "ring_unavailable";
      e.retry_after_s = 1;
      break;
  }
  return e;
}

void RunAnswer(AnswerJob& job, RingAccess& ring, Metrics& metrics, const AnswerLimits& limits) {
  const CompletionRequest& req = job.request;
  const std::string input = req.endpoint == Endpoint::kChatCompletions ? "messages" : "prompt";
  auto client = ring.Take();
  TraceTiming("serve", "link", "req={}", job.meta.id);
  if (!client.ok()) {
    job.reply(ErrorResponse(RingError(client.status().WithCode(StatusCode::kUnavailable), input)));
    return;
  }
  GeneratedText text(req.stop);
  std::shared_ptr<net::HttpBodyStream> stream;
  auto cancel = std::make_shared<std::atomic<bool>>(false);
  std::string whole;
  double ttft_s = 0;
  bool started = false;
  bool wrote_text = false;
  // Log-probabilities: one entry per token of text, with where its bytes end in the generated
  // text; an entry goes out with the chunk that shows the last of its bytes (stop strings and
  // incomplete characters hold text back), and none of the text a stop string cut.
  TokenLogs logs;
  // Streams `piece` (false: the client has gone) or keeps it for the whole answer.
  auto emit_text = [&](const std::string& piece) {
    if (piece.empty()) return true;
    if (!wrote_text) TraceTiming("serve", "first_text", "req={}", job.meta.id);
    wrote_text = true;
    if (!req.stream) {
      whole += piece;
      return true;
    }
    const LogprobsPart part = logs.Release(piece.size());
    return stream->Write(ChunkEvent(job.meta, piece, "", false, req.include_usage,
                                    req.logprobs.enabled ? &part : nullptr));
  };
  // With tools, the text goes through the call parser: content as text, calls in pieces.
  std::optional<ToolCallParser> tools;
  if (job.tool_syntax) tools.emplace(*job.tool_syntax, req.tools.tools);
  std::vector<ToolCall> calls;
  auto emit_parsed = [&](ToolCallParser::Output out) {
    for (const ToolCallParser::Piece& p : out.pieces) {
      if (p.call < 0) {
        if (!emit_text(p.content)) return false;
      } else if (req.stream && !stream->Write(ToolCallChunk(job.meta, p.call, p.id, p.name,
                                                            p.arguments, req.include_usage))) {
        return false;
      }
    }
    for (ToolCall& c : out.calls) calls.push_back(std::move(c));
    return true;
  };
  auto emit = [&](const std::string& piece) {
    return tools ? emit_parsed(tools->Push(piece)) : emit_text(piece);
  };
  auto on_token = [&](const ring::TokenMsg& t) {
    if (!started) {
      TraceTiming("serve", "first_token", "req={} session={}", job.meta.id, t.token.session);
      started = true;
      ttft_s = SecondsSince(job.arrived);
      metrics.ObserveFirstToken(ttft_s);
      if (req.stream) {
        stream = std::make_shared<net::HttpBodyStream>(limits.stream_buffer_bytes);
        stream->OnGone([cancel] { cancel->store(true); });
        net::HttpServerResponse res;
        res.content_type = "text/event-stream";
        res.headers.emplace_back("Cache-Control", "no-cache");
        res.stream = stream;
        job.reply(std::move(res));
        if (req.endpoint == Endpoint::kChatCompletions &&
            !stream->Write(ChunkEvent(job.meta, "", "", true, req.include_usage))) {
          return false;
        }
      }
    }
    if (req.logprobs.enabled) logs.Add(t);
    if (!emit(text.Push(t.piece))) return false;
    return !text.stopped();
  };
  auto r = (*client)->Generate(job.generate, on_token, cancel.get());
  ring.Give(std::move(client).value());
  if (!r.ok()) {
    const ApiError e = RingError(r.status(), input);
    if (e.status == 503) ring.Refresh();
    if (!started) return job.reply(ErrorResponse(e));
    KV_LOG_WARN("serve: {} failed after it began: {}", job.meta.id, e.message);
    if (stream) {
      stream->Write(SseEvent(ErrorBody(e)));
      stream->End();
    } else {
      job.reply(ErrorResponse(e));
    }
    return;
  }
  if (req.stream && stream == nullptr) {  // no token came: nothing began
    return job.reply(ErrorResponse(RingError(
        Error(StatusCode::kUnavailable, "the ring ended the session without a token"), input)));
  }
  if (r->reason == wire::FinishReason::kClientClosed && !text.stopped()) {
    KV_LOG_INFO("serve: {}: the client went away; its session is closed", job.meta.id);
    if (stream) stream->End();
    return;
  }
  std::string finish = text.stopped() ? "stop" : FinishReason(r->reason);
  bool ok = emit(text.Finish());
  if (tools && ok) ok = emit_parsed(tools->Finish(/*cut=*/finish == "length"));
  if (!calls.empty() && finish != "length") finish = "tool_calls";
  Usage usage;
  usage.prompt_tokens = r->n_prompt;
  usage.cached_tokens = r->n_cached;
  usage.completion_tokens =
      std::max(0, r->n_generated - (r->reason == wire::FinishReason::kEog ? 1 : 0));
  metrics.CountTokens(usage.prompt_tokens, usage.completion_tokens, usage.cached_tokens);
  metrics.ObserveDecode(r->n_generated - 1, (r->total_ms - r->ttft_ms) / 1e3);
  if (!req.stream) {
    net::HttpServerResponse res;
    res.content_type = "application/json";
    const LogprobsPart part = logs.Release(whole.size(), /*last=*/true);
    res.body =
        AnswerBody(job.meta, whole, finish, usage, req.logprobs.enabled ? &part : nullptr, calls);
    return job.reply(std::move(res));
  }
  if (ok) {
    const LogprobsPart rest = logs.Release(0, /*last=*/true);
    stream->Write(ChunkEvent(job.meta, "", finish, false, req.include_usage,
                             req.logprobs.enabled ? &rest : nullptr));
    if (req.include_usage) stream->Write(UsageEvent(job.meta, usage));
    stream->Write(DoneEvent());
  }
  stream->End();
}

}  // namespace kvasir::serve
