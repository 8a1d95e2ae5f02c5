// JSON schema keywords to grammar rules: the dispatch over keywords, $ref, enum/const and the
// scalar types. Objects are in json_schema_object.cpp.
#include "grammar/json_schema.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "grammar/json_schema_compiler.h"
#include "grammar/json_schema_parts.h"

namespace kvasir::grammar {
namespace {

using json_parts::Decimal;
using json_parts::Literal;

const std::set<std::string> kAnnotations = {
    "title",   "description", "$comment", "examples",  "default", "$schema",    "$id",
    "$anchor", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions"};
const std::set<std::string> kObjectKeys = {"properties", "required", "additionalProperties"};
const std::set<std::string> kArrayKeys = {"items", "minItems", "maxItems"};
const std::set<std::string> kStringKeys = {"minLength", "maxLength", "pattern", "format"};
const std::set<std::string> kNumberKeys = {"minimum", "maximum", "exclusiveMinimum",
                                           "exclusiveMaximum"};
const std::set<std::string> kOtherKeys = {"type",  "enum",  "const", "anyOf",
                                          "oneOf", "allOf", "$ref"};
// The shared rules' names (GenericJsonRules): never given to a schema's rules.
const std::set<std::string> kSharedRules = {"ws",     "value", "object", "member", "array",
                                            "string", "char",  "hex",    "number", "integer"};
const std::vector<std::string> kTypes = {"null",   "boolean", "integer", "number",
                                         "string", "array",   "object"};

std::string Alternatives(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  std::string out = "(";
  for (size_t i = 0; i < alts.size(); ++i) out += (i ? " | " : " ") + alts[i];
  return out + " )";
}

bool TypeMatches(const OrderedJson& v, const std::string& type) {
  if (type == "null") return v.is_null();
  if (type == "boolean") return v.is_boolean();
  if (type == "string") return v.is_string();
  if (type == "array") return v.is_array();
  if (type == "object") return v.is_object();
  if (type == "number") return v.is_number();
  if (type == "integer") {
    if (v.is_number_integer()) return true;
    if (!v.is_number_float()) return false;
    const double d = v.get<double>();
    return std::isfinite(d) && std::floor(d) == d;
  }
  return false;
}

}  // namespace

std::string GenericJsonRules(const JsonGrammarOptions& o) {
  return fmt::format(
      "ws ::= ( \" \" | \"\\n\" [ \\t]{{0,{}}} )?\n"
      "value ::= object | array | string | number | \"true\" | \"false\" | \"null\"\n"
      "object ::= \"{{\" ws ( member ( \",\" ws member )* )? \"}}\"\n"
      "member ::= string ws \":\" ws value ws\n"
      "array ::= \"[\" ws ( value ws ( \",\" ws value ws )* )? \"]\"\n"
      "string ::= \"\\\"\" char* \"\\\"\"\n"
      // One character: a code point, or an escape; \\u escapes of surrogates only as a pair.
      "char ::= [^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-CeEfF] "
      "hex{{3}} "
      "| [dD] [0-7] hex{{2}} | [dD] [89abAB] hex{{2}} \"\\\\u\" [dD] [c-fC-F] hex{{2}} ) )\n"
      "hex ::= [0-9a-fA-F]\n"
      "number ::= \"-\"? ( \"0\" | [1-9] [0-9]{{0,{}}} ) ( \".\" [0-9]{{1,{}}} )? "
      "( [eE] [+\\-]? [0-9]{{1,{}}} )?\n"
      "integer ::= {}\n",
      o.max_indent, o.max_integer_digits - 1, o.max_fraction_digits, o.max_exponent_digits,
      json_parts::IntegerRange(std::nullopt, std::nullopt, o.max_integer_digits));
}

std::string SchemaCompiler::Reserve(const std::string& hint) {
  std::string base;
  for (char c : hint) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
    if (ok)
      base.push_back(c);
    else if (!base.empty() && base.back() != '-')
      base.push_back('-');
  }
  while (!base.empty() && base.back() == '-') base.pop_back();
  if (base.size() > 60) base.resize(60);
  std::string name = base;
  if (base.empty()) base = "schema";
  for (int n = 2; rule_index_.count(name) || kSharedRules.count(name) || name.empty(); ++n) {
    name = fmt::format("{}-{}", base, n);
  }
  rule_index_[name] = rules_.size();
  rules_.emplace_back(name, "");
  return name;
}

void SchemaCompiler::SetBody(const std::string& name, std::string body) {
  rules_[rule_index_.at(name)].second = std::move(body);
}

Result<std::string> SchemaCompiler::Run() {
  Reserve("root");
  KV_ASSIGN_OR_RETURN(std::string body, Body(root_, "#", 0));
  SetBody("root", std::move(body));
  std::string text;
  for (const auto& [name, rule] : rules_) text += name + " ::= " + rule + "\n";
  return text + GenericJsonRules(o_);
}

Result<std::string> SchemaCompiler::Sub(const OrderedJson& schema, const std::string& path,
                                        const std::string& hint, int depth) {
  const std::string name = Reserve(hint);
  KV_ASSIGN_OR_RETURN(std::string body, Body(schema, path, depth + 1));
  SetBody(name, std::move(body));
  return name;
}

Result<std::string> SchemaCompiler::Body(const OrderedJson& schema, const std::string& path,
                                         int depth) {
  if (depth > o_.max_schema_depth) {
    return At(path, fmt::format("schemas nested deeper than {}", o_.max_schema_depth));
  }
  if (schema.is_boolean()) {
    if (schema.get<bool>()) return std::string("value");
    return At(path, "the schema false admits no value");
  }
  if (!schema.is_object()) return At(path, "a schema must be an object or a boolean");
  std::vector<std::string> keys;  // constraining keywords, in the schema's order
  for (const auto& [key, v] : schema.items()) {
    if (kAnnotations.count(key)) continue;
    if (!kObjectKeys.count(key) && !kArrayKeys.count(key) && !kStringKeys.count(key) &&
        !kNumberKeys.count(key) && !kOtherKeys.count(key)) {
      return At(path, fmt::format("keyword '{}' is not supported", key));
    }
    keys.push_back(key);
  }
  auto alone = [&](const std::string& keyword, const std::set<std::string>& also) -> Status {
    for (const std::string& k : keys) {
      if (k != keyword && !also.count(k)) {
        return At(path, fmt::format("'{}' next to '{}' is not supported", k, keyword));
      }
    }
    return Status::Ok();
  };
  if (schema.contains("$ref")) {
    KV_RETURN_IF_ERROR(alone("$ref", {}));
    return Ref(schema["$ref"], path, depth);
  }
  for (const char* kw : {"anyOf", "oneOf"}) {
    if (!schema.contains(kw)) continue;
    KV_RETURN_IF_ERROR(alone(kw, {}));
    const OrderedJson& list = schema[kw];
    if (!list.is_array() || list.empty()) {
      return At(path, fmt::format("'{}' must be a non-empty array of schemas", kw));
    }
    std::vector<std::string> alts;
    for (size_t i = 0; i < list.size(); ++i) {
      const std::string sub = fmt::format("{}/{}/{}", path, kw, i);
      KV_ASSIGN_OR_RETURN(std::string rule, Sub(list[i], sub, sub, depth));
      alts.push_back(rule);
    }
    return Alternatives(alts);
  }
  if (schema.contains("allOf")) {
    KV_RETURN_IF_ERROR(alone("allOf", {}));
    const OrderedJson& list = schema["allOf"];
    if (!list.is_array() || list.size() != 1) {
      return At(path, "'allOf' is supported with exactly one schema");
    }
    return Body(list[0], path + "/allOf/0", depth + 1);
  }
  if (schema.contains("enum") || schema.contains("const")) return Enum(schema, path);

  std::vector<std::string> types;
  if (schema.contains("type")) {
    const OrderedJson& t = schema["type"];
    std::vector<OrderedJson> list =
        t.is_array() ? std::vector<OrderedJson>(t.begin(), t.end()) : std::vector<OrderedJson>{t};
    if (list.empty()) return At(path, "'type' is an empty list");
    for (const OrderedJson& one : list) {
      if (!one.is_string() ||
          std::find(kTypes.begin(), kTypes.end(), one.get<std::string>()) == kTypes.end()) {
        return At(path, fmt::format("'type' {} is not one of null, boolean, integer, number, "
                                    "string, array, object",
                                    one.dump()));
      }
      if (std::find(types.begin(), types.end(), one.get<std::string>()) != types.end()) {
        return At(path, fmt::format("'type' lists {} twice", one.dump()));
      }
      types.push_back(one.get<std::string>());
    }
  } else {
    // No type: the type-specific keywords say which (JSON Schema applies them only to values of
    // their type, so keywords of two types without a type would admit anything else too).
    std::vector<std::pair<std::string, const std::set<std::string>*>> groups = {
        {"object", &kObjectKeys},
        {"array", &kArrayKeys},
        {"string", &kStringKeys},
        {"number", &kNumberKeys}};
    std::vector<std::string> seen;
    for (const auto& [type, group] : groups) {
      for (const std::string& k : keys) {
        if (group->count(k)) {
          if (types.empty() || types.back() != type) types.push_back(type);
          seen.push_back(k);
          break;
        }
      }
    }
    if (types.size() > 1) {
      return At(path, fmt::format("keywords of several types ({}) without 'type'",
                                  fmt::join(seen, ", ")));
    }
    if (types.empty()) return std::string("value");
  }
  std::vector<std::string> alts;
  for (const std::string& type : types) {
    KV_ASSIGN_OR_RETURN(std::string body, TypeBody(schema, type, path, path, depth));
    alts.push_back(body);
  }
  return Alternatives(alts);
}

Result<std::string> SchemaCompiler::Ref(const OrderedJson& ref, const std::string& path,
                                        int depth) {
  if (!ref.is_string()) return At(path, "'$ref' must be a string");
  const std::string text = ref.get<std::string>();
  if (auto it = refs_.find(text); it != refs_.end()) return it->second;
  if (text == "#") return std::string("root");
  std::string defs, name;
  for (const char* prefix : {"#/$defs/", "#/definitions/"}) {
    if (text.starts_with(prefix)) {
      defs = std::string(prefix).substr(2, std::string(prefix).size() - 3);
      name = text.substr(std::string(prefix).size());
    }
  }
  if (defs.empty() || name.empty() || name.find('/') != std::string::npos) {
    return At(path, fmt::format("'$ref' {}: only #, #/$defs/NAME and #/definitions/NAME are "
                                "supported",
                                ref.dump()));
  }
  std::string key;  // JSON pointer unescaping
  for (size_t i = 0; i < name.size(); ++i) {
    if (name[i] == '~' && i + 1 < name.size() && (name[i + 1] == '0' || name[i + 1] == '1')) {
      key.push_back(name[++i] == '0' ? '~' : '/');
    } else {
      key.push_back(name[i]);
    }
  }
  if (!root_.is_object() || !root_.contains(defs) || !root_[defs].is_object() ||
      !root_[defs].contains(key)) {
    return At(path, fmt::format("'$ref' {} names a schema that does not exist", ref.dump()));
  }
  const std::string rule = Reserve("def-" + key);
  refs_[text] = rule;  // before compiling it: recursive schemas refer back to the rule
  KV_ASSIGN_OR_RETURN(std::string body, Body(root_[defs][key], text, depth + 1));
  SetBody(rule, std::move(body));
  return rule;
}

Result<std::string> SchemaCompiler::Enum(const OrderedJson& schema, const std::string& path) {
  if (schema.contains("enum") && schema.contains("const")) {
    return At(path, "'enum' and 'const' together are not supported");
  }
  const char* kw = schema.contains("enum") ? "enum" : "const";
  for (const auto& [key, v] : schema.items()) {
    if (!kAnnotations.count(key) && key != kw && key != "type") {
      return At(path, fmt::format("'{}' next to '{}' is not supported", key, kw));
    }
  }
  std::vector<OrderedJson> values;
  if (std::string(kw) == "const") {
    values.push_back(schema["const"]);
  } else {
    if (!schema["enum"].is_array() || schema["enum"].empty()) {
      return At(path, "'enum' must be a non-empty array");
    }
    values.assign(schema["enum"].begin(), schema["enum"].end());
  }
  std::vector<std::string> types;
  if (schema.contains("type")) {
    const OrderedJson& t = schema["type"];
    for (const OrderedJson& one : t.is_array() ? t : OrderedJson::array({t})) {
      if (!one.is_string()) return At(path, "'type' must be a string or a list of strings");
      types.push_back(one.get<std::string>());
    }
  }
  std::vector<std::string> alts;
  for (const OrderedJson& v : values) {
    if (!types.empty() && std::none_of(types.begin(), types.end(),
                                       [&](const std::string& t) { return TypeMatches(v, t); })) {
      continue;  // a value of another type can never validate
    }
    std::string text;
    try {
      text = v.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::strict);
    } catch (const nlohmann::ordered_json::exception& e) {
      return At(path, fmt::format("'{}' holds a string that is not valid UTF-8", kw));
    }
    if (std::find(alts.begin(), alts.end(), Literal(text)) == alts.end()) {
      alts.push_back(Literal(text));
    }
  }
  if (alts.empty()) return At(path, fmt::format("no '{}' value has the schema's 'type'", kw));
  return Alternatives(alts);
}

Result<std::string> SchemaCompiler::TypeBody(const OrderedJson& schema, const std::string& type,
                                             const std::string& path, const std::string& hint,
                                             int depth) {
  if (type == "null") return std::string("\"null\"");
  if (type == "boolean") return std::string("( \"true\" | \"false\" )");
  if (type == "integer") return Integer(schema, path);
  if (type == "number") return Number(schema, path);
  if (type == "string") return String(schema, path);
  if (type == "array") return Array(schema, path, hint, depth);
  return Object(schema, path, hint, depth);
}

}  // namespace kvasir::grammar
