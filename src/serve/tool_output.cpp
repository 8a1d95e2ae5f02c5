#include "serve/tool_output.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "serve/tool_prompt.h"

namespace kvasir::serve {
namespace {

using OrderedJson = nlohmann::ordered_json;
constexpr size_t kIncomplete = std::string::npos;
constexpr size_t kMalformed = std::string::npos - 1;

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

size_t SkipSpace(std::string_view s, size_t i, bool semicolons = false) {
  while (i < s.size() && (IsSpace(s[i]) || (semicolons && s[i] == ';'))) ++i;
  return i;
}

// One past the end of the JSON object or array that starts at s[i], found by its brackets (the
// parser checks the rest); kIncomplete when it has not ended yet, kMalformed when it cannot (then
// *broken_at, if given, is the index of the character that makes it so).
size_t ValueEnd(std::string_view s, size_t i, size_t* broken_at = nullptr) {
  const auto malformed = [&] {
    if (broken_at != nullptr) *broken_at = i;
    return kMalformed;
  };
  std::string closers;
  bool in_string = false, escaped = false;
  for (; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      if (closers.empty()) return malformed();
      in_string = true;
    } else if (c == '{' || c == '[') {
      closers.push_back(c == '{' ? '}' : ']');
    } else if (c == '}' || c == ']') {
      if (closers.empty() || closers.back() != c) return malformed();
      closers.pop_back();
      if (closers.empty()) return i + 1;
    } else if (closers.empty() && !IsSpace(c)) {
      return malformed();
    }
  }
  return kIncomplete;
}

// The length of the longest end of `s` that is a proper prefix of `marker`.
size_t PartialMarker(std::string_view s, std::string_view marker) {
  for (size_t n = std::min(s.size(), marker.size() - 1); n > 0; --n) {
    if (marker.starts_with(s.substr(s.size() - n))) return n;
  }
  return 0;
}

bool HasText(std::string_view s) {
  return std::any_of(s.begin(), s.end(), [](char c) { return !IsSpace(c); });
}

// How far the call object at s[start] ('{') has been written: its name once complete, and where
// its arguments' value begins and ends.
struct CallShape {
  std::optional<std::string> name;
  size_t args_begin = std::string::npos;
  size_t args_end = std::string::npos;  // one past the value's end; npos: not yet
  size_t end = std::string::npos;       // one past the object's '}'; npos: not yet
};

// The text of the JSON string token `token`, or nullopt.
std::optional<std::string> DecodeString(std::string_view token) {
  const OrderedJson v = OrderedJson::parse(token, nullptr, /*allow_exceptions=*/false);
  if (!v.is_string()) return std::nullopt;
  return v.get<std::string>();
}

// One past the string token at s[i] ('"'), or npos when it has not ended yet.
size_t StringEnd(std::string_view s, size_t i) {
  for (++i; i < s.size(); ++i) {
    if (s[i] == '\\') {
      ++i;
    } else if (s[i] == '"') {
      return i + 1;
    }
  }
  return std::string::npos;
}

CallShape ScanCall(std::string_view s, size_t start) {
  CallShape shape;
  std::string key;
  bool in_value = false;
  for (size_t i = start + 1; i < s.size();) {
    const char c = s[i];
    if (IsSpace(c) || c == ',') {
      if (c == ',') in_value = false;
      ++i;
    } else if (c == ':') {
      in_value = true;
      ++i;
    } else if (c == '}') {
      shape.end = i + 1;
      return shape;
    } else {
      // A token: a key, or a value (a string, an object or array, a number or literal).
      size_t end = c == '"'               ? StringEnd(s, i)
                   : c == '{' || c == '[' ? ValueEnd(s, i)
                                          : s.find_first_of(",}", i);
      const bool args = in_value && (key == "arguments" || key == "parameters");
      if (args && shape.args_begin == std::string::npos) shape.args_begin = i;
      if (end == kMalformed || end == std::string::npos) return shape;
      if (!in_value) {
        auto k = DecodeString(s.substr(i, end - i));
        if (!k) return shape;
        key = std::move(*k);
      } else if (key == "name" && c == '"') {
        shape.name = DecodeString(s.substr(i, end - i));
      }
      if (args && shape.args_begin == i) shape.args_end = end;
      in_value = false;
      i = end;
    }
  }
  return shape;
}

// Where the calls of the value at s[v] begin: v for an object; for an array, each object in it
// (as far as it has been written).
std::vector<size_t> CallStarts(std::string_view s, size_t v) {
  if (s[v] == '{') return {v};
  std::vector<size_t> starts;
  for (size_t i = v + 1; i < s.size();) {
    if (s[i] != '{') {
      ++i;
      continue;
    }
    starts.push_back(i);
    const size_t end = ValueEnd(s, i);
    if (end == kIncomplete || end == kMalformed) break;
    i = end;
  }
  return starts;
}

// The longest prefix of compact JSON object text `args` (as far as it has been written) that a
// "}" closes into a valid object: it ends right after the opening brace, where a member ends
// (before a comma at the top level) or before the closing brace. 0 when `args` is no object.
size_t ClosablePrefix(std::string_view args) {
  if (args.empty() || args[0] != '{') return 0;
  std::vector<size_t> ends = {1};
  int depth = 0;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < args.size(); ++i) {
    const char c = args[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      ++depth;
    } else if ((c == '}' || c == ']') && --depth == 0) {
      ends.push_back(i);
      break;
    } else if (c == ',' && depth == 1) {
      ends.push_back(i);
    }
  }
  for (auto it = ends.rbegin(); it != ends.rend(); ++it) {
    const std::string closed = std::string(args.substr(0, *it)) + "}";
    if (OrderedJson::parse(closed, nullptr, /*allow_exceptions=*/false).is_object()) return *it;
  }
  return 1;
}

}  // namespace

std::string ToolCallParser::Output::text() const {
  std::string t;
  for (const Piece& p : pieces) t += p.content;
  return t;
}

std::string ToolCallParser::CompactArguments(std::string_view json_text) {
  std::string out;
  bool in_string = false, escaped = false;
  for (const char c : json_text) {
    if (in_string) {
      in_string = escaped || c != '"';
      escaped = !escaped && c == '\\';
    } else if (IsSpace(c)) {
      continue;
    } else {
      in_string = c == '"';
    }
    out += c;
  }
  return out;
}

ToolSyntax ToolSyntaxFor(ChatFamily family, bool forced) {
  switch (ToolStyleFor(family)) {
    case ToolStyle::kLlama3:
      return {"<|python_tag|>", "", false, true, forced};
    case ToolStyle::kMistral:
      return {"[TOOL_CALLS]", "", true, forced, forced};
    case ToolStyle::kQwenXml:
      return {"<tool_call>", "</tool_call>", false, false, forced, /*xml=*/true};
    case ToolStyle::kHermes:
      break;
  }
  return {"<tool_call>", "</tool_call>", false, false, forced};
}

std::string NewToolCallId() {
  static constexpr std::string_view kAlphabet =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id += kAlphabet[rng() % kAlphabet.size()];
  return id;
}

ToolCallParser::ToolCallParser(ToolSyntax syntax, std::vector<std::string> names)
    : syntax_(std::move(syntax)), names_(std::move(names)) {}

ToolCallParser::ToolCallParser(ToolSyntax syntax, std::span<const ToolDef> tools)
    : syntax_(std::move(syntax)), tools_(tools.begin(), tools.end()) {
  for (const ToolDef& t : tools) names_.push_back(t.name);
}

ToolCallParser::Output ToolCallParser::Push(std::string_view text) {
  Output out;
  held_ += text;
  Scan(/*final=*/false, &out);
  return out;
}

ToolCallParser::Output ToolCallParser::Finish(bool cut) {
  Output out;
  if (cut && mode_ == Mode::kCalls) {
    held_.clear();
    xml_ = XmlCall{};  // a call cut short is dropped, though its first pieces were shown
  }
  Scan(/*final=*/true, &out);
  AddText(std::move(held_), &out);  // held back for a marker that never came
  held_.clear();
  return out;
}

void ToolCallParser::Scan(bool final, Output* out) {
  for (;;) {
    if (mode_ == Mode::kPlain) {
      AddText(std::move(held_), out);
      held_.clear();
      return;
    }
    if (mode_ == Mode::kSkip) {
      const size_t at = syntax_.close.empty() ? std::string::npos : held_.find(syntax_.close);
      if (at == std::string::npos) {  // keeps what may be the start of the close marker
        const size_t keep =
            final || syntax_.close.empty() ? 0 : PartialMarker(held_, syntax_.close);
        held_.erase(0, held_.size() - keep);
        return;
      }
      held_.erase(0, at + syntax_.close.size());
      mode_ = Mode::kText;
      continue;
    }
    if (mode_ == Mode::kCalls) {
      if (!CallStep(final, out)) return;
      continue;
    }
    if (syntax_.bare && at_start_) {
      const size_t p = SkipSpace(held_, 0);
      if (p == held_.size()) return;  // only whitespace: a bare call may still begin
      if (held_[p] == '{' || (syntax_.array && held_[p] == '[')) {
        held_.erase(0, p);
        mode_ = Mode::kCalls;
        continue;
      }
    }
    const size_t at = held_.find(syntax_.open);
    const size_t shown = at != std::string::npos ? at
                         : final                 ? held_.size()
                                 : held_.size() - PartialMarker(held_, syntax_.open);
    if (HasText(std::string_view(held_).substr(0, shown))) at_start_ = false;
    AddText(held_.substr(0, shown), out);
    held_.erase(0, shown);
    if (at == std::string::npos) return;
    mode_ = Mode::kCalls;
  }
}

bool ToolCallParser::CallStep(bool final, Output* out) {
  if (syntax_.xml) return XmlStep(final, out);
  const size_t p = SkipSpace(held_, 0, syntax_.bare);
  if (p == held_.size()) {
    if (final) held_.clear();  // whitespace after the last call
    return false;
  }
  const std::string_view rest = std::string_view(held_).substr(p);
  size_t v = 0;
  if (rest.starts_with(syntax_.open)) {
    v = SkipSpace(held_, p + syntax_.open.size());
  } else if (syntax_.bare && (rest[0] == '{' || (syntax_.array && rest[0] == '['))) {
    v = p;
  } else if (!final && std::string_view(syntax_.open).starts_with(rest)) {
    return false;  // perhaps the next call's marker
  } else {         // text after the calls: back to text, which may hold more calls
    held_.erase(0, p);
    mode_ = Mode::kText;
    at_start_ = false;
    return true;
  }
  if (v == held_.size()) {
    if (final) GiveUp(out);
    return false;
  }
  // A call whose name is already a tool's is shown before it is given up, and then closed.
  // `until`: the text it may read (a value that broke is read up to where it broke, as far in
  // a stream as whole).
  auto fail = [&](size_t until = std::string::npos) {
    if (!syntax_.forced) StreamPartial(v, out, until);
    GiveUp(out);
  };
  const size_t end = ValueEnd(held_, v);
  if (end == kIncomplete && held_.size() - v > kMaxCallBytes) {  // each piece rescans the call
    fail();
    return true;
  }
  if (end == kIncomplete) {
    if (!final) {
      StreamPartial(v, out);
      return false;
    }
    fail();
    return true;
  }
  std::vector<ToolCall> calls;
  if (end == kMalformed) {
    size_t broken_at = held_.size();
    ValueEnd(held_, v, &broken_at);
    fail(broken_at + 1);
    return true;
  }
  if (!ReadCalls(std::string_view(held_).substr(v, end - v), &calls)) {
    fail(end);
    return true;
  }
  size_t after = end;
  if (!syntax_.close.empty()) {
    after = SkipSpace(held_, end);
    const std::string_view tail = std::string_view(held_).substr(after);
    if (tail.starts_with(syntax_.close)) {
      after += syntax_.close.size();
    } else if (!std::string_view(syntax_.close).starts_with(tail)) {
      fail();
      return true;
    } else if (!final) {
      return false;  // the close marker may be coming
    } else {
      after = held_.size();  // the answer ended before the close marker: the call stands
    }
  }
  held_.erase(0, after);
  for (size_t k = 0; k < calls.size(); ++k) {
    ToolCall& c = calls[k];
    Piece piece;
    piece.call = static_cast<int>(made_ + k);
    size_t shown = 0;
    if (k < streamed_.size()) {  // its first pieces went out as it was written
      c.id = streamed_[k].id;
      shown = std::min(streamed_[k].args_shown, c.arguments.size());
    } else {
      piece.id = c.id;
      piece.name = c.name;
    }
    piece.arguments = c.arguments.substr(shown);
    if (!piece.id.empty() || !piece.arguments.empty()) out->pieces.push_back(std::move(piece));
  }
  streamed_.clear();
  made_ += calls.size();
  for (ToolCall& c : calls) out->calls.push_back(std::move(c));
  return true;
}

void ToolCallParser::StreamPartial(size_t v, Output* out, size_t until) {
  if (!syntax_.forced && held_[v] != '{' && !(syntax_.array && held_[v] == '[')) return;
  const std::string_view text = std::string_view(held_).substr(0, until);
  const std::vector<size_t> starts = CallStarts(text, v);
  for (size_t k = 0; k < starts.size(); ++k) {
    const CallShape shape = ScanCall(text, starts[k]);
    if (!shape.name) return;
    if (!syntax_.forced && std::find(names_.begin(), names_.end(), *shape.name) == names_.end()) {
      return;  // not a call of the request's tools: it will be text
    }
    Piece piece;
    piece.call = static_cast<int>(made_ + k);
    if (k == streamed_.size()) {
      streamed_.push_back({NewToolCallId(), *shape.name, "", 0});
      piece.id = streamed_[k].id;
      piece.name = *shape.name;
    }
    if (shape.args_begin != std::string::npos && text[shape.args_begin] != '"') {
      const size_t avail = std::min(shape.args_end, text.size());
      std::string args = CompactArguments(text.substr(shape.args_begin, avail - shape.args_begin));
      if (!syntax_.forced) args.resize(ClosablePrefix(args));
      if (args.size() > streamed_[k].args_shown) {
        piece.arguments = args.substr(streamed_[k].args_shown);
        streamed_[k].args_shown = args.size();
        streamed_[k].args = std::move(args);
      }
    }
    if (!piece.id.empty() || !piece.arguments.empty()) out->pieces.push_back(std::move(piece));
    if (shape.end == std::string::npos) return;
  }
}

bool ToolCallParser::CloseStreamed(Output* out) {
  if (syntax_.forced || streamed_.empty()) return false;
  for (size_t k = 0; k < streamed_.size(); ++k) {
    Streamed& s = streamed_[k];
    const std::string close = s.args.empty() ? "{}" : "}";  // shown to a closable point
    Piece piece;
    piece.call = static_cast<int>(made_ + k);
    piece.arguments = close;
    out->pieces.push_back(std::move(piece));
    out->calls.push_back({s.id, s.name, s.args + close});
  }
  made_ += streamed_.size();
  streamed_.clear();
  mode_ = Mode::kSkip;  // the rest of the broken markup
  at_start_ = false;
  return true;
}

void ToolCallParser::AddText(std::string text, Output* out) {
  if (text.empty()) return;
  if (!out->pieces.empty() && out->pieces.back().call < 0) {
    out->pieces.back().content += text;
  } else {
    Piece p;
    p.content = std::move(text);
    out->pieces.push_back(std::move(p));
  }
}

void ToolCallParser::GiveUp(Output* out) {
  if (CloseStreamed(out)) return;
  mode_ = Mode::kPlain;
  AddText(std::move(held_), out);
  held_.clear();
  streamed_.clear();
}

bool ToolCallParser::ReadCalls(std::string_view text, std::vector<ToolCall>* out) const {
  const OrderedJson v = OrderedJson::parse(text, nullptr, /*allow_exceptions=*/false);
  if (v.is_discarded() || (v.is_array() && v.empty())) return false;
  const std::vector<size_t> starts = CallStarts(text, 0);
  if (starts.size() != (v.is_array() ? v.size() : 1)) return false;  // not all objects
  size_t k = 0;
  for (const OrderedJson& c : v.is_array() ? v : OrderedJson::array({v})) {
    const CallShape shape = ScanCall(text, starts[k++]);
    if (!c.is_object() || !c.contains("name") || !c["name"].is_string()) return false;
    ToolCall call;
    call.id = NewToolCallId();
    call.name = c["name"].get<std::string>();
    if (std::find(names_.begin(), names_.end(), call.name) == names_.end()) return false;
    OrderedJson args = OrderedJson::object();
    for (const char* key : {"arguments", "parameters"}) {
      if (c.contains(key)) args = c[key];
    }
    if (args.is_string()) {  // some models write the arguments as a JSON string
      args = OrderedJson::parse(args.get<std::string>(), nullptr, /*allow_exceptions=*/false);
      if (!args.is_object()) return false;
      call.arguments = args.dump();
    } else if (!args.is_object()) {
      return false;
    } else if (shape.args_end != std::string::npos) {  // as written, as it was streamed
      call.arguments =
          CompactArguments(text.substr(shape.args_begin, shape.args_end - shape.args_begin));
    } else {
      call.arguments = "{}";  // none given
    }
    out->push_back(std::move(call));
  }
  return true;
}

}  // namespace kvasir::serve
