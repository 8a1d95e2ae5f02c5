// Chat templates without a Jinja engine: the family of a model's `tokenizer.chat_template` is
// recognised from marker substrings, and each family's turn format is written out in C++. The
// families, their names and their formats are those of llama.cpp's built-in templates
// (llama_chat_apply_template), so that `Encode(FormatChat(...), add_special = true,
// parse_special = true)` gives the ids llama.cpp gives for the same conversation: no family writes
// a leading BOS, which the tokenizer adds when the vocabulary asks (tokenizer.ggml.add_bos_token).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace kvasir {

// GGUF key of the Jinja template text.
inline constexpr std::string_view kChatTemplateKey = "tokenizer.chat_template";

enum class ChatFamily {
  kChatMl,           // <|im_start|>role\n...<|im_end|>\n (Qwen, Qwen2, Qwen3, ...)
  kLlama2,           // [INST] ... [/INST], system text without <<SYS>>
  kLlama2Sys,        // system inside <<SYS>>\n...\n<</SYS>>\n\n
  kLlama2SysBos,     // as kLlama2Sys, later turns start with <s>
  kLlama2SysStrip,   // as kLlama2Sys, contents trimmed
  kMistralV1,        // " [INST] ... [/INST]" (spaces around the markers)
  kMistralV3,        // "[INST] ... [/INST]", assistant content trimmed
  kMistralV3Tekken,  // "[INST]...[/INST]" (no spaces)
  kMistralV7,        // [SYSTEM_PROMPT] ...[/SYSTEM_PROMPT][INST] ...[/INST]
  kMistralV7Tekken,  // as kMistralV7 without the spaces
  kLlama3,           // <|start_header_id|>role<|end_header_id|>\n\n...<|eot_id|>
  kGemma,            // <start_of_turn>user\n...<end_of_turn>\n, system folded into the first user
  kPhi3,             // <|role|>\n...<|end|>\n
  kPhi4,             // <|im_start|>role<|im_sep|>...<|im_end|>
  kQwen35,           // ChatML turns; tools and calls in Qwen3.5's XML-style format (<function=...>)
};

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// The family's name as --chat-template takes it ("chatml", "llama3", "mistral-v7", ...).
std::string_view ChatFamilyName(ChatFamily family);
// Every family name, in enum order.
std::vector<std::string_view> ChatFamilyNames();
// The family named `name`. An unknown name is an error that lists the known ones.
Result<ChatFamily> ChatFamilyFromName(std::string_view name);

// Recognises the family of a Jinja chat template from marker substrings, in llama.cpp's order of
// checks (e.g. <|im_start|> means ChatML unless <|im_sep|> makes it Phi-4; [INST] means Mistral or
// Llama 2, told apart by [SYSTEM_PROMPT], [AVAILABLE_TOOLS], <<SYS>> and spacing). A template
// llama.cpp knows as a family this build does not format (Zephyr, Command R, ...) is refused with
// that family's name; one with none of the markers is refused with the list of markers looked for.
// A ChatML template that writes calls as <function=NAME> (Qwen3.5, Qwen3-Coder) is kQwen35.
Result<ChatFamily> DetectChatTemplate(std::string_view template_text);

// The family for a model: `override_name` when non-empty (a family name, see ChatFamilyFromName),
// else detected from the header's tokenizer.chat_template (a ChatML template of a qwen35 or
// qwen35moe model, whatever its text, is kQwen35). Errors name `name` (the file) and what
// is wrong: no template key, a key that is not a string, or a template not recognised.
Result<ChatFamily> ChatFamilyForModel(const GgufHeader& header, const std::string& name,
                                      std::string_view override_name);

// The conversation as the family lays it out. `add_generation_prompt` appends the opening of an
// assistant turn for the families that have one (the [INST] families end a user turn with [/INST]
// and have none). Roles must be "system", "user" or "assistant" (another role is a bug). The text
// is meant to be tokenized with parse_special = true, so that the markers become their tokens.
std::string FormatChat(ChatFamily family, std::span<const ChatMessage> messages,
                       bool add_generation_prompt);

}  // namespace kvasir
