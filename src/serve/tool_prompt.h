// Tool definitions and earlier tool calls laid into a chat prompt, in the format each template
// family's models were trained on:
//  - Hermes (ChatML/Qwen, and every family without a tool format of its own): a system block
//    listing the tools in <tools></tools>, calls as <tool_call>{"name": ..., "arguments": ...}
//    </tool_call>, results as <tool_response> blocks in a user turn;
//  - Llama 3.1+: the tools as JSON in the first user turn, calls as {"name": ..., "parameters":
//    ...}, results in an `ipython` turn;
//  - Mistral v3+/v7: [AVAILABLE_TOOLS] [...][/AVAILABLE_TOOLS] before the last [INST], calls as
//    [TOOL_CALLS] [...], results as [TOOL_RESULTS] {...}[/TOOL_RESULTS];
//  - Qwen3.5 (and Qwen3-Coder): the tools as JSON lines in a system block, calls as
//    <tool_call>\n<function=NAME>\n<parameter=P>\nVALUE\n</parameter>\n</function>\n</tool_call>
//    (a string value as it is, others as JSON), results as Hermes's.
#pragma once

#include <nlohmann/json.hpp>
#include <span>
#include <string>

#include "serve/request.h"
#include "tokenizer/chat_template.h"

namespace kvasir::serve {

enum class ToolStyle { kHermes, kLlama3, kMistral, kQwenXml };

// The tool format of `family`.
ToolStyle ToolStyleFor(ChatFamily family);

// True when `request` needs the tool layout: tools to lay out, or tool calls and results among
// its messages. Otherwise FormatChat lays it out alone, exactly as before tools.
bool NeedsToolLayout(const CompletionRequest& request);

// The conversation in `family`'s layout with the assistant's turn opened; the tools are laid out
// only when `tools.active()` (tool_choice "none" shows none), earlier calls and results always.
std::string FormatToolChat(ChatFamily family, std::span<const ChatTurn> turns,
                           const ToolsRequest& tools);

// A call argument's value as Qwen3.5's template writes it between <parameter=P> and
// </parameter>: a string as it is, an object or array as TemplateJson, true/false/null as Python
// prints them (True, False, None), a number as JSON.
std::string XmlParameterValue(const nlohmann::ordered_json& value);

// JSON as Python's json.dumps writes it (the templates' `tojson`): ", " and ": " on one line, or
// with `indent` > 0 one member per line. Non-ASCII text is kept as UTF-8.
std::string TemplateJson(const nlohmann::ordered_json& v, int indent = 0);

}  // namespace kvasir::serve
