#include "serve/tool_grammar.h"

#include <fmt/format.h>

#include "base/check.h"
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

}  // namespace

Result<std::string> ToolCallGrammarText(ChatFamily family, const ToolsRequest& tools) {
  const ToolStyle style = ToolStyleFor(family);
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
