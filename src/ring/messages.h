// Typed ring messages (docs/PROTOCOL.md, "Messages"): decoding a Frame into a validated Message,
// and encoding a Message into a whole frame. Every limit the specification sets is enforced here,
// so code above this layer can trust the sizes and counts of a decoded message. Semantic checks
// that need the receiver's state (n_embd of this stage, model identity, known sessions, vocabulary
// size) belong to the receiver.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "base/status.h"
#include "ring/frame.h"
#include "ring/wire.h"

namespace kvasir::ring {

struct HelloMsg {  // HELLO
  wire::Hello hello{};
};

struct ErrorMsg {  // ERROR; the encoder cuts `message` to kMaxErrorMessage bytes
  wire::ErrorCode code = wire::ErrorCode::kInternal;
  uint32_t session = 0;  // 0: the link / all sessions
  std::string message;
};

// The sampling a request carries beyond SamplingWire, present when its sampling.flags has
// wire::kSamplingExtra (and then only). The codec checks sizes and counts; every stage checks the
// values (CheckSamplingExtra) before it opens a session.
struct LogitBias {
  int32_t id = 0;
  float bias = 0;
};
struct SamplingExtra {
  float presence_penalty = 0;
  float frequency_penalty = 0;
  std::vector<LogitBias> logit_bias;  // at most wire::kMaxLogitBias
  // What the last stage does beyond drawing a token, each under its own flag: grammar text that
  // constrains the draw (wire::kSamplingGrammar, non-empty, at most wire::kMaxGrammarBytes), and
  // log-probabilities with every TOKEN (wire::kSamplingLogprobs: the sampled token's and
  // top_logprobs alternatives', at most wire::kMaxTopLogprobs).
  std::string grammar;
  uint32_t top_logprobs = 0;
};

struct GenerateMsg {  // GENERATE, client -> head
  wire::SamplingWire sampling{};
  std::string prompt;              // UTF-8, at most kMaxPromptBytes
  std::vector<std::string> stops;  // at most kMaxStopStrings, each under 64 KiB
  bool add_special = true;
  SamplingExtra extra;             // with sampling.flags & kSamplingExtra
  bool report_cached = false;      // wire::kGenerateReportCached
  // wire::kGenerateClientCount: the receipt id the client will sign its count for.
  std::optional<std::array<uint8_t, 16>> receipt_id{};
};

struct OpenSessionMsg {  // OPEN_SESSION
  uint32_t session = 0;  // nonzero
  wire::SamplingWire sampling{};
  std::vector<int32_t> prompt;  // token ids, each >= 0
  SamplingExtra extra;          // with sampling.flags & kSamplingExtra
  // Prompt cache: take over kept session `fork_from` with its first `n_cached` positions (the
  // prompt's first n_cached ids; n_cached < prompt.size()); `keep` this session when it ends.
  uint32_t fork_from = 0;
  uint32_t n_cached = 0;
  bool keep = false;
  // A repair's replay (wire::kOpenReplay, never with fork_from): `prompt` holds the request's
  // prompt then the `n_generated` tokens sampled so far (n_generated < prompt.size()).
  bool replay = false;
  uint32_t n_generated = 0;
};

struct HiddenMsg {       // HIDDEN
  uint32_t session = 0;  // nonzero
  uint32_t pos0 = 0;     // position of the first row
  uint32_t n_tokens = 0;
  uint32_t n_embd = 0;
  wire::Dtype dtype = wire::Dtype::kF32;
  uint16_t flags = 0;         // wire::kHiddenSample, wire::kHiddenVerify
  std::vector<uint8_t> data;  // [n_tokens, n_embd] row-major, raw little-endian values of dtype
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0;
  std::string piece;  // head -> client only
};

struct TokenMsg {           // TOKEN
  wire::TokenBody token{};  // piece_bytes and n_logprobs are ignored when encoding: the sizes of
                            // piece and logprobs are sent
  std::string piece;        // head -> client only
  // Head -> client, first token, when GENERATE asked: prompt tokens the prompt cache served.
  std::optional<uint32_t> n_cached;
  // The sampled token's first, then the alternatives (kSamplingLogprobs sessions), at most
  // 1 + wire::kMaxTopLogprobs.
  std::vector<TokenLogprob> logprobs;
  // Last stage -> head, speculation (docs/PROTOCOL.md, "Speculation"): the tokens drafted to
  // follow this one (wire::kTokenDrafts, at most wire::kMaxDraftTokens), and whether more tokens
  // of the same verify chunk follow (wire::kTokenMore; then there are no drafts).
  std::vector<int32_t> drafts{};
  bool more = false;
  // Last stage -> head, overlap (wire::kTokenAhead, with drafts): a guessed token, fed with its
  // drafts as a verify chunk, never streamed.
  bool ahead = false;
};

struct CloseMsg {        // CLOSE_SESSION
  uint32_t session = 0;  // nonzero
  uint8_t reason = 0;    // wire::FinishReason
  // Client -> head only: the client's signed count for the session (a wire::ClientCount after
  // the body), when its GENERATE carried a receipt id.
  std::optional<wire::ClientCount> count{};
};

struct PingMsg {  // PING, or PONG when `pong`
  bool pong = false;
  wire::PingBody body{};
};

struct StatsMsg {  // STATS
  std::vector<wire::StageStats> records;
  // Speculation (wire::kStatsDrafts): empty, or one per record.
  std::vector<wire::DraftStatsWire> drafts{};
  // Repair (wire::kStatsRepair): empty, or one per record.
  std::vector<wire::RepairStatsWire> repairs{};
};

struct HandshakeMsg {  // HANDSHAKE (before encryption starts; see ring/handshake.h)
  wire::HandshakeBody body{};
};

struct KeepaliveMsg {  // KEEPALIVE (link liveness; the link consumes it)
  wire::KeepaliveBody body{};
};

// RECEIPT. The codec carries the payload as it is: ring/receipt.h parses and builds it
// (ParseReceipt / EncodeReceipt), so a receipt that does not parse is dropped by the stage that
// reads it instead of closing the link (a receipt is accounting, never part of a session).
struct ReceiptMsg {
  std::vector<uint8_t> payload;  // wire::ReceiptBody [+ ClientCount] + n_lines x ReceiptLine, unchecked
};

using Message = std::variant<HelloMsg, ErrorMsg, GenerateMsg, OpenSessionMsg, HiddenMsg, TokenMsg,
                             CloseMsg, PingMsg, StatsMsg, HandshakeMsg, KeepaliveMsg, ReceiptMsg>;

// Validates the payload of `frame` against its type and builds the typed message: body size, the
// tail size the body implies (exactly), limits (error message <= kMaxErrorMessage bytes, prompt <=
// kMaxPromptBytes, n_stop <= kMaxStopStrings, n_records <= kMaxStatsRecords, n_tokens * n_embd * dtype size without overflow),
// known dtype and finish reasons, nonzero sessions where the message names one. Errors name the
// message type and the field: "HIDDEN: dtype 7 is unknown (0 f32, 1 f16, 2 bf16)". A RECEIPT
// payload is taken as it is (see ReceiptMsg).
Result<Message> DecodeMessage(const Frame& frame);

// The message id `m` travels under.
wire::MsgType MessageType(const Message& m);

// Whether EncodeMessage accepts `m`: the same limits DecodeMessage enforces, plus a payload within
// kMaxPayload and a HIDDEN data size matching its shape. Check messages built from outside input
// (a user's prompt, say) here; EncodeMessage treats a violation as a bug.
Status CheckEncodable(const Message& m);

// Header + payload of `m`, ready to write. Requires CheckEncodable(m).ok(), except that an ERROR
// message longer than kMaxErrorMessage is cut at a UTF-8 character boundary.
std::vector<uint8_t> EncodeMessage(const Message& m);

// Converts rows [n_tokens, n_embd] of f32 (`rows`, exactly n_tokens * n_embd values) to `dtype`,
// rounding to nearest even for f16 and bf16; f32 is copied bit-exactly.
HiddenMsg MakeHidden(uint32_t session, uint32_t pos0, uint32_t n_tokens, uint32_t n_embd,
                     wire::Dtype dtype, uint16_t flags, std::span<const float> rows);

// Widens the rows of a decoded (or MakeHidden-built) message to f32.
// out: [n_tokens, n_embd] row-major, resized to fit.
void HiddenToF32(const HiddenMsg& m, std::vector<float>* out);

// A short description for logs: "HELLO(stage-1, layers [0, 16))", "HIDDEN(session 3, 12 rows)".
std::string MessageName(const Message& m);

// "malformed", "link_down", ...; "unknown" for codes outside the specification.
const char* ErrorCodeName(wire::ErrorCode code);
// "f32", "f16", "bf16"; "unknown" otherwise.
const char* DtypeName(wire::Dtype dtype);

}  // namespace kvasir::ring
