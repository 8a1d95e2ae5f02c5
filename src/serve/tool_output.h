// A model's answer read back into tool calls, whole or as it streams. The text before a call is
// content; a call's own markup is never content, so text that may be the start of a call marker is
// held back until the next piece tells (as StopFilter holds back stop strings). A call that breaks
// before its name is read, or names no tool of the request, is given back as content, markup
// included. Once its name is a tool's, a call is shown as it is written and stays a call: if it
// breaks later it is closed at its last complete argument and the rest of its markup dropped. The
// result never depends on how the answer was split into pieces.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "serve/request.h"
#include "tokenizer/chat_template.h"

namespace kvasir::serve {

// The longest call (or array of calls, after its marker) read back; a longer one is content.
inline constexpr size_t kMaxCallBytes = size_t{256} << 10;

// How a family's model writes calls (tool_prompt.h): each call is a JSON object {"name": ...,
// "arguments" (or "parameters"): {...}}.
struct ToolSyntax {
  std::string open;    // the marker before a call: "<tool_call>", "[TOOL_CALLS]", ...
  std::string close;   // the marker after it ("</tool_call>"), or none
  bool array = false;  // after `open` comes an array of calls (Mistral)
  // A call may also begin without `open`, as bare JSON at the start of the answer or right after
  // another call: Llama 3's plain JSON calls, and calls a grammar enforces without a marker.
  bool bare = false;
  // The answer is written under ToolCallGrammarText's grammar, so every call that begins is one
  // (its name comes first, then its arguments): a call is streamed as it is written, not once it
  // is complete.
  bool forced = false;
  // Qwen3.5's XML-style calls inside open/close: <function=NAME>, then <parameter=P>VALUE
  // </parameter> for each argument, then </function> (tool_prompt.h). Streamed as written in every
  // mode, as the markup tells a call from text once <function=NAME> is complete: the name first,
  // then the arguments object piece by piece (a string value as its characters arrive).
  bool xml = false;
};

// `family`'s syntax; `forced`: the answer is written under ToolCallGrammarText's grammar.
ToolSyntax ToolSyntaxFor(ChatFamily family, bool forced);

// "call_" and 24 random letters and digits.
std::string NewToolCallId();

class ToolCallParser {
 public:
  // `names`: the request's tools; a call of another name is content.
  ToolCallParser(ToolSyntax syntax, std::vector<std::string> names);
  // The request's tools: their names, and for XML calls their parameters' types (a parameter
  // whose schema's type is "string" is taken as written; another is read as JSON where it parses).
  ToolCallParser(ToolSyntax syntax, std::span<const ToolDef> tools);

  // What a stream shows next, in order: text, or a piece of a call.
  struct Piece {
    std::string content;  // text (when call < 0)
    int call = -1;        // else the call's index in the answer
    std::string id;       // the call's first piece: its new id and its name
    std::string name;
    std::string arguments;  // the next bytes of the call's arguments
  };
  struct Output {
    std::vector<Piece> pieces;
    std::vector<ToolCall> calls;  // calls now complete (their pieces have all been given)
    std::string text() const;     // the pieces' content, joined
  };
  // Adds the next piece of the answer.
  Output Push(std::string_view text);
  // At the end of the answer: what was held back. A call cut short becomes content, unless `cut`
  // (max_tokens or the context ended the answer inside it): then it is dropped, as its markup is
  // not the model's text.
  Output Finish(bool cut = false);
  // Calls returned so far.
  size_t calls_made() const { return made_; }
  // A call's arguments as returned: the JSON object's text without the whitespace between tokens.
  static std::string CompactArguments(std::string_view json_text);

 private:
  // kSkip: the rest of a broken call that was shown in part, dropped up to its close marker.
  enum class Mode { kText, kCalls, kPlain, kSkip };
  void Scan(bool final, Output* out);
  // kCalls: one step over held_; false when it must wait for more text.
  bool CallStep(bool final, Output* out);
  void GiveUp(Output* out);
  // auto: the calls shown in part, closed where they were shown to (the rest of their markup is
  // dropped, never content); false when none was shown.
  bool CloseStreamed(Output* out);
  // The calls of the complete JSON value `text` (an object, or an array of them); false when it
  // is not calls of the request's tools.
  bool ReadCalls(std::string_view text, std::vector<ToolCall>* out) const;
  // The pieces of the calls in the value being written at held_[v, until), so far.
  void StreamPartial(size_t v, Output* out, size_t until = std::string::npos);
  void AddText(std::string text, Output* out);
  // xml: one step over held_ (in xml_call.cpp); false when it must wait for more text.
  bool XmlStep(bool final, Output* out);
  // xml: the call being read, ended early (malformed, or the answer ended): closed as far as it
  // was shown when it was shown at all, else its markup given back as content.
  void XmlEndEarly(Output* out);
  void XmlArgs(std::string text, Output* out);  // appends to the call's arguments and shows them
  const ToolDef* FindTool(const std::string& name) const;

  struct Streamed {  // a call of the value being written, as far as it has been shown
    std::string id;
    std::string name;
    std::string args;       // the bytes of its compact arguments shown
    size_t args_shown = 0;  // their count
  };

  ToolSyntax syntax_;
  std::vector<std::string> names_;
  Mode mode_ = Mode::kText;
  std::string held_;      // kText: text not yet shown; kCalls: the markup since the last call
  bool at_start_ = true;  // only whitespace so far
  size_t made_ = 0;
  // The calls of the value being written, shown as they are written: under a grammar (forced)
  // byte by byte; else (auto) a call once its name is one of the tools', then its arguments up
  // to the end of their last complete member, so that a call that breaks off can be closed.
  std::vector<Streamed> streamed_;
  std::vector<ToolDef> tools_;  // for XML calls' parameter types (empty: no types known)

  struct XmlCall {  // the XML call being read
    enum class Stage { kOutside, kName, kParams, kValue, kAfterFunction };
    Stage stage = Stage::kOutside;
    std::string raw;  // its markup read so far (content again if it is given up before its name)
    ToolCall call;    // id and name once read; arguments as shown so far
    int params = 0;   // parameters complete
    bool value_is_string = false;  // kValue: shown as it arrives, between quotes
    bool value_began = false;      // kValue: the newline after <parameter=P> is behind
    std::string param;             // kValue: its name
  };
  XmlCall xml_;
};

}  // namespace kvasir::serve
