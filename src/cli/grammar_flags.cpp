#include "cli/grammar_flags.h"

#include <fmt/format.h>

#include <fstream>
#include <sstream>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "ring/tail_sampler.h"
#include "ring/wire.h"

namespace kvasir::cli {
namespace {

Result<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error("{}: cannot be read", path);
  std::ostringstream text;
  text << in.rdbuf();
  if (text.str().size() > wire::kMaxGrammarBytes) {
    return Error("{}: {} bytes, over the limit of {} KiB for a grammar", path, text.str().size(),
                 wire::kMaxGrammarBytes >> 10);
  }
  return text.str();
}

}  // namespace

void AddGrammarFlags(CLI::App& app, GrammarFlags* flags) {
  auto* g = app.add_option("--grammar-file", flags->grammar_file,
                           "constrain the output to this grammar (docs/GRAMMAR.md)");
  app.add_option("--json-schema-file", flags->schema_file,
                 "constrain the output to JSON valid against this schema")
      ->excludes(g);
}

Result<std::string> LoadGrammar(const GrammarFlags& flags) {
  if (!flags.given()) return std::string();
  std::string text;
  if (!flags.grammar_file.empty()) {
    KV_ASSIGN_OR_RETURN(text, ReadText(flags.grammar_file));
  } else {
    KV_ASSIGN_OR_RETURN(std::string schema_text, ReadText(flags.schema_file));
    auto schema = grammar::ParseJsonText(schema_text);
    if (!schema.ok()) return Error("{}: {}", flags.schema_file, schema.status().message());
    auto compiled = grammar::JsonSchemaGrammarText(*schema);
    if (!compiled.ok()) return Error("{}: {}", flags.schema_file, compiled.status().message());
    if (compiled->size() > wire::kMaxGrammarBytes) {
      return Error("{}: the schema compiles to a grammar of {} KiB, over the limit of {} KiB",
                   flags.schema_file, compiled->size() >> 10, wire::kMaxGrammarBytes >> 10);
    }
    text = std::move(compiled).value();
  }
  if (text.empty()) return Error("{}: the grammar is empty", flags.grammar_file);
  auto parsed = grammar::Grammar::Parse(text, ring::TailGrammarLimits());
  if (!parsed.ok()) {
    return Error("{}: {}", flags.grammar_file.empty() ? flags.schema_file : flags.grammar_file,
                 parsed.status().message());
  }
  return text;
}

}  // namespace kvasir::cli
