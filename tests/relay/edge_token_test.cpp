#include "relay/edge_token.h"

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
