#include "serve/tool_prompt.h"

#include <fmt/format.h>

#include <cctype>
#include <vector>

namespace kvasir::serve {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kHermesTools =
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are "
    "provided with function signatures within <tools></tools> XML tags:\n<tools>";
constexpr std::string_view kHermesFormat =
    "\n</tools>\n\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\n</tool_call>";
constexpr std::string_view kQwenXmlTools =
    "# Tools\n\nYou have access to the following functions:\n\n<tools>";
constexpr std::string_view kQwenXmlFormat =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO "
    "suffix:\n\n<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>"
    "\nvalue_1\n</parameter>\n<parameter=example_parameter_2>\nThis is the value for the second "
    "parameter\nthat can span\nmultiple lines\n</parameter>\n</function>\n</tool_call>\n\n"
    "<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified format: an inner "
    "<function=...></function> block must be nested within <tool_call></tool_call> XML tags\n- "
    "Required parameters MUST be specified\n- You may provide optional reasoning for your "
    "function call in natural language BEFORE the function call, but NOT after\n- If there is no "
    "function call available, answer the question like normal with your current knowledge and do "
    "not tell the user about function calls\n</IMPORTANT>";
constexpr std::string_view kLlama3Tools =
    "Given the following functions, please respond with a JSON for a function call with its "
    "proper arguments that best answers the given prompt.\n\nRespond in the format {\"name\": "
    "function name, \"parameters\": dictionary of argument name and its value}.Do not use "
    "variables.\n\n";

std::string_view Trim(std::string_view s) {
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

void Write(const OrderedJson& v, int indent, int level, std::string* out) {
  const bool lines = indent > 0;
  const auto newline = [&](int l) {
    if (lines) *out += "\n" + std::string(static_cast<size_t>(indent * l), ' ');
  };
  const std::string_view comma = lines ? "," : ", ";
  if (v.is_object() && !v.empty()) {
    *out += "{";
    bool first = true;
    for (const auto& [key, value] : v.items()) {
      if (!first) *out += comma;
      first = false;
      newline(level + 1);
      *out += OrderedJson(key).dump() + ": ";
      Write(value, indent, level + 1, out);
    }
    newline(level);
    *out += "}";
  } else if (v.is_array() && !v.empty()) {
    *out += "[";
    for (size_t i = 0; i < v.size(); ++i) {
      if (i > 0) *out += comma;
      newline(level + 1);
      Write(v[i], indent, level + 1, out);
    }
    newline(level);
    *out += "]";
  } else {
    *out += v.dump();
  }
}

// {"type": "function", "function": {"name", "description", "parameters"}}, as the templates
// print a tool.
OrderedJson ToolJson(const ToolDef& t) {
  OrderedJson f = {{"name", t.name}};
  if (!t.description.empty()) f["description"] = t.description;
  f["parameters"] = t.parameters;
  return {{"type", "function"}, {"function", f}};
}

OrderedJson Arguments(const ToolCall& c) {
  auto args = OrderedJson::parse(c.arguments, nullptr, /*allow_exceptions=*/false);
  return args.is_discarded() ? OrderedJson::object() : args;  // checked when parsed
}

// The system turn that lists the tools: Hermes's before the system message, Qwen3.5's after.
// `system`: the conversation's system message, or null.
std::string ToolsSystem(bool xml, const std::vector<ToolDef>& tools, const std::string* system) {
  if (!xml) {
    std::string out = system != nullptr ? *system + "\n\n" : "";
    out += kHermesTools;
    for (const ToolDef& t : tools) out += "\n" + TemplateJson(ToolJson(t));
    return out + std::string(kHermesFormat);
  }
  std::string out(kQwenXmlTools);
  for (const ToolDef& t : tools) out += "\n" + TemplateJson(ToolJson(t));
  out += kQwenXmlFormat;
  if (system != nullptr && !Trim(*system).empty()) out += "\n\n" + std::string(Trim(*system));
  return out;
}

// An assistant turn's text and calls, in Hermes's JSON or Qwen3.5's XML call format.
std::string AssistantWithCalls(bool xml, const ChatTurn& t) {
  if (!xml) {
    std::string content = t.content;
    for (size_t c = 0; c < t.tool_calls.size(); ++c) {
      if (c > 0 || !content.empty()) content += "\n";
      const OrderedJson call = {{"name", t.tool_calls[c].name},
                                {"arguments", Arguments(t.tool_calls[c])}};
      content += "<tool_call>\n" + TemplateJson(call) + "\n</tool_call>";
    }
    return content;
  }
  std::string content(Trim(t.content));
  for (size_t c = 0; c < t.tool_calls.size(); ++c) {
    content += c > 0 ? "\n" : content.empty() ? "" : "\n\n";
    content += "<tool_call>\n<function=" + t.tool_calls[c].name + ">\n";
    const OrderedJson args = Arguments(t.tool_calls[c]);
    for (const auto& [key, value] : args.items()) {
      content += "<parameter=" + key + ">\n" + XmlParameterValue(value) + "\n</parameter>\n";
    }
    content += "</function>\n</tool_call>";
  }
  return content;
}

// Hermes and Qwen3.5: tools in the system turn, calls and results as tagged text in ordinary
// turns; the family's FormatChat lays the turns out.
std::string FormatTagged(ChatFamily family, bool xml, std::span<const ChatTurn> turns,
                         const ToolsRequest& tools) {
  std::vector<ChatMessage> msgs;
  size_t from = 0;
  if (tools.active()) {
    const std::string* system = nullptr;
    if (!turns.empty() && turns[0].role == "system") {
      system = &turns[0].content;
      from = 1;
    }
    msgs.push_back({"system", ToolsSystem(xml, tools.tools, system)});
  }
  for (size_t i = from; i < turns.size(); ++i) {
    const ChatTurn& t = turns[i];
    if (t.role == "tool") {
      std::string text = fmt::format("<tool_response>\n{}\n</tool_response>", t.content);
      if (i > from && turns[i - 1].role == "tool") {  // one user turn for consecutive results
        msgs.back().content += "\n" + text;
      } else {
        msgs.push_back({"user", std::move(text)});
      }
      continue;
    }
    msgs.push_back({t.role, t.tool_calls.empty() ? t.content : AssistantWithCalls(xml, t)});
  }
  return FormatChat(family, msgs, /*add_generation_prompt=*/true);
}

std::string FormatLlama3Tools(std::span<const ChatTurn> turns, const ToolsRequest& tools) {
  std::string out;
  bool tools_shown = !tools.active();
  for (const ChatTurn& t : turns) {
    std::string content(Trim(t.content));
    if (t.role == "user" && !tools_shown) {  // the tools go in the first user turn
      std::string head(kLlama3Tools);
      for (const ToolDef& d : tools.tools) head += TemplateJson(ToolJson(d), 4) + "\n\n";
      content = head + content;
      tools_shown = true;
    }
    for (size_t c = 0; c < t.tool_calls.size(); ++c) {
      if (c > 0 || !content.empty()) content += c > 0 ? "; " : "\n";
      content += TemplateJson(
          {{"name", t.tool_calls[c].name}, {"parameters", Arguments(t.tool_calls[c])}});
    }
    const std::string_view role = t.role == "tool" ? "ipython" : std::string_view(t.role);
    out += fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>", role, content);
  }
  return out + "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

std::string FormatMistralTools(ChatFamily family, std::span<const ChatTurn> turns,
                               const ToolsRequest& tools) {
  const bool v7 = family == ChatFamily::kMistralV7 || family == ChatFamily::kMistralV7Tekken;
  const bool tekken =
      family == ChatFamily::kMistralV3Tekken || family == ChatFamily::kMistralV7Tekken;
  const std::string_view sp = tekken ? "" : " ";
  size_t last_user = turns.size();
  for (size_t i = 0; i < turns.size(); ++i) {
    if (turns[i].role == "user") last_user = i;
  }
  std::string out, system;
  for (size_t i = 0; i < turns.size(); ++i) {
    const ChatTurn& t = turns[i];
    if (t.role == "system") {
      if (v7) {
        out += fmt::format("[SYSTEM_PROMPT]{}{}[/SYSTEM_PROMPT]", sp, t.content);
      } else {
        system += t.content + "\n\n";  // opens the next [INST], as FormatChat does
      }
    } else if (t.role == "user") {
      if (i == last_user && tools.active()) {
        OrderedJson list = OrderedJson::array();
        for (const ToolDef& d : tools.tools) list.push_back(ToolJson(d));
        out += fmt::format("[AVAILABLE_TOOLS]{}{}[/AVAILABLE_TOOLS]", sp, TemplateJson(list));
      }
      out += fmt::format("[INST]{}{}{}[/INST]", sp, system, t.content);
      system.clear();
    } else if (t.role == "tool") {
      const OrderedJson result = {{"content", t.content}, {"call_id", t.tool_call_id}};
      out += fmt::format("[TOOL_RESULTS]{}{}[/TOOL_RESULTS]", sp, TemplateJson(result));
    } else if (!t.tool_calls.empty()) {
      OrderedJson calls = OrderedJson::array();
      for (const ToolCall& c : t.tool_calls) {
        OrderedJson call = {{"name", c.name}, {"arguments", Arguments(c)}};
        if (!c.id.empty()) call["id"] = c.id;
        calls.push_back(std::move(call));
      }
      out += fmt::format("[TOOL_CALLS]{}{}</s>", sp, TemplateJson(calls));
    } else {
      const std::string_view answer =
          family == ChatFamily::kMistralV3 ? Trim(t.content) : std::string_view(t.content);
      out += fmt::format("{}{}</s>", sp, answer);
    }
  }
  return out;
}

}  // namespace

ToolStyle ToolStyleFor(ChatFamily family) {
  switch (family) {
    case ChatFamily::kLlama3:
      return ToolStyle::kLlama3;
    case ChatFamily::kMistralV3:
    case ChatFamily::kMistralV3Tekken:
    case ChatFamily::kMistralV7:
    case ChatFamily::kMistralV7Tekken:
      return ToolStyle::kMistral;
    case ChatFamily::kQwen35:
      return ToolStyle::kQwenXml;
    default:
      return ToolStyle::kHermes;
  }
}

bool NeedsToolLayout(const CompletionRequest& r) {
  if (r.tools.active()) return true;
  for (const ChatTurn& t : r.messages) {
    if (t.role == "tool" || !t.tool_calls.empty()) return true;
  }
  return false;
}

std::string FormatToolChat(ChatFamily family, std::span<const ChatTurn> turns,
                           const ToolsRequest& tools) {
  switch (ToolStyleFor(family)) {
    case ToolStyle::kLlama3:
      return FormatLlama3Tools(turns, tools);
    case ToolStyle::kMistral:
      return FormatMistralTools(family, turns, tools);
    case ToolStyle::kHermes:
    case ToolStyle::kQwenXml:
      break;
  }
  return FormatTagged(family, ToolStyleFor(family) == ToolStyle::kQwenXml, turns, tools);
}

std::string XmlParameterValue(const OrderedJson& value) {
  if (value.is_string()) return value.get<std::string>();
  if (value.is_object() || value.is_array()) return TemplateJson(value);
  if (value.is_boolean()) return value.get<bool>() ? "True" : "False";
  if (value.is_null()) return "None";
  return value.dump();
}

std::string TemplateJson(const OrderedJson& v, int indent) {
  std::string out;
  Write(v, indent, 0, &out);
  return out;
}

}  // namespace kvasir::serve
