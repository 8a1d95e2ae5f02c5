// Cost per sampled token of a grammar constraint on the Qwen2 vocabulary (151,936 tokens):
//
//   KVASIR_ASSETS=../shared build/bin/grammar_bench --benchmark_repetitions=3
//       --benchmark_report_aggregates_only=true
//
// Decode/* walk a real JSON document token by token (the Qwen2 tokenizer's split of it) with one
// fresh recognizer, as a generation does: FastPath checks only the next token (what a sampler
// does when the model's own draw is allowed), FullMask computes the whole allowed set at every
// token (the worst case: every draw refused). Both report the time per document and tokens per
// second. MaskAt/* time one full mask at a fixed point inside the document: Warm on a recognizer
// that has computed it before (its transitions and character runs memoised), Cold on a fresh
// recognizer each time (everything computed anew).
// Two grammars: any JSON object (response_format json_object), and a schema with typed
// properties, an enum and an array.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "grammar/json_schema.h"
#include "grammar/recognizer.h"
#include "grammar/token_mask.h"
#include "tokenizer/tokenizer.h"

namespace kvasir::grammar {
namespace {

constexpr char kSchema[] = R"({"type": "object", "properties": {
  "name": {"type": "string", "maxLength": 40},
  "age": {"type": "integer", "minimum": 0, "maximum": 150},
  "email": {"type": "string", "format": "email"},
  "role": {"enum": ["admin", "editor", "viewer"]},
  "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
  "score": {"type": "number", "minimum": 0, "maximum": 100},
  "active": {"type": "boolean"}},
  "required": ["name", "age", "role", "tags", "active"], "additionalProperties": false})";

// A document each grammar admits, as a model would write it.
constexpr char kDocument[] = R"({
  "name": "Ada Lovelace, Countess of Lovelace",
  "age": 36,
  "email": "ada.lovelace@analytical-engine.org",
  "role": "editor",
  "tags": ["mathematics", "poetry", "Bernoulli numbers", "注释"],
  "score": 99.5,
  "active": true
})";

struct Fixture {
  std::unique_ptr<Tokenizer> tokenizer;
  std::unique_ptr<TokenTrie> trie;
  std::shared_ptr<const Grammar> json_object, schema;
  std::vector<int32_t> doc_tokens;
  double trie_build_ms = 0;
  bool ok = false;

  Fixture() {
    const char* env = std::getenv("KVASIR_ASSETS");
    const std::string assets = env && *env ? env : "../shared";  // run from the repository root
    const std::string path = assets + "/vocab/ggml-vocab-qwen2.gguf";
    auto file = GgufFile::Open(path);
    if (!file.ok()) {
      Fail(file.status());
      return;
    }
    auto tok = Tokenizer::FromGguf(file->header(), path);
    if (!tok.ok()) {
      Fail(tok.status());
      return;
    }
    tokenizer = std::move(*tok);
    std::vector<std::string> pieces;
    std::vector<TokenKind> kinds;
    for (int32_t id = 0; id < tokenizer->n_vocab(); ++id) {
      const TokenAttr a = tokenizer->Attr(id);
      const bool control =
          a == TokenAttr::kControl || a == TokenAttr::kUnknown || a == TokenAttr::kUnused;
      kinds.push_back(tokenizer->IsEog(id) ? TokenKind::kEndOfGeneration
                      : control            ? TokenKind::kControl
                                           : TokenKind::kText);
      pieces.push_back(tokenizer->TokenToPiece(id, false));
    }
    const auto t0 = std::chrono::steady_clock::now();
    auto t = TokenTrie::Build(pieces, kinds);
    trie_build_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!t.ok()) {
      Fail(t.status());
      return;
    }
    trie = std::make_unique<TokenTrie>(std::move(*t));
    auto g1 = Grammar::Parse(JsonObjectGrammarText());
    if (!g1.ok()) {
      Fail(g1.status());
      return;
    }
    json_object = *g1;
    auto schema_json = ParseJsonText(kSchema);
    if (!schema_json.ok()) {
      Fail(schema_json.status());
      return;
    }
    auto text = JsonSchemaGrammarText(*schema_json);
    if (!text.ok()) {
      Fail(text.status());
      return;
    }
    auto g2 = Grammar::Parse(*text);
    if (!g2.ok()) {
      Fail(g2.status());
      return;
    }
    schema = *g2;
    doc_tokens = tokenizer->Encode(kDocument, false);
    ok = true;
  }
  void Fail(const Status& s) { std::fprintf(stderr, "grammar_bench: %s\n", s.message().c_str()); }
};

Fixture& F() {
  static Fixture f;
  return f;
}

std::shared_ptr<const Grammar> Pick(int which) { return which == 0 ? F().json_object : F().schema; }

void Decode(benchmark::State& state, bool full) {
  if (!F().ok) return state.SkipWithError("no vocabulary (set KVASIR_ASSETS)");
  const auto grammar = Pick(static_cast<int>(state.range(0)));
  TokenMask mask;
  size_t allowed = 0, memory = 0;
  for (auto _ : state) {
    Recognizer r(grammar);
    Matcher m(&r);
    for (int32_t id : F().doc_tokens) {
      if (full) {
        if (!F().trie->FillMask(m, &mask).ok() || !mask.Test(id)) {
          return state.SkipWithError("the document is not admitted");
        }
        allowed += mask.Count();
      } else if (!F().trie->Allows(m, id)) {
        return state.SkipWithError("the document is not admitted");
      }
      F().trie->Accept(&m, id);
    }
    memory = r.MemoryBytes();
  }
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(F().doc_tokens.size()));
  state.counters["tokens"] = static_cast<double>(F().doc_tokens.size());
  state.counters["recognizer_KiB"] = static_cast<double>(memory) / 1024;
  state.counters["trie_nodes"] = static_cast<double>(F().trie->node_count());
  state.counters["trie_build_ms"] = F().trie_build_ms;
  if (full) {
    state.counters["allowed/token"] =
        static_cast<double>(allowed) /
        static_cast<double>(state.iterations() * F().doc_tokens.size());
  }
}

void BM_DecodeFastPath(benchmark::State& state) { Decode(state, false); }
void BM_DecodeFullMask(benchmark::State& state) { Decode(state, true); }
BENCHMARK(BM_DecodeFastPath)->ArgName("schema")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecodeFullMask)->ArgName("schema")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);

// Points inside kDocument: the number of its bytes already written.
const std::vector<std::pair<const char*, size_t>>& Points() {
  static const std::vector<std::pair<const char*, size_t>> points = [] {
    const std::string doc = kDocument;
    return std::vector<std::pair<const char*, size_t>>{
        {"start", 0},
        {"key", doc.find("\"name\"") + 1},
        {"in_string", doc.find("Lovelace,")},
        // 14 characters before the name's maxLength: longer tokens are refused one by one.
        {"near_max_length", doc.find("Lovelace\"")},
        {"in_integer", doc.find("36") + 1},
        {"in_email", doc.find("@analytical")},
        {"in_enum", doc.find("editor") + 2},
        {"in_array", doc.find("\"poetry\"") - 1},
        {"in_number", doc.find("99.") + 3},
        {"end", doc.size()},
    };
  }();
  return points;
}

void MaskAt(benchmark::State& state, bool warm) {
  if (!F().ok) return state.SkipWithError("no vocabulary (set KVASIR_ASSETS)");
  const auto grammar = Pick(static_cast<int>(state.range(0)));
  const auto& [name, bytes] = Points()[static_cast<size_t>(state.range(1))];
  state.SetLabel(name);
  const std::string prefix = std::string(kDocument).substr(0, bytes);
  TokenMask mask;
  auto r = std::make_unique<Recognizer>(grammar);
  Matcher m(r.get());
  if (!m.AcceptBytes(prefix)) return state.SkipWithError("prefix not admitted");
  if (warm && !F().trie->FillMask(m, &mask).ok()) return state.SkipWithError("mask failed");
  for (auto _ : state) {
    if (!warm) {
      state.PauseTiming();
      r = std::make_unique<Recognizer>(grammar);
      m = Matcher(r.get());
      m.AcceptBytes(prefix);
      state.ResumeTiming();
    }
    if (!F().trie->FillMask(m, &mask).ok()) return state.SkipWithError("mask failed");
  }
  state.counters["allowed"] = static_cast<double>(mask.Count());
}

void PointArgs(benchmark::internal::Benchmark* b) {
  b->ArgNames({"schema", "point"});
  for (int g = 0; g < 2; ++g) {
    for (size_t p = 0; p < Points().size(); ++p) b->Args({g, static_cast<int64_t>(p)});
  }
}
void BM_MaskAtWarm(benchmark::State& state) { MaskAt(state, true); }
void BM_MaskAtCold(benchmark::State& state) { MaskAt(state, false); }
BENCHMARK(BM_MaskAtWarm)->Apply(PointArgs)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_MaskAtCold)->Apply(PointArgs)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace kvasir::grammar

BENCHMARK_MAIN();
