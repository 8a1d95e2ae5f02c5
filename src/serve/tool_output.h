// A model's answer read back into tool calls, whole or as it streams. The text before a call is
// content; a call's own markup is never content, so text that may be the start of a call marker is
// held back until the next piece tells (as StopFilter holds back stop strings). A call that does
// not parse, or names no tool of the request, is given back as content, markup included: nothing
// the model wrote is lost.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "serve/request.h"
#include "tokenizer/chat_template.h"

namespace kvasir::serve {

// How a family's model writes calls (tool_prompt.h): each call is a JSON object {"name": ...,
// "arguments" (or "parameters"): {...}}.
struct ToolSyntax {
  std::string open;    // the marker before a call: "<tool_call>", "[TOOL_CALLS]", ...
  std::string close;   // the marker after it ("</tool_call>"), or none
  bool array = false;  // after `open` comes an array of calls (Mistral)
  // A call may also begin without `open`, as bare JSON at the start of the answer or right after
  // another call: Llama 3's plain JSON calls, and calls a grammar enforces without a marker.
  bool bare = false;
};

// `family`'s syntax; `forced`: the answer is written under ToolCallGrammarText's grammar.
ToolSyntax ToolSyntaxFor(ChatFamily family, bool forced);

// "call_" and 24 random letters and digits.
std::string NewToolCallId();

class ToolCallParser {
 public:
  // `names`: the request's tools; a call of another name is content.
  ToolCallParser(ToolSyntax syntax, std::vector<std::string> names);

  struct Output {
    std::string content;          // text to show, in order, before `calls`
    std::vector<ToolCall> calls;  // calls now complete, with new ids
  };
  // Adds the next piece of the answer.
  Output Push(std::string_view text);
  // At the end of the answer: what was held back. A call cut short becomes content, unless `cut`
  // (max_tokens or the context ended the answer inside it): then it is dropped, as its markup is
  // not the model's text.
  Output Finish(bool cut = false);
  // Calls returned so far.
  size_t calls_made() const { return made_; }

 private:
  enum class Mode { kText, kCalls, kPlain };
  void Scan(bool final, Output* out);
  // kCalls: one step over held_; false when it must wait for more text.
  bool CallStep(bool final, Output* out);
  void GiveUp(Output* out);
  bool ReadCalls(std::string_view json, std::vector<ToolCall>* out) const;

  ToolSyntax syntax_;
  std::vector<std::string> names_;
  Mode mode_ = Mode::kText;
  std::string held_;      // kText: text not yet shown; kCalls: the markup since the last call
  bool at_start_ = true;  // only whitespace so far
  size_t made_ = 0;
};

}  // namespace kvasir::serve
