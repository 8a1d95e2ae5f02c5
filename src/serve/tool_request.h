// The tool-call fields of a chat request (tools, tool_choice, parallel_tool_calls, and the
// messages' tool_calls and tool_call_id), read and checked with errors naming the field. Called by
// request.cpp; pure functions of the JSON, as the rest of the request.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "serve/api_error.h"
#include "serve/request.h"

namespace kvasir::serve {

inline constexpr size_t kMaxTools = 128;
inline constexpr size_t kMaxToolCallsPerTurn = 64;
inline constexpr size_t kMaxToolNameBytes = 64;

// "tools": [{"type": "function", "function": {"name", "description", "parameters", "strict"}}].
// The parameters are taken here from `v` (member order lost); CompileToolParameters replaces them
// with the ordered ones.
bool ReadTools(const nlohmann::json& v, std::vector<ToolDef>* out, ApiError* error);

// "tool_choice": "none" | "auto" | "required" | {"type": "function", "function": {"name"}}.
bool ReadToolChoice(const nlohmann::json& v, ToolChoice* out, ApiError* error);

// An assistant message's "tool_calls": [{"id", "type": "function", "function": {"name",
// "arguments": "<JSON object text>"}}]; `param` is the field's path ("messages[2].tool_calls").
bool ReadToolCalls(const nlohmann::json& v, const std::string& param, std::vector<ToolCall>* out,
                   ApiError* error);

// With the body parsed again in member order (`ordered`): each tool's parameters in that order,
// compiled once by grammar/json_schema.h so that an unsupported keyword is the client's 400
// naming the tool; then tool_choice checked against the tools (a named function must be one).
bool CompleteTools(const nlohmann::ordered_json& ordered, ToolsRequest* tools, ApiError* error);

}  // namespace kvasir::serve
