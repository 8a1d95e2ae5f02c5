// The link's trust layer on its own: node keys, the handshake's proofs, the encrypted stream and
// the link's liveness and bounded queues. Known-answer vectors come from outside this code base:
// RFC 8032 (Ed25519 test 1), RFC 4231 (HMAC-SHA256 test 2); the BLAKE2b and proof values were
// computed once with Python's hashlib, hmac and the `cryptography` package:
//   hashlib.blake2b(b"kvasir link v2" + b"abc", digest_size=32)
//   hashlib.blake2b(h1 + b"def", digest_size=32); blake2b(h2, digest_size=32, key=bytes(range(32)))
//   Ed25519PrivateKey.from_private_bytes(seed).sign(b"kvasir link v2 responder" + h2)
//   hmac.new(b"ring-secret-0123456789", b"kvasir link v2 responder" + h2, hashlib.sha256)
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <future>
#include <thread>

#include "base/secret_file.h"
#include "net/stream.h"
#include "ring/handshake.h"
#include "ring/link.h"
#include "ring/node_key.h"
#include "ring/secure_stream.h"
#include "test_assets.h"

namespace kvasir::ring {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<uint8_t> FromHex(std::string_view hex) {
  std::vector<uint8_t> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    out[i] = static_cast<uint8_t>(std::stoi(std::string(hex.substr(2 * i, 2)), nullptr, 16));
  }
  return out;
}

std::string ToHex(std::span<const uint8_t> b) {
  std::string s;
  for (uint8_t x : b) s += fmt::format("{:02x}", x);
  return s;
}

std::span<const uint8_t> Text(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

// Two connected loopback TCP streams.
struct Pair {
  std::unique_ptr<net::Stream> a, b;
};
Pair Connected() {
  auto l = net::Listener::Bind("127.0.0.1", 0);
  EXPECT_TRUE(l.ok());
  auto accepted = std::async(std::launch::async, [&] { return l->Accept(); });
  auto dialed = net::DialTcp("127.0.0.1", l->port(), 2000);
  EXPECT_TRUE(dialed.ok());
  auto got = accepted.get();
  EXPECT_TRUE(got.ok());
  return {std::move(dialed).value(), std::move(got).value()};
}

std::shared_ptr<const NodeKey> NewKey() {
  return std::make_shared<const NodeKey>(NodeKey::Generate());
}

struct Outcome {
  Result<HandshakeResult> initiator = Status::Error("unset");
  Result<HandshakeResult> responder = Status::Error("unset");
};

Outcome Shake(wire::Role role, const LinkAuth& initiator, const LinkAuth& stage_auth,
            const LinkAuth& client_auth = {}) {
  Pair p = Connected();
  Outcome o;
  auto r = std::async(std::launch::async,
                      [&] { return HandshakeRespond(*p.b, stage_auth, client_auth); });
  o.initiator = HandshakeInitiate(*p.a, role, initiator);
  if (!o.initiator.ok()) p.a->Shutdown();
  o.responder = r.get();
  return o;
}

TEST(TrustTest, KnownAnswerVectors) {
  // RFC 8032, section 7.1, test 1.
  auto seed = FromHex("9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60");
  const NodeKey k = NodeKey::FromSeed(std::span<const uint8_t, 32>(seed.data(), 32));
  EXPECT_EQ(PublicKeyHex(k.public_key()),
            "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a");
  EXPECT_EQ(ToHex(k.Sign({})),
            "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61"
            "e39701cf9b46bd25bf5f0595bbe24655141438e7a100b");
  // RFC 4231, test case 2.
  EXPECT_EQ(ToHex(HmacSha256("Jefe", Text("what do ya want for nothing?"))),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  // The transcript chain, the key derivation and the proofs over them.
  const auto h1 = TranscriptHash({}, Text("abc"));
  EXPECT_EQ(ToHex(h1), "7e0f3ea5c6c28bd2236e679ca5c8f69b19ecc9a6b80f5c2a0ea692805d773f9d");
  const auto h2 = TranscriptHash(h1, Text("def"));
  EXPECT_EQ(ToHex(h2), "fa73bbb694d9b3f7e2b5f809ec4fe5ea3397377a099ac7aa78dcb0a41db5aca7");
  SessionKey kx;
  for (int i = 0; i < 32; ++i) kx[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(ToHex(DeriveKey(kx, h2)),
            "bdc47183e75011d88c19f5b494424329638e9e1ad5a81cb18f286fb6834b6fb4");
  const auto proof = ProofInput("kvasir link v2 responder", h2);
  EXPECT_EQ(ToHex(k.Sign(proof)),
            "f248b23a221a5371ae55f3e920b9dd2688d3a67341a44a2a08f5e5fbe483faee087a4791f5ab755e312"
            "eab71e6efdd185f134254addfa5d2697d2e509426a906");
  EXPECT_EQ(ToHex(HmacSha256("ring-secret-0123456789", proof)),
            "d516dcd54e974f555bc2915d6ae88689caa2332af58ddbb99a0bfbd70b35bd02");
  Signature sig = k.Sign(proof);
  EXPECT_TRUE(VerifySignature(k.public_key(), proof, sig));
  sig[7] ^= 1;
  EXPECT_FALSE(VerifySignature(k.public_key(), proof, sig));
}

TEST(TrustTest, KeyFilesAreCreatedPrivateAndReloaded) {
  testing::TempDir dir;
  const std::string path = dir.File("state/kvasir/node.key");
  bool created = false;
  auto k1 = NodeKey::LoadOrCreate(path, &created);
  ASSERT_TRUE(k1.ok()) << k1.status().message();
  EXPECT_TRUE(created);
  struct stat st {};
  ASSERT_EQ(stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  auto k2 = NodeKey::LoadOrCreate(path, &created);
  ASSERT_TRUE(k2.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(k1->public_key(), k2->public_key());
  // Many processes (threads here) creating one key at once all end with the same key.
  const std::string race = dir.File("race.key");
  std::vector<std::future<Result<NodeKey>>> all;
  for (int i = 0; i < 8; ++i) {
    all.push_back(std::async(std::launch::async, [&] { return NodeKey::LoadOrCreate(race); }));
  }
  std::optional<PublicKey> first;
  for (auto& f : all) {
    auto k = f.get();
    ASSERT_TRUE(k.ok()) << k.status().message();
    if (!first) first = k->public_key();
    EXPECT_EQ(*first, k->public_key());
  }
  // A key others may read, a damaged file and a wrong format are refused by name.
  chmod(path.c_str(), 0644);
  auto loose = NodeKey::Load(path);
  ASSERT_FALSE(loose.ok());
  EXPECT_NE(loose.status().message().find("chmod 600"), std::string::npos);
  const std::string bad = dir.File("bad.key");
  {
    std::FILE* f = std::fopen(bad.c_str(), "w");
    std::fputs("kvasir-node-key-v1\nseed zz\n", f);
    std::fclose(f);
  }
  chmod(bad.c_str(), 0600);
  auto damaged = NodeKey::Load(bad);
  ASSERT_FALSE(damaged.ok());
  EXPECT_NE(damaged.status().message().find("seed"), std::string::npos);
  EXPECT_FALSE(ParsePublicKey("abc").ok());
  EXPECT_FALSE(ParsePublicKey(std::string(64, 'g')).ok());
  auto parsed = ParsePublicKey(PublicKeyHex(k1->public_key()));
  ASSERT_TRUE(parsed.ok());
  EXPECT_EQ(*parsed, k1->public_key());
}

TEST(TrustTest, SecretFiles) {
  testing::TempDir dir;
  const std::string path = dir.File("ring.secret");
  ASSERT_TRUE(WriteNewSecretFile(path).ok());
  EXPECT_FALSE(WriteNewSecretFile(path).ok());  // never overwritten
  auto s = ReadSecretFile(path, "ring secret");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->size(), 64u);
  const std::string short_file = dir.File("short");
  std::FILE* f = std::fopen(short_file.c_str(), "w");
  std::fputs("tiny\n", f);
  std::fclose(f);
  auto refused = ReadSecretFile(short_file, "ring secret");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("at least 16 bytes"), std::string::npos);
}

TEST(TrustTest, RingSecretHandshakeAgreesOnKeys) {
  LinkAuth a, b;
  a.key = NewKey();
  b.key = NewKey();
  a.ring_secret = b.ring_secret = "the-ring-secret-0123456789";
  Outcome o = Shake(wire::Role::kStage, a, b);
  ASSERT_TRUE(o.initiator.ok()) << o.initiator.status().message();
  ASSERT_TRUE(o.responder.ok()) << o.responder.status().message();
  EXPECT_EQ(o.initiator->tx, o.responder->rx);
  EXPECT_EQ(o.initiator->rx, o.responder->tx);
  EXPECT_NE(o.initiator->tx, o.initiator->rx);
  EXPECT_TRUE(o.initiator->peer_has_ring_secret);
  EXPECT_TRUE(o.responder->peer_has_ring_secret);
  EXPECT_EQ(o.initiator->peer_key, b.key->public_key());
  EXPECT_EQ(o.responder->peer_key, a.key->public_key());
  EXPECT_EQ(o.responder->peer_role, wire::Role::kStage);
  // A second handshake between the same nodes gets fresh keys.
  Outcome again = Shake(wire::Role::kStage, a, b);
  ASSERT_TRUE(again.initiator.ok());
  EXPECT_NE(again.initiator->tx, o.initiator->tx);
}

TEST(TrustTest, WrongSecretOrKeyIsRefusedWithAReason) {
  LinkAuth a, b;
  a.key = NewKey();
  b.key = NewKey();
  a.ring_secret = "the-ring-secret-0123456789";
  b.ring_secret = "another-secret-0123456789";
  Outcome o = Shake(wire::Role::kStage, a, b);
  ASSERT_FALSE(o.initiator.ok());
  EXPECT_EQ(o.initiator.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(o.initiator.status().message().find("different ring secret"), std::string::npos)
      << o.initiator.status().message();
  ASSERT_FALSE(o.responder.ok());
  EXPECT_NE(o.responder.status().message().find("different ring secret"), std::string::npos)
      << o.responder.status().message();

  // Node keys from a manifest: the predecessor must be exactly the listed node.
  LinkAuth pred, succ;
  pred.key = NewKey();
  succ.key = NewKey();
  const auto impostor = NewKey();
  succ.peer_key = impostor->public_key();
  pred.peer_key = succ.key->public_key();
  Outcome k = Shake(wire::Role::kStage, pred, succ);
  ASSERT_FALSE(k.responder.ok());
  EXPECT_EQ(k.responder.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(k.responder.status().message().find("expected node " + ShortKey(impostor->public_key())),
            std::string::npos)
      << k.responder.status().message();
  ASSERT_FALSE(k.initiator.ok());
  EXPECT_NE(k.initiator.status().message().find("refused"), std::string::npos)
      << k.initiator.status().message();
  succ.peer_key = pred.key->public_key();
  Outcome good = Shake(wire::Role::kStage, pred, succ);
  EXPECT_TRUE(good.initiator.ok()) << good.initiator.status().message();
  EXPECT_TRUE(good.responder.ok()) << good.responder.status().message();

  // A peer without any proof, against a responder that demands one.
  LinkAuth nobody;
  nobody.insecure = true;
  Outcome none = Shake(wire::Role::kStage, nobody, b);
  ASSERT_FALSE(none.responder.ok());
  EXPECT_NE(none.responder.status().message().find("does not prove the ring secret"),
            std::string::npos)
      << none.responder.status().message();
}

TEST(TrustTest, ClientsAreAnonymousUnlessASecretIsDemanded) {
  LinkAuth head;
  head.key = NewKey();
  head.ring_secret = "the-ring-secret-0123456789";
  LinkAuth client;
  client.peer_key = head.key->public_key();
  Outcome o = Shake(wire::Role::kClient, client, head);
  ASSERT_TRUE(o.initiator.ok()) << o.initiator.status().message();
  ASSERT_TRUE(o.responder.ok()) << o.responder.status().message();
  EXPECT_EQ(o.responder->peer_role, wire::Role::kClient);
  EXPECT_FALSE(o.responder->peer_key.has_value());
  EXPECT_EQ(o.responder->peer_desc, "anonymous client");

  // A client that expects another head refuses before sending anything else.
  LinkAuth wrong_head;
  wrong_head.peer_key = NewKey()->public_key();
  Outcome w = Shake(wire::Role::kClient, wrong_head, head);
  ASSERT_FALSE(w.initiator.ok());
  EXPECT_EQ(w.initiator.status().code(), StatusCode::kUnauthenticated);

  // --client-key-file on the head: the bearer secret is required and checked.
  LinkAuth demand;
  demand.client_secret = "client-bearer-secret-0123";
  Outcome missing = Shake(wire::Role::kClient, client, head, demand);
  ASSERT_FALSE(missing.responder.ok());
  EXPECT_NE(missing.responder.status().message().find("client secret"), std::string::npos);
  LinkAuth bad = client;
  bad.client_secret = "not-the-bearer-secret-999";
  Outcome wrong = Shake(wire::Role::kClient, bad, head, demand);
  ASSERT_FALSE(wrong.responder.ok());
  LinkAuth ok = client;
  ok.client_secret = demand.client_secret;
  Outcome right = Shake(wire::Role::kClient, ok, head, demand);
  EXPECT_TRUE(right.responder.ok()) << right.responder.status().message();
}

TEST(TrustTest, GarbageAndOldPeersGetAClearError) {
  LinkAuth stage;
  stage.key = NewKey();
  stage.ring_secret = "the-ring-secret-0123456789";
  Pair p = Connected();
  auto r = std::async(std::launch::async, [&] { return HandshakeRespond(*p.b, stage, {}); });
  wire::Hello hello{};
  hello.protocol_version = 1;
  ASSERT_TRUE(p.a->WriteAll(EncodeMessage(HelloMsg{hello})).ok());
  auto res = r.get();
  ASSERT_FALSE(res.ok());
  EXPECT_NE(res.status().message().find("protocol 1"), std::string::npos);
  // The peer is told why in a frame it can read.
  Link l(std::move(p.a), "old peer");
  auto reply = l.Receive();
  ASSERT_TRUE(reply.ok()) << reply.status().message();
  ASSERT_TRUE(std::holds_alternative<ErrorMsg>(*reply));
  EXPECT_EQ(std::get<ErrorMsg>(*reply).code, wire::ErrorCode::kVersion);
}

TEST(TrustTest, SecureStreamCarriesBytesAndRejectsTampering) {
  SessionKey k1{}, k2{};
  k1[0] = 1;
  k2[0] = 2;
  {
    Pair p = Connected();
    SecureStream a(std::move(p.a), k1, k2, 1 << 20);
    SecureStream b(std::move(p.b), k2, k1, 1 << 20);
    std::vector<uint8_t> big(300000);
    for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7);
    ASSERT_TRUE(a.WriteAll(Text("hello")).ok());
    ASSERT_TRUE(a.WriteAll(big).ok());
    std::vector<uint8_t> got;
    uint8_t buf[4096];
    while (got.size() < 5 + big.size()) {
      auto n = b.ReadSome(buf);
      ASSERT_TRUE(n.ok()) << n.status().message();
      ASSERT_GT(*n, 0u);
      got.insert(got.end(), buf, buf + *n);
    }
    EXPECT_EQ(std::string(got.begin(), got.begin() + 5), "hello");
    EXPECT_TRUE(std::equal(big.begin(), big.end(), got.begin() + 5));
    a.Shutdown();
    auto eof = b.ReadSome(buf);
    ASSERT_TRUE(eof.ok());
    EXPECT_EQ(*eof, 0u);
  }
  // A bit flipped on the wire, a record replayed, a length over the limit: all end the stream.
  auto capture = [&](const std::vector<std::vector<uint8_t>>& plain) {
    // Seal records with a SecureStream whose inner stream is a loopback pair, and return the
    // ciphertext bytes as they went over the wire.
    Pair p = Connected();
    SecureStream a(std::move(p.a), k1, k2, 1 << 20);
    for (const auto& m : plain) EXPECT_TRUE(a.WriteAll(m).ok());
    a.Shutdown();
    std::vector<uint8_t> wire;
    uint8_t buf[4096];
    while (true) {
      auto n = p.b->ReadSome(buf);
      if (!n.ok() || *n == 0) break;
      wire.insert(wire.end(), buf, buf + *n);
    }
    return wire;
  };
  auto open = [&](const std::vector<uint8_t>& wire) -> Status {
    Pair p = Connected();
    EXPECT_TRUE(p.a->WriteAll(wire).ok());
    p.a->Shutdown();
    SecureStream b(std::move(p.b), k2, k1, 1 << 20);
    uint8_t buf[4096];
    while (true) {
      auto n = b.ReadSome(buf);
      if (!n.ok()) return n.status();
      if (*n == 0) return Status::Ok();
    }
  };
  const std::vector<uint8_t> m1(100, 1), m2(200, 2);
  const auto wire = capture({m1, m2});
  EXPECT_TRUE(open(wire).ok());
  auto flipped = wire;
  flipped[24 + 4 + 10] ^= 0x40;
  Status s = open(flipped);
  EXPECT_EQ(s.code(), StatusCode::kUnauthenticated) << s.message();
  // Replay: the first record again after itself.
  const size_t rec1 = 4 + 100 + crypto_secretstream_xchacha20poly1305_ABYTES;
  // [header (24), record 1, record 1 again]
  std::vector<uint8_t> replayed(24 + 2 * rec1);
  std::copy(wire.begin(), wire.begin() + 24 + rec1, replayed.begin());
  std::copy(wire.begin() + 24, wire.begin() + 24 + rec1, replayed.begin() + 24 + rec1);
  s = open(replayed);
  EXPECT_EQ(s.code(), StatusCode::kUnauthenticated) << s.message();
  auto huge = wire;
  const uint32_t len = 0x7FFFFFFF;
  std::memcpy(huge.data() + 24, &len, 4);
  s = open(huge);
  EXPECT_EQ(s.code(), StatusCode::kTooLarge) << s.message();
}

TEST(TrustTest, LinkKeepaliveAndLiveness) {
  LinkOptions o;
  o.timeout_ms = 400;
  {
    // Two live links stay up well past the timeout: keepalives flow both ways.
    Pair p = Connected();
    Link a(std::move(p.a), "a", o), b(std::move(p.b), "b", o);
    auto got = std::async(std::launch::async, [&] { return b.Receive(); });
    ASSERT_EQ(got.wait_for(std::chrono::milliseconds(1500)), std::future_status::timeout)
        << got.get().status().message();
    ASSERT_TRUE(a.Send(PingMsg{false, {42, 0}}).ok());
    auto m = got.get();
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(std::get<PingMsg>(*m).body.nonce, 42u);
  }
  {
    // A peer that sends nothing at all (frozen) is declared down after the timeout.
    Pair p = Connected();
    Link a(std::move(p.a), "a", o);
    const auto t0 = Clock::now();
    auto m = a.Receive();
    const double s = std::chrono::duration<double>(Clock::now() - t0).count();
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kTimeout) << m.status().message();
    EXPECT_NE(m.status().message().find("link timeout"), std::string::npos);
    EXPECT_GE(s, 0.35);
    EXPECT_LT(s, 10.0);  // generous: the point is that it ends
  }
  {
    // A receive deadline ends a wait even while keepalives arrive.
    Pair p = Connected();
    Link a(std::move(p.a), "a", o), b(std::move(p.b), "b", o);
    b.SetReceiveDeadline(300);
    auto m = b.Receive();
    ASSERT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), StatusCode::kTimeout);
  }
}

TEST(TrustTest, LinkDropsAPeerThatDoesNotRead) {
  LinkOptions o;
  o.timeout_ms = 0;  // no liveness: only the queue bound acts
  o.max_queued_bytes = 1 << 20;
  o.drop_when_full = true;
  Pair p = Connected();  // p.b is never read
  Link a(std::move(p.a), "client", o);
  std::vector<float> rows(16384, 1.0f);
  const HiddenMsg h = MakeHidden(1, 0, 4, 4096, wire::Dtype::kF32, 0, rows);
  Status last = Status::Ok();
  const auto t0 = Clock::now();
  for (int i = 0; i < 10000 && last.ok(); ++i) last = a.Send(h);
  ASSERT_FALSE(last.ok()) << "a reader that never reads must not absorb unbounded data";
  EXPECT_EQ(last.code(), StatusCode::kTooLarge) << last.message();
  EXPECT_NE(last.message().find("not reading"), std::string::npos) << last.message();
  EXPECT_TRUE(a.closed());
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 30.0);
  // What the link holds stays within its bound (plus the frame being written).
  EXPECT_LE(a.queued_bytes(), (1u << 20) + 65536 + 64);
}

TEST(TrustTest, EncodingLimitsAreErrorsNotAborts) {
  Pair p = Connected();
  Link a(std::move(p.a), "a");
  StatsMsg st;
  st.records.resize(wire::kMaxStatsRecords + 1);
  Status s = a.Send(st);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kTooLarge);
  HiddenMsg h;
  h.session = 1;
  h.n_tokens = 4096;
  h.n_embd = 8192;
  h.dtype = wire::Dtype::kF32;
  h.data.resize(size_t{4096} * 8192 * 4);
  s = a.Send(h);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("exceeds"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace kvasir::ring
