// The chat flags of `generate` and `run` (--chat, -sys/--system, --chat-template): the prompt
// becomes a user message (after the system message, if any) laid out by the model's chat template
// with the opening of the assistant's turn, as llama.cpp's built-in templates lay it out
// (tokenizer/chat_template.h). The text is then tokenized like any prompt (BOS as the vocabulary
// asks, special tokens parsed), here or on a ring's head.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace kvasir::cli {

struct ChatFlags {
  bool chat = false;          // --chat
  std::string system;         // -sys, --system: implies --chat
  std::string template_name;  // --chat-template: a family name; implies --chat
  bool enabled() const { return chat || !system.empty() || !template_name.empty(); }
};

// Adds --chat, --system and --chat-template.
void AddChatFlags(CLI::App& app, ChatFlags* flags);

// argv with llama.cpp's "-sys" spelled "--system" (CLI11 takes only one-letter short names). The
// pointers are argv's own, or a static string; argv[0] is kept as it is.
std::vector<char*> SpellChatAliases(int argc, char** argv);

// A --chat-template value that names no family, as a usage message, or "" when it is fine (or
// absent). Checked before anything is loaded.
std::string CheckChatFlags(const ChatFlags& flags);

// The prompt text to tokenize: `user_text` as the user's message (after --system) laid out by the
// family of --chat-template or else of the model's tokenizer.chat_template. Errors name `name`
// (the model file or URL) and what is wrong (no template, an unknown one) and say how to choose a
// family.
Result<std::string> ChatPrompt(const ChatFlags& flags, const GgufHeader& header,
                               const std::string& name, const std::string& user_text);

// The same with no model at hand (a ring's client): only --chat-template can name the family.
// `where` says why there is no model ("--ring").
Result<std::string> ChatPromptWithoutModel(const ChatFlags& flags, const std::string& where,
                                           const std::string& user_text);

}  // namespace kvasir::cli
