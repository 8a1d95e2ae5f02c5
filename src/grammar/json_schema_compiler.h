// Internal: the JSON schema compiler's state (rules written so far, $ref memo). The keyword
// dispatch is in json_schema.cpp, objects in json_schema_object.cpp.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "grammar/json_schema.h"

namespace kvasir::grammar {

using OrderedJson = nlohmann::ordered_json;

// The rules every JSON grammar shares: ws, value, object, member, array, string, char, hex,
// number, integer.
std::string GenericJsonRules(const JsonGrammarOptions& o);

class SchemaCompiler {
 public:
  SchemaCompiler(const OrderedJson& root, const JsonGrammarOptions& options)
      : root_(root), o_(options) {}
  // The grammar text (root rule "root").
  Result<std::string> Run();

 private:
  // Grammar expression for the values `schema` at `path` admits.
  Result<std::string> Body(const OrderedJson& schema, const std::string& path, int depth);
  // A rule for a subschema (named after `hint`); returns the rule name.
  Result<std::string> Sub(const OrderedJson& schema, const std::string& path,
                          const std::string& hint, int depth);
  Result<std::string> Ref(const OrderedJson& ref, const std::string& path, int depth);
  Result<std::string> Enum(const OrderedJson& schema, const std::string& path);
  Result<std::string> TypeBody(const OrderedJson& schema, const std::string& type,
                               const std::string& path, const std::string& hint, int depth);
  Result<std::string> Integer(const OrderedJson& schema, const std::string& path);
  Result<std::string> Number(const OrderedJson& schema, const std::string& path);
  Result<std::string> String(const OrderedJson& schema, const std::string& path);
  Result<std::string> Array(const OrderedJson& schema, const std::string& path,
                            const std::string& hint, int depth);
  Result<std::string> Object(const OrderedJson& schema, const std::string& path,
                             const std::string& hint, int depth);
  // Keys of JSON objects that are none of `names`, as the string contents between the quotes.
  std::string KeyOtherThan(const std::vector<std::string>& names, const std::string& hint);

  std::string Reserve(const std::string& hint);
  void SetBody(const std::string& name, std::string body);
  std::string Rule(const std::string& hint, std::string body) {
    std::string name = Reserve(hint);
    SetBody(name, std::move(body));
    return name;
  }
  Status At(const std::string& path, const std::string& what) const {
    return Error("json schema: at {}: {}", path, what);
  }

  const OrderedJson& root_;
  JsonGrammarOptions o_;
  std::vector<std::pair<std::string, std::string>> rules_;
  std::map<std::string, size_t> rule_index_;
  std::map<std::string, std::string> refs_;  // "$ref" text -> rule
};

}  // namespace kvasir::grammar
