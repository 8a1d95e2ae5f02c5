#include "serve/tool_request.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "grammar/json_schema.h"
#include "serve/json_fields.h"

namespace kvasir::serve {
namespace {

using nlohmann::json;

constexpr size_t kMaxDescriptionBytes = 16 << 10;
constexpr size_t kMaxArgumentsBytes = 1 << 20;

ApiError Missing(const std::string& param) {
  return BadRequest("missing_required_parameter", param, fmt::format("'{}' is required", param));
}

ApiError UnknownField(const std::string& param) {
  return BadRequest("unknown_parameter", param, fmt::format("unrecognized field '{}'", param));
}

bool ReadObject(const json& v, const std::string& param, ApiError* e) {
  if (v.is_object()) return true;
  *e = BadRequest("invalid_type", param, fmt::format("'{}' must be an object", param));
  return false;
}

// A function name as OpenAI allows it: 1 to 64 of letters, digits, '_' and '-'.
bool ReadName(const json& v, const std::string& param, std::string* out, ApiError* e) {
  if (!ReadString(v, param, kMaxToolNameBytes, out, e)) return false;
  const bool ok = !out->empty() && std::all_of(out->begin(), out->end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  if (!ok) {
    *e = BadRequest(
        "invalid_value", param,
        fmt::format("'{}' must be 1 to {} letters, digits, '_' or '-'", param, kMaxToolNameBytes));
  }
  return ok;
}

// "type": "function", the only kind of tool.
bool ReadFunctionType(const json& v, const std::string& param, ApiError* e) {
  std::string type;
  if (!ReadString(v, param, 64, &type, e)) return false;
  if (type == "function") return true;
  *e = BadRequest("invalid_value", param,
                  fmt::format("'{}' must be 'function', not '{}'", param, type.substr(0, 32)));
  return false;
}

bool ReadFunction(const json& v, const std::string& at, ToolDef* out, ApiError* e) {
  if (!ReadObject(v, at, e)) return false;
  bool has_name = false;
  for (const auto& [key, value] : v.items()) {
    const std::string param = at + "." + key;
    if (value.is_null()) continue;
    if (key == "name") {
      if (!ReadName(value, param, &out->name, e)) return false;
      has_name = true;
    } else if (key == "description") {
      if (!ReadString(value, param, kMaxDescriptionBytes, &out->description, e)) return false;
    } else if (key == "parameters") {
      if (!ReadObject(value, param, e)) return false;  // taken in order by CompleteTools
    } else if (key == "strict") {
      if (!ReadBool(value, param, &out->strict, e)) return false;
    } else {
      *e = UnknownField(param);
      return false;
    }
  }
  if (!has_name) *e = Missing(at + ".name");
  return has_name;
}

}  // namespace

bool ReadTools(const json& v, std::vector<ToolDef>* out, ApiError* e) {
  if (!v.is_array() || v.size() > kMaxTools) {
    *e = BadRequest("invalid_type", "tools",
                    fmt::format("'tools' must be an array of at most {} tools", kMaxTools));
    return false;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = fmt::format("tools[{}]", i);
    if (!ReadObject(v[i], at, e)) return false;
    ToolDef tool;
    bool has_type = false, has_function = false;
    for (const auto& [key, value] : v[i].items()) {
      if (key == "type") {
        if (!ReadFunctionType(value, at + ".type", e)) return false;
        has_type = true;
      } else if (key == "function") {
        if (!ReadFunction(value, at + ".function", &tool, e)) return false;
        has_function = true;
      } else {
        *e = UnknownField(at + "." + key);
        return false;
      }
    }
    if (!has_type || !has_function) {
      *e = Missing(at + (has_type ? ".function" : ".type"));
      return false;
    }
    for (const ToolDef& other : *out) {
      if (other.name == tool.name) {
        *e = BadRequest("invalid_value", at + ".function.name",
                        fmt::format("two tools are named '{}'", tool.name));
        return false;
      }
    }
    out->push_back(std::move(tool));
  }
  return true;
}

bool ReadToolChoice(const json& v, ToolChoice* out, ApiError* e) {
  using Kind = ToolChoice::Kind;
  if (v.is_string()) {
    const std::string& s = v.get_ref<const std::string&>();
    if (s == "none") {
      out->kind = Kind::kNone;
    } else if (s == "auto") {
      out->kind = Kind::kAuto;
    } else if (s == "required") {
      out->kind = Kind::kRequired;
    } else {
      *e = BadRequest("invalid_value", "tool_choice",
                      fmt::format("'tool_choice' must be 'none', 'auto', 'required' or "
                                  "{{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, "
                                  "not '{}'",
                                  s.substr(0, 32)));
      return false;
    }
    return true;
  }
  if (!v.is_object()) {
    *e = BadRequest("invalid_type", "tool_choice", "'tool_choice' must be a string or an object");
    return false;
  }
  bool has_function = false;
  for (const auto& [key, value] : v.items()) {
    if (key == "type") {
      if (!ReadFunctionType(value, "tool_choice.type", e)) return false;
    } else if (key == "function") {
      if (!ReadObject(value, "tool_choice.function", e)) return false;
      for (const auto& [k, x] : value.items()) {
        if (k != "name") {
          *e = UnknownField("tool_choice.function." + k);
          return false;
        }
      }
      auto name = value.find("name");
      if (name == value.end()) {
        *e = Missing("tool_choice.function.name");
        return false;
      }
      if (!ReadName(*name, "tool_choice.function.name", &out->name, e)) return false;
      has_function = true;
    } else {
      *e = UnknownField("tool_choice." + key);
      return false;
    }
  }
  if (!has_function) {
    *e = Missing("tool_choice.function");
    return false;
  }
  out->kind = Kind::kNamed;
  return true;
}

bool ReadToolCalls(const json& v, const std::string& param, std::vector<ToolCall>* out,
                   ApiError* e) {
  if (!v.is_array() || v.size() > kMaxToolCallsPerTurn) {
    *e = BadRequest(
        "invalid_type", param,
        fmt::format("'{}' must be an array of at most {} calls", param, kMaxToolCallsPerTurn));
    return false;
  }
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string at = fmt::format("{}[{}]", param, i);
    if (!ReadObject(v[i], at, e)) return false;
    ToolCall call;
    bool has_function = false;
    for (const auto& [key, value] : v[i].items()) {
      if (key == "id") {
        if (!ReadString(value, at + ".id", 256, &call.id, e)) return false;
      } else if (key == "type") {
        if (!ReadFunctionType(value, at + ".type", e)) return false;
      } else if (key == "function") {
        const std::string f = at + ".function";
        if (!ReadObject(value, f, e)) return false;
        auto name = value.find("name");
        auto args = value.find("arguments");
        if (name == value.end() || args == value.end()) {
          *e = Missing(f + (name == value.end() ? ".name" : ".arguments"));
          return false;
        }
        if (!ReadName(*name, f + ".name", &call.name, e)) return false;
        if (!ReadString(*args, f + ".arguments", kMaxArgumentsBytes, &call.arguments, e)) {
          return false;
        }
        // Laid into the prompt as JSON: it must be a JSON object.
        const auto parsed = json::parse(call.arguments, nullptr, /*allow_exceptions=*/false);
        if (!parsed.is_object()) {
          *e = BadRequest("invalid_value", f + ".arguments",
                          fmt::format("'{}.arguments' must be the text of a JSON object", f));
          return false;
        }
        has_function = true;
      } else {
        *e = UnknownField(at + "." + key);
        return false;
      }
    }
    if (!has_function) {
      *e = Missing(at + ".function");
      return false;
    }
    out->push_back(std::move(call));
  }
  return true;
}

bool CompleteTools(const nlohmann::ordered_json& ordered, ToolsRequest* t, ApiError* e) {
  if (!t->tools.empty()) {
    // The body read again, in order: the same tools (the first reading checked their shape).
    const auto tools = ordered.find("tools");
    if (tools == ordered.end() || !tools->is_array() || tools->size() != t->tools.size()) {
      *e = BadRequest("invalid_value", "tools", "'tools' reads differently a second time");
      return false;
    }
    for (size_t i = 0; i < t->tools.size(); ++i) {
      const std::string param = fmt::format("tools[{}].function.parameters", i);
      ToolDef& tool = t->tools[i];
      const auto& item = (*tools)[i];
      if (!item.is_object() || !item.contains("function") || !item["function"].is_object()) {
        *e = BadRequest("invalid_value", fmt::format("tools[{}]", i),
                        fmt::format("'tools[{}]' reads differently a second time", i));
        return false;
      }
      const auto& f = item["function"];
      if (f.contains("parameters") && f["parameters"].is_object()) {
        tool.parameters = f["parameters"];
      } else {  // no parameters: a function of no arguments
        tool.parameters = {{"type", "object"}, {"properties", nlohmann::ordered_json::object()}};
      }
      // A call's arguments are a JSON object.
      if (tool.parameters.contains("type") && tool.parameters["type"] != "object") {
        *e = BadRequest("invalid_value", param,
                        fmt::format("'{}' must describe an object (\"type\": \"object\"), not {}",
                                    param, tool.parameters["type"].dump()));
        return false;
      }
      auto grammar = grammar::JsonSchemaGrammarText(tool.parameters);
      if (!grammar.ok()) {
        *e = BadRequest("invalid_value", param,
                        fmt::format("'{}': {}", param, grammar.status().message()));
        return false;
      }
    }
  }
  using Kind = ToolChoice::Kind;
  if (t->choice.kind == Kind::kRequired && t->tools.empty()) {
    *e = BadRequest("invalid_value", "tool_choice", "'tool_choice' is 'required' but no tools");
    return false;
  }
  if (t->choice.kind == Kind::kNamed) {
    const bool known = std::any_of(t->tools.begin(), t->tools.end(),
                                   [&](const ToolDef& d) { return d.name == t->choice.name; });
    if (!known) {
      *e = BadRequest(
          "invalid_value", "tool_choice.function.name",
          fmt::format("'tool_choice' names '{}', which is not one of the tools", t->choice.name));
      return false;
    }
  }
  return true;
}

}  // namespace kvasir::serve
