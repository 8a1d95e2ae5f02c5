// --grammar-file and --json-schema-file: a constraint on what `generate` and `run` may write,
// applied where tokens are sampled (the ring's last stage, or the one process).
#pragma once

#include <CLI/CLI.hpp>
#include <string>

#include "base/status.h"

namespace kvasir::cli {

struct GrammarFlags {
  std::string grammar_file;  // GBNF-like grammar text (docs/GRAMMAR.md)
  std::string schema_file;   // a JSON schema, compiled to a grammar
  bool given() const { return !grammar_file.empty() || !schema_file.empty(); }
};

void AddGrammarFlags(CLI::App& app, GrammarFlags* flags);

// The grammar text the flags ask for ("" for none), parsed once here so that a mistake is reported
// before anything runs: the file, and the line or schema keyword at fault.
Result<std::string> LoadGrammar(const GrammarFlags& flags);

}  // namespace kvasir::cli
