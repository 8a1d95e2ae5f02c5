#include "ring/handshake.h"

#include <sodium.h>

#include <cstring>

#include "ring/frame.h"
#include "ring/messages.h"

namespace kvasir::ring {
namespace {

constexpr std::string_view kTranscriptLabel = "kvasir link v2";
constexpr std::string_view kResponderLabel = "kvasir link v2 responder";
constexpr std::string_view kInitiatorLabel = "kvasir link v2 initiator";
constexpr std::string_view kClientLabel = "kvasir link v2 client";
// Before the handshake the only frames are HANDSHAKE and ERROR: nothing larger is read.
constexpr uint32_t kMaxHandshakeFrame =
    std::max<uint32_t>(sizeof(wire::HandshakeBody), sizeof(wire::ErrorBody) + wire::kMaxErrorMessage);

Status ReadExact(net::Stream& stream, std::span<uint8_t> out) {
  size_t got = 0;
  while (got < out.size()) {
    KV_ASSIGN_OR_RETURN(size_t n, stream.ReadSome(out.subspan(got)));
    if (n == 0) {
      return Error(StatusCode::kEndOfStream, "{}: closed the connection during the handshake",
                   stream.peer());
    }
    got += n;
  }
  return Status::Ok();
}

// What a failed read should answer the peer: nothing (it closed, or it refused us), or an ERROR.
struct ReadFailure {
  bool answer = false;
  wire::ErrorCode code = wire::ErrorCode::kMalformed;
};

// Reads exactly one frame (never a byte past it: what follows is the encrypted stream).
Result<Message> ReadHandshakeFrame(net::Stream& stream, ReadFailure* fail) {
  *fail = ReadFailure{};
  uint8_t header[sizeof(wire::FrameHeader)];
  KV_RETURN_IF_ERROR(ReadExact(stream, header));
  const wire::FrameHeader h = LoadFrameHeader(header);
  fail->answer = true;
  if (h.magic == wire::kMagic && h.type == static_cast<uint16_t>(wire::MsgType::kHello)) {
    fail->code = wire::ErrorCode::kVersion;
    return Error(StatusCode::kInvalidInput,
                 "{}: sent HELLO without a handshake: it speaks protocol 1, this end speaks {}",
                 stream.peer(), wire::kProtocolVersion);
  }
  KV_RETURN_IF_ERROR(CheckFrameHeader(h, kMaxHandshakeFrame).WithContext(stream.peer()));
  Frame f;
  f.type = h.type;
  f.payload.resize(h.length);
  if (Status s = ReadExact(stream, f.payload); !s.ok()) {
    fail->answer = false;
    return s;
  }
  auto m = DecodeMessage(f);
  if (!m.ok()) return m.status().WithContext(stream.peer());
  if (auto* e = std::get_if<ErrorMsg>(&*m)) {
    fail->answer = false;
    const StatusCode code = e->code == wire::ErrorCode::kUnauthenticated
                                ? StatusCode::kUnauthenticated
                                : StatusCode::kInvalidInput;
    return Error(code, "{} refused the handshake: {}", stream.peer(), e->message);
  }
  if (!std::holds_alternative<HandshakeMsg>(*m)) {
    return Error("{}: expected HANDSHAKE, got {}", stream.peer(), MessageName(*m));
  }
  return m;
}

// Reads handshake step `step`. A malformed or unexpected frame is answered with ERROR.
Result<wire::HandshakeBody> ReadStep(net::Stream& stream, uint8_t step) {
  ReadFailure fail;
  auto m = ReadHandshakeFrame(stream, &fail);
  if (!m.ok()) {
    if (fail.answer) {
      (void)stream.WriteAll(EncodeMessage(ErrorMsg{fail.code, 0, m.status().message()}));
    }
    return m.status();
  }
  wire::HandshakeBody b = std::get<HandshakeMsg>(*m).body;
  if (b.protocol_version != wire::kProtocolVersion) {
    (void)stream.WriteAll(EncodeMessage(ErrorMsg{
        wire::ErrorCode::kVersion, 0,
        fmt::format("this end speaks protocol {}, not {}", wire::kProtocolVersion,
                    b.protocol_version)}));
    return Error("{}: speaks protocol {}, this end speaks {}", stream.peer(), b.protocol_version,
                 wire::kProtocolVersion);
  }
  if (b.step != step) {
    (void)stream.WriteAll(EncodeMessage(ErrorMsg{
        wire::ErrorCode::kMalformed, 0,
        fmt::format("handshake step {} arrived where step {} was expected", b.step, step)}));
    return Error("{}: handshake step {} arrived where step {} was expected", stream.peer(), b.step,
                 step);
  }
  return b;
}

Status SendStep(net::Stream& stream, const wire::HandshakeBody& b) {
  return stream.WriteAll(EncodeMessage(HandshakeMsg{b}));
}

// Tells the peer why, then reports the same reason to the caller.
Status Refuse(net::Stream& stream, wire::ErrorCode code, const std::string& why) {
  (void)stream.WriteAll(EncodeMessage(ErrorMsg{code, 0, why}));
  return Error(code == wire::ErrorCode::kUnauthenticated ? StatusCode::kUnauthenticated
                                                         : StatusCode::kInvalidInput,
               "{}: {}", stream.peer(), why);
}

std::span<const uint8_t> Bytes(const wire::HandshakeBody& b) {
  return {reinterpret_cast<const uint8_t*>(&b), sizeof(b)};
}

wire::HandshakeBody WithoutProofs(wire::HandshakeBody b) {
  std::memset(b.signature, 0, sizeof(b.signature));
  std::memset(b.mac, 0, sizeof(b.mac));
  return b;
}

bool MacEquals(const std::array<uint8_t, 32>& expected, const uint8_t* got) {
  return sodium_memcmp(expected.data(), got, 32) == 0;
}

// Checks the proofs of `b` (the peer's step) against `label` || `hash` and what `auth` demands.
// `demand_ring` says whether the ring secret is demanded of this peer (stage peers).
Status CheckProofs(const wire::HandshakeBody& b, std::span<const uint8_t, 32> hash,
                   std::string_view sig_label, std::string_view mac_label,
                   const std::string& mac_secret, const std::optional<PublicKey>& demanded_key,
                   const std::function<bool(const PublicKey&)>& also_accept, bool insecure, const std::string& what, std::optional<PublicKey>* proven_key,
                   bool* proved_secret) {
  PublicKey key;
  std::memcpy(key.data(), b.node_key, key.size());
  if ((b.proofs & wire::kProofSignature) != 0) {
    Signature sig;
    std::memcpy(sig.data(), b.signature, sig.size());
    if (!VerifySignature(key, ProofInput(sig_label, hash), sig)) {
      return Error(StatusCode::kUnauthenticated,
                   "{}: the signature of node {} over the handshake does not verify", what,
                   ShortKey(key));
    }
    *proven_key = key;
  }
  if (demanded_key.has_value()) {
    if (!proven_key->has_value()) {
      return Error(StatusCode::kUnauthenticated, "{}: no signature; expected node {}", what,
                   ShortKey(*demanded_key));
    }
    if (**proven_key != *demanded_key && !(also_accept && also_accept(**proven_key))) {
      return Error(StatusCode::kUnauthenticated, "{}: is node {}, expected node {}", what,
                   ShortKey(**proven_key), ShortKey(*demanded_key));
    }
  }
  const uint8_t mac_bit = mac_label == kClientLabel ? wire::kProofClientSecret
                                                    : wire::kProofRingSecret;
  if (!mac_secret.empty()) {
    if ((b.proofs & mac_bit) == 0) {
      return Error(StatusCode::kUnauthenticated, "{}: does not prove the {}", what,
                   mac_bit == wire::kProofClientSecret ? "client secret" : "ring secret");
    }
    if (!MacEquals(HmacSha256(mac_secret, ProofInput(mac_label, hash)), b.mac)) {
      return Error(StatusCode::kUnauthenticated, "{}: holds a different {}", what,
                   mac_bit == wire::kProofClientSecret ? "client secret" : "ring secret");
    }
    *proved_secret = true;
  }
  if (!demanded_key.has_value() && mac_secret.empty() && !insecure) {
    return Error(StatusCode::kUnauthenticated,
                 "{}: nothing to check it against (no expected node key, no secret)", what);
  }
  return Status::Ok();
}

// The proofs a step will carry. They are set before the step is hashed, so the transcript
// covers which proofs were given.
uint8_t ProofBits(std::string_view mac_label, const NodeKey* key, const std::string& mac_secret) {
  uint8_t bits = key != nullptr ? wire::kProofSignature : 0;
  if (!mac_secret.empty()) {
    bits |= mac_label == kClientLabel ? wire::kProofClientSecret : wire::kProofRingSecret;
  }
  return bits;
}

void Prove(wire::HandshakeBody* b, std::span<const uint8_t, 32> hash, std::string_view sig_label,
           std::string_view mac_label, const NodeKey* key, const std::string& mac_secret) {
  if (key != nullptr) {
    const Signature sig = key->Sign(ProofInput(sig_label, hash));
    std::memcpy(b->signature, sig.data(), sig.size());
  }
  if (!mac_secret.empty()) {
    const auto mac = HmacSha256(mac_secret, ProofInput(mac_label, hash));
    std::memcpy(b->mac, mac.data(), mac.size());
  }
}

std::string Describe(const HandshakeResult& r) {
  if (r.peer_key.has_value()) return "node " + ShortKey(*r.peer_key);
  if (r.peer_role == wire::Role::kClient) return "anonymous client";
  return r.peer_has_ring_secret ? "ring member (no node key)" : "unauthenticated peer";
}

struct Ephemeral {
  uint8_t pk[crypto_kx_PUBLICKEYBYTES];
  uint8_t sk[crypto_kx_SECRETKEYBYTES];
  Ephemeral() { crypto_kx_keypair(pk, sk); }
  ~Ephemeral() { sodium_memzero(sk, sizeof(sk)); }
};

// Binds the crypto_kx keys to the transcript (then wipes them) and names the peer.
void Finish(SessionKey& rx, SessionKey& tx, std::span<const uint8_t, 32> h3, HandshakeResult* r) {
  r->rx = DeriveKey(rx, h3);
  r->tx = DeriveKey(tx, h3);
  sodium_memzero(rx.data(), rx.size());
  sodium_memzero(tx.data(), tx.size());
  r->peer_desc = Describe(*r);
}

std::array<uint8_t, 32> Hash3(std::span<const uint8_t, 32> h2, const wire::HandshakeBody& reply,
                              const wire::HandshakeBody& finish_without_proofs) {
  std::vector<uint8_t> both(Bytes(reply).begin(), Bytes(reply).end());
  both.insert(both.end(), Bytes(finish_without_proofs).begin(), Bytes(finish_without_proofs).end());
  return TranscriptHash(h2, both);
}

}  // namespace

std::array<uint8_t, 32> TranscriptHash(std::span<const uint8_t> prev,
                                       std::span<const uint8_t> message) {
  InitCrypto();
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, 32);
  if (prev.empty()) {
    crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(kTranscriptLabel.data()),
                              kTranscriptLabel.size());
  } else {
    crypto_generichash_update(&st, prev.data(), prev.size());
  }
  crypto_generichash_update(&st, message.data(), message.size());
  std::array<uint8_t, 32> out;
  crypto_generichash_final(&st, out.data(), out.size());
  return out;
}

std::vector<uint8_t> ProofInput(std::string_view label, std::span<const uint8_t, 32> hash) {
  std::vector<uint8_t> v(label.begin(), label.end());
  v.insert(v.end(), hash.begin(), hash.end());
  return v;
}

std::array<uint8_t, 32> HmacSha256(std::string_view secret, std::span<const uint8_t> data) {
  InitCrypto();
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, reinterpret_cast<const uint8_t*>(secret.data()), secret.size());
  crypto_auth_hmacsha256_update(&st, data.data(), data.size());
  std::array<uint8_t, 32> out;
  crypto_auth_hmacsha256_final(&st, out.data());
  sodium_memzero(&st, sizeof(st));
  return out;
}

SessionKey DeriveKey(const SessionKey& kx_key, std::span<const uint8_t, 32> transcript) {
  InitCrypto();
  SessionKey out;
  crypto_generichash(out.data(), out.size(), transcript.data(), transcript.size(), kx_key.data(),
                     kx_key.size());
  return out;
}

Result<HandshakeResult> HandshakeInitiate(net::Stream& stream, wire::Role role,
                                          const LinkAuth& auth) {
  InitCrypto();
  Ephemeral eph;
  wire::HandshakeBody init{};
  init.protocol_version = wire::kProtocolVersion;
  init.step = wire::kHandshakeInit;
  init.role = static_cast<uint8_t>(role);
  std::memcpy(init.ephemeral, eph.pk, 32);
  KV_RETURN_IF_ERROR(SendStep(stream, init));
  const auto h1 = TranscriptHash({}, Bytes(init));

  KV_ASSIGN_OR_RETURN(wire::HandshakeBody reply, ReadStep(stream, wire::kHandshakeReply));
  const auto h2 = TranscriptHash(h1, Bytes(WithoutProofs(reply)));
  HandshakeResult r;
  r.peer_role = wire::Role::kStage;
  const bool is_client = role == wire::Role::kClient;
  const std::string what = is_client ? "the head" : "the successor";
  if (Status s = CheckProofs(reply, h2, kResponderLabel, kResponderLabel, auth.ring_secret,
                             auth.peer_key, auth.also_accept, auth.insecure, what, &r.peer_key,
                             &r.peer_has_ring_secret);
      !s.ok()) {
    return Refuse(stream, wire::ErrorCode::kUnauthenticated, s.message());
  }

  wire::HandshakeBody finish{};
  finish.protocol_version = wire::kProtocolVersion;
  finish.step = wire::kHandshakeFinish;
  const NodeKey* key = is_client ? nullptr : auth.key.get();
  if (key != nullptr) std::memcpy(finish.node_key, key->public_key().data(), kPublicKeyBytes);
  const std::string& finish_secret = is_client ? auth.client_secret : auth.ring_secret;
  const std::string_view finish_label = is_client ? kClientLabel : kInitiatorLabel;
  finish.proofs = ProofBits(finish_label, key, finish_secret);
  const auto h3 = Hash3(h2, reply, finish);
  Prove(&finish, h3, kInitiatorLabel, finish_label, key, finish_secret);
  KV_RETURN_IF_ERROR(SendStep(stream, finish));
  KV_ASSIGN_OR_RETURN(wire::HandshakeBody accept, ReadStep(stream, wire::kHandshakeAccept));
  (void)accept;

  SessionKey rx, tx;
  if (crypto_kx_client_session_keys(rx.data(), tx.data(), eph.pk, eph.sk, reply.ephemeral) != 0) {
    return Refuse(stream, wire::ErrorCode::kUnauthenticated, "the peer's ephemeral key is invalid");
  }
  Finish(rx, tx, h3, &r);
  return r;
}

Result<HandshakeResult> HandshakeRespond(net::Stream& stream, const LinkAuth& stage_auth,
                                         const LinkAuth& client_auth) {
  InitCrypto();
  KV_ASSIGN_OR_RETURN(const wire::HandshakeBody init, ReadStep(stream, wire::kHandshakeInit));
  if (init.role > static_cast<uint8_t>(wire::Role::kClient)) {
    return Refuse(stream, wire::ErrorCode::kMalformed,
                  fmt::format("handshake role {} is unknown (0 stage, 1 client)", init.role));
  }
  HandshakeResult r;
  r.peer_role = static_cast<wire::Role>(init.role);
  const bool is_client = r.peer_role == wire::Role::kClient;
  const auto h1 = TranscriptHash({}, Bytes(init));

  Ephemeral eph;
  wire::HandshakeBody reply{};
  reply.protocol_version = wire::kProtocolVersion;
  reply.step = wire::kHandshakeReply;
  std::memcpy(reply.ephemeral, eph.pk, 32);
  if (stage_auth.key != nullptr) {
    std::memcpy(reply.node_key, stage_auth.key->public_key().data(), kPublicKeyBytes);
  }
  reply.proofs = ProofBits(kResponderLabel, stage_auth.key.get(), stage_auth.ring_secret);
  const auto h2 = TranscriptHash(h1, Bytes(reply));
  Prove(&reply, h2, kResponderLabel, kResponderLabel, stage_auth.key.get(),
        stage_auth.ring_secret);
  KV_RETURN_IF_ERROR(SendStep(stream, reply));

  KV_ASSIGN_OR_RETURN(wire::HandshakeBody finish, ReadStep(stream, wire::kHandshakeFinish));
  const auto h3 = Hash3(h2, reply, WithoutProofs(finish));
  Status checked =
      is_client ? CheckProofs(finish, h3, kInitiatorLabel, kClientLabel, client_auth.client_secret,
                              std::nullopt, nullptr, /*insecure=*/true, "client", &r.peer_key,
                              &r.peer_has_ring_secret)
                : CheckProofs(finish, h3, kInitiatorLabel, kInitiatorLabel, stage_auth.ring_secret,
                              stage_auth.peer_key, stage_auth.also_accept, stage_auth.insecure,
                              "predecessor", &r.peer_key,
                              &r.peer_has_ring_secret);
  if (!checked.ok()) return Refuse(stream, wire::ErrorCode::kUnauthenticated, checked.message());

  SessionKey rx, tx;
  if (crypto_kx_server_session_keys(rx.data(), tx.data(), eph.pk, eph.sk, init.ephemeral) != 0) {
    return Refuse(stream, wire::ErrorCode::kUnauthenticated, "the peer's ephemeral key is invalid");
  }
  wire::HandshakeBody accept{};
  accept.protocol_version = wire::kProtocolVersion;
  accept.step = wire::kHandshakeAccept;
  KV_RETURN_IF_ERROR(SendStep(stream, accept));
  Finish(rx, tx, h3, &r);
  return r;
}

}  // namespace kvasir::ring
