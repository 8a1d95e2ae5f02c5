// The public entry points: JSON text with a depth check, response_format objects, and the
// grammar for any JSON object.
#include <fmt/format.h>

#include <algorithm>

#include "grammar/json_schema.h"
#include "grammar/json_schema_compiler.h"

namespace kvasir::grammar {
namespace {

// Deep nesting is refused before parsing, so that no parser recursion or destructor can be driven
// by a text of a million '['.
Status DepthCheck(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (char c : text) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return Error("json: nested deeper than {}", max_depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return Status::Ok();
}

}  // namespace

Result<nlohmann::ordered_json> ParseJsonText(std::string_view text,
                                             const JsonGrammarOptions& options) {
  KV_RETURN_IF_ERROR(DepthCheck(text, options.max_schema_depth + 8));
  auto j = nlohmann::ordered_json::parse(text, nullptr, false);
  if (j.is_discarded()) return Error("json: not valid JSON");
  return j;
}

std::string JsonObjectGrammarText(const JsonGrammarOptions& options) {
  return "root ::= object\n" + GenericJsonRules(options);
}

Result<std::string> JsonSchemaGrammarText(const nlohmann::ordered_json& schema,
                                          const JsonGrammarOptions& options) {
  return SchemaCompiler(schema, options).Run();
}

Result<std::string> ResponseFormatGrammarText(const nlohmann::ordered_json& rf,
                                              const JsonGrammarOptions& options) {
  if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
    return Error("response_format: must be an object with a string 'type'");
  }
  const std::string type = rf["type"].get<std::string>();
  auto only = [&](const nlohmann::ordered_json& j, std::initializer_list<const char*> keys,
                  const char* what) -> Status {
    for (const auto& item : j.items()) {
      const std::string& k = item.key();
      if (std::find_if(keys.begin(), keys.end(), [&](const char* s) { return k == s; }) ==
          keys.end()) {
        return Error("{}: key '{}' is not supported", what, k);
      }
    }
    return Status::Ok();
  };
  if (type == "json_object") {
    KV_RETURN_IF_ERROR(only(rf, {"type"}, "response_format"));
    return JsonObjectGrammarText(options);
  }
  if (type == "json_schema") {
    KV_RETURN_IF_ERROR(only(rf, {"type", "json_schema"}, "response_format"));
    if (!rf.contains("json_schema") || !rf["json_schema"].is_object()) {
      return Error("response_format.json_schema: missing, or not an object");
    }
    const auto& js = rf["json_schema"];
    KV_RETURN_IF_ERROR(
        only(js, {"name", "description", "schema", "strict"}, "response_format.json_schema"));
    if (!js.contains("schema")) return Error("response_format.json_schema.schema: missing");
    if (js.contains("name") && !js["name"].is_string()) {
      return Error("response_format.json_schema.name: must be a string");
    }
    if (js.contains("strict") && !js["strict"].is_boolean()) {
      return Error("response_format.json_schema.strict: must be true or false");
    }
    return JsonSchemaGrammarText(js["schema"], options);
  }
  if (type == "text") return Error("response_format: type 'text' needs no grammar");
  return Error("response_format: type '{}' is not one of json_object, json_schema, text", type);
}

Result<std::shared_ptr<const Grammar>> CompileResponseFormat(const nlohmann::ordered_json& rf,
                                                             const JsonGrammarOptions& options,
                                                             const GrammarLimits& limits) {
  JsonGrammarOptions o = options;
  o.max_repeat = std::min(o.max_repeat, limits.max_repeat);
  KV_ASSIGN_OR_RETURN(std::string text, ResponseFormatGrammarText(rf, o));
  return Grammar::Parse(text, limits);
}

}  // namespace kvasir::grammar
