// JSON schema objects: properties in the schema's order, each required or optional, and
// additional properties (none, any, or of a schema) under keys other than the listed ones.
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "grammar/code_points.h"
#include "grammar/json_schema_compiler.h"
#include "grammar/json_schema_parts.h"

namespace kvasir::grammar {
namespace {

std::string PointerToken(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~')
      out += "~0";
    else if (c == '/')
      out += "~1";
    else
      out.push_back(c);
  }
  return out;
}

// Characters an additional key may hold: any but those JSON must escape. Escapes are left out so
// that an additional key cannot spell a listed one differently ("\u0061" for "a").
CodePointSet PlainKeyChars() {
  CodePointSet special;
  special.Add(0, 0x1F);
  special.Add('"');
  special.Add('\\');
  return CodePointSet::All().Minus(special);
}

}  // namespace

std::string SchemaCompiler::KeyOtherThan(const std::vector<std::string>& names,
                                         const std::string& hint) {
  const CodePointSet plain = PlainKeyChars();
  const std::string any = json_parts::Class(plain) + "*";
  // A trie of the listed names over code points: inside it a key may still become a listed one;
  // a character that leaves it makes the key different from all of them.
  struct Node {
    std::map<uint32_t, size_t> children;
    bool ends = false;
  };
  std::vector<Node> trie(1);
  for (const std::string& name : names) {
    size_t v = 0;
    for (size_t i = 0; i < name.size();) {
      uint32_t c = 0;
      const int n = DecodeUtf8(name.data() + i, name.size() - i, &c);
      if (n == 0) break;  // names come from parsed JSON: valid UTF-8
      i += static_cast<size_t>(n);
      auto it = trie[v].children.find(c);
      if (it == trie[v].children.end()) {
        trie.push_back({});
        it = trie[v].children.emplace(c, trie.size() - 1).first;
      }
      v = it->second;
    }
    trie[v].ends = true;
  }
  std::vector<std::string> rule(trie.size());
  for (size_t v = 0; v < trie.size(); ++v) rule[v] = Reserve(hint + "-key");
  for (size_t v = 0; v < trie.size(); ++v) {
    std::vector<std::string> alts;
    if (!trie[v].ends) alts.push_back("\"\"");
    CodePointSet leave = plain;
    for (const auto& [c, child] : trie[v].children) {
      if (!plain.Contains(c)) continue;
      std::string bytes;
      AppendUtf8(c, &bytes);
      alts.push_back(json_parts::Literal(bytes) + " " + rule[child]);
      CodePointSet one;
      one.Add(c);
      leave = leave.Minus(one);
    }
    if (!leave.empty()) alts.push_back(json_parts::Class(leave) + " " + any);
    std::string body;
    for (size_t i = 0; i < alts.size(); ++i) body += (i ? " | " : "") + alts[i];
    SetBody(rule[v], body);
  }
  return rule[0];
}

Result<std::string> SchemaCompiler::Object(const OrderedJson& schema, const std::string& path,
                                           const std::string& hint, int depth) {
  const bool has_props = schema.contains("properties");
  const bool has_additional = schema.contains("additionalProperties");
  const bool has_required = schema.contains("required");
  // Without properties, an absent additionalProperties admits any object (as JSON Schema says);
  // with properties, only the listed ones are produced.
  if (!has_props && !has_required &&
      (!has_additional || schema["additionalProperties"] == OrderedJson(true))) {
    return std::string("object");
  }
  if (has_props && !schema["properties"].is_object()) {
    return At(path, "'properties' must be an object");
  }
  std::vector<std::string> required;
  if (has_required) {
    const OrderedJson& r = schema["required"];
    if (!r.is_array()) return At(path, "'required' must be an array of strings");
    for (const OrderedJson& name : r) {
      if (!name.is_string()) return At(path, "'required' must be an array of strings");
      if (std::find(required.begin(), required.end(), name.get<std::string>()) != required.end()) {
        return At(path, fmt::format("'required' lists {} twice", name.dump()));
      }
      required.push_back(name.get<std::string>());
    }
  }
  const OrderedJson no_props = OrderedJson::object();
  const OrderedJson& props = has_props ? schema["properties"] : no_props;
  for (const std::string& name : required) {
    if (!props.contains(name)) {
      return At(path, fmt::format("required property \"{}\" is not in 'properties'", name));
    }
  }
  struct Member {
    std::string rule;
    bool required;
  };
  std::vector<Member> members;
  std::vector<std::string> names;
  for (const auto& [name, sub] : props.items()) {
    names.push_back(name);
    const bool req = std::find(required.begin(), required.end(), name) != required.end();
    const std::string sub_path = path + "/properties/" + PointerToken(name);
    if (sub.is_boolean() && !sub.get<bool>()) {
      if (req) return At(sub_path, "a required property whose schema is false");
      continue;  // may not appear
    }
    KV_ASSIGN_OR_RETURN(std::string value, Sub(sub, sub_path, hint + "-" + name, depth));
    const std::string key =
        OrderedJson(name).dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
    members.push_back({Rule(hint + "-" + name + "-kv",
                            fmt::format("{} ws \":\" ws {} ws", json_parts::Literal(key), value)),
                       req});
  }
  std::string extra;  // rule for one additional member, or empty
  if (has_additional) {
    const OrderedJson& a = schema["additionalProperties"];
    if (!(a.is_boolean() && !a.get<bool>())) {
      std::string value = "value";
      if (!a.is_boolean()) {
        KV_ASSIGN_OR_RETURN(value,
                            Sub(a, path + "/additionalProperties", hint + "-additional", depth));
      }
      const std::string key = KeyOtherThan(names, hint);
      extra = Rule(hint + "-additional-kv",
                   fmt::format("\"\\\"\" {} \"\\\"\" ws \":\" ws {} ws", key, value));
    }
  }
  // first_i: members i.. when none has been written yet (no comma before the first);
  // rest_i: members i.. after at least one (each with its comma).
  std::string rest =
      extra.empty() ? "" : Rule(hint + "-rest", fmt::format("( \",\" ws {} )*", extra));
  std::string first =
      extra.empty() ? "" : Rule(hint + "-first", fmt::format("( {0} ( \",\" ws {0} )* )?", extra));
  for (size_t i = members.size(); i-- > 0;) {
    const Member& m = members[i];
    const std::string after = rest.empty() ? "" : " " + rest;
    std::string first_body =
        m.required ? m.rule + after
                   : fmt::format("( {}{} | {} )", m.rule, after, first.empty() ? "\"\"" : first);
    if (i > 0) {
      rest = Rule(hint + "-rest", m.required ? fmt::format("\",\" ws {}{}", m.rule, after)
                                             : fmt::format("( \",\" ws {} )?{}", m.rule, after));
    }
    first = Rule(hint + "-first", first_body);
  }
  return fmt::format("\"{{\" ws {}\"}}\"", first.empty() ? "" : first + " ");
}

}  // namespace kvasir::grammar
