#include "serve/tool_grammar.h"

#include <fmt/format.h>

#include <algorithm>

#include "base/check.h"
#include "base/json_escape.h"
#include "grammar/json_schema.h"
#include "ring/tail_sampler.h"
#include "ring/wire.h"
#include "serve/tool_prompt.h"

namespace kvasir::serve {
namespace {

using OrderedJson = nlohmann::ordered_json;

// Moves tool `i`'s schema under the combined schema's $defs: its own $defs become "t<i>-NAME"
// and its "$ref"s are rewritten to match ("#" becomes "t<i>", the tool's schema itself).
class RefRewriter {
 public:
  RefRewriter(size_t i, OrderedJson* defs) : prefix_(fmt::format("t{}", i)), defs_(defs) {}

  OrderedJson Run(const OrderedJson& schema) {
    OrderedJson out = Walk(schema, /*root=*/true);
    if (root_referenced_) (*defs_)[prefix_] = out;
    return out;
  }

 private:
  OrderedJson Walk(const OrderedJson& v, bool root) {
    if (v.is_array()) {
      OrderedJson out = OrderedJson::array();
      for (const auto& x : v) out.push_back(Walk(x, false));
      return out;
    }
    if (!v.is_object()) return v;
    OrderedJson out = OrderedJson::object();
    for (const auto& [key, x] : v.items()) {
      if (root && (key == "$defs" || key == "definitions") && x.is_object()) {
        for (const auto& [name, def] : x.items()) {
          (*defs_)[prefix_ + "-" + name] = Walk(def, false);
        }
      } else if (key == "$ref" && x.is_string()) {
        out[key] = Ref(x.get<std::string>());
      } else {
        out[key] = Walk(x, false);
      }
    }
    return out;
  }

  std::string Ref(const std::string& ref) {
    if (ref == "#") {
      root_referenced_ = true;
      return "#/$defs/" + prefix_;
    }
    for (const std::string_view p : {"#/$defs/", "#/definitions/"}) {
      if (ref.starts_with(p)) return "#/$defs/" + prefix_ + "-" + ref.substr(p.size());
    }
    return ref;  // refused by the compiler, naming it
  }

  std::string prefix_;
  OrderedJson* defs_;
  bool root_referenced_ = false;
};

// A name for the call rule that no rule of `text` has.
std::string FreeRuleName(const std::string& text) {
  std::string name = "tool-call";
  for (int n = 1;
       text.find("\n" + name + " ::=") != std::string::npos || text.starts_with(name + " ::=");
       ++n) {
    name = fmt::format("tool-call-{}", n);
  }
  return name;
}

// `text` as a grammar literal.
std::string Literal(std::string_view text) { return "\"" + JsonEscape(text) + "\""; }

// A string parameter's value: text without "</" (without "<" when its minLength or maxLength
// bound its characters), or
// one of its enum or const. A pattern or format is refused: the value is raw text, not JSON.
Result<std::string> XmlStringValue(const std::string& param, const OrderedJson& schema) {
  for (const char* key : {"pattern", "format"}) {
    if (schema.contains(key)) {
      return Error("parameter '{}': '{}' cannot be enforced on a qwen3.5 call's text value", param,
                   key);
    }
  }
  std::vector<std::string> options;
  if (schema.contains("const") && schema["const"].is_string()) {
    options.push_back(schema["const"].get<std::string>());
  } else if (schema.contains("enum") && schema["enum"].is_array()) {
    for (const auto& v : schema["enum"]) {
      if (v.is_string()) options.push_back(v.get<std::string>());
    }
  }
  if (options.empty()) {
    auto bound = [&](const char* key) -> Result<int64_t> {
      if (!schema.contains(key)) return int64_t{-1};
      const OrderedJson& v = schema[key];
      if (!v.is_number_unsigned() || v.get<uint64_t>() > 100000) {
        return Error("parameter '{}': '{}' must be an integer from 0 to 100000", param, key);
      }
      return static_cast<int64_t>(v.get<uint64_t>());
    };
    KV_ASSIGN_OR_RETURN(const int64_t lo, bound("minLength"));
    KV_ASSIGN_OR_RETURN(const int64_t hi, bound("maxLength"));
    if (lo < 0 && hi < 0) return std::string("xml-char*");
    if (hi >= 0 && lo > hi) return Error("parameter '{}': minLength over maxLength", param);
    // Counted in characters, so no "<" at all (a "<" not before "/" would take two).
    return hi < 0 ? fmt::format("[^<]{{{},}}", std::max<int64_t>(lo, 0))
                  : fmt::format("[^<]{{{},{}}}", std::max<int64_t>(lo, 0), hi);
  }
  std::string out = "(";
  for (size_t i = 0; i < options.size(); ++i) out += (i > 0 ? " | " : " ") + Literal(options[i]);
  return out + " )";
}

// A schema of strings only: "type": "string", or no type and a string enum or const.
bool IsStringSchema(const OrderedJson& schema) {
  if (!schema.is_object()) return false;
  if (schema.contains("type")) return schema["type"] == "string";
  if (schema.contains("const")) return schema["const"].is_string();
  if (!schema.contains("enum") || !schema["enum"].is_array() || schema["enum"].empty())
    return false;
  return std::all_of(schema["enum"].begin(), schema["enum"].end(),
                     [](const OrderedJson& v) { return v.is_string(); });
}

// Qwen3.5's XML-style calls: each tool a rule "<function=NAME>\n" then its properties in the
// schema's order (the required ones always, the others optionally), each value a string as
// written or the JSON its schema admits, compiled by the JSON schema compiler as $defs.
Result<std::string> XmlCallGrammarText(const ToolsRequest& tools) {
  OrderedJson defs = OrderedJson::object();
  OrderedJson refs = OrderedJson::array();
  std::vector<std::string> functions;
  std::string rules;
  for (size_t i = 0; i < tools.tools.size(); ++i) {
    const ToolDef& t = tools.tools[i];
    if (tools.choice.kind == ToolChoice::Kind::kNamed && t.name != tools.choice.name) continue;
    const OrderedJson params = RefRewriter(i, &defs).Run(t.parameters);
    std::string body = Literal("<function=" + t.name + ">\n");
    if (params.is_object() && params.contains("properties") && params["properties"].is_object()) {
      const OrderedJson required =
          params.contains("required") ? params["required"] : OrderedJson::array();
      size_t k = 0;
      for (const auto& [name, schema] : params["properties"].items()) {
        std::string value;
        if (IsStringSchema(schema)) {
          KV_ASSIGN_OR_RETURN(value, XmlStringValue(name, schema));
        } else {
          const std::string def = fmt::format("xml-t{}-p{}", i, k);
          defs[def] = schema;
          refs.push_back({{"$ref", "#/$defs/" + def}});
          value = "def-" + def;
        }
        ++k;
        const std::string param =
            Literal("<parameter=" + name + ">\n") + " " + value + " " + Literal("\n</parameter>\n");
        const bool needed = required.is_array() &&
                            std::find(required.begin(), required.end(), name) != required.end();
        body += needed ? " " + param : " ( " + param + " )?";
      }
    }
    body += " " + Literal("</function>");
    functions.push_back(fmt::format("xml-f{}", i));
    rules += fmt::format("xml-f{} ::= {}\n", i, body);
  }
  if (functions.empty()) return Error("no tool named '{}'", tools.choice.name);
  std::string json;
  if (!refs.empty()) {
    OrderedJson schema = {{"anyOf", std::move(refs)}, {"$defs", std::move(defs)}};
    KV_ASSIGN_OR_RETURN(json, grammar::JsonSchemaGrammarText(schema));
    // Its root (the anyOf) is replaced by the calls; every value rule must have its $def's name.
    size_t at = 0;
    if (!json.starts_with("root ::=")) {
      at = json.find("\nroot ::=");
      KV_CHECK(at != std::string::npos, "the schema grammar has no root rule");
      ++at;
    }
    json.erase(at, json.find('\n', at) + 1 - at);
    for (const auto& [name, unused] : schema["$defs"].items()) {
      if (!name.starts_with("xml-")) continue;
      const std::string rule = "def-" + name + " ::=";
      if (!json.starts_with(rule) && json.find("\n" + rule) == std::string::npos) {
        return Error("tool parameter schema {} did not compile to its own rule", name);
      }
    }
  }
  std::string call = "xml-call ::= ";
  for (size_t i = 0; i < functions.size(); ++i) call += (i > 0 ? " | " : "") + functions[i];
  const int more = tools.parallel ? kMaxParallelCalls - 1 : 0;
  std::string root = R"(root ::= "<tool_call>\n" xml-call "\n</tool_call>")";
  if (more > 0) {
    root += fmt::format(R"( ( "\n<tool_call>\n" xml-call "\n</tool_call>" ){{0,{}}})", more);
  }
  return root + "\n" + call + "\n" + rules + "xml-char ::= [^<] | \"<\" [^/]\n" + json;
}

}  // namespace

Result<std::string> ToolCallGrammarText(ChatFamily family, const ToolsRequest& tools) {
  const ToolStyle style = ToolStyleFor(family);
  if (style == ToolStyle::kQwenXml) return XmlCallGrammarText(tools);
  const char* args_key = style == ToolStyle::kLlama3 ? "parameters" : "arguments";
  OrderedJson defs = OrderedJson::object();
  OrderedJson calls = OrderedJson::array();
  for (size_t i = 0; i < tools.tools.size(); ++i) {
    const ToolDef& t = tools.tools[i];
    if (tools.choice.kind == ToolChoice::Kind::kNamed && t.name != tools.choice.name) continue;
    OrderedJson props = OrderedJson::object();
    props["name"] = {{"const", t.name}};
    props[args_key] = RefRewriter(i, &defs).Run(t.parameters);
    calls.push_back({{"type", "object"},
                     {"properties", props},
                     {"required", {"name", args_key}},
                     {"additionalProperties", false}});
  }
  if (calls.empty()) return Error("no tool named '{}'", tools.choice.name);
  OrderedJson schema = calls.size() == 1 ? calls[0] : OrderedJson{{"anyOf", std::move(calls)}};
  if (!defs.empty()) schema["$defs"] = std::move(defs);
  KV_ASSIGN_OR_RETURN(std::string text, grammar::JsonSchemaGrammarText(schema));
  // The schema's root becomes the call rule; nothing refers to "root" (every "#" was rewritten).
  const std::string call = FreeRuleName(text);
  size_t at = 0;
  if (!text.starts_with("root ::=")) {
    at = text.find("\nroot ::=");
    KV_CHECK(at != std::string::npos, "the schema grammar has no root rule");
    ++at;
  }
  text.replace(at, 4, call);
  const int more = tools.parallel ? kMaxParallelCalls - 1 : 0;
  std::string root;
  switch (style) {
    case ToolStyle::kHermes:
      root = fmt::format(R"("<tool_call>\n" {0} "\n</tool_call>")", call);
      if (more > 0)
        root += fmt::format(R"( ( "\n<tool_call>\n" {} "\n</tool_call>" ){{0,{}}})", call, more);
      break;
    case ToolStyle::kLlama3:
      root = call;
      if (more > 0) root += fmt::format(R"( ( "; " {} ){{0,{}}})", call, more);
      break;
    case ToolStyle::kQwenXml:  // XmlCallGrammarText
      break;
    case ToolStyle::kMistral:
      root = fmt::format(R"("[" {})", call);
      if (more > 0) root += fmt::format(R"( ( ", " {} ){{0,{}}})", call, more);
      root += R"( "]")";
      break;
  }
  return "root ::= " + root + "\n" + text;
}

bool ApplyToolGrammar(ChatFamily family, CompletionRequest* r, ApiError* e) {
  if (!r->tools.forced()) return true;
  auto text = ToolCallGrammarText(family, r->tools);
  if (text.ok() && text->size() > wire::kMaxGrammarBytes) {
    text = Error("the tools compile to a grammar of {} KiB, over the limit of {} KiB",
                 text->size() >> 10, wire::kMaxGrammarBytes >> 10);
  }
  if (text.ok()) {
    auto g = grammar::Grammar::Parse(*text, ring::TailGrammarLimits());
    if (!g.ok()) text = g.status();
  }
  if (!text.ok()) {
    *e = BadRequest("invalid_value", "tools", "'tools': " + text.status().message());
    return false;
  }
  r->response_format.kind = ResponseFormat::Kind::kGrammar;
  r->response_format.grammar = std::move(text).value();
  return true;
}

}  // namespace kvasir::serve
