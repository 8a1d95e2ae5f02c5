// Chat template families: recognition from marker substrings and the turn format of each.
#include "tokenizer/chat_template.h"

#include <fmt/format.h>

#include <array>
#include <cctype>

#include "base/check.h"

namespace kvasir {
namespace {

struct FamilyName {
  ChatFamily family;
  std::string_view name;
};

// The names llama.cpp gives these families, so a --chat-template value means the same in both.
constexpr std::array<FamilyName, 15> kFamilyNames = {{
    {ChatFamily::kChatMl, "chatml"},
    {ChatFamily::kLlama2, "llama2"},
    {ChatFamily::kLlama2Sys, "llama2-sys"},
    {ChatFamily::kLlama2SysBos, "llama2-sys-bos"},
    {ChatFamily::kLlama2SysStrip, "llama2-sys-strip"},
    {ChatFamily::kMistralV1, "mistral-v1"},
    {ChatFamily::kMistralV3, "mistral-v3"},
    {ChatFamily::kMistralV3Tekken, "mistral-v3-tekken"},
    {ChatFamily::kMistralV7, "mistral-v7"},
    {ChatFamily::kMistralV7Tekken, "mistral-v7-tekken"},
    {ChatFamily::kLlama3, "llama3"},
    {ChatFamily::kGemma, "gemma"},
    {ChatFamily::kPhi3, "phi3"},
    {ChatFamily::kPhi4, "phi4"},
    {ChatFamily::kQwen35, "qwen3.5"},
}};

// A family llama.cpp recognises but this build does not format, with the markers that identify
// it (all of them must occur; an empty second marker is none).
struct OtherFamily {
  std::string_view name;
  std::string_view marker;
  std::string_view also = {};
};

// Checked after Phi-3 and before Gemma, as llama.cpp does: their templates may also contain a
// later family's markers, so they are refused by name rather than formatted as that family.
const OtherFamily kCheckedBeforeGemma[] = {
    {"ChatGLM 4", "[gMASK]<sop>"},
    {"Falcon 3 / GLM-Edge / EXAONE MoE", "<|assistant|>", "<|user|>"},
    {"GLM-Edge", "<|{{ item['role'] }}|>", "<|begin_of_image|>"},
    {"Zephyr", "<|user|>", "<|endoftext|>"},
    {"Monarch", "bos_token + message['role']"},
};
// Checked after Gemma and before Llama 3.
const OtherFamily kCheckedBeforeLlama3[] = {
    {"Orion", "'\\n\\nAssistant: ' + eos_token"},
    {"OpenChat", "GPT4 Correct "},
    {"Vicuna", "USER: ", "ASSISTANT: "},
    {"DeepSeek Coder", "### Instruction:", "<|EOT|>"},
    {"Command R", "<|START_OF_TURN_TOKEN|>", "<|USER_TOKEN|>"},
};

constexpr std::string_view kMarkersLookedFor =
    "<|im_start|> (chatml, phi4), [INST] (mistral-*, llama2-*), <|assistant|> with <|end|> (phi3), "
    "<start_of_turn> (gemma), <|start_header_id|> with <|end_header_id|> (llama3)";

std::string KnownNames() {
  std::string out;
  for (const FamilyName& f : kFamilyNames) {
    if (!out.empty()) out += ", ";
    out += f.name;
  }
  return out;
}

// The first characters of a template, on one line, for an error message.
std::string Excerpt(std::string_view text) {
  constexpr size_t kMax = 60;
  std::string out;
  for (char c : text.substr(0, kMax)) {
    out += std::isprint(static_cast<unsigned char>(c)) ? c : ' ';
  }
  if (text.size() > kMax) out += "...";
  return out;
}

std::string_view Trim(std::string_view s) {
  const auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

bool Contains(std::string_view text, std::string_view marker) {
  return text.find(marker) != std::string_view::npos;
}

// The [INST] families. Mistral's official templates name [SYSTEM_PROMPT] (v7) or the tool markers
// and differ in spacing; every other [INST] template is Llama 2, whose variants differ in system
// support, BOS between turns and trimming. Like llama.cpp, a v7 template text is never taken for
// v7-tekken (only the name selects it).
ChatFamily DetectInst(std::string_view t) {
  if (Contains(t, "[SYSTEM_PROMPT]")) return ChatFamily::kMistralV7;
  if (Contains(t, "' [INST] ' + system_message") || Contains(t, "[AVAILABLE_TOOLS]")) {
    if (Contains(t, " [INST]")) return ChatFamily::kMistralV1;
    if (Contains(t, "\"[INST]\"")) return ChatFamily::kMistralV3Tekken;
    return ChatFamily::kMistralV3;
  }
  if (Contains(t, "content.strip()")) return ChatFamily::kLlama2SysStrip;
  if (Contains(t, "bos_token + '[INST]")) return ChatFamily::kLlama2SysBos;
  if (Contains(t, "<<SYS>>")) return ChatFamily::kLlama2Sys;
  return ChatFamily::kLlama2;
}

// The first family of `others` whose markers all occur in `t`, or nullptr.
template <size_t N>
const OtherFamily* MatchOther(std::string_view t, const OtherFamily (&others)[N]) {
  for (const OtherFamily& o : others) {
    if (Contains(t, o.marker) && (o.also.empty() || Contains(t, o.also))) return &o;
  }
  return nullptr;
}

Status Unsupported(const OtherFamily& o) {
  return Error(
      "the chat template looks like {} (it contains '{}'), a format kvasir does not "
      "write; supported: {}",
      o.name, o.marker, KnownNames());
}

void FormatChatMl(std::span<const ChatMessage> msgs, bool gen, std::string* out) {
  for (const ChatMessage& m : msgs) {
    *out += fmt::format("<|im_start|>{}\n{}<|im_end|>\n", m.role, m.content);
  }
  if (gen) *out += "<|im_start|>assistant\n";
}

void FormatPhi4(std::span<const ChatMessage> msgs, bool gen, std::string* out) {
  for (const ChatMessage& m : msgs) {
    *out += fmt::format("<|im_start|>{}<|im_sep|>{}<|im_end|>", m.role, m.content);
  }
  if (gen) *out += "<|im_start|>assistant<|im_sep|>";
}

void FormatPhi3(std::span<const ChatMessage> msgs, bool gen, std::string* out) {
  for (const ChatMessage& m : msgs) *out += fmt::format("<|{}|>\n{}<|end|>\n", m.role, m.content);
  if (gen) *out += "<|assistant|>\n";
}

void FormatLlama3(std::span<const ChatMessage> msgs, bool gen, std::string* out) {
  for (const ChatMessage& m : msgs) {
    *out += fmt::format("<|start_header_id|>{}<|end_header_id|>\n\n{}<|eot_id|>", m.role,
                        Trim(m.content));
  }
  if (gen) *out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

// Gemma has no system role: system text (trimmed) opens the next user turn.
void FormatGemma(std::span<const ChatMessage> msgs, bool gen, std::string* out) {
  std::string system;
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") {
      system += Trim(m.content);
      continue;
    }
    const bool model = m.role == "assistant";
    *out += fmt::format("<start_of_turn>{}\n", model ? "model" : m.role);
    if (!model && !system.empty()) {
      *out += system + "\n\n";
      system.clear();
    }
    *out += fmt::format("{}<end_of_turn>\n", Trim(m.content));
  }
  if (gen) *out += "<start_of_turn>model\n";
}

// Mistral v7: each message in its own markers; the assistant's turn follows [/INST] directly, so
// there is no generation prompt to add.
void FormatMistralV7(std::span<const ChatMessage> msgs, bool tekken, std::string* out) {
  const std::string_view sp = tekken ? "" : " ";
  for (const ChatMessage& m : msgs) {
    if (m.role == "system") {
      *out += fmt::format("[SYSTEM_PROMPT]{}{}[/SYSTEM_PROMPT]", sp, m.content);
    } else if (m.role == "user") {
      *out += fmt::format("[INST]{}{}[/INST]", sp, m.content);
    } else {
      *out += fmt::format("{}{}</s>", sp, m.content);
    }
  }
}

// Mistral v1/v3/v3-tekken: a turn is [INST] (system text, then) user text [/INST] and the answer
// up to </s>; the versions differ only in the spaces around the markers and in v3 trimming the
// answer.
void FormatMistral(std::span<const ChatMessage> msgs, ChatFamily family, std::string* out) {
  const std::string_view before = family == ChatFamily::kMistralV1 ? " " : "";
  const std::string_view after = family == ChatFamily::kMistralV3Tekken ? "" : " ";
  bool in_turn = false;
  for (const ChatMessage& m : msgs) {
    if (!in_turn) {
      *out += fmt::format("{}[INST]{}", before, after);
      in_turn = true;
    }
    if (m.role == "system") {
      *out += m.content + "\n\n";
    } else if (m.role == "user") {
      *out += fmt::format("{}{}[/INST]", m.content, before);
    } else {
      const std::string_view answer =
          family == ChatFamily::kMistralV3 ? Trim(m.content) : std::string_view(m.content);
      *out += fmt::format("{}{}</s>", after, answer);
      in_turn = false;
    }
  }
}

// Llama 2: the first [INST] carries no BOS (the tokenizer adds it); later turns start with "<s>"
// only in the -bos variant.
void FormatLlama2(std::span<const ChatMessage> msgs, ChatFamily family, std::string* out) {
  const bool sys_block = family != ChatFamily::kLlama2;
  const bool bos_between = family == ChatFamily::kLlama2SysBos;
  const bool strip = family == ChatFamily::kLlama2SysStrip;
  *out += "[INST] ";
  bool in_turn = true;
  for (const ChatMessage& m : msgs) {
    const std::string_view content = strip ? Trim(m.content) : std::string_view(m.content);
    if (!in_turn) {
      *out += bos_between ? "<s>[INST] " : "[INST] ";
      in_turn = true;
    }
    if (m.role == "system") {
      *out += sys_block ? fmt::format("<<SYS>>\n{}\n<</SYS>>\n\n", content)
                        : fmt::format("{}\n", content);
    } else if (m.role == "user") {
      *out += fmt::format("{} [/INST]", content);
    } else {
      *out += fmt::format("{}</s>", content);
      in_turn = false;
    }
  }
}

}  // namespace

std::string_view ChatFamilyName(ChatFamily family) {
  for (const FamilyName& f : kFamilyNames) {
    if (f.family == family) return f.name;
  }
  KV_CHECK(false, "chat family {} has no name", static_cast<int>(family));
  return {};
}

std::vector<std::string_view> ChatFamilyNames() {
  std::vector<std::string_view> names;
  for (const FamilyName& f : kFamilyNames) names.push_back(f.name);
  return names;
}

Result<ChatFamily> ChatFamilyFromName(std::string_view name) {
  for (const FamilyName& f : kFamilyNames) {
    if (f.name == name) return f.family;
  }
  return Error("unknown chat template name '{}' (known: {})", Excerpt(name), KnownNames());
}

Result<ChatFamily> DetectChatTemplate(std::string_view t) {
  // A template text that is a family's name selects it, as in llama.cpp.
  for (const FamilyName& f : kFamilyNames) {
    if (f.name == t) return f.family;
  }
  if (Contains(t, "<|im_start|>")) {
    if (Contains(t, "<|im_sep|>")) return ChatFamily::kPhi4;
    if (Contains(t, "<end_of_utterance>")) {
      return Unsupported(OtherFamily{"SmolVLM", "<end_of_utterance>"});
    }
    if (Contains(t, "<function=")) return ChatFamily::kQwen35;
    return ChatFamily::kChatMl;
  }
  if (t.starts_with("mistral") || Contains(t, "[INST]")) return DetectInst(t);
  if (Contains(t, "<|assistant|>") && Contains(t, "<|end|>")) return ChatFamily::kPhi3;
  if (const OtherFamily* o = MatchOther(t, kCheckedBeforeGemma)) return Unsupported(*o);
  if (Contains(t, "<start_of_turn>")) return ChatFamily::kGemma;
  if (const OtherFamily* o = MatchOther(t, kCheckedBeforeLlama3)) return Unsupported(*o);
  if (Contains(t, "<|start_header_id|>") && Contains(t, "<|end_header_id|>")) {
    return ChatFamily::kLlama3;
  }
  if (Trim(t).empty()) return Error("the chat template is empty");
  return Error("chat template not recognised: looked for {}; the template begins '{}'",
               kMarkersLookedFor, Excerpt(t));
}

Result<ChatFamily> ChatFamilyForModel(const GgufHeader& header, const std::string& name,
                                      std::string_view override_name) {
  if (!override_name.empty()) return ChatFamilyFromName(override_name);
  const GgufValue* v = header.Find(kChatTemplateKey);
  if (v == nullptr) {
    return Error("{}: the model has no {}, so its chat format is unknown; name one of: {}", name,
                 kChatTemplateKey, KnownNames());
  }
  const std::string* text = v->AsString();
  if (text == nullptr) return Error("{}: {} is not a string", name, kChatTemplateKey);
  auto family = DetectChatTemplate(*text);
  if (!family.ok()) return Error("{}: {}: {}", name, kChatTemplateKey, family.status().message());
  if (*family == ChatFamily::kChatMl) {
    const GgufValue* arch = header.Find("general.architecture");
    const std::string* a = arch != nullptr ? arch->AsString() : nullptr;
    if (a != nullptr && (*a == "qwen35" || *a == "qwen35moe")) return ChatFamily::kQwen35;
  }
  return family;
}

std::string FormatChat(ChatFamily family, std::span<const ChatMessage> messages,
                       bool add_generation_prompt) {
  for (const ChatMessage& m : messages) {
    KV_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant",
             "chat message role '{}' is not system, user or assistant", m.role);
  }
  std::string out;
  const bool gen = add_generation_prompt;
  switch (family) {
    case ChatFamily::kChatMl:
    case ChatFamily::kQwen35:
      FormatChatMl(messages, gen, &out);
      break;
    case ChatFamily::kPhi4:
      FormatPhi4(messages, gen, &out);
      break;
    case ChatFamily::kPhi3:
      FormatPhi3(messages, gen, &out);
      break;
    case ChatFamily::kLlama3:
      FormatLlama3(messages, gen, &out);
      break;
    case ChatFamily::kGemma:
      FormatGemma(messages, gen, &out);
      break;
    case ChatFamily::kMistralV7:
      FormatMistralV7(messages, /*tekken=*/false, &out);
      break;
    case ChatFamily::kMistralV7Tekken:
      FormatMistralV7(messages, /*tekken=*/true, &out);
      break;
    case ChatFamily::kMistralV1:
    case ChatFamily::kMistralV3:
    case ChatFamily::kMistralV3Tekken:
      FormatMistral(messages, family, &out);
      break;
    case ChatFamily::kLlama2:
    case ChatFamily::kLlama2Sys:
    case ChatFamily::kLlama2SysBos:
    case ChatFamily::kLlama2SysStrip:
      FormatLlama2(messages, family, &out);
      break;
  }
  return out;
}

}  // namespace kvasir
