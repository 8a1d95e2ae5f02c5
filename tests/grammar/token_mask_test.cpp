// Token masks: the trie walk gives exactly the tokens whose bytes the grammar accepts, on a hand
// vocabulary and on the real 151,936-token Qwen2 vocabulary.
#include "grammar/token_mask.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar_test_util.h"
#include "test_assets.h"

namespace kvasir::grammar {
namespace {

using testing::MustParse;

constexpr char kQwen2Vocab[] = "vocab/ggml-vocab-qwen2.gguf";

struct HandVocab {
  std::vector<std::string> pieces = {"{",     "}",     "\"",   "a",        "ab",
                                     "\"a",   "\xC3",  "\xA9", "\xC3\xA9", "",
                                     "<eos>", "<ctl>", "a\"}", "ab",       " "};
  std::vector<TokenKind> kinds = std::vector<TokenKind>(15, TokenKind::kText);
  HandVocab() {
    kinds[10] = TokenKind::kEndOfGeneration;
    kinds[11] = TokenKind::kControl;
  }
};

std::vector<int32_t> Allowed(const TokenTrie& trie, const Matcher& m) {
  TokenMask mask;
  Status s = trie.FillMask(m, &mask);
  EXPECT_TRUE(s.ok()) << s.message();
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < trie.n_vocab(); ++id) {
    if (mask.Test(id)) ids.push_back(id);
  }
  return ids;
}

// The mask must equal checking every token on its own.
void ExpectMaskEqualsOneByOne(const TokenTrie& trie, const Matcher& m, const std::string& where) {
  TokenMask mask;
  ASSERT_TRUE(trie.FillMask(m, &mask).ok());
  size_t allowed = 0;
  for (int32_t id = 0; id < trie.n_vocab(); ++id) {
    const bool one = trie.Allows(m, id);
    ASSERT_EQ(mask.Test(id), one) << "after " << ::testing::PrintToString(where) << ": token " << id
                                  << " " << ::testing::PrintToString(trie.piece(id));
    allowed += one;
  }
  EXPECT_EQ(mask.Count(), allowed);
}

TEST(TokenMask, HandVocabularyFollowsTheGrammarByteByByte) {
  HandVocab v;
  auto trie = TokenTrie::Build(v.pieces, v.kinds);
  ASSERT_TRUE(trie.ok()) << trie.status().message();
  auto g = MustParse("root ::= \"{\" \"\\\"\" [a\\u00e9]* \"\\\"\" \"}\"");
  Recognizer r(g);
  Matcher m(&r);
  EXPECT_EQ(Allowed(*trie, m), (std::vector<int32_t>{0}));
  ASSERT_TRUE(trie->Accept(&m, 0));
  EXPECT_EQ(Allowed(*trie, m), (std::vector<int32_t>{2, 5}));
  ASSERT_TRUE(trie->Accept(&m, 2));
  // Inside the string: the quote, a, a"}, é whole, and é's first byte alone (not "ab").
  EXPECT_EQ(Allowed(*trie, m), (std::vector<int32_t>{2, 3, 6, 8, 12}));
  Matcher split = m;
  ASSERT_TRUE(trie->Accept(&split, 6));  // a token ending inside a character
  EXPECT_EQ(Allowed(*trie, split), (std::vector<int32_t>{7}));
  ASSERT_TRUE(trie->Accept(&split, 7));
  ASSERT_TRUE(trie->Accept(&split, 12));
  // Complete: only the end-of-generation token; control and empty tokens never.
  EXPECT_EQ(Allowed(*trie, split), (std::vector<int32_t>{10}));
  EXPECT_FALSE(trie->Allows(split, 11));
  EXPECT_FALSE(trie->Allows(split, 9));
  EXPECT_FALSE(trie->Allows(split, -1));
  EXPECT_FALSE(trie->Allows(split, 15));
  for (const char* prefix : {"", "{", "{\"", "{\"a", "{\"\xC3", "{\"\xC3\xA9\"", "{\"\"}"}) {
    Matcher p(&r);
    ASSERT_TRUE(p.AcceptBytes(prefix));
    ExpectMaskEqualsOneByOne(*trie, p, prefix);
  }
}

TEST(TokenMask, EndOfGenerationOnlyWhereTheGrammarMayEnd) {
  HandVocab v;
  auto trie = TokenTrie::Build(v.pieces, v.kinds);
  ASSERT_TRUE(trie.ok());
  auto g = MustParse("root ::= \"a\"+");
  Recognizer r(g);
  Matcher m(&r);
  EXPECT_FALSE(trie->Allows(m, 10));
  ASSERT_TRUE(trie->Accept(&m, 3));
  EXPECT_TRUE(trie->Allows(m, 10));
  EXPECT_TRUE(trie->Allows(m, 3));
  const Recognizer::State before = m.state();
  EXPECT_TRUE(trie->Accept(&m, 10));  // the end leaves the state as it was
  EXPECT_EQ(m.state(), before);
}

TEST(TokenMask, BuildRefusesBadInput) {
  std::vector<std::string> pieces = {"a", "b"};
  std::vector<TokenKind> kinds = {TokenKind::kText};
  auto t = TokenTrie::Build(pieces, kinds);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "token trie: 2 pieces but 1 kinds");
  pieces = {std::string(TokenTrie::kMaxPieceBytes + 1, 'x')};
  t = TokenTrie::Build(pieces, kinds);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().message(), "token trie: token 0 is 4097 bytes long, over the limit of 4096");
}

TEST(TokenMask, QwenVocabularyMaskEqualsEveryTokenCheckedAlone) {
  KV_REQUIRE_ASSET(kQwen2Vocab);
  const testing::Vocab v = testing::LoadVocab(::kvasir::testing::AssetPath(kQwen2Vocab));
  ASSERT_EQ(v.pieces.size(), 151936u);
  auto trie = TokenTrie::Build(v.pieces, v.kinds);
  ASSERT_TRUE(trie.ok()) << trie.status().message();
  EXPECT_GT(trie->node_count(), 100000u);
  auto g = MustParse(JsonObjectGrammarText());
  Recognizer r(g);
  // Points inside a document, including one inside a three-byte character (U+4F60).
  for (const char* prefix :
       {"", "{", "{\"", "{\"na", "{\"name\": ", "{\"name\": \"Jo", "{\"name\": \"\xE4\xBD",
        "{\"a\": [1, 2", "{\"a\": 1.5e", "{\"a\": {\"b\": null}\n  ", "{\"a\": true}"}) {
    Matcher m(&r);
    ASSERT_TRUE(m.AcceptBytes(prefix)) << prefix;
    ExpectMaskEqualsOneByOne(*trie, m, prefix);
  }
  // A bounded string (runs of characters end at maxLength), with the masks asked in an order
  // that makes the recognizer learn its runs a little at a time; a pattern; an enum.
  auto schema = ParseJsonText(R"({"type": "object", "properties": {
      "s": {"type": "string", "maxLength": 12}, "p": {"type": "string", "pattern": "^[a-f]{2,}$"},
      "e": {"enum": ["alpha", "beta"]}}, "required": ["s", "p", "e"]})");
  ASSERT_TRUE(schema.ok());
  auto schema_text = JsonSchemaGrammarText(*schema);
  ASSERT_TRUE(schema_text.ok()) << schema_text.status().message();
  auto sg = MustParse(*schema_text);
  Recognizer sr(sg);
  for (const char* prefix :
       {"{\"s\": \"abcdefghijk", "{\"s\": \"", "{\"s\": \"abc\xC3", "{\"s\": \"abcdefghijkl",
        "{\"s\": \"a b", "{\"s\": \"\", \"p\": \"ab", "{\"s\": \"\", \"p\": \"abcdef",
        "{\"s\": \"\", \"p\": \"ab\", \"e\": \"al"}) {
    Matcher m(&sr);
    ASSERT_TRUE(m.AcceptBytes(prefix)) << prefix;
    ExpectMaskEqualsOneByOne(*trie, m, prefix);
  }
  // At the end only end-of-generation tokens remain.
  Matcher done(&r);
  ASSERT_TRUE(done.AcceptBytes("{}"));
  TokenMask mask;
  ASSERT_TRUE(trie->FillMask(done, &mask).ok());
  size_t eog = 0;
  for (int32_t id = 0; id < trie->n_vocab(); ++id)
    eog += v.kinds[id] == TokenKind::kEndOfGeneration;
  EXPECT_GT(eog, 0u);
  EXPECT_EQ(mask.Count(), eog);
}

}  // namespace
}  // namespace kvasir::grammar
