#include "cli/chat_prompt.h"

#include <fmt/format.h>

#include <cstring>

#include "tokenizer/chat_template.h"

namespace kvasir::cli {
namespace {

std::string FamilyList() {
  std::string out;
  for (std::string_view name : ChatFamilyNames()) {
    if (!out.empty()) out += ", ";
    out += name;
  }
  return out;
}

std::string Format(ChatFamily family, const ChatFlags& flags, const std::string& user_text) {
  std::vector<ChatMessage> messages;
  if (!flags.system.empty()) messages.push_back({"system", flags.system});
  messages.push_back({"user", user_text});
  return FormatChat(family, messages, /*add_generation_prompt=*/true);
}

}  // namespace

void AddChatFlags(CLI::App& app, ChatFlags* flags) {
  app.add_flag("--chat", flags->chat,
               "treat -p as a user message: apply the model's chat template (tokenizer."
               "chat_template) with the assistant's turn opened");
  // "-sys" reaches here as --system (SpellChatAliases).
  app.add_option("--system", flags->system, "(also -sys) system message (implies --chat)");
  app.add_option(
      "--chat-template", flags->template_name,
      "chat format to use instead of the model's template (implies --chat): " + FamilyList());
}

std::vector<char*> SpellChatAliases(int argc, char** argv) {
  static char kSystem[] = "--system";
  std::vector<char*> out(argv, argv + argc);
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(out[i], "--") == 0) break;
    if (std::strcmp(out[i], "-sys") == 0) out[i] = kSystem;
  }
  return out;
}

std::string CheckChatFlags(const ChatFlags& flags) {
  if (flags.template_name.empty()) return "";
  auto family = ChatFamilyFromName(flags.template_name);
  return family.ok() ? "" : "--chat-template: " + family.status().message();
}

Result<std::string> ChatPrompt(const ChatFlags& flags, const GgufHeader& header,
                               const std::string& name, const std::string& user_text) {
  auto family = ChatFamilyForModel(header, name, flags.template_name);
  if (!family.ok()) {
    return Error("--chat: {}; choose one with --chat-template NAME", family.status().message());
  }
  return Format(*family, flags, user_text);
}

Result<std::string> ChatPromptWithoutModel(const ChatFlags& flags, const std::string& where,
                                           const std::string& user_text) {
  if (flags.template_name.empty()) {
    return Error(
        "--chat with {} needs --chat-template NAME ({}): this client has no model file "
        "to read tokenizer.chat_template from, and the head tokenizes the text it is sent",
        where, FamilyList());
  }
  auto family = ChatFamilyFromName(flags.template_name);
  if (!family.ok()) return family.status();
  return Format(*family, flags, user_text);
}

}  // namespace kvasir::cli
