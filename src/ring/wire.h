// Ring protocol version 2: frozen message ids and fixed-width little-endian bodies. The
// specification is docs/PROTOCOL.md; this header is its code. Every struct is packed and its size
// asserted, so a layout change fails to compile instead of silently changing the wire.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvasir::wire {

inline constexpr uint32_t kMagic = 0x3152564B;  // "KVR1"
inline constexpr uint32_t kProtocolVersion = 2;
inline constexpr uint32_t kMaxPayload = 64u << 20;
// STATS records: one per stage, so a ring of at most this many stages.
inline constexpr uint32_t kMaxStatsRecords = 1024;
inline constexpr uint32_t kMaxErrorMessage = 1024;
inline constexpr uint32_t kMaxPromptBytes = 1u << 20;
inline constexpr uint32_t kMaxStopStrings = 16;
// RECEIPT lines: one per stage, so a receipt covers a ring of at most this many stages.
inline constexpr uint32_t kMaxReceiptLines = 256;

enum class MsgType : uint16_t {
  kHello = 1,
  kError = 2,
  kGenerate = 3,
  kOpenSession = 4,
  kHidden = 5,
  kToken = 6,
  kCloseSession = 7,
  kPing = 8,
  kPong = 9,
  kStats = 10,
  kHandshake = 11,  // link handshake, before any other frame (unencrypted)
  kKeepalive = 12,  // link liveness; consumed by the link, never forwarded
  kReceipt = 13,    // contribution receipt, once around the ring after a session closes
};
inline constexpr uint16_t kMaxMsgType = 13;
const char* MsgTypeName(uint16_t type);

enum class ErrorCode : uint32_t {
  kMalformed = 1,
  kVersion = 2,
  kWrongModel = 3,
  kNotAdjacent = 4,
  kUnknownSession = 5,
  kBadRequest = 6,
  kLinkDown = 7,
  kInternal = 8,
  kBusy = 9,
  kUnauthenticated = 10,  // the handshake's proof of identity is missing or wrong
  kTooLarge = 11,         // a message would exceed a limit of the protocol or of the receiver
  kTimeout = 12,          // a deadline passed (handshake, link liveness)
  kCacheMiss = 13,        // OPEN_SESSION's fork_from is not kept here: the head opens it afresh
};

enum class FinishReason : uint8_t {
  kNone = 0,
  kEog = 1,
  kMaxTokens = 2,
  kStopString = 3,
  kContextFull = 4,
  kError = 5,
  kClientClosed = 6,
};
const char* FinishReasonName(uint8_t reason);

enum class Dtype : uint16_t { kF32 = 0, kF16 = 1, kBF16 = 2 };
inline constexpr size_t DtypeSize(Dtype d) { return d == Dtype::kF32 ? 4 : 2; }

enum class Role : uint32_t { kStage = 0, kClient = 1 };

#pragma pack(push, 1)

struct FrameHeader {
  uint32_t magic;
  uint16_t type;
  uint16_t flags;
  uint32_t length;  // payload bytes after this header
  uint32_t reserved;
};
static_assert(sizeof(FrameHeader) == 16);

inline constexpr uint32_t kHelloHasEmbed = 1;
inline constexpr uint32_t kHelloHasHead = 2;

struct Hello {
  uint32_t protocol_version;
  uint32_t role;          // Role
  uint8_t model_id[16];
  uint32_t n_layer;
  uint32_t n_embd;
  int32_t window_first;
  int32_t window_last;
  uint32_t flags;         // kHelloHasEmbed | kHelloHasHead
  uint32_t reserved;
  char name[32];          // NUL-padded
  // Stages: which process holds this place in the ring, newest highest (microseconds since the
  // Unix epoch when it started, or when a standby was adopted). A neighbour refuses a peer older
  // than one it already linked with on that side (docs/PROTOCOL.md, "Repair"); 0: unknown.
  uint64_t generation;
  uint8_t pad[8];
};
static_assert(sizeof(Hello) == 96);

struct ErrorBody {
  uint32_t code;           // ErrorCode
  uint32_t session;        // 0: the link / all sessions
  uint32_t message_bytes;  // tail: UTF-8, at most kMaxErrorMessage
  uint32_t reserved;
};
static_assert(sizeof(ErrorBody) == 16);

// Sampling and limits shared by GENERATE and OPEN_SESSION.
struct SamplingWire {
  float temperature;
  float top_p;
  float min_p;
  float repeat_penalty;
  int32_t top_k;
  int32_t repeat_last_n;
  uint64_t seed;
  uint32_t max_tokens;
  uint32_t flags;  // kSamplingIgnoreEog | kSamplingExtra
};
static_assert(sizeof(SamplingWire) == 40);
inline constexpr uint32_t kSamplingIgnoreEog = 1;
// The message (GENERATE, OPEN_SESSION) carries a SamplingExtraWire and its logit biases after its
// other tails. A stage that predates it refuses the unknown flag bit instead of sampling without.
inline constexpr uint32_t kSamplingExtra = 2;
// The last stage draws only tokens a grammar allows (kSamplingGrammar) and/or reports
// log-probabilities with every TOKEN (kSamplingLogprobs): the message then carries a
// SamplingOutputWire and the grammar's text after the extra sampling (when both are present).
inline constexpr uint32_t kSamplingGrammar = 4;
inline constexpr uint32_t kSamplingLogprobs = 8;
inline constexpr uint32_t kSamplingKnownFlags =
    kSamplingIgnoreEog | kSamplingExtra | kSamplingGrammar | kSamplingLogprobs;
inline constexpr uint32_t kMaxLogitBias = 1024;
// Grammar text (docs/GRAMMAR.md) a request may carry; a JSON schema of a few hundred properties
// compiles to tens of KiB.
inline constexpr uint32_t kMaxGrammarBytes = 256u << 10;
// Alternatives a TOKEN may report besides the sampled token (OpenAI's top_logprobs limit).
inline constexpr uint32_t kMaxTopLogprobs = 20;

// Sampling beyond SamplingWire (kSamplingExtra), applied by the last stage before the others:
// biases added to logits, then over the penalty window (repeat_last_n) the presence penalty once
// and the frequency penalty once per occurrence of each token, after the repeat penalty.
struct SamplingExtraWire {
  float presence_penalty;
  float frequency_penalty;
  uint32_t n_logit_bias;  // tail: n_logit_bias × LogitBiasWire, at most kMaxLogitBias
  uint32_t reserved;      // zero
};
static_assert(sizeof(SamplingExtraWire) == 16);

struct LogitBiasWire {
  int32_t id;
  float bias;
};
static_assert(sizeof(LogitBiasWire) == 8);

struct SamplingOutputWire {
  uint32_t grammar_bytes;  // tail: grammar text; nonzero exactly under kSamplingGrammar
  uint32_t top_logprobs;   // alternatives per TOKEN under kSamplingLogprobs (else 0)
};
static_assert(sizeof(SamplingOutputWire) == 8);

struct GenerateBody {
  SamplingWire sampling;
  uint32_t prompt_bytes;   // tail: prompt UTF-8
  uint32_t n_stop;         // tail: then n_stop × (u16 length + bytes)
  uint32_t add_special;    // 1: add BOS/EOS as the vocabulary asks
  uint32_t flags;          // kGenerateReportCached
  uint8_t pad[8];
};
static_assert(sizeof(GenerateBody) == 64);
// The client asks for the count of prompt tokens the prompt cache served, in its first TOKEN.
inline constexpr uint32_t kGenerateReportCached = 1;
// The client will vouch for the session's count (docs/PROTOCOL.md, "Client counts"): the
// session's receipt id, 16 bytes the client picked at random, follows the body (before the
// prompt), and the head uses it for the session's receipt.
inline constexpr uint32_t kGenerateClientCount = 2;

struct OpenSessionBody {
  uint32_t session;
  uint32_t n_prompt;       // tail: n_prompt × i32 ids
  SamplingWire sampling;
  uint32_t fork_from;    // 0, or a kept session whose state this one takes over
  uint32_t n_cached;     // with fork_from: its first positions kept (< n_prompt); else 0
  uint32_t open_flags;   // kOpenKeep | kOpenReplay
  uint32_t n_generated;  // with kOpenReplay: the last n_generated ids were sampled (< n_prompt)
};
static_assert(sizeof(OpenSessionBody) == 64);
// Keep the session's state when it ends, for a later session to take over (prompt cache).
inline constexpr uint32_t kOpenKeep = 1;
// A repair's replay (docs/PROTOCOL.md, "Repair"): the session may exist already; every stage
// starts it again from position 0, and the ids are the prompt then the tokens sampled so far.
inline constexpr uint32_t kOpenReplay = 2;

inline constexpr uint16_t kHiddenSample = 1;
// A verify chunk (with kHiddenSample): the rows are a token and the drafts that follow it. Every
// stage keeps a rollback checkpoint before each row, and the last stage takes the logits of every
// row and verifies the drafts. At most 1 + kMaxDraftTokens rows.
inline constexpr uint16_t kHiddenVerify = 2;
// Drafted tokens one verify chunk may carry (the tail drafts at most this many after a token).
inline constexpr uint32_t kMaxDraftTokens = 16;

struct HiddenBody {
  uint32_t session;
  uint32_t pos0;
  uint32_t n_tokens;
  uint32_t n_embd;
  uint16_t dtype;          // Dtype
  uint16_t flags;          // kHiddenSample, kHiddenVerify
  uint8_t pad[12];
};
static_assert(sizeof(HiddenBody) == 32);

struct TokenBody {
  uint32_t session;
  uint32_t pos;            // position the token takes in the sequence
  int32_t id;
  uint8_t finished;      // 1 on the last token of the session
  uint8_t reason;        // FinishReason
  uint8_t n_logprobs;    // LogprobWire entries after the piece (kSamplingLogprobs sessions)
  uint8_t flags;         // kTokenCached, kTokenDrafts, kTokenMore, kTokenAhead
  uint32_t piece_bytes;  // tail: the token's text (head -> client only)
  uint32_t n_prompt;     // prompt tokens (head -> client; 0 elsewhere)
  float logit;           // the token's raw logit where it was sampled (f32 bits unchanged)
};
static_assert(sizeof(TokenBody) == 28);

// Head -> client, the session's first TOKEN when GENERATE asked (kGenerateReportCached): a u32
// count of prompt tokens served from the prompt cache follows the piece.
inline constexpr uint8_t kTokenCached = 1;
// Last stage -> head, speculation: a u32 n_drafts (1..kMaxDraftTokens) and n_drafts i32 ids (each
// >= 0) follow the logprobs: the tokens the last stage drafted to follow this one. The head feeds
// this token and them as one verify chunk (kHiddenVerify).
inline constexpr uint8_t kTokenDrafts = 2;
// Last stage -> head, speculation: another token decided by the same verify chunk follows this
// one; the head streams this one and feeds only the last (the one without kTokenMore).
inline constexpr uint8_t kTokenMore = 4;
// Last stage -> head, speculation with overlap (with kTokenDrafts): not a decided token but the
// last stage's guess of the one at this position, made while the verify chunks before it travel;
// the head streams nothing and feeds it and its drafts as a verify chunk behind them.
inline constexpr uint8_t kTokenAhead = 8;

// A TOKEN's log-probabilities: the sampled token's first, then its top alternatives, most likely
// first; each followed by its text (head -> client only, else piece_bytes is 0).
struct LogprobWire {
  int32_t id;
  float logprob;  // natural log, from the logits the token was sampled from
  uint32_t piece_bytes;
};
static_assert(sizeof(LogprobWire) == 12);

struct CloseBody {
  uint32_t session;
  uint32_t reason;         // FinishReason
};
static_assert(sizeof(CloseBody) == 8);

struct PingBody {
  uint64_t nonce;
  uint64_t sent_ns;
};
static_assert(sizeof(PingBody) == 16);

struct StatsBody {
  uint32_t n_records;      // tail: n_records × StageStats
  uint32_t flags;          // kStatsDrafts | kStatsRepair (was reserved, zero)
};
static_assert(sizeof(StatsBody) == 8);
// After the records, one DraftStatsWire per record, in the same order (speculation: set by the
// first stage that drafts, which gives the records before its own zeros).
inline constexpr uint32_t kStatsDrafts = 1;

struct DraftStatsWire {
  char drafter[8];         // "ngram", "model", NUL-padded; zero: the stage does not draft
  uint64_t steps;          // verify chunks
  uint64_t drafted;        // tokens drafted
  uint64_t accepted;       // of them, accepted
};
static_assert(sizeof(DraftStatsWire) == 32);

// After the records (and the DraftStatsWire), one RepairStatsWire per record, in the same order
// (repair, docs/PROTOCOL.md "Repair": set by the first stage that has replayed a session, which
// gives the records before its own zeros).
inline constexpr uint32_t kStatsRepair = 2;

struct RepairStatsWire {
  uint64_t repairs;         // head: sessions replayed
  uint64_t kept;            // replayed positions this stage did not run again (sent its rows on)
  uint64_t recomputed;      // replayed positions this stage ran again
  uint64_t pauses;          // head: replayed sessions whose client got a token again
  uint64_t pause_ms_total;  // head: the pauses those clients saw, added up
  uint64_t pause_ms_max;    // head: the longest of them
};
static_assert(sizeof(RepairStatsWire) == 48);

struct StageStats {
  char name[32];
  int32_t window_first;
  int32_t window_last;
  uint64_t weight_bytes;
  uint64_t rss_bytes;
  uint64_t bytes_in;       // payload bytes received from the predecessor
  uint64_t bytes_out;      // payload bytes sent to the successor
  uint64_t rows;           // hidden-state rows (tokens) processed
  uint64_t decode_rows;    // rows that were single-token decode steps
  uint64_t busy_ns;        // time spent in Forward
  uint64_t decode_busy_ns; // time spent in Forward on batches of decode rows only
  uint32_t sessions_open;
  uint32_t links_refused;  // connections refused: failed proofs, limits, deadlines
  char backend[16];        // where the window runs ("cpu", "cuda:0"), NUL-padded; zero: not said
};
static_assert(sizeof(StageStats) == 128);

// The link handshake (docs/PROTOCOL.md, "Handshake"): four HANDSHAKE frames, initiator (the
// upstream end: a predecessor or a client) -> responder -> initiator -> responder -> initiator.
// Fields a step does not use are zero.
inline constexpr uint8_t kHandshakeInit = 1;    // initiator: ephemeral key
inline constexpr uint8_t kHandshakeReply = 2;   // responder: ephemeral key, node key, proofs
inline constexpr uint8_t kHandshakeFinish = 3;  // initiator: node key (stages), proofs
inline constexpr uint8_t kHandshakeAccept = 4;  // responder: proofs checked, encryption starts
inline constexpr uint8_t kProofSignature = 1;   // `signature` by `node_key` over the transcript
inline constexpr uint8_t kProofRingSecret = 2;  // `mac` keyed with the ring secret
inline constexpr uint8_t kProofClientSecret = 4;  // `mac` keyed with the client secret

struct HandshakeBody {
  uint32_t protocol_version;
  uint8_t step;            // kHandshakeInit / Reply / Finish / Accept
  uint8_t role;            // Role of the initiator (Init); 0 otherwise
  uint8_t proofs;          // kProof* bits present in this step
  uint8_t reserved;
  uint8_t ephemeral[32];   // X25519 public key (Init, Reply)
  uint8_t node_key[32];    // Ed25519 public key (Reply, Finish from a stage)
  uint8_t signature[64];   // Ed25519 over the transcript (kProofSignature)
  uint8_t mac[32];         // HMAC-SHA256 over the transcript (kProofRingSecret/ClientSecret)
  uint8_t pad[32];
};
static_assert(sizeof(HandshakeBody) == 200);

struct KeepaliveBody {
  uint64_t sent_ns;        // sender's clock, for logs only
  uint64_t reserved;
};
static_assert(sizeof(KeepaliveBody) == 16);

// RECEIPT (docs/PROTOCOL.md, "RECEIPT"): the body, an optional client count, then n_lines lines, one per stage in ring
// order from the head. Line i's signature covers kReceiptSignLabel, the body with n_lines = i + 1,
// lines 0..i-1 whole and line i up to its signature (ring/receipt.h builds and checks them).
// Version 2 added the row commitment of each line; a version 1 receipt (version field 0) is
// refused.
inline constexpr uint32_t kReceiptVersion = 2;
inline constexpr char kReceiptSignLabel[] = "kvasir-receipt-v2";  // signed with its NUL

struct ReceiptBody {
  uint32_t session;
  uint32_t n_lines;        // tail: n_lines × ReceiptLine, 1..kMaxReceiptLines
  uint8_t receipt_id[16];  // random, chosen by the head: the session's global id
  uint8_t model_id[16];    // the model identity (HELLO's model_id)
  uint32_t version;        // kReceiptVersion
  uint8_t flags;           // kReceiptHasClientCount or 0
  uint8_t reserved[3];     // zero
};
static_assert(sizeof(ReceiptBody) == 48);

// With kReceiptHasClientCount in ReceiptBody::flags, a ClientCount follows the body, before the
// lines, and every line's signature covers it too. The client signs kClientCountSignLabel (with
// its NUL), the body's receipt_id, model_id and session, then tokens, so a count is good for one
// session only (ring/receipt.h).
inline constexpr uint8_t kReceiptHasClientCount = 1;
inline constexpr char kClientCountSignLabel[] = "kvasir-client-count-v1";

struct ClientCount {
  uint8_t client_key[32];  // the client's Ed25519 public key
  uint64_t tokens;         // tokens the client says it received
  uint8_t signature[64];   // Ed25519 by client_key (see above)
};
static_assert(sizeof(ClientCount) == 104);

struct ReceiptLine {
  uint8_t node_key[32];    // the signer's Ed25519 public key
  uint32_t first;          // the signer's window [first, last)
  uint32_t last;
  uint64_t tokens;         // token rows the signer's window ran for the session
  uint8_t rows_root[32];   // Merkle root of the rows it took in and gave out (row_commit.h)
  uint8_t reserved[8];     // zero
  uint8_t signature[64];   // Ed25519 by node_key (see above)
};
static_assert(sizeof(ReceiptLine) == 152);
inline constexpr size_t kReceiptLineSigned = 88;  // the bytes of a line before its signature
static_assert(offsetof(ReceiptLine, signature) == kReceiptLineSigned);

#pragma pack(pop)

}  // namespace kvasir::wire
