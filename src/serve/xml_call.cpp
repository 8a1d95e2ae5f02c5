// Qwen3.5's XML-style tool calls read back as they stream (ToolCallParser with syntax.xml):
//   <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n...</function>\n</tool_call>
// The arguments object is built as the markup arrives, in the compact form the JSON calls are
// returned in ({"P":VALUE,...}), and every byte added to it is shown at once, so the pieces of a
// call joined are its arguments.
#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/json_escape.h"
#include "serve/tool_output.h"

namespace kvasir::serve {
namespace {

using OrderedJson = nlohmann::ordered_json;

constexpr std::string_view kFunction = "<function=";
constexpr std::string_view kParameter = "<parameter=";
constexpr std::string_view kParameterEnd = "\n</parameter>";
constexpr std::string_view kFunctionEnd = "</function>";
// A function or parameter name longer than this is not markup.
constexpr size_t kMaxXmlName = 256;

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t SkipSpace(std::string_view s, size_t i) {
  while (i < s.size() && IsSpace(s[i])) ++i;
  return i;
}

// The length of the longest end of `s` that is a proper prefix of `marker`.
size_t PartialMarker(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(s.substr(s.size() - n))) return n;
  }
  return 0;
}

// The types a parameter's schema names ("type": "x" or ["x", ...]); empty when none.
std::vector<std::string> ParamTypes(const ToolDef* tool, const std::string& param) {
  std::vector<std::string> types;
  if (tool == nullptr || !tool->parameters.is_object()) return types;
  const auto props = tool->parameters.find("properties");
  if (props == tool->parameters.end() || !props->is_object()) return types;
  const auto p = props->find(param);
  if (p == props->end() || !p->is_object()) return types;
  const auto t = p->find("type");
  if (t == p->end()) return types;
  if (t->is_string()) types.push_back(t->get<std::string>());
  if (t->is_array()) {
    for (const auto& x : *t) {
      if (x.is_string()) types.push_back(x.get<std::string>());
    }
  }
  return types;
}

bool IsStringOnly(const std::vector<std::string>& types) {
  return types.size() == 1 && types[0] == "string";
}

// A value written between the parameter tags, as JSON: text for a string parameter; else the
// JSON it parses to (Python's True/False/None too), or the text when it does not parse.
std::string ValueJson(const std::vector<std::string>& types, std::string_view text) {
  if (!IsStringOnly(types)) {
    std::string_view t = text;
    while (!t.empty() && IsSpace(t.front())) t.remove_prefix(1);
    while (!t.empty() && IsSpace(t.back())) t.remove_suffix(1);
    if (t == "True" || t == "False") return t == "True" ? "true" : "false";
    if (t == "None") return "null";
    const OrderedJson v = OrderedJson::parse(t, nullptr, /*allow_exceptions=*/false);
    const bool is_text =
        v.is_string() && std::find(types.begin(), types.end(), "string") != types.end();
    if (!v.is_discarded() && !is_text) return v.dump();
  }
  return "\"" + JsonEscape(text) + "\"";
}

}  // namespace

const ToolDef* ToolCallParser::FindTool(const std::string& name) const {
  for (const ToolDef& t : tools_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

void ToolCallParser::XmlArgs(std::string text, Output* out) {
  if (text.empty()) return;
  xml_.call.arguments += text;
  Piece piece;
  piece.call = static_cast<int>(made_);
  piece.arguments = std::move(text);
  out->pieces.push_back(std::move(piece));
}

void ToolCallParser::XmlEndEarly(Output* out) {
  using S = XmlCall::Stage;
  if (xml_.stage == S::kName) {  // nothing shown: the markup is the model's text
    mode_ = Mode::kPlain;
    AddText(std::move(xml_.raw) + held_, out);
    held_.clear();
    xml_ = XmlCall{};
    return;
  }
  // Shown in part: close what was shown, so that the pieces still join into a JSON object.
  if (xml_.stage == S::kValue) XmlArgs(xml_.value_is_string ? "\"}" : "null}", out);
  if (xml_.stage == S::kParams) XmlArgs(xml_.params > 0 ? "}" : "{}", out);
  ++made_;
  out->calls.push_back(std::move(xml_.call));
  xml_ = XmlCall{};
  mode_ = Mode::kSkip;  // the rest of its markup, up to its close marker
  at_start_ = false;
}

bool ToolCallParser::XmlStep(bool final, Output* out) {
  using S = XmlCall::Stage;
  const std::string_view h = held_;
  // Consumes n bytes of markup.
  auto take = [&](size_t n) {
    xml_.raw += held_.substr(0, n);
    held_.erase(0, n);
  };
  // Waits for more text, or ends the call when there is none or it has run past the limit.
  auto wait = [&]() {
    const bool end = final || held_.size() > kMaxCallBytes;
    if (end) XmlEndEarly(out);
    return end;  // after XmlEndEarly, scanning goes on over what is left
  };
  switch (xml_.stage) {
    case S::kOutside: {
      const size_t p = SkipSpace(h, 0);
      if (p == h.size()) {
        if (final) held_.clear();  // whitespace after the last call
        return false;
      }
      const std::string_view rest = h.substr(p);
      if (rest.starts_with(syntax_.open)) {
        xml_.stage = S::kName;
        take(p + syntax_.open.size());
        return true;
      }
      if (!final && std::string_view(syntax_.open).starts_with(rest)) return false;
      held_.erase(0, p);  // text after the calls: back to text, which may hold more calls
      mode_ = Mode::kText;
      at_start_ = false;
      return true;
    }
    case S::kName: {
      const size_t p = SkipSpace(h, 0);
      const std::string_view rest = h.substr(p);
      if (rest.size() < kFunction.size() && kFunction.starts_with(rest)) return wait();
      const size_t gt = rest.find('>');
      if (!rest.starts_with(kFunction) ||
          (gt == std::string::npos && rest.size() > kFunction.size() + kMaxXmlName)) {
        XmlEndEarly(out);
        return true;
      }
      if (gt == std::string::npos) return wait();
      std::string name(rest.substr(kFunction.size(), gt - kFunction.size()));
      if (FindTool(name) == nullptr &&
          std::find(names_.begin(), names_.end(), name) == names_.end()) {
        XmlEndEarly(out);  // not a tool of the request: the text is content
        return true;
      }
      take(p + gt + 1);
      xml_.call.id = NewToolCallId();
      xml_.call.name = name;
      xml_.stage = S::kParams;
      Piece piece;
      piece.call = static_cast<int>(made_);
      piece.id = xml_.call.id;
      piece.name = std::move(name);
      out->pieces.push_back(std::move(piece));
      return true;
    }
    case S::kParams: {
      const size_t p = SkipSpace(h, 0);
      const std::string_view rest = h.substr(p);
      if (rest.starts_with(kFunctionEnd)) {
        XmlArgs(xml_.params > 0 ? "}" : "{}", out);
        take(p + kFunctionEnd.size());
        xml_.stage = S::kAfterFunction;
        return true;
      }
      if (rest.starts_with(kParameter)) {
        const size_t gt = rest.find('>');
        if (gt == std::string::npos) {
          if (rest.size() > kParameter.size() + kMaxXmlName) break;
          return wait();
        }
        xml_.param = std::string(rest.substr(kParameter.size(), gt - kParameter.size()));
        const std::vector<std::string> types = ParamTypes(FindTool(xml_.call.name), xml_.param);
        xml_.value_is_string = IsStringOnly(types);
        xml_.value_began = false;
        XmlArgs((xml_.params > 0 ? "," : "{") + OrderedJson(xml_.param).dump() + ":" +
                    (xml_.value_is_string ? "\"" : ""),
                out);
        take(p + gt + 1);
        xml_.stage = S::kValue;
        return true;
      }
      if (rest.size() < kParameter.size() &&
          (kParameter.starts_with(rest) || kFunctionEnd.starts_with(rest))) {
        return wait();
      }
      break;  // neither: malformed
    }
    case S::kValue: {
      if (!xml_.value_began) {
        if (h.empty()) return wait();
        if (h[0] == '\n') take(1);  // the template's newline after <parameter=P>
        xml_.value_began = true;
        return true;
      }
      const size_t end = h.find(kParameterEnd);
      if (end == std::string::npos) {
        if (xml_.value_is_string) {  // shows what cannot be the start of the end marker
          const size_t shown = h.size() - PartialMarker(h, kParameterEnd);
          XmlArgs(JsonEscape(h.substr(0, shown)), out);
          take(shown);
        }
        return wait();
      }
      if (xml_.value_is_string) {
        XmlArgs(JsonEscape(h.substr(0, end)) + "\"", out);
      } else {
        const auto types = ParamTypes(FindTool(xml_.call.name), xml_.param);
        XmlArgs(ValueJson(types, h.substr(0, end)), out);
      }
      take(end + kParameterEnd.size());
      ++xml_.params;
      xml_.stage = S::kParams;
      return true;
    }
    case S::kAfterFunction: {
      const size_t p = SkipSpace(h, 0);
      const std::string_view rest = h.substr(p);
      if (rest.empty() || (rest.size() < syntax_.close.size() &&
                           std::string_view(syntax_.close).starts_with(rest))) {
        if (!final) return false;
        held_.clear();
      } else if (rest.starts_with(syntax_.close)) {
        take(p + syntax_.close.size());
      }
      // Complete (text after </function> without the close marker is text again).
      ++made_;
      out->calls.push_back(std::move(xml_.call));
      xml_ = XmlCall{};
      return true;
    }
  }
  XmlEndEarly(out);
  return true;
}

}  // namespace kvasir::serve
