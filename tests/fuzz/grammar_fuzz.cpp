// libFuzzer target: grammar text and JSON schemas from a client. The first byte picks the input
// kind (bit 0: a JSON schema or response_format, else grammar text); the rest is the text, up to
// a 0xFF byte, then bytes to match. Invariants: nothing crashes or runs away (small limits); a
// schema the compiler accepts gives grammar text that parses, unless a limit or an analysis
// (a rule that can never end) refuses it, never a syntax error; a refused byte leaves the matcher
// unchanged; a full mask equals checking each token alone.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "grammar/json_schema.h"
#include "grammar/recognizer.h"
#include "grammar/token_mask.h"

using namespace kvasir::grammar;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t cut = input.find('\xFF');
  const std::string_view text = input.substr(0, cut);
  const std::string_view bytes = cut == std::string_view::npos ? "" : input.substr(cut + 1);

  GrammarLimits limits;
  limits.max_elements = 1 << 16;
  limits.max_repeat = 2000;
  limits.max_stacks = 64;
  std::shared_ptr<const Grammar> grammar;
  if (mode & 1) {
    auto json = ParseJsonText(text);
    if (!json.ok()) return 0;
    JsonGrammarOptions options;
    options.max_repeat = limits.max_repeat;  // as CompileResponseFormat does
    auto gtext = (mode & 2) ? ResponseFormatGrammarText(*json, options)
                            : JsonSchemaGrammarText(*json, options);
    if (!gtext.ok()) return 0;
    auto g = Grammar::Parse(*gtext, limits);
    if (!g.ok()) {
      const std::string& msg = g.status().message();
      // "grammar:LINE:COL: ..." is a syntax error in text the compiler wrote: a bug.
      if (msg.size() > 8 && msg.compare(0, 8, "grammar:") == 0 && msg[8] >= '0' && msg[8] <= '9') {
        std::abort();
      }
      return 0;
    }
    grammar = *g;
  } else {
    auto g = Grammar::Parse(text, limits);
    if (!g.ok()) return 0;
    grammar = *g;
  }

  MatcherLimits matcher_limits;
  matcher_limits.max_frames = 1 << 14;
  matcher_limits.max_states = 1 << 12;
  matcher_limits.max_table_bytes = 1 << 18;
  Recognizer r(grammar, matcher_limits);
  Matcher m(&r);
  for (char c : bytes) {
    const Matcher before = m;
    if (!m.Accept(static_cast<uint8_t>(c)) && m.state() != before.state()) std::abort();
    if (m.MustEnd() && !m.CanEnd()) std::abort();
  }

  // A small vocabulary cut from the input bytes: every prefix length 1..3 at a few offsets.
  std::vector<std::string> pieces = {"{", "}", "\"", " ", "a", "0", ",", ":"};
  for (size_t i = 0; i < bytes.size() && pieces.size() < 40; i += 3) {
    pieces.emplace_back(bytes.substr(i, 1 + (i % 3)));
  }
  std::vector<TokenKind> kinds(pieces.size(), TokenKind::kText);
  kinds[0] = TokenKind::kEndOfGeneration;
  auto trie = TokenTrie::Build(pieces, kinds);
  if (!trie.ok()) std::abort();
  TokenMask mask;
  if (trie->FillMask(m, &mask).ok()) {
    for (int32_t id = 0; id < trie->n_vocab(); ++id) {
      if (mask.Test(id) != trie->Allows(m, id) && r.status().ok()) std::abort();
    }
  }
  return 0;
}
