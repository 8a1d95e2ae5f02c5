// JSON output constraints compiled to grammars: OpenAI's `response_format` ({"type":
// "json_object"} or {"type": "json_schema", "json_schema": {"schema": ...}}) and JSON schemas.
// docs/GRAMMAR.md lists every supported keyword and how it is compiled; anything else is refused
// with the keyword and its JSON path ("json schema: at #/properties/age: keyword 'multipleOf' is
// not supported"), never ignored.
#pragma once

#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "base/status.h"
#include "grammar/grammar.h"

namespace kvasir::grammar {

struct JsonGrammarOptions {
  // Whitespace between tokens is bounded: nothing, one space, or a newline followed by up to
  // this many spaces or tabs (indentation), so a model cannot loop on blanks.
  int max_indent = 40;
  // Digits a generated number may have in its integer part, fraction and exponent.
  int max_integer_digits = 20;
  int max_fraction_digits = 20;
  int max_exponent_digits = 2;  // so that every number is a finite double
  // Schema objects nested deeper than this are refused (the compiler recurses over them).
  int max_schema_depth = 64;
  // The largest count a schema may ask for (maxLength, maxItems, a pattern's {m,n}); at most the
  // GrammarLimits::max_repeat the grammar is parsed with (CompileResponseFormat takes the smaller).
  uint32_t max_repeat = 100000;
};

// Parses schema or response_format text, refusing JSON nested deeper than
// options.max_schema_depth + 8 before the parser sees it. Object members keep their order.
Result<nlohmann::ordered_json> ParseJsonText(std::string_view text,
                                             const JsonGrammarOptions& options = {});

// Grammar text for any JSON object (the rules value, object, array, string, number, ws).
std::string JsonObjectGrammarText(const JsonGrammarOptions& options = {});
// Grammar text for the values `schema` admits (root rule "root").
Result<std::string> JsonSchemaGrammarText(const nlohmann::ordered_json& schema,
                                          const JsonGrammarOptions& options = {});
// Grammar text for an OpenAI response_format object; {"type": "text"} is refused (no grammar).
Result<std::string> ResponseFormatGrammarText(const nlohmann::ordered_json& response_format,
                                              const JsonGrammarOptions& options = {});
// ResponseFormatGrammarText, parsed.
Result<std::shared_ptr<const Grammar>> CompileResponseFormat(
    const nlohmann::ordered_json& response_format, const JsonGrammarOptions& options = {},
    const GrammarLimits& limits = {});

}  // namespace kvasir::grammar
