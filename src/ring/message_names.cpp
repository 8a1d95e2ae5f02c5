// Names of messages, error codes and dtypes for logs and errors (declared in ring/messages.h).
#include <fmt/format.h>

#include <string>

#include "ring/messages.h"

namespace kvasir::ring {
namespace {

using wire::Dtype;

// Printable ASCII of a NUL-padded fixed-size name from a peer, for logs.
std::string PrintableName(const char* name, size_t size) {
  std::string out;
  for (size_t i = 0; i < size && name[i] != '\0'; ++i) {
    const char c = name[i];
    out.push_back(c >= 0x20 && c < 0x7F ? c : '?');
  }
  return out;
}

}  // namespace

std::string MessageName(const Message& msg) {
  if (const auto* m = std::get_if<HelloMsg>(&msg)) {
    return fmt::format("HELLO({}, layers [{}, {}))",
                       PrintableName(m->hello.name, sizeof(m->hello.name)), m->hello.window_first,
                       m->hello.window_last);
  }
  if (const auto* m = std::get_if<ErrorMsg>(&msg)) {
    return fmt::format("ERROR({}, session {})", ErrorCodeName(m->code), m->session);
  }
  if (const auto* m = std::get_if<GenerateMsg>(&msg)) {
    return fmt::format("GENERATE({} prompt bytes, {} stops)", m->prompt.size(), m->stops.size());
  }
  if (const auto* m = std::get_if<OpenSessionMsg>(&msg)) {
    return fmt::format("OPEN_SESSION(session {}, {} prompt tokens)", m->session, m->prompt.size());
  }
  if (const auto* m = std::get_if<HiddenMsg>(&msg)) {
    return fmt::format("HIDDEN(session {}, {} rows)", m->session, m->n_tokens);
  }
  if (const auto* m = std::get_if<TokenMsg>(&msg)) {
    std::string s =
        fmt::format("TOKEN(session {}, pos {}, id {}", m->token.session, m->token.pos, m->token.id);
    if (m->token.finished != 0) {
      s += fmt::format(", finished: {}", wire::FinishReasonName(m->token.reason));
    }
    return s + ")";
  }
  if (const auto* m = std::get_if<CloseMsg>(&msg)) {
    return fmt::format("CLOSE_SESSION(session {}, {})", m->session,
                       wire::FinishReasonName(m->reason));
  }
  if (const auto* m = std::get_if<PingMsg>(&msg)) {
    return fmt::format("{}(nonce {})", m->pong ? "PONG" : "PING", m->body.nonce);
  }
  if (const auto* m = std::get_if<HandshakeMsg>(&msg)) {
    return fmt::format("HANDSHAKE(step {})", m->body.step);
  }
  if (std::holds_alternative<KeepaliveMsg>(msg)) return "KEEPALIVE";
  if (const auto* m = std::get_if<ReceiptMsg>(&msg)) {
    // Only the body's counts, read as they are: the payload has not been parsed yet.
    if (m->payload.size() < sizeof(wire::ReceiptBody)) {
      return fmt::format("RECEIPT({} bytes)", m->payload.size());
    }
    wire::ReceiptBody b;
    std::memcpy(&b, m->payload.data(), sizeof(b));
    return fmt::format("RECEIPT(session {}, {} lines)", b.session, b.n_lines);
  }
  const auto& m = std::get<StatsMsg>(msg);
  return fmt::format("STATS({} records)", m.records.size());
}

const char* ErrorCodeName(wire::ErrorCode code) {
  switch (code) {
    case wire::ErrorCode::kMalformed:
      return "malformed";
    case wire::ErrorCode::kVersion:
      return "version";
    case wire::ErrorCode::kWrongModel:
      return "wrong_model";
    case wire::ErrorCode::kNotAdjacent:
      return "not_adjacent";
    case wire::ErrorCode::kUnknownSession:
      return "unknown_session";
    case wire::ErrorCode::kBadRequest:
      return "bad_request";
    case wire::ErrorCode::kLinkDown:
      return "link_down";
    case wire::ErrorCode::kInternal:
      return "internal";
    case wire::ErrorCode::kBusy:
      return "busy";
    case wire::ErrorCode::kUnauthenticated:
      return "unauthenticated";
    case wire::ErrorCode::kTooLarge:
      return "too_large";
    case wire::ErrorCode::kTimeout:
      return "timeout";
    case wire::ErrorCode::kCacheMiss:
      return "cache_miss";
  }
  return "unknown";
}

const char* DtypeName(wire::Dtype dtype) {
  switch (dtype) {
    case Dtype::kF32:
      return "f32";
    case Dtype::kF16:
      return "f16";
    case Dtype::kBF16:
      return "bf16";
  }
  return "unknown";
}

}  // namespace kvasir::ring
