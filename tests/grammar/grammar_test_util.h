// Helpers for the grammar tests: parsing that fails the test on error, matching whole strings,
// the Qwen2 vocabulary as pieces, random strings from a grammar, and a shortest completion.
#pragma once

#include <gtest/gtest.h>

#include <deque>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/recognizer.h"
#include "grammar/token_mask.h"

namespace kvasir::grammar::testing {

inline std::shared_ptr<const Grammar> MustParse(std::string_view text) {
  auto g = Grammar::Parse(text);
  EXPECT_TRUE(g.ok()) << g.status().message() << "\n" << text;
  return g.ok() ? *g : nullptr;
}

// Whether the whole of `input` is a complete match of `g`.
inline bool FullMatch(const std::shared_ptr<const Grammar>& g, std::string_view input) {
  if (!g) return false;
  Recognizer r(g);
  Matcher m(&r);
  return m.AcceptBytes(input) && m.CanEnd();
}

// Whether `input` is a prefix the grammar accepts (possibly incomplete).
inline bool PrefixMatch(const std::shared_ptr<const Grammar>& g, std::string_view input) {
  if (!g) return false;
  Recognizer r(g);
  Matcher m(&r);
  return m.AcceptBytes(input);
}

// The Qwen2 vocabulary (151,936 ids) as the pieces and kinds a sampler would hand the trie.
struct Vocab {
  std::vector<std::string> pieces;
  std::vector<TokenKind> kinds;
};
// Reads `path` (a vocabulary GGUF); adds a test failure and returns an empty vocabulary on error.
Vocab LoadVocab(const std::string& path);

// A random string of the grammar's language, by expanding rules at random; past `depth` the
// alternative with the shortest derivation is taken so that expansion ends.
std::string RandomString(const Grammar& g, std::mt19937_64* rng, int depth = 12);

// The shortest bytes that complete the match from `m` (breadth-first over states), or nullopt
// when none is found within `max_states` states.
std::optional<std::string> ShortestCompletion(Matcher m, size_t max_states = 200000);

}  // namespace kvasir::grammar::testing
