#include "ring/messages.h"

#include <bit>
#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>

#include "base/check.h"
#include "kernels/kernels.h"
#include "ring/sampling_tails.h"
#include "ring/spec_wire.h"

namespace kvasir::ring {

static_assert(std::endian::native == std::endian::little,
              "the ring codec copies little-endian wire structs as they are");

namespace {

using wire::Dtype;
using wire::MsgType;

constexpr size_t kHeaderSize = sizeof(wire::FrameHeader);
constexpr uint8_t kMaxFinishReason = static_cast<uint8_t>(wire::FinishReason::kClientClosed);
constexpr size_t kMaxStopBytes = 0xFFFF;  // a stop string's length travels as u16

const char* Name(MsgType t) { return wire::MsgTypeName(static_cast<uint16_t>(t)); }

// ---- Field checks shared by the decoder and CheckEncodable ---------------------------------

Status CheckSession(MsgType t, uint32_t session) {
  if (session == 0) return Error("{}: session is 0 (session ids are nonzero)", Name(t));
  return Status::Ok();
}

Status CheckReason(MsgType t, uint32_t reason) {
  if (reason > kMaxFinishReason) {
    return Error("{}: reason {} is not a finish reason (0..{})", Name(t), reason, kMaxFinishReason);
  }
  return Status::Ok();
}

Status CheckPayloadSize(MsgType t, uint64_t payload) {
  if (payload > wire::kMaxPayload) {
    return Error(StatusCode::kTooLarge, "{}: payload of {} bytes exceeds the {} MiB limit", Name(t),
                 payload, wire::kMaxPayload >> 20);
  }
  return Status::Ok();
}

// Bytes of the rows a HIDDEN body describes, after checking its session, dtype and shape.
Result<uint64_t> HiddenTailBytes(uint32_t session, uint32_t n_tokens, uint32_t n_embd,
                                 uint16_t dtype) {
  KV_RETURN_IF_ERROR(CheckSession(MsgType::kHidden, session));
  if (dtype > static_cast<uint16_t>(Dtype::kBF16)) {
    return Error("HIDDEN: dtype {} is unknown (0 f32, 1 f16, 2 bf16)", dtype);
  }
  if (n_tokens == 0) return Error("HIDDEN: n_tokens is 0");
  if (n_embd == 0) return Error("HIDDEN: n_embd is 0");
  const uint64_t values = uint64_t{n_tokens} * n_embd;  // both < 2^32: cannot wrap
  if (values > wire::kMaxPayload) {
    return Error("HIDDEN: n_tokens {} x n_embd {} = {} values exceeds any payload ({} MiB)",
                 n_tokens, n_embd, values, wire::kMaxPayload >> 20);
  }
  return values * wire::DtypeSize(static_cast<Dtype>(dtype));
}

// ---- Decoding ------------------------------------------------------------------------------

// Copies the packed body at the start of the payload.
template <typename Body>
Status LoadBody(const Frame& f, Body* body) {
  static_assert(std::is_trivially_copyable_v<Body>);
  if (f.payload.size() < sizeof(Body)) {
    return Error("{}: payload of {} bytes is shorter than its {}-byte body",
                 wire::MsgTypeName(f.type), f.payload.size(), sizeof(Body));
  }
  std::memcpy(body, f.payload.data(), sizeof(Body));
  return Status::Ok();
}

// Requires exactly `tail` bytes after the body; `what` names the fields that imply it.
Status CheckTail(const Frame& f, size_t body_size, uint64_t tail, std::string_view what) {
  const uint64_t have = f.payload.size() - body_size;
  if (have == tail) return Status::Ok();
  if (what.empty()) {
    return Error("{}: payload is {} bytes, but the message is its {}-byte body alone",
                 wire::MsgTypeName(f.type), f.payload.size(), body_size);
  }
  return Error("{}: tail is {} bytes, but {} needs {}", wire::MsgTypeName(f.type), have, what,
               tail);
}

const uint8_t* Tail(const Frame& f, size_t body_size) { return f.payload.data() + body_size; }

Result<Message> DecodeHello(const Frame& f) {
  HelloMsg m;
  KV_RETURN_IF_ERROR(LoadBody(f, &m.hello));
  KV_RETURN_IF_ERROR(CheckTail(f, sizeof(wire::Hello), 0, ""));
  return Message(std::move(m));
}

Result<Message> DecodeError(const Frame& f) {
  wire::ErrorBody b{};
  KV_RETURN_IF_ERROR(LoadBody(f, &b));
  if (b.message_bytes > wire::kMaxErrorMessage) {
    return Error("ERROR: message_bytes {} exceeds the {}-byte limit", b.message_bytes,
                 wire::kMaxErrorMessage);
  }
  KV_RETURN_IF_ERROR(
      CheckTail(f, sizeof(b), b.message_bytes, fmt::format("message_bytes {}", b.message_bytes)));
  // Codes outside the specification are kept: the peer still reports a failure.
  ErrorMsg m{static_cast<wire::ErrorCode>(b.code), b.session, {}};
  m.message.assign(reinterpret_cast<const char*>(Tail(f, sizeof(b))), b.message_bytes);
  return Message(std::move(m));
}

Result<Message> DecodeGenerate(const Frame& f) {
  wire::GenerateBody b{};
  KV_RETURN_IF_ERROR(LoadBody(f, &b));
  if (b.prompt_bytes > wire::kMaxPromptBytes) {
    return Error("GENERATE: prompt_bytes {} exceeds the {} MiB limit", b.prompt_bytes,
                 wire::kMaxPromptBytes >> 20);
  }
  if (b.n_stop > wire::kMaxStopStrings) {
    return Error("GENERATE: n_stop {} exceeds the limit of {} stop strings", b.n_stop,
                 wire::kMaxStopStrings);
  }
  if (b.add_special > 1) return Error("GENERATE: add_special {} is not 0 or 1", b.add_special);
  if ((b.flags & ~(wire::kGenerateReportCached | wire::kGenerateClientCount)) != 0) {
    return Error("GENERATE: flags 0x{:x} has unknown bits", b.flags);
  }
  const uint8_t* p = Tail(f, sizeof(b));
  size_t left = f.payload.size() - sizeof(b);
  std::optional<std::array<uint8_t, 16>> receipt_id;
  if ((b.flags & wire::kGenerateClientCount) != 0) {
    if (left < 16) return Error("GENERATE: the tail ends before the 16-byte receipt id");
    std::memcpy(receipt_id.emplace().data(), p, 16);
    p += 16;
    left -= 16;
  }
  if (left < b.prompt_bytes) {
    return Error("GENERATE: prompt_bytes {} but the tail holds {} bytes", b.prompt_bytes, left);
  }
  GenerateMsg m;
  m.sampling = b.sampling;
  m.add_special = b.add_special != 0;
  m.report_cached = (b.flags & wire::kGenerateReportCached) != 0;
  m.receipt_id = receipt_id;
  m.prompt.assign(reinterpret_cast<const char*>(p), b.prompt_bytes);
  p += b.prompt_bytes;
  left -= b.prompt_bytes;
  m.stops.reserve(b.n_stop);
  for (uint32_t i = 0; i < b.n_stop; ++i) {
    if (left < sizeof(uint16_t)) {
      return Error("GENERATE: stop string {} of {}: tail ends before its u16 length", i, b.n_stop);
    }
    uint16_t len;
    std::memcpy(&len, p, sizeof(len));
    p += sizeof(len);
    left -= sizeof(len);
    if (left < len) {
      return Error("GENERATE: stop string {} of {}: length {} but {} bytes remain", i, b.n_stop,
                   len, left);
    }
    m.stops.emplace_back(reinterpret_cast<const char*>(p), len);
    p += len;
    left -= len;
  }
  if (HasSamplingTails(b.sampling)) {
    KV_RETURN_IF_ERROR(
        DecodeSamplingTails(Name(MsgType::kGenerate), b.sampling, p, left, &m.extra));
  } else if (left != 0) {
    return Error("GENERATE: {} bytes follow the prompt and {} stop strings", left, b.n_stop);
  }
  return Message(std::move(m));
}

Result<Message> DecodeOpenSession(const Frame& f) {
  wire::OpenSessionBody b{};
  KV_RETURN_IF_ERROR(LoadBody(f, &b));
  KV_RETURN_IF_ERROR(CheckSession(MsgType::kOpenSession, b.session));
  const uint64_t ids = uint64_t{b.n_prompt} * sizeof(int32_t);
  OpenSessionMsg m;
  if (HasSamplingTails(b.sampling)) {
    const size_t left = f.payload.size() - sizeof(b);
    if (left < ids) {
      return Error("OPEN_SESSION: tail is {} bytes, but n_prompt {} x i32 needs {}", left,
                   b.n_prompt, ids);
    }
    KV_RETURN_IF_ERROR(DecodeSamplingTails(Name(MsgType::kOpenSession), b.sampling,
                                           Tail(f, sizeof(b)) + ids, left - ids, &m.extra));
  } else {
    KV_RETURN_IF_ERROR(CheckTail(f, sizeof(b), ids, fmt::format("n_prompt {} x i32", b.n_prompt)));
  }
  if ((b.open_flags & ~(wire::kOpenKeep | wire::kOpenReplay)) != 0) {
    return Error("OPEN_SESSION: open_flags 0x{:x} has unknown bits", b.open_flags);
  }
  const bool replay = (b.open_flags & wire::kOpenReplay) != 0;
  if (replay ? (b.fork_from != 0 || b.n_generated >= b.n_prompt) : b.n_generated != 0) {
    return Error("OPEN_SESSION: n_generated {} with fork_from {}, {} ids and replay {}",
                 b.n_generated, b.fork_from, b.n_prompt, replay ? "on" : "off");
  }
  if (b.fork_from == 0 ? b.n_cached != 0 : b.n_cached >= b.n_prompt) {
    return Error("OPEN_SESSION: n_cached {} {}", b.n_cached,
                 b.fork_from == 0 ? "without fork_from"
                                  : fmt::format("is not below n_prompt {}", b.n_prompt));
  }
  m.session = b.session;
  m.sampling = b.sampling;
  m.fork_from = b.fork_from;
  m.n_cached = b.n_cached;
  m.keep = (b.open_flags & wire::kOpenKeep) != 0;
  m.prompt.resize(b.n_prompt);
  m.replay = replay;
  m.n_generated = b.n_generated;
  if (b.n_prompt > 0) {
    std::memcpy(m.prompt.data(), Tail(f, sizeof(b)), size_t{b.n_prompt} * sizeof(int32_t));
  }
  for (uint32_t i = 0; i < b.n_prompt; ++i) {
    if (m.prompt[i] < 0) return Error("OPEN_SESSION: prompt token {} is {}", i, m.prompt[i]);
  }
  return Message(std::move(m));
}

Result<Message> DecodeHidden(const Frame& f) {
  wire::HiddenBody b{};
  KV_RETURN_IF_ERROR(LoadBody(f, &b));
  KV_ASSIGN_OR_RETURN(uint64_t bytes, HiddenTailBytes(b.session, b.n_tokens, b.n_embd, b.dtype));
  KV_RETURN_IF_ERROR(CheckTail(f, sizeof(b), bytes,
                               fmt::format("n_tokens {} x n_embd {} x {}", b.n_tokens, b.n_embd,
                                           DtypeName(static_cast<Dtype>(b.dtype)))));
  KV_RETURN_IF_ERROR(CheckHiddenFlags(b.flags, b.n_tokens));
  HiddenMsg m{b.session, b.pos0, b.n_tokens, b.n_embd, static_cast<Dtype>(b.dtype), b.flags, {}};
  m.data.assign(Tail(f, sizeof(b)), Tail(f, sizeof(b)) + bytes);
  return Message(std::move(m));
}

Result<Message> DecodeToken(const Frame& f) {
  TokenMsg m;
  wire::TokenBody& b = m.token;
  KV_RETURN_IF_ERROR(LoadBody(f, &b));
  KV_RETURN_IF_ERROR(CheckSession(MsgType::kToken, b.session));
  if (b.id < 0) return Error("TOKEN: id {} is negative", b.id);
  if (b.finished > 1) return Error("TOKEN: finished {} is not 0 or 1", b.finished);
  KV_RETURN_IF_ERROR(CheckReason(MsgType::kToken, b.reason));
  if (b.n_logprobs > 1 + wire::kMaxTopLogprobs) {
    return Error("TOKEN: n_logprobs {} exceeds the limit of {}", b.n_logprobs,
                 1 + wire::kMaxTopLogprobs);
  }
  if ((b.flags &
       ~(wire::kTokenCached | wire::kTokenDrafts | wire::kTokenMore | wire::kTokenAhead)) != 0) {
    return Error("TOKEN: flags 0x{:x} has unknown bits", b.flags);
  }
  m.more = (b.flags & wire::kTokenMore) != 0;
  m.ahead = (b.flags & wire::kTokenAhead) != 0;
  if (m.ahead && (b.flags & wire::kTokenDrafts) == 0) {
    return Error("TOKEN: kTokenAhead without drafts (a guessed window is a token and its drafts)");
  }
  if (m.ahead && (b.flags & wire::kTokenCached) != 0) {
    return Error(
        "TOKEN: kTokenAhead with a cached count (a guessed window is a token and its drafts)");
  }
  if (m.more && (b.flags & wire::kTokenDrafts) != 0) {
    return Error("TOKEN: kTokenMore and kTokenDrafts together (drafts follow the last token only)");
  }
  if (m.more && b.finished != 0) return Error("TOKEN: kTokenMore on a finished token");
  if (b.n_logprobs == 0 && b.flags == 0) {
    KV_RETURN_IF_ERROR(
        CheckTail(f, sizeof(b), b.piece_bytes, fmt::format("piece_bytes {}", b.piece_bytes)));
    m.piece.assign(reinterpret_cast<const char*>(Tail(f, sizeof(b))), b.piece_bytes);
    return Message(std::move(m));
  }
  const uint8_t* p = Tail(f, sizeof(b));
  size_t left = f.payload.size() - sizeof(b);
  if (left < b.piece_bytes) {
    return Error("TOKEN: piece_bytes {} but the tail holds {} bytes", b.piece_bytes, left);
  }
  m.piece.assign(reinterpret_cast<const char*>(p), b.piece_bytes);
  p += b.piece_bytes;
  left -= b.piece_bytes;
  if ((b.flags & wire::kTokenCached) != 0) {
    uint32_t n = 0;
    if (left < sizeof(n)) return Error("TOKEN: the tail ends before its cached count");
    std::memcpy(&n, p, sizeof(n));
    p += sizeof(n);
    left -= sizeof(n);
    m.n_cached = n;
  }
  m.logprobs.resize(b.n_logprobs);
  for (TokenLogprob& lp : m.logprobs) {
    wire::LogprobWire w{};
    if (left < sizeof(w)) {
      return Error("TOKEN: logprob {} of {}: the tail ends before it", &lp - m.logprobs.data(),
                   b.n_logprobs);
    }
    std::memcpy(&w, p, sizeof(w));
    p += sizeof(w);
    left -= sizeof(w);
    if (w.id < 0) return Error("TOKEN: logprob token id {} is negative", w.id);
    if (!(w.logprob <= 0)) return Error("TOKEN: logprob {} is not a log-probability", w.logprob);
    if (left < w.piece_bytes) {
      return Error("TOKEN: logprob piece_bytes {} but {} bytes remain", w.piece_bytes, left);
    }
    lp.id = w.id;
    lp.logprob = w.logprob;
    lp.piece.assign(reinterpret_cast<const char*>(p), w.piece_bytes);
    p += w.piece_bytes;
    left -= w.piece_bytes;
  }
  if ((b.flags & wire::kTokenDrafts) != 0) {
    KV_RETURN_IF_ERROR(DecodeTokenDrafts(&p, &left, b.finished != 0, &m.drafts));
  }
  if (left != 0) return Error("TOKEN: {} bytes follow the last logprob", left);
  return Message(std::move(m));
}

Result<Message> DecodeClose(const Frame& f) {
  wire::CloseBody b{};
  KV_RETURN_IF_ERROR(LoadBody(f, &b));
  // A client's count may follow the body (wire::ClientCount).
  const size_t tail = f.payload.size() - sizeof(b);
  if (tail != 0) {
    KV_RETURN_IF_ERROR(CheckTail(f, sizeof(b), sizeof(wire::ClientCount), "a client count"));
  }
  KV_RETURN_IF_ERROR(CheckSession(MsgType::kCloseSession, b.session));
  KV_RETURN_IF_ERROR(CheckReason(MsgType::kCloseSession, b.reason));
  CloseMsg c{b.session, static_cast<uint8_t>(b.reason), std::nullopt};
  if (tail != 0) std::memcpy(&c.count.emplace(), Tail(f, sizeof(b)), sizeof(wire::ClientCount));
  return Message(c);
}

Result<Message> DecodePing(const Frame& f) {
  PingMsg m;
  m.pong = f.type == static_cast<uint16_t>(MsgType::kPong);
  KV_RETURN_IF_ERROR(LoadBody(f, &m.body));
  KV_RETURN_IF_ERROR(CheckTail(f, sizeof(m.body), 0, ""));
  return Message(m);
}

Result<Message> DecodeStats(const Frame& f) {
  wire::StatsBody b{};
  KV_RETURN_IF_ERROR(LoadBody(f, &b));
  if (b.n_records > wire::kMaxStatsRecords) {
    return Error("STATS: n_records {} exceeds the limit of {} stages", b.n_records,
                 wire::kMaxStatsRecords);
  }
  if ((b.flags & ~(wire::kStatsDrafts | wire::kStatsRepair)) != 0) {
    return Error("STATS: flags 0x{:x} has unknown bits", b.flags);
  }
  const bool drafts = (b.flags & wire::kStatsDrafts) != 0;
  const bool repairs = (b.flags & wire::kStatsRepair) != 0;
  const uint64_t per_record = sizeof(wire::StageStats) +
                              (drafts ? sizeof(wire::DraftStatsWire) : 0) +
                              (repairs ? sizeof(wire::RepairStatsWire) : 0);
  KV_RETURN_IF_ERROR(CheckTail(
      f, sizeof(b), uint64_t{b.n_records} * per_record,
      fmt::format("n_records {} x {}-byte StageStats{}{}", b.n_records, per_record,
                  drafts ? " and DraftStatsWire" : "", repairs ? " and RepairStatsWire" : "")));
  StatsMsg m;
  m.records.resize(b.n_records);
  if (b.n_records > 0) {
    std::memcpy(m.records.data(), Tail(f, sizeof(b)),
                size_t{b.n_records} * sizeof(wire::StageStats));
  }
  if (drafts) {
    m.drafts.resize(b.n_records);
    if (b.n_records > 0) {
      std::memcpy(m.drafts.data(),
                  Tail(f, sizeof(b)) + size_t{b.n_records} * sizeof(wire::StageStats),
                  size_t{b.n_records} * sizeof(wire::DraftStatsWire));
    }
  }
  if (repairs) {
    m.repairs.resize(b.n_records);
    if (b.n_records > 0) {
      std::memcpy(m.repairs.data(),
                  Tail(f, sizeof(b)) + size_t{b.n_records} * sizeof(wire::StageStats) +
                      m.drafts.size() * sizeof(wire::DraftStatsWire),
                  size_t{b.n_records} * sizeof(wire::RepairStatsWire));
    }
  }
  return Message(std::move(m));
}

Result<Message> DecodeHandshake(const Frame& f) {
  HandshakeMsg m;
  KV_RETURN_IF_ERROR(LoadBody(f, &m.body));
  KV_RETURN_IF_ERROR(CheckTail(f, sizeof(m.body), 0, ""));
  if (m.body.step < wire::kHandshakeInit || m.body.step > wire::kHandshakeAccept) {
    return Error("HANDSHAKE: step {} is not 1..4", m.body.step);
  }
  return Message(m);
}

Result<Message> DecodeKeepalive(const Frame& f) {
  KeepaliveMsg m;
  KV_RETURN_IF_ERROR(LoadBody(f, &m.body));
  KV_RETURN_IF_ERROR(CheckTail(f, sizeof(m.body), 0, ""));
  return Message(m);
}

Result<Message> DecodeReceipt(const Frame& f) { return Message(ReceiptMsg{f.payload}); }

// ---- Encoding ------------------------------------------------------------------------------

// Builds header + payload in one buffer, so a large HIDDEN tail is copied once.
class FrameBuilder {
 public:
  FrameBuilder(MsgType type, size_t payload_bytes) : type_(type) {
    out_.reserve(kHeaderSize + payload_bytes);
    out_.resize(kHeaderSize);
  }
  template <typename T>
  void Put(const T& v) {
    static_assert(std::is_trivially_copyable_v<T>);
    PutBytes(&v, sizeof(T));
  }
  void PutBytes(const void* p, size_t n) {
    if (n == 0) return;
    const size_t at = out_.size();
    out_.resize(at + n);
    std::memcpy(out_.data() + at, p, n);
  }
  std::vector<uint8_t> Finish() {
    const size_t payload = out_.size() - kHeaderSize;
    KV_CHECK(payload <= wire::kMaxPayload, "{} payload of {} bytes", Name(type_), payload);
    wire::FrameHeader h{};
    h.magic = wire::kMagic;
    h.type = static_cast<uint16_t>(type_);
    h.length = static_cast<uint32_t>(payload);
    std::memcpy(out_.data(), &h, kHeaderSize);
    return std::move(out_);
  }

 private:
  MsgType type_;
  std::vector<uint8_t> out_;
};

// The longest prefix of `s` of at most `max` bytes that does not split a UTF-8 sequence.
std::string_view Utf8Prefix(std::string_view s, size_t max) {
  if (s.size() <= max) return s;
  size_t cut = max;
  while (cut > 0 && (static_cast<uint8_t>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut);
}

std::vector<uint8_t> Encode(const HelloMsg& m) {
  FrameBuilder fb(MsgType::kHello, sizeof(m.hello));
  fb.Put(m.hello);
  return fb.Finish();
}

std::vector<uint8_t> Encode(const ErrorMsg& m) {
  const std::string_view text = Utf8Prefix(m.message, wire::kMaxErrorMessage);
  wire::ErrorBody b{};
  b.code = static_cast<uint32_t>(m.code);
  b.session = m.session;
  b.message_bytes = static_cast<uint32_t>(text.size());
  FrameBuilder fb(MsgType::kError, sizeof(b) + text.size());
  fb.Put(b);
  fb.PutBytes(text.data(), text.size());
  return fb.Finish();
}

std::vector<uint8_t> Encode(const GenerateMsg& m) {
  wire::GenerateBody b{};
  b.sampling = m.sampling;
  b.prompt_bytes = static_cast<uint32_t>(m.prompt.size());
  b.n_stop = static_cast<uint32_t>(m.stops.size());
  b.add_special = m.add_special ? 1 : 0;
  b.flags = (m.report_cached ? wire::kGenerateReportCached : 0) |
            (m.receipt_id ? wire::kGenerateClientCount : 0);
  size_t bytes = sizeof(b) + (m.receipt_id ? 16 : 0) + m.prompt.size();
  for (const std::string& s : m.stops) bytes += sizeof(uint16_t) + s.size();
  bytes += SamplingTailBytes(m.sampling, m.extra);
  FrameBuilder fb(MsgType::kGenerate, bytes);
  fb.Put(b);
  if (m.receipt_id) fb.PutBytes(m.receipt_id->data(), 16);
  fb.PutBytes(m.prompt.data(), m.prompt.size());
  for (const std::string& s : m.stops) {
    fb.Put(static_cast<uint16_t>(s.size()));
    fb.PutBytes(s.data(), s.size());
  }
  PutSamplingTails(fb, m.sampling, m.extra);
  return fb.Finish();
}

std::vector<uint8_t> Encode(const OpenSessionMsg& m) {
  wire::OpenSessionBody b{};
  b.session = m.session;
  b.n_prompt = static_cast<uint32_t>(m.prompt.size());
  b.sampling = m.sampling;
  b.fork_from = m.fork_from;
  b.n_cached = m.n_cached;
  b.open_flags = (m.keep ? wire::kOpenKeep : 0) | (m.replay ? wire::kOpenReplay : 0);
  b.n_generated = m.n_generated;
  const size_t tail = m.prompt.size() * sizeof(int32_t);
  FrameBuilder fb(MsgType::kOpenSession, sizeof(b) + tail + SamplingTailBytes(m.sampling, m.extra));
  fb.Put(b);
  fb.PutBytes(m.prompt.data(), tail);
  PutSamplingTails(fb, m.sampling, m.extra);
  return fb.Finish();
}

std::vector<uint8_t> Encode(const HiddenMsg& m) {
  wire::HiddenBody b{};
  b.session = m.session;
  b.pos0 = m.pos0;
  b.n_tokens = m.n_tokens;
  b.n_embd = m.n_embd;
  b.dtype = static_cast<uint16_t>(m.dtype);
  b.flags = m.flags;
  FrameBuilder fb(MsgType::kHidden, sizeof(b) + m.data.size());
  fb.Put(b);
  fb.PutBytes(m.data.data(), m.data.size());
  return fb.Finish();
}

uint64_t TokenTailBytes(const TokenMsg& m) {
  uint64_t bytes = m.piece.size() + (m.n_cached ? sizeof(uint32_t) : 0);
  for (const TokenLogprob& lp : m.logprobs) bytes += sizeof(wire::LogprobWire) + lp.piece.size();
  if (!m.drafts.empty()) bytes += sizeof(uint32_t) + m.drafts.size() * sizeof(int32_t);
  return bytes;
}

std::vector<uint8_t> Encode(const TokenMsg& m) {
  wire::TokenBody b = m.token;
  b.piece_bytes = static_cast<uint32_t>(m.piece.size());
  b.n_logprobs = static_cast<uint8_t>(m.logprobs.size());
  b.flags = (m.n_cached ? wire::kTokenCached : 0) | (m.drafts.empty() ? 0 : wire::kTokenDrafts) |
            (m.more ? wire::kTokenMore : 0) | (m.ahead ? wire::kTokenAhead : 0);
  FrameBuilder fb(MsgType::kToken, sizeof(b) + TokenTailBytes(m));
  fb.Put(b);
  fb.PutBytes(m.piece.data(), m.piece.size());
  if (m.n_cached) fb.Put(*m.n_cached);
  for (const TokenLogprob& lp : m.logprobs) {
    fb.Put(wire::LogprobWire{lp.id, lp.logprob, static_cast<uint32_t>(lp.piece.size())});
    fb.PutBytes(lp.piece.data(), lp.piece.size());
  }
  if (!m.drafts.empty()) {
    fb.Put(static_cast<uint32_t>(m.drafts.size()));
    fb.PutBytes(reinterpret_cast<const uint8_t*>(m.drafts.data()),
                m.drafts.size() * sizeof(int32_t));
  }
  return fb.Finish();
}

std::vector<uint8_t> Encode(const CloseMsg& m) {
  wire::CloseBody b{m.session, m.reason};
  FrameBuilder fb(MsgType::kCloseSession, sizeof(b) + (m.count ? sizeof(wire::ClientCount) : 0));
  fb.Put(b);
  if (m.count) fb.Put(*m.count);
  return fb.Finish();
}

std::vector<uint8_t> Encode(const PingMsg& m) {
  FrameBuilder fb(m.pong ? MsgType::kPong : MsgType::kPing, sizeof(m.body));
  fb.Put(m.body);
  return fb.Finish();
}

std::vector<uint8_t> Encode(const StatsMsg& m) {
  wire::StatsBody b{};
  b.n_records = static_cast<uint32_t>(m.records.size());
  b.flags =
      (m.drafts.empty() ? 0 : wire::kStatsDrafts) | (m.repairs.empty() ? 0 : wire::kStatsRepair);
  const size_t tail = m.records.size() * sizeof(wire::StageStats);
  const size_t drafts = m.drafts.size() * sizeof(wire::DraftStatsWire);
  const size_t repairs = m.repairs.size() * sizeof(wire::RepairStatsWire);
  FrameBuilder fb(MsgType::kStats, sizeof(b) + tail + drafts + repairs);
  fb.Put(b);
  fb.PutBytes(m.records.data(), tail);
  fb.PutBytes(m.drafts.data(), drafts);
  fb.PutBytes(m.repairs.data(), repairs);
  return fb.Finish();
}

std::vector<uint8_t> Encode(const HandshakeMsg& m) {
  FrameBuilder fb(MsgType::kHandshake, sizeof(m.body));
  fb.Put(m.body);
  return fb.Finish();
}

std::vector<uint8_t> Encode(const KeepaliveMsg& m) {
  FrameBuilder fb(MsgType::kKeepalive, sizeof(m.body));
  fb.Put(m.body);
  return fb.Finish();
}

std::vector<uint8_t> Encode(const ReceiptMsg& m) {
  FrameBuilder fb(MsgType::kReceipt, m.payload.size());
  fb.PutBytes(m.payload.data(), m.payload.size());
  return fb.Finish();
}

}  // namespace

Result<Message> DecodeMessage(const Frame& frame) {
  switch (frame.type) {
    case static_cast<uint16_t>(MsgType::kHello):
      return DecodeHello(frame);
    case static_cast<uint16_t>(MsgType::kError):
      return DecodeError(frame);
    case static_cast<uint16_t>(MsgType::kGenerate):
      return DecodeGenerate(frame);
    case static_cast<uint16_t>(MsgType::kOpenSession):
      return DecodeOpenSession(frame);
    case static_cast<uint16_t>(MsgType::kHidden):
      return DecodeHidden(frame);
    case static_cast<uint16_t>(MsgType::kToken):
      return DecodeToken(frame);
    case static_cast<uint16_t>(MsgType::kCloseSession):
      return DecodeClose(frame);
    case static_cast<uint16_t>(MsgType::kPing):
    case static_cast<uint16_t>(MsgType::kPong):
      return DecodePing(frame);
    case static_cast<uint16_t>(MsgType::kStats):
      return DecodeStats(frame);
    case static_cast<uint16_t>(MsgType::kHandshake):
      return DecodeHandshake(frame);
    case static_cast<uint16_t>(MsgType::kKeepalive):
      return DecodeKeepalive(frame);
    case static_cast<uint16_t>(MsgType::kReceipt):
      return DecodeReceipt(frame);
    default:
      return Error("frame type {} is unknown (this build knows 1..{})", frame.type,
                   wire::kMaxMsgType);
  }
}

wire::MsgType MessageType(const Message& m) {
  static constexpr MsgType kByIndex[] = {
      MsgType::kHello,  MsgType::kError,     MsgType::kGenerate,     MsgType::kOpenSession,
      MsgType::kHidden, MsgType::kToken,     MsgType::kCloseSession, MsgType::kPing,
      MsgType::kStats,  MsgType::kHandshake, MsgType::kKeepalive,    MsgType::kReceipt};
  static_assert(std::size(kByIndex) == std::variant_size_v<Message>);
  if (const auto* ping = std::get_if<PingMsg>(&m); ping != nullptr && ping->pong) {
    return MsgType::kPong;
  }
  return kByIndex[m.index()];
}

Status CheckEncodable(const Message& msg) {
  const MsgType t = MessageType(msg);
  if (const auto* m = std::get_if<GenerateMsg>(&msg)) {
    KV_RETURN_IF_ERROR(CheckSamplingTailsEncodable(Name(t), m->sampling, m->extra));
    if (m->prompt.size() > wire::kMaxPromptBytes) {
      return Error("GENERATE: prompt of {} bytes exceeds the {} MiB limit", m->prompt.size(),
                   wire::kMaxPromptBytes >> 20);
    }
    if (m->stops.size() > wire::kMaxStopStrings) {
      return Error("GENERATE: {} stop strings exceed the limit of {}", m->stops.size(),
                   wire::kMaxStopStrings);
    }
    for (size_t i = 0; i < m->stops.size(); ++i) {
      if (m->stops[i].size() > kMaxStopBytes) {
        return Error("GENERATE: stop string {} of {} bytes exceeds {}", i, m->stops[i].size(),
                     kMaxStopBytes);
      }
    }
  } else if (const auto* m = std::get_if<OpenSessionMsg>(&msg)) {
    KV_RETURN_IF_ERROR(CheckSession(t, m->session));
    KV_RETURN_IF_ERROR(CheckSamplingTailsEncodable(Name(t), m->sampling, m->extra));
    if (m->fork_from == 0 ? m->n_cached != 0 : m->n_cached >= m->prompt.size()) {
      return Error("OPEN_SESSION: n_cached {} with fork_from {} and {} prompt tokens", m->n_cached,
                   m->fork_from, m->prompt.size());
    }
    if (m->replay ? (m->fork_from != 0 || m->n_generated >= m->prompt.size())
                  : m->n_generated != 0) {
      return Error("OPEN_SESSION: n_generated {} with fork_from {}, {} ids and replay {}",
                   m->n_generated, m->fork_from, m->prompt.size(), m->replay ? "on" : "off");
    }
    for (size_t i = 0; i < m->prompt.size(); ++i) {
      if (m->prompt[i] < 0) return Error("OPEN_SESSION: prompt token {} is {}", i, m->prompt[i]);
    }
    KV_RETURN_IF_ERROR(CheckPayloadSize(t, sizeof(wire::OpenSessionBody) +
                                               uint64_t{m->prompt.size()} * sizeof(int32_t) +
                                               SamplingTailBytes(m->sampling, m->extra)));
  } else if (const auto* m = std::get_if<HiddenMsg>(&msg)) {
    KV_ASSIGN_OR_RETURN(uint64_t bytes, HiddenTailBytes(m->session, m->n_tokens, m->n_embd,
                                                        static_cast<uint16_t>(m->dtype)));
    if (bytes != m->data.size()) {
      return Error("HIDDEN: data is {} bytes, but n_tokens {} x n_embd {} x {} needs {}",
                   m->data.size(), m->n_tokens, m->n_embd, DtypeName(m->dtype), bytes);
    }
    KV_RETURN_IF_ERROR(CheckHiddenFlags(m->flags, m->n_tokens));
    KV_RETURN_IF_ERROR(CheckPayloadSize(t, sizeof(wire::HiddenBody) + bytes));
  } else if (const auto* m = std::get_if<TokenMsg>(&msg)) {
    KV_RETURN_IF_ERROR(CheckSession(t, m->token.session));
    if (m->token.id < 0) return Error("TOKEN: id {} is negative", m->token.id);
    if (m->token.finished > 1) return Error("TOKEN: finished {} is not 0 or 1", m->token.finished);
    KV_RETURN_IF_ERROR(CheckReason(t, m->token.reason));
    if (m->logprobs.size() > 1 + wire::kMaxTopLogprobs) {
      return Error("TOKEN: {} logprobs exceed the limit of {}", m->logprobs.size(),
                   1 + wire::kMaxTopLogprobs);
    }
    KV_RETURN_IF_ERROR(CheckTokenDrafts(*m));
    for (const TokenLogprob& lp : m->logprobs) {
      if (lp.id < 0) return Error("TOKEN: logprob token id {} is negative", lp.id);
      if (!(lp.logprob <= 0))
        return Error("TOKEN: logprob {} is not a log-probability", lp.logprob);
    }
    KV_RETURN_IF_ERROR(CheckPayloadSize(t, sizeof(wire::TokenBody) + TokenTailBytes(*m)));
  } else if (const auto* m = std::get_if<CloseMsg>(&msg)) {
    KV_RETURN_IF_ERROR(CheckSession(t, m->session));
    KV_RETURN_IF_ERROR(CheckReason(t, m->reason));
  } else if (const auto* m = std::get_if<StatsMsg>(&msg)) {
    if (m->records.size() > wire::kMaxStatsRecords) {
      return Error(StatusCode::kTooLarge, "STATS: {} records exceed the limit of {} stages",
                   m->records.size(), wire::kMaxStatsRecords);
    }
    if (!m->drafts.empty() && m->drafts.size() != m->records.size()) {
      return Error("STATS: {} draft records for {} stage records", m->drafts.size(),
                   m->records.size());
    }
    if (!m->repairs.empty() && m->repairs.size() != m->records.size()) {
      return Error("STATS: {} repair records for {} stage records", m->repairs.size(),
                   m->records.size());
    }
    KV_RETURN_IF_ERROR(CheckPayloadSize(
        t, sizeof(wire::StatsBody) + uint64_t{m->records.size()} * sizeof(wire::StageStats) +
               uint64_t{m->drafts.size()} * sizeof(wire::DraftStatsWire) +
               uint64_t{m->repairs.size()} * sizeof(wire::RepairStatsWire)));
  } else if (const auto* m = std::get_if<ReceiptMsg>(&msg)) {
    KV_RETURN_IF_ERROR(CheckPayloadSize(t, m->payload.size()));
  }
  return Status::Ok();
}

std::vector<uint8_t> EncodeMessage(const Message& m) {
  const Status s = CheckEncodable(m);
  KV_CHECK(s.ok(), "encoding a message the protocol forbids: {}", s.message());
  return std::visit([](const auto& v) { return Encode(v); }, m);
}

HiddenMsg MakeHidden(uint32_t session, uint32_t pos0, uint32_t n_tokens, uint32_t n_embd,
                     wire::Dtype dtype, uint16_t flags, std::span<const float> rows) {
  const size_t n = size_t{n_tokens} * n_embd;
  KV_CHECK(rows.size() == n, "MakeHidden: {} values for [{}, {}]", rows.size(), n_tokens, n_embd);
  HiddenMsg m{session, pos0, n_tokens, n_embd, dtype, flags, {}};
  switch (dtype) {
    case Dtype::kF32:
      m.data.resize(n * sizeof(float));
      if (n > 0) std::memcpy(m.data.data(), rows.data(), n * sizeof(float));
      break;
    case Dtype::kF16:
    case Dtype::kBF16: {
      m.data.resize(n * sizeof(uint16_t));
      uint8_t* out = m.data.data();
      const bool f16 = dtype == Dtype::kF16;
      for (size_t i = 0; i < n; ++i) {
        const uint16_t h = f16 ? F32ToF16(rows[i]) : F32ToBF16(rows[i]);
        std::memcpy(out + i * sizeof(h), &h, sizeof(h));
      }
      break;
    }
    default:
      KV_CHECK(false, "MakeHidden: dtype {}", static_cast<int>(dtype));
  }
  return m;
}

void HiddenToF32(const HiddenMsg& m, std::vector<float>* out) {
  const size_t n = size_t{m.n_tokens} * m.n_embd;
  KV_CHECK(m.dtype <= Dtype::kBF16, "HiddenToF32: dtype {}", static_cast<int>(m.dtype));
  KV_CHECK(m.data.size() == n * wire::DtypeSize(m.dtype), "HiddenToF32: {} bytes for [{}, {}] {}",
           m.data.size(), m.n_tokens, m.n_embd, DtypeName(m.dtype));
  out->resize(n);
  if (m.dtype == Dtype::kF32) {
    if (n > 0) std::memcpy(out->data(), m.data.data(), n * sizeof(float));
    return;
  }
  const uint8_t* in = m.data.data();
  const bool f16 = m.dtype == Dtype::kF16;
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, in + i * sizeof(h), sizeof(h));
    (*out)[i] = f16 ? F16ToF32(h) : BF16ToF32(h);
  }
}

}  // namespace kvasir::ring
