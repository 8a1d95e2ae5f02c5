#include "relay/edge_token.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "test_assets.h"

namespace kvasir::relay {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

TEST(EdgeTokenTest, EdgeIds) {
  EXPECT_TRUE(ValidEdgeId("ring1-r0-r1"));
  EXPECT_TRUE(ValidEdgeId(std::string(64, 'a')));
  EXPECT_FALSE(ValidEdgeId(""));
  EXPECT_FALSE(ValidEdgeId(std::string(65, 'a')));
  EXPECT_FALSE(ValidEdgeId("a/b"));
  EXPECT_FALSE(ValidEdgeId("a b"));
  EXPECT_FALSE(ValidEdgeId("..%2f"));
}

TEST(EdgeTokenTest, TokensAreBoundToSecretEdgeAndRole) {
  const std::string secret = "0123456789abcdef0123";
  const EdgeToken t = MakeEdgeToken(Bytes(secret), "e1", Role::kPredecessorSide);
  EXPECT_TRUE(TokensEqual(t, MakeEdgeToken(Bytes(secret), "e1", Role::kPredecessorSide)));
  EXPECT_FALSE(TokensEqual(t, MakeEdgeToken(Bytes(secret), "e1", Role::kSuccessorSide)));
  EXPECT_FALSE(TokensEqual(t, MakeEdgeToken(Bytes(secret), "e2", Role::kPredecessorSide)));
  EXPECT_FALSE(TokensEqual(t, MakeEdgeToken(Bytes(std::string("another secret 123")), "e1",
                                            Role::kPredecessorSide)));
  // "e1" + role 0x01 must not collide with "e" + "1\x01..." style concatenations.
  EXPECT_FALSE(TokensEqual(MakeEdgeToken(Bytes(secret), "ab", Role::kPredecessorSide),
                           MakeEdgeToken(Bytes(secret), "a", Role::kPredecessorSide)));
  const std::string hello = EdgeHello(Bytes(secret), "e1", Role::kSuccessorSide);
  ASSERT_EQ(hello.size(), kHelloBytes);
  EXPECT_EQ(static_cast<uint8_t>(hello[0]), 0x02);
  EXPECT_TRUE(TokensEqual(Bytes(hello.substr(1)),
                          MakeEdgeToken(Bytes(secret), "e1", Role::kSuccessorSide)));
}

std::string Hex(std::span<const uint8_t> b) {
  static const char* kDigits = "0123456789abcdef";
  std::string out;
  for (uint8_t c : b) {
    out.push_back(kDigits[c >> 4]);
    out.push_back(kDigits[c & 15]);
  }
  return out;
}

// Known answers, computed outside this code base, once, with two independent tools over the same
// message ("kvasir-relay-v1" 0x00 <edge id> 0x00 <role byte>, docs/RELAY.md):
//   printf 'kvasir-relay-v1\x00e1\x00\x01' | openssl dgst -sha256 -hmac '0123456789abcdef0123'
//   python3 -c "import hmac,hashlib; print(hmac.new(b'0123456789abcdef0123',
//               b'kvasir-relay-v1\0e1\0\x01', hashlib.sha256).hexdigest())"
// (OpenSSL 3 and Python 3.11 gave the same digests for every row.)
TEST(EdgeTokenTest, KnownAnswers) {
  struct Kat {
    std::string secret, edge;
    Role role;
    const char* hmac_sha256;
  };
  const Kat kats[] = {
      {"0123456789abcdef0123", "e1", Role::kPredecessorSide,
       "47a71bf44f61c6cdbd4995e86eb06cc5e0e59cae4e2728b84d560ecfa06218f0"},
      {"0123456789abcdef0123", "e1", Role::kSuccessorSide,
       "ded8bd62b4027c76f6eeba0b7cd3d5b7346e7e833e29d66d2868c02e0c1ed552"},
      {"a ring secret of 32 bytes.......", "ring1-r0-r1", Role::kPredecessorSide,
       "a4c99c16d6b43801bcd232f4500e15b953aee0fe454e014990f55773f2eb398d"},
      {"0123456789abcdef0123", std::string(64, 'a'), Role::kSuccessorSide,
       "f9b3a430d3b012dc9ac7df121724e2b4109760972174576c61e9e5d500baf446"},
  };
  for (const Kat& k : kats) {
    SCOPED_TRACE(k.edge);
    EXPECT_EQ(Hex(MakeEdgeToken(Bytes(k.secret), k.edge, k.role)), k.hmac_sha256);
    const std::string hello = EdgeHello(Bytes(k.secret), k.edge, k.role);
    EXPECT_EQ(Hex(Bytes(hello)), fmt::format("{:02x}{}", static_cast<int>(k.role), k.hmac_sha256));
  }
  // Without a secret the hello is the role byte and 32 zero bytes.
  EXPECT_EQ(EdgeHello({}, "e1", Role::kSuccessorSide), "\x02" + std::string(32, '\0'));
}

TEST(EdgeTokenTest, HellosAreChecked) {
  const std::string secret = "0123456789abcdef0123";
  const std::string good = EdgeHello(Bytes(secret), "e1", Role::kSuccessorSide);
  auto r = CheckEdgeHello(Bytes(secret), "e1", Bytes(good), true);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(*r, Role::kSuccessorSide);
  const auto why = [&](const std::string& msg, bool binary, const std::string& edge = "e1") {
    auto c = CheckEdgeHello(Bytes(secret), edge, Bytes(msg), binary);
    return c.ok() ? std::string("accepted") : c.status().message();
  };
  EXPECT_THAT(why(good, false), ::testing::HasSubstr("bad preamble: a text first message"));
  EXPECT_THAT(why(good.substr(0, 32), true), ::testing::HasSubstr("of 32 bytes (it must be 33)"));
  EXPECT_THAT(why(good + "x", true), ::testing::HasSubstr("of 34 bytes"));
  EXPECT_THAT(why("", true), ::testing::HasSubstr("of 0 bytes"));
  std::string bad_role = good;
  bad_role[0] = 0x07;
  EXPECT_THAT(why(bad_role, true), ::testing::HasSubstr("role byte 0x07"));
  EXPECT_THAT(why(good, true, "e2"), ::testing::HasSubstr("bad token for edge e2"));
  EXPECT_EQ(CheckEdgeHello(Bytes(secret), "e2", Bytes(good), true).status().code(),
            StatusCode::kUnauthenticated);
  EXPECT_EQ(CheckEdgeHello(Bytes(secret), "e1", Bytes(bad_role), true).status().code(),
            StatusCode::kInvalidInput);
  // A relay without a secret takes any token, but still only a well-formed hello.
  EXPECT_TRUE(CheckEdgeHello({}, "e2", Bytes(good), true).ok());
  EXPECT_FALSE(CheckEdgeHello({}, "e2", Bytes(bad_role), true).ok());
}

TEST(EdgeTokenTest, EdgePaths) {
  EXPECT_EQ(ParseEdgePath("/edge/ring1-r0-r1").value(), "ring1-r0-r1");
  EXPECT_THAT(ParseEdgePath("/edges/a").status().message(),
              ::testing::HasSubstr("/edge/<edge-id>"));
  EXPECT_THAT(ParseEdgePath("/edge/").status().message(), ::testing::HasSubstr("not an edge id"));
  EXPECT_FALSE(ParseEdgePath("/edge/a/b").ok());
  EXPECT_FALSE(ParseEdgePath("/edge/a?x=1").ok());
  EXPECT_FALSE(ParseEdgePath("edge/a").ok());
  EXPECT_FALSE(ParseEdgePath("").ok());
  EXPECT_FALSE(ParseEdgePath("/edge/" + std::string(65, 'a')).ok());
}

TEST(EdgeTokenTest, SecretFiles) {
  testing::TempDir dir;
  std::ofstream(dir.File("ok")) << "0123456789abcdef\n";
  auto s = ReadSecretFile(dir.File("ok"));
  ASSERT_TRUE(s.ok()) << s.status().message();
  EXPECT_EQ(*s, "0123456789abcdef");
  std::ofstream(dir.File("short")) << "tooshort\n";
  EXPECT_THAT(ReadSecretFile(dir.File("short")).status().message(),
              ::testing::HasSubstr("at least 16 bytes (got 8)"));
  EXPECT_THAT(ReadSecretFile(dir.File("missing")).status().message(),
              ::testing::HasSubstr("cannot read the ring secret"));
}

}  // namespace
}  // namespace kvasir::relay
