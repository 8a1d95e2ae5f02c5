// Drawing first and masking only on a refusal gives exactly the masked distribution.
#include "grammar/constrained_draw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "grammar_test_util.h"

namespace kvasir::grammar {
namespace {

TEST(ConstrainedDraw, FollowsTheMaskedDistributionExactly) {
  // Tokens "a".."f"; the grammar allows b, d and e. p(A) = 0.1 + 0.3 + 0.05 = 0.45.
  const std::vector<std::string> pieces = {"a", "b", "c", "d", "e", "f"};
  const std::vector<TokenKind> kinds(6, TokenKind::kText);
  auto trie = TokenTrie::Build(pieces, kinds);
  ASSERT_TRUE(trie.ok());
  auto g = testing::MustParse("root ::= [bde]");
  Recognizer r(g);
  const Matcher m(&r);
  const std::vector<float> p = {0.2f, 0.1f, 0.25f, 0.3f, 0.05f, 0.1f};
  const double pa = 0.45;
  std::mt19937_64 rng(1234);
  TokenMask scratch;
  const int n = 200000;
  std::vector<int> count(6, 0);
  int masked = 0;
  for (int i = 0; i < n; ++i) {
    auto d = DrawConstrained(p, *trie, m, &rng, &scratch);
    ASSERT_TRUE(d.ok()) << d.status().message();
    ++count[d->token];
    masked += d->used_mask;
  }
  for (int t = 0; t < 6; ++t) {
    const bool allowed = t == 1 || t == 3 || t == 4;
    if (!allowed) {
      EXPECT_EQ(count[t], 0) << t;
      continue;
    }
    const double q = p[t] / pa;
    const double sigma = std::sqrt(n * q * (1 - q));
    EXPECT_NEAR(count[t], n * q, 5 * sigma) << "token " << t;
  }
  // The full mask is needed exactly when the first draw is refused: probability 1 - p(A).
  const double sigma = std::sqrt(n * pa * (1 - pa));
  EXPECT_NEAR(masked, n * (1 - pa), 5 * sigma);
}

TEST(ConstrainedDraw, RefusesWeightsThatCannotBeDrawn) {
  const std::vector<std::string> pieces = {"a", "b"};
  const std::vector<TokenKind> kinds(2, TokenKind::kText);
  auto trie = TokenTrie::Build(pieces, kinds);
  ASSERT_TRUE(trie.ok());
  auto g = testing::MustParse("root ::= \"b\"");
  Recognizer r(g);
  const Matcher m(&r);
  std::mt19937_64 rng(1);
  TokenMask scratch;
  auto d = DrawConstrained(std::vector<float>{1.0f, 0.0f}, *trie, m, &rng, &scratch);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(),
            "constrained draw: none of the 1 tokens the grammar allows has a positive weight");
  d = DrawConstrained(std::vector<float>{1.0f}, *trie, m, &rng, &scratch);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), "constrained draw: 1 weights for a vocabulary of 2");
  d = DrawConstrained(std::vector<float>{NAN, 1.0f}, *trie, m, &rng, &scratch);
  ASSERT_FALSE(d.ok());
  d = DrawConstrained(std::vector<float>{-1.0f, 1.0f}, *trie, m, &rng, &scratch);
  ASSERT_FALSE(d.ok());
}

}  // namespace
}  // namespace kvasir::grammar
