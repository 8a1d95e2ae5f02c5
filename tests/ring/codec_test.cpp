// Frame codec and typed messages: round trips of every message, stream reassembly under any
// split, and rejection (never a crash) of truncated, oversized and inconsistent input.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/kernels.h"
#include "ring/frame.h"
#include "ring/messages.h"

namespace kvasir::ring {
namespace {

using wire::Dtype;
using wire::MsgType;

constexpr size_t kHeader = sizeof(wire::FrameHeader);

template <typename T>
void Append(std::vector<uint8_t>* out, const T& v) {
  const size_t at = out->size();
  out->resize(at + sizeof(T));
  std::memcpy(out->data() + at, &v, sizeof(T));
}

template <typename T>
bool SameBytes(const T& a, const T& b) {
  return std::memcmp(&a, &b, sizeof(T)) == 0;
}

// A frame of `type` whose payload is `body` followed by `tail_bytes` bytes of 0xAB.
template <typename Body>
Frame RawFrame(MsgType type, const Body& body, size_t tail_bytes = 0) {
  Frame f{static_cast<uint16_t>(type), {}};
  Append(&f.payload, body);
  f.payload.resize(f.payload.size() + tail_bytes, 0xAB);
  return f;
}

std::string DecodeError(const Frame& f) {
  auto r = DecodeMessage(f);
  return r.ok() ? "(decoded)" : r.status().message();
}

// Encodes `m`, reassembles it with a FrameDecoder and decodes it.
Message RoundTrip(const Message& m) {
  const std::vector<uint8_t> bytes = EncodeMessage(m);
  FrameDecoder dec;
  dec.Feed(bytes);
  auto next = dec.Next();
  EXPECT_TRUE(next.ok()) << next.status().message();
  EXPECT_TRUE(next->has_value());
  EXPECT_EQ(dec.buffered(), 0u);
  EXPECT_EQ((**next).type, static_cast<uint16_t>(MessageType(m)));
  auto decoded = DecodeMessage(**next);
  EXPECT_TRUE(decoded.ok()) << decoded.status().message();
  return std::move(decoded).value();
}

wire::SamplingWire Sampling() {
  wire::SamplingWire s{};
  s.temperature = 0.7f;
  s.top_p = 0.9f;
  s.min_p = 0.05f;
  s.repeat_penalty = 1.1f;
  s.top_k = 40;
  s.repeat_last_n = 64;
  s.seed = 0x0123456789ABCDEFull;
  s.max_tokens = 256;
  s.flags = wire::kSamplingIgnoreEog;
  return s;
}

wire::StageStats Stats(int i) {
  wire::StageStats s{};
  std::snprintf(s.name, sizeof(s.name), "stage-%d", i);
  s.window_first = 4 * i;
  s.window_last = 4 * i + 4;
  s.weight_bytes = 1000u + i;
  s.rss_bytes = 2000u + i;
  s.bytes_in = 3u + i;
  s.bytes_out = 4u + i;
  s.rows = 5u + i;
  s.decode_rows = 6u + i;
  s.busy_ns = 7u + i;
  s.decode_busy_ns = 8u + i;
  s.sessions_open = 9u + i;
  return s;
}

std::vector<float> TestRows(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(0.37f * i) * (1.0f + i % 7) * 3.0f;
  return v;
}

// One message of every kind, with both empty and non-empty tails.
std::vector<Message> SampleMessages() {
  std::vector<Message> out;
  HelloMsg hello{};
  hello.hello.protocol_version = wire::kProtocolVersion;
  hello.hello.role = static_cast<uint32_t>(wire::Role::kStage);
  for (int i = 0; i < 16; ++i) hello.hello.model_id[i] = static_cast<uint8_t>(0xA0 + i);
  hello.hello.n_layer = 32;
  hello.hello.n_embd = 4096;
  hello.hello.window_first = 8;
  hello.hello.window_last = 16;
  hello.hello.flags = wire::kHelloHasHead;
  std::snprintf(hello.hello.name, sizeof(hello.hello.name), "stage-b");
  out.push_back(hello);
  out.push_back(ErrorMsg{wire::ErrorCode::kLinkDown, 0, ""});
  out.push_back(ErrorMsg{wire::ErrorCode::kUnknownSession, 7, "session 7 is not open here"});
  out.push_back(GenerateMsg{Sampling(), "", {}, false, {}});
  out.push_back(GenerateMsg{Sampling(), "Once upon a time", {"\n\n", "", "The end"}, true, {}});
  out.push_back(OpenSessionMsg{3, Sampling(), {}, {}});
  out.push_back(OpenSessionMsg{4, Sampling(), {1, 15043, 0, 31999}, {}});
  OpenSessionMsg replay{5, Sampling(), {1, 15043, 0, 31999}, {}};
  replay.replay = true;
  replay.n_generated = 2;
  out.push_back(replay);
  const std::vector<float> rows = TestRows(3 * 5);
  out.push_back(MakeHidden(3, 0, 3, 5, Dtype::kF32, wire::kHiddenSample, rows));
  out.push_back(MakeHidden(3, 9, 3, 5, Dtype::kF16, 0, rows));
  out.push_back(MakeHidden(3, 12, 1, 15, Dtype::kBF16, wire::kHiddenSample, rows));
  TokenMsg token{};
  token.token = {5, 17, 31, 1,  static_cast<uint8_t>(wire::FinishReason::kMaxTokens),
                 0, 0,  0,  11, -2.5f};
  token.piece = " hello";
  out.push_back(token);
  token.token.finished = 0;
  token.token.reason = 0;
  token.piece.clear();
  out.push_back(token);
  out.push_back(CloseMsg{5, static_cast<uint8_t>(wire::FinishReason::kClientClosed)});
  out.push_back(PingMsg{false, {42, 123456789}});
  out.push_back(PingMsg{true, {42, 987654321}});
  out.push_back(StatsMsg{});
  out.push_back(StatsMsg{{Stats(0), Stats(1), Stats(2)}});
  return out;
}

// Field-by-field equality of two messages of the same kind.
void ExpectSameMessage(const Message& a, const Message& b) {
  ASSERT_EQ(a.index(), b.index());
  if (auto* x = std::get_if<HelloMsg>(&a)) {
    EXPECT_TRUE(SameBytes(x->hello, std::get<HelloMsg>(b).hello));
  } else if (auto* x = std::get_if<ErrorMsg>(&a)) {
    const auto& y = std::get<ErrorMsg>(b);
    EXPECT_EQ(x->code, y.code);
    EXPECT_EQ(x->session, y.session);
    EXPECT_EQ(x->message, y.message);
  } else if (auto* x = std::get_if<GenerateMsg>(&a)) {
    const auto& y = std::get<GenerateMsg>(b);
    EXPECT_TRUE(SameBytes(x->sampling, y.sampling));
    EXPECT_EQ(x->prompt, y.prompt);
    EXPECT_EQ(x->stops, y.stops);
    EXPECT_EQ(x->add_special, y.add_special);
  } else if (auto* x = std::get_if<OpenSessionMsg>(&a)) {
    const auto& y = std::get<OpenSessionMsg>(b);
    EXPECT_EQ(x->session, y.session);
    EXPECT_TRUE(SameBytes(x->sampling, y.sampling));
    EXPECT_EQ(x->prompt, y.prompt);
    EXPECT_EQ(x->replay, y.replay);
    EXPECT_EQ(x->n_generated, y.n_generated);
  } else if (auto* x = std::get_if<HiddenMsg>(&a)) {
    const auto& y = std::get<HiddenMsg>(b);
    EXPECT_EQ(x->session, y.session);
    EXPECT_EQ(x->pos0, y.pos0);
    EXPECT_EQ(x->n_tokens, y.n_tokens);
    EXPECT_EQ(x->n_embd, y.n_embd);
    EXPECT_EQ(x->dtype, y.dtype);
    EXPECT_EQ(x->flags, y.flags);
    EXPECT_EQ(x->data, y.data);
  } else if (auto* x = std::get_if<TokenMsg>(&a)) {
    const auto& y = std::get<TokenMsg>(b);
    wire::TokenBody expected = x->token;
    expected.piece_bytes = static_cast<uint32_t>(x->piece.size());
    EXPECT_TRUE(SameBytes(expected, y.token));
    EXPECT_EQ(x->piece, y.piece);
  } else if (auto* x = std::get_if<CloseMsg>(&a)) {
    EXPECT_EQ(x->session, std::get<CloseMsg>(b).session);
    EXPECT_EQ(x->reason, std::get<CloseMsg>(b).reason);
  } else if (auto* x = std::get_if<PingMsg>(&a)) {
    EXPECT_EQ(x->pong, std::get<PingMsg>(b).pong);
    EXPECT_TRUE(SameBytes(x->body, std::get<PingMsg>(b).body));
  } else {
    const auto& xs = std::get<StatsMsg>(a).records;
    const auto& ys = std::get<StatsMsg>(b).records;
    ASSERT_EQ(xs.size(), ys.size());
    for (size_t i = 0; i < xs.size(); ++i) EXPECT_TRUE(SameBytes(xs[i], ys[i])) << i;
  }
}

// ---- Round trips ---------------------------------------------------------------------------

TEST(RingCodecTest, EveryMessageRoundTrips) {
  for (const Message& m : SampleMessages()) {
    SCOPED_TRACE(MessageName(m));
    ExpectSameMessage(m, RoundTrip(m));
  }
}

TEST(RingCodecTest, MaximalTailsRoundTrip) {
  ErrorMsg e{wire::ErrorCode::kBadRequest, 9, std::string(wire::kMaxErrorMessage, 'e')};
  ExpectSameMessage(e, RoundTrip(e));

  GenerateMsg g{Sampling(), std::string(wire::kMaxPromptBytes, 'p'), {}, true, {}};
  for (uint32_t i = 0; i < wire::kMaxStopStrings; ++i) g.stops.push_back(std::string(i, 's'));
  g.stops.back() = std::string(0xFFFF, 'x');
  ASSERT_TRUE(CheckEncodable(g).ok());
  ExpectSameMessage(g, RoundTrip(g));

  // The largest HIDDEN that fits the payload limit: 32-byte body + 4 MiB f32 values - 8 values.
  const uint32_t n_embd = 4096;
  const uint32_t n_tokens = (wire::kMaxPayload - sizeof(wire::HiddenBody)) / (n_embd * 4);
  const std::vector<float> rows = TestRows(size_t{n_tokens} * n_embd);
  HiddenMsg h = MakeHidden(1, 0, n_tokens, n_embd, Dtype::kF32, 0, rows);
  ExpectSameMessage(h, RoundTrip(h));

  StatsMsg s;
  for (int i = 0; i < 300; ++i) s.records.push_back(Stats(i));
  ExpectSameMessage(s, RoundTrip(s));
}

// STATS with repair counts (kStatsRepair), after drafting counts or alone: they come back in
// order, one per record; a count of them other than the records' is refused before it is sent,
// and a frame whose flags promise them but that lacks their bytes is refused when it arrives.
TEST(RingCodecTest, StatsRepairCountsRoundTrip) {
  for (bool with_drafts : {false, true}) {
    StatsMsg s{{Stats(0), Stats(1)}};
    if (with_drafts) s.drafts = {wire::DraftStatsWire{{'n', 'g', 'r', 'a', 'm'}, 1, 2, 3}, {}};
    s.repairs = {wire::RepairStatsWire{8, 120, 3, 8, 1600, 250},
                 wire::RepairStatsWire{0, 0, 123, 0, 0, 0}};
    const auto back = std::get<StatsMsg>(RoundTrip(s));
    ExpectSameMessage(s, back);
    ASSERT_EQ(back.repairs.size(), 2u);
    EXPECT_TRUE(SameBytes(back.repairs[0], s.repairs[0]));
    EXPECT_TRUE(SameBytes(back.repairs[1], s.repairs[1]));
    EXPECT_EQ(back.drafts.size(), s.drafts.size());
  }
  StatsMsg bad{{Stats(0), Stats(1)}};
  bad.repairs = {wire::RepairStatsWire{}};
  EXPECT_FALSE(CheckEncodable(bad).ok());
  // One record promised with its repair counts, which are missing.
  wire::StatsBody body{};
  body.n_records = 1;
  body.flags = wire::kStatsRepair;
  const std::string why = DecodeError(RawFrame(MsgType::kStats, body, sizeof(wire::StageStats)));
  EXPECT_NE(why.find("RepairStatsWire"), std::string::npos) << why;
  body.flags = 4;  // unknown
  EXPECT_NE(
      DecodeError(RawFrame(MsgType::kStats, body, sizeof(wire::StageStats))).find("unknown bits"),
      std::string::npos);
}

TEST(RingCodecTest, LongErrorMessageIsCutAtACharacterBoundary) {
  // 1023 ASCII bytes and then a 3-byte character: the cut drops the whole character.
  ErrorMsg e{wire::ErrorCode::kInternal, 0, std::string(1023, 'a') + "\xE2\x82\xAC" + "tail"};
  const auto back = std::get<ErrorMsg>(RoundTrip(e));
  EXPECT_EQ(back.message, std::string(1023, 'a'));
}

TEST(RingCodecTest, HiddenF32IsBitExact) {
  std::vector<float> rows = {0.0f,
                             -0.0f,
                             1.0f,
                             -1.5f,
                             3.4028235e38f,
                             1e-45f,
                             1.17549435e-38f,
                             std::numeric_limits<float>::infinity(),
                             -std::numeric_limits<float>::infinity(),
                             0.1f,
                             123456.789f,
                             -2e-10f};
  HiddenMsg h = MakeHidden(2, 5, 3, 4, Dtype::kF32, 0, rows);
  EXPECT_EQ(h.data.size(), rows.size() * 4);
  const auto back = std::get<HiddenMsg>(RoundTrip(h));
  std::vector<float> out;
  HiddenToF32(back, &out);
  ASSERT_EQ(out.size(), rows.size());
  EXPECT_EQ(std::memcmp(out.data(), rows.data(), rows.size() * sizeof(float)), 0);
}

TEST(RingCodecTest, HiddenF16AndBf16RoundToNearest) {
  const std::vector<float> rows = TestRows(4 * 64);
  for (Dtype d : {Dtype::kF16, Dtype::kBF16}) {
    SCOPED_TRACE(DtypeName(d));
    HiddenMsg h = MakeHidden(2, 0, 4, 64, d, 0, rows);
    ASSERT_EQ(h.data.size(), rows.size() * 2);
    const auto back = std::get<HiddenMsg>(RoundTrip(h));
    std::vector<float> out;
    HiddenToF32(back, &out);
    ASSERT_EQ(out.size(), rows.size());
    // Relative error of a round to nearest: 2^-11 for f16, 2^-8 for bf16.
    const float rel = d == Dtype::kF16 ? 1.0f / 2048 : 1.0f / 256;
    for (size_t i = 0; i < rows.size(); ++i) {
      const float expected =
          d == Dtype::kF16 ? F16ToF32(F32ToF16(rows[i])) : BF16ToF32(F32ToBF16(rows[i]));
      EXPECT_EQ(out[i], expected) << i;
      EXPECT_NEAR(out[i], rows[i], std::fabs(rows[i]) * rel + 1e-7f) << i;
    }
  }
  // Known values: 1.0 and -2.0 are exact in both formats; f16 1.0 is 0x3C00, bf16 is 0x3F80.
  const std::vector<float> one = {1.0f, -2.0f};
  HiddenMsg f16 = MakeHidden(1, 0, 1, 2, Dtype::kF16, 0, one);
  EXPECT_EQ((std::vector<uint8_t>{0x00, 0x3C, 0x00, 0xC0}), f16.data);
  HiddenMsg bf16 = MakeHidden(1, 0, 1, 2, Dtype::kBF16, 0, one);
  EXPECT_EQ((std::vector<uint8_t>{0x80, 0x3F, 0x00, 0xC0}), bf16.data);
}

TEST(RingCodecTest, WireLayoutIsLittleEndian) {
  const std::vector<uint8_t> bytes = EncodeMessage(CloseMsg{3, 2});
  const std::vector<uint8_t> expected = {'K', 'V', 'R', '1', 7, 0, 0, 0, 8, 0, 0, 0,
                                         0,   0,   0,   0,   3, 0, 0, 0, 2, 0, 0, 0};
  EXPECT_EQ(bytes, expected);
  const std::vector<uint8_t> stop = EncodeMessage(GenerateMsg{{}, "ab", {"xyz"}, true, {}});
  ASSERT_EQ(stop.size(), kHeader + 64 + 2 + 2 + 3);
  EXPECT_EQ(stop[kHeader + 40], 2);  // prompt_bytes
  EXPECT_EQ(stop[kHeader + 44], 1);  // n_stop
  EXPECT_EQ(stop[kHeader + 48], 1);  // add_special
  EXPECT_EQ(std::string(stop.begin() + kHeader + 64, stop.end()), std::string("ab\x03\0xyz", 7));
}

TEST(RingCodecTest, MessageNames) {
  EXPECT_EQ(MessageName(MakeHidden(3, 0, 12, 1, Dtype::kF32, 0, TestRows(12))),
            "HIDDEN(session 3, 12 rows)");
  EXPECT_EQ(MessageName(SampleMessages()[0]), "HELLO(stage-b, layers [8, 16))");
  EXPECT_EQ(MessageName(ErrorMsg{wire::ErrorCode::kMalformed, 0, "x"}),
            "ERROR(malformed, session 0)");
  EXPECT_EQ(MessageName(CloseMsg{4, 1}), "CLOSE_SESSION(session 4, eog)");
  EXPECT_EQ(MessageName(PingMsg{true, {9, 0}}), "PONG(nonce 9)");
  EXPECT_EQ(MessageName(StatsMsg{{Stats(0)}}), "STATS(1 records)");
  EXPECT_EQ(MessageType(PingMsg{false, {}}), MsgType::kPing);
  EXPECT_EQ(MessageType(PingMsg{true, {}}), MsgType::kPong);
  EXPECT_STREQ(wire::MsgTypeName(13), "RECEIPT");
  EXPECT_STREQ(wire::MsgTypeName(14), "UNKNOWN");
}

// ---- Stream reassembly ---------------------------------------------------------------------

std::vector<uint8_t> SampleStream(std::vector<Message>* messages) {
  *messages = SampleMessages();
  std::vector<uint8_t> stream;
  for (const Message& m : *messages) {
    const std::vector<uint8_t> f = EncodeMessage(m);
    stream.insert(stream.end(), f.begin(), f.end());
  }
  return stream;
}

// Drains every complete frame from `dec`, decoding each into `out`.
void Drain(FrameDecoder* dec, std::vector<Message>* out) {
  while (true) {
    auto next = dec->Next();
    ASSERT_TRUE(next.ok()) << next.status().message();
    if (!next->has_value()) return;
    auto m = DecodeMessage(**next);
    ASSERT_TRUE(m.ok()) << m.status().message();
    out->push_back(std::move(m).value());
  }
}

TEST(RingCodecTest, DecoderOneByteAtATime) {
  std::vector<Message> sent;
  const std::vector<uint8_t> stream = SampleStream(&sent);
  FrameDecoder dec;
  std::vector<Message> got;
  for (uint8_t b : stream) {
    dec.Feed(std::span<const uint8_t>(&b, 1));
    Drain(&dec, &got);
  }
  EXPECT_EQ(dec.buffered(), 0u);
  ASSERT_EQ(got.size(), sent.size());
  for (size_t i = 0; i < sent.size(); ++i) ExpectSameMessage(sent[i], got[i]);
}

TEST(RingCodecTest, DecoderRandomSplits) {
  std::vector<Message> sent;
  const std::vector<uint8_t> stream = SampleStream(&sent);
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 200; ++trial) {
    FrameDecoder dec;
    std::vector<Message> got;
    size_t pos = 0;
    while (pos < stream.size()) {
      const size_t max_chunk = trial % 2 == 0 ? 8 : 300;
      const size_t n = std::min(stream.size() - pos, size_t{1} + rng() % max_chunk);
      dec.Feed(std::span<const uint8_t>(stream.data() + pos, n));
      pos += n;
      // Sometimes let several frames pile up before draining.
      if (rng() % 3 != 0 || pos == stream.size()) Drain(&dec, &got);
    }
    EXPECT_EQ(dec.buffered(), 0u);
    ASSERT_EQ(got.size(), sent.size()) << "trial " << trial;
    for (size_t i = 0; i < sent.size(); ++i) ExpectSameMessage(sent[i], got[i]);
  }
}

TEST(RingCodecTest, EveryTruncationIsIncompleteOrRejected) {
  for (const Message& m : SampleMessages()) {
    SCOPED_TRACE(MessageName(m));
    const std::vector<uint8_t> bytes = EncodeMessage(m);
    // A prefix of a stream is never an error and never a frame.
    for (size_t n = 0; n < bytes.size(); ++n) {
      FrameDecoder dec;
      dec.Feed(std::span<const uint8_t>(bytes.data(), n));
      auto next = dec.Next();
      ASSERT_TRUE(next.ok()) << n;
      EXPECT_FALSE(next->has_value()) << n;
    }
    // A frame whose payload is cut short, or has one byte too many, is malformed.
    const std::vector<uint8_t> payload(bytes.begin() + kHeader, bytes.end());
    for (size_t n = 0; n < payload.size(); ++n) {
      Frame f{static_cast<uint16_t>(MessageType(m)),
              std::vector<uint8_t>(payload.begin(), payload.begin() + n)};
      EXPECT_FALSE(DecodeMessage(f).ok()) << n;
    }
    Frame longer{static_cast<uint16_t>(MessageType(m)), payload};
    longer.payload.push_back(0);
    EXPECT_FALSE(DecodeMessage(longer).ok());
  }
}

// ---- Malformed frames ----------------------------------------------------------------------

std::vector<uint8_t> Header(uint32_t magic, uint16_t type, uint32_t length) {
  wire::FrameHeader h{magic, type, 0, length, 0};
  std::vector<uint8_t> out;
  Append(&out, h);
  return out;
}

std::string DecoderError(const std::vector<uint8_t>& bytes, uint32_t max_payload) {
  FrameDecoder dec(max_payload);
  dec.Feed(bytes);
  auto next = dec.Next();
  if (next.ok()) return next->has_value() ? "(frame)" : "(incomplete)";
  EXPECT_TRUE(dec.failed());
  return next.status().message();
}

TEST(RingCodecTest, MalformedHeadersAreStickyErrors) {
  EXPECT_EQ(DecoderError(Header(0x31525640, 1, 0), wire::kMaxPayload),
            "frame magic 0x31525640 is not KVR1 (0x3152564B): not a Kvasir ring peer or a "
            "desynchronised stream");
  EXPECT_EQ(DecoderError(Header(wire::kMagic, 0, 0), wire::kMaxPayload),
            "frame type 0 is unknown (this build knows 1..13)");
  EXPECT_EQ(DecoderError(Header(wire::kMagic, 14, 0), wire::kMaxPayload),
            "frame type 14 is unknown (this build knows 1..13)");
  EXPECT_EQ(DecoderError(Header(wire::kMagic, 5, 99999999), wire::kMaxPayload),
            "HIDDEN frame length 99999999 exceeds the 64 MiB limit");
  EXPECT_EQ(DecoderError(Header(wire::kMagic, 5, 101), 100),
            "HIDDEN frame length 101 exceeds the 100-byte limit");
  EXPECT_EQ(DecoderError(Header(wire::kMagic, 5, 100), 100), "(incomplete)");
  EXPECT_TRUE(CheckFrameHeader({wire::kMagic, 10, 0xFFFF, 0, 0xFFFFFFFF}).ok());

  // Once failed, the decoder stays failed and drops what it is fed.
  FrameDecoder dec(64);
  dec.Feed(Header(wire::kMagic, 8, 65));
  EXPECT_FALSE(dec.Next().ok());
  dec.Feed(EncodeMessage(PingMsg{}));
  EXPECT_FALSE(dec.Next().ok());
  EXPECT_EQ(dec.buffered(), 0u);
}

TEST(RingCodecTest, OversizedLengthIsRefusedBeforeAnyPayloadArrives) {
  FrameDecoder dec;
  dec.Feed(Header(wire::kMagic, 5, 0xFFFFFFFFu));
  auto next = dec.Next();
  ASSERT_FALSE(next.ok());
  EXPECT_EQ(next.status().message(), "HIDDEN frame length 4294967295 exceeds the 64 MiB limit");
}

TEST(RingCodecTest, UnknownTypeInAFrame) {
  EXPECT_EQ(DecodeError(Frame{14, {}}), "frame type 14 is unknown (this build knows 1..13)");
  EXPECT_EQ(DecodeError(Frame{0, {}}), "frame type 0 is unknown (this build knows 1..13)");
}

TEST(RingCodecTest, ShortBodies) {
  EXPECT_EQ(DecodeError(Frame{5, std::vector<uint8_t>(10)}),
            "HIDDEN: payload of 10 bytes is shorter than its 32-byte body");
  EXPECT_EQ(DecodeError(Frame{8, std::vector<uint8_t>(17)}),
            "PING: payload is 17 bytes, but the message is its 16-byte body alone");
}

wire::HiddenBody HiddenBody(uint32_t n_tokens, uint32_t n_embd, uint16_t dtype) {
  wire::HiddenBody b{};
  b.session = 1;
  b.n_tokens = n_tokens;
  b.n_embd = n_embd;
  b.dtype = dtype;
  return b;
}

TEST(RingCodecTest, HiddenTailMustMatchTheShape) {
  EXPECT_TRUE(DecodeMessage(RawFrame(MsgType::kHidden, HiddenBody(2, 3, 1), 12)).ok());
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kHidden, HiddenBody(2, 3, 1), 11)),
            "HIDDEN: tail is 11 bytes, but n_tokens 2 x n_embd 3 x f16 needs 12");
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kHidden, HiddenBody(2, 3, 0), 12)),
            "HIDDEN: tail is 12 bytes, but n_tokens 2 x n_embd 3 x f32 needs 24");
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kHidden, HiddenBody(2, 3, 3), 12)),
            "HIDDEN: dtype 3 is unknown (0 f32, 1 f16, 2 bf16)");
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kHidden, HiddenBody(0, 3, 0), 0)),
            "HIDDEN: n_tokens is 0");
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kHidden, HiddenBody(1, 0, 0), 0)), "HIDDEN: n_embd is 0");
  wire::HiddenBody no_session = HiddenBody(1, 1, 0);
  no_session.session = 0;
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kHidden, no_session, 4)),
            "HIDDEN: session is 0 (session ids are nonzero)");
}

TEST(RingCodecTest, HiddenShapeOverflowIsRejected) {
  // 2^31 x 2^31 x 4 bytes wraps to 0 in 64 bits: an empty tail must not pass for it.
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kHidden, HiddenBody(1u << 31, 1u << 31, 0), 0)),
            "HIDDEN: n_tokens 2147483648 x n_embd 2147483648 = 4611686018427387904 values "
            "exceeds any payload (64 MiB)");
  EXPECT_FALSE(
      DecodeMessage(RawFrame(MsgType::kHidden, HiddenBody(0xFFFFFFFF, 0xFFFFFFFF, 2), 2)).ok());
  EXPECT_FALSE(DecodeMessage(RawFrame(MsgType::kHidden, HiddenBody(1u << 30, 4, 0), 0)).ok());
  HiddenMsg h{1, 0, 1u << 31, 1u << 31, Dtype::kF32, 0, {}};
  EXPECT_FALSE(CheckEncodable(h).ok());
}

TEST(RingCodecTest, ErrorMessageLimits) {
  wire::ErrorBody b{1, 0, wire::kMaxErrorMessage + 1, 0};
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kError, b, wire::kMaxErrorMessage + 1)),
            "ERROR: message_bytes 1025 exceeds the 1024-byte limit");
  b.message_bytes = 5;
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kError, b, 4)),
            "ERROR: tail is 4 bytes, but message_bytes 5 needs 5");
  b.code = 1234;  // codes from a newer peer still decode
  auto r = DecodeMessage(RawFrame(MsgType::kError, b, 5));
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(MessageName(*r), "ERROR(unknown, session 0)");
}

wire::GenerateBody GenerateBody(uint32_t prompt_bytes, uint32_t n_stop) {
  wire::GenerateBody b{};
  b.prompt_bytes = prompt_bytes;
  b.n_stop = n_stop;
  b.add_special = 1;
  return b;
}

TEST(RingCodecTest, GenerateLimits) {
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kGenerate, GenerateBody(wire::kMaxPromptBytes + 1, 0),
                                 wire::kMaxPromptBytes + 1)),
            "GENERATE: prompt_bytes 1048577 exceeds the 1 MiB limit");
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kGenerate, GenerateBody(0, 17), 34)),
            "GENERATE: n_stop 17 exceeds the limit of 16 stop strings");
  wire::GenerateBody bad_flag = GenerateBody(0, 0);
  bad_flag.add_special = 2;
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kGenerate, bad_flag)),
            "GENERATE: add_special 2 is not 0 or 1");
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kGenerate, GenerateBody(10, 0), 9)),
            "GENERATE: prompt_bytes 10 but the tail holds 9 bytes");
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kGenerate, GenerateBody(2, 0), 3)),
            "GENERATE: 1 bytes follow the prompt and 0 stop strings");
  // One stop string whose u16 length (0xABAB from the filler) runs past the tail.
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kGenerate, GenerateBody(0, 1), 4)),
            "GENERATE: stop string 0 of 1: length 43947 but 2 bytes remain");
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kGenerate, GenerateBody(0, 2), 1)),
            "GENERATE: stop string 0 of 2: tail ends before its u16 length");

  GenerateMsg g{Sampling(), std::string(wire::kMaxPromptBytes + 1, 'p'), {}, true, {}};
  EXPECT_EQ(CheckEncodable(g).message(),
            "GENERATE: prompt of 1048577 bytes exceeds the 1 MiB limit");
  g.prompt = "hi";
  g.stops.assign(17, "stop");
  EXPECT_EQ(CheckEncodable(g).message(), "GENERATE: 17 stop strings exceed the limit of 16");
  g.stops.assign(1, std::string(0x10000, 's'));
  EXPECT_FALSE(CheckEncodable(g).ok());
}

TEST(RingCodecTest, OpenSessionChecks) {
  wire::OpenSessionBody b{};
  b.session = 2;
  b.n_prompt = 3;
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kOpenSession, b, 11)),
            "OPEN_SESSION: tail is 11 bytes, but n_prompt 3 x i32 needs 12");
  b.n_prompt = 0xFFFFFFFF;
  EXPECT_FALSE(DecodeMessage(RawFrame(MsgType::kOpenSession, b, 4)).ok());
  b.n_prompt = 1;  // the filler 0xABABABAB is a negative id
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kOpenSession, b, 4)),
            "OPEN_SESSION: prompt token 0 is -1414812757");
  b.session = 0;
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kOpenSession, b, 4)),
            "OPEN_SESSION: session is 0 (session ids are nonzero)");
}

// A replay names how many of its ids were sampled: fewer than all, and only in a replay.
TEST(RingCodecTest, OpenSessionReplayChecks) {
  wire::OpenSessionBody b{};
  b.session = 2;
  b.n_prompt = 1;
  b.n_generated = 1;
  auto frame = [&] {
    Frame f{static_cast<uint16_t>(MsgType::kOpenSession), {}};
    Append(&f.payload, b);
    f.payload.resize(f.payload.size() + sizeof(int32_t), 0);  // one id: 0
    return f;
  };
  EXPECT_EQ(DecodeError(frame()),
            "OPEN_SESSION: n_generated 1 with fork_from 0, 1 ids and replay off");
  b.open_flags = wire::kOpenReplay;
  EXPECT_EQ(DecodeError(frame()),
            "OPEN_SESSION: n_generated 1 with fork_from 0, 1 ids and replay on");
  b.n_generated = 0;
  auto ok = DecodeMessage(frame());
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_TRUE(std::get<OpenSessionMsg>(*ok).replay);
  OpenSessionMsg bad{3, {}, {1, 2}, {}};
  bad.replay = true;
  bad.n_generated = 2;
  EXPECT_FALSE(CheckEncodable(bad).ok());
}

TEST(RingCodecTest, TokenAndCloseChecks) {
  wire::TokenBody t{1, 2, 3, 1, 9, 0, 0, 0, 0, 0.0f};
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kToken, t)),
            "TOKEN: reason 9 is not a finish reason (0..6)");
  t.reason = 1;
  t.piece_bytes = 4;
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kToken, t, 5)),
            "TOKEN: tail is 5 bytes, but piece_bytes 4 needs 4");
  t.finished = 2;
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kToken, t, 4)), "TOKEN: finished 2 is not 0 or 1");
  t.finished = 1;
  t.id = -1;
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kToken, t, 4)), "TOKEN: id -1 is negative");

  EXPECT_EQ(DecodeError(RawFrame(MsgType::kCloseSession, wire::CloseBody{0, 1})),
            "CLOSE_SESSION: session is 0 (session ids are nonzero)");
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kCloseSession, wire::CloseBody{1, 300})),
            "CLOSE_SESSION: reason 300 is not a finish reason (0..6)");
  EXPECT_FALSE(CheckEncodable(CloseMsg{0, 1}).ok());
}

TEST(RingCodecTest, StatsRecordCountMustMatch) {
  wire::StatsBody b{2, 0};
  EXPECT_TRUE(DecodeMessage(RawFrame(MsgType::kStats, b, 256)).ok());
  EXPECT_EQ(DecodeError(RawFrame(MsgType::kStats, b, 128)),
            "STATS: tail is 128 bytes, but n_records 2 x 128-byte StageStats needs 256");
  b.n_records = 0xFFFFFFFF;
  EXPECT_FALSE(DecodeMessage(RawFrame(MsgType::kStats, b, 0)).ok());
}

}  // namespace
}  // namespace kvasir::ring
