// Chat templates: family detection on the public templates of real models, the text each family
// writes for one conversation, names, and refusals.
#include "tokenizer/chat_template.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "chat_template_samples.h"
#include "gguf/gguf_file.h"
#include "test_assets.h"
#include "tokenizer/tokenizer.h"

namespace kvasir {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ChatFamily Detect(const char* text) {
  auto f = DetectChatTemplate(text);
  EXPECT_TRUE(f.ok()) << f.status().message();
  return f.ok() ? *f : ChatFamily::kChatMl;
}

TEST(ChatTemplateTest, DetectsRealTemplates) {
  namespace s = chat_samples;
  EXPECT_EQ(Detect(s::kQwen25), ChatFamily::kChatMl);
  EXPECT_EQ(Detect(s::kQwen3), ChatFamily::kChatMl);
  EXPECT_EQ(Detect(s::kLlama31), ChatFamily::kLlama3);
  // Llama 2 chat strips the contents (content.strip()), which llama.cpp's llama2-sys-strip does.
  EXPECT_EQ(Detect(s::kLlama2), ChatFamily::kLlama2SysStrip);
  EXPECT_EQ(Detect(s::kMistralV1), ChatFamily::kMistralV1);
  EXPECT_EQ(Detect(s::kMistralV03), ChatFamily::kMistralV3);
  EXPECT_EQ(Detect(s::kMistralNemo), ChatFamily::kMistralV3Tekken);
  EXPECT_EQ(Detect(s::kMistralV7), ChatFamily::kMistralV7);
  // [SYSTEM_PROMPT] means v7; the tekken spacing is only chosen by name (as in llama.cpp).
  EXPECT_EQ(Detect(s::kMistralSmall32), ChatFamily::kMistralV7);
  EXPECT_EQ(Detect(s::kGemma2), ChatFamily::kGemma);
  EXPECT_EQ(Detect(s::kPhi3Mini), ChatFamily::kPhi3);
  EXPECT_EQ(Detect(s::kPhi35Mini), ChatFamily::kPhi3);
  EXPECT_EQ(Detect(s::kPhi4), ChatFamily::kPhi4);
  // ChatML that writes calls as <function=NAME> (Qwen3.5, Qwen3-Coder).
  EXPECT_EQ(Detect("{{- '<|im_start|>' + message.role }}{{- '<tool_call>\\n<function=' + "
                   "tool_call.name + '>\\n' }}"),
            ChatFamily::kQwen35);
}

TEST(ChatTemplateTest, DetectsLlama2Variants) {
  EXPECT_EQ(Detect("{{ '[INST] ' + message['content'] + ' [/INST]' }}"), ChatFamily::kLlama2);
  EXPECT_EQ(Detect("{{ '[INST] <<SYS>>\\n' + message['content'] }}"), ChatFamily::kLlama2Sys);
  EXPECT_EQ(Detect("{{ '<<SYS>>' }}{{ bos_token + '[INST] ' + message['content'] }}"),
            ChatFamily::kLlama2SysBos);
  // A template that starts with "mistral" is an [INST] family even without the marker.
  EXPECT_EQ(Detect("mistral-ish"), ChatFamily::kLlama2);
}

TEST(ChatTemplateTest, NamesRoundTrip) {
  for (std::string_view name : ChatFamilyNames()) {
    auto f = ChatFamilyFromName(name);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(ChatFamilyName(*f), name);
    // A template text that is exactly a name selects that family, as in llama.cpp.
    auto d = DetectChatTemplate(name);
    ASSERT_TRUE(d.ok()) << name;
    EXPECT_EQ(*d, *f);
  }
  EXPECT_EQ(*ChatFamilyFromName("mistral-v7-tekken"), ChatFamily::kMistralV7Tekken);
  auto bad = ChatFamilyFromName("vicuna");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("'vicuna'"));
  EXPECT_THAT(bad.status().message(), HasSubstr("chatml, llama2"));
}

TEST(ChatTemplateTest, UnknownTemplateNamesWhatWasLookedFor) {
  auto r = DetectChatTemplate(
      "{% for m in messages %}### {{ m['role'] }}: {{ m['content'] }}\n"
      "{% endfor %}");
  ASSERT_FALSE(r.ok());
  const std::string& msg = r.status().message();
  EXPECT_THAT(msg, HasSubstr("not recognised"));
  for (const char* marker :
       {"<|im_start|>", "[INST]", "<start_of_turn>", "<|start_header_id|>", "<|end|>"}) {
    EXPECT_THAT(msg, HasSubstr(marker));
  }
  EXPECT_THAT(msg, HasSubstr("begins '{% for m in messages %}###"));
  EXPECT_THAT(msg, Not(HasSubstr("\n")));
  EXPECT_FALSE(DetectChatTemplate("").ok());
}

TEST(ChatTemplateTest, KnownButUnsupportedFamilyIsRefusedByName) {
  // Command R's template is not Llama 3 or anything else this build writes.
  auto r = DetectChatTemplate(chat_samples::kCommandR);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("Command R"));
  EXPECT_THAT(r.status().message(), HasSubstr("supported: chatml"));
  // Zephyr-style <|user|> ... <|endoftext|> is refused before it could pass for anything else.
  auto z = DetectChatTemplate("{{ '<|user|>\\n' + m['content'] + '<|endoftext|>' }}");
  ASSERT_FALSE(z.ok());
  EXPECT_THAT(z.status().message(), HasSubstr("Zephyr"));
}

const std::vector<ChatMessage> kConversation = {
    {"system", "You are a helpful assistant"},
    {"user", "Hello"},
    {"assistant", "Hi there"},
    {"user", "Who are you"},
};

struct Expected {
  ChatFamily family;
  const char* text;  // with the generation prompt
};

TEST(ChatTemplateTest, FormatsEachFamily) {
  const Expected cases[] = {
      {ChatFamily::kChatMl,
       "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n"
       "<|im_start|>user\nHello<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n"
       "<|im_start|>user\nWho are you<|im_end|>\n<|im_start|>assistant\n"},
      {ChatFamily::kLlama3,
       "<|start_header_id|>system<|end_header_id|>\n\nYou are a helpful assistant<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nHello<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\nHi there<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nWho are you<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
      {ChatFamily::kLlama2,
       "[INST] You are a helpful assistant\nHello [/INST]Hi there</s>"
       "[INST] Who are you [/INST]"},
      {ChatFamily::kLlama2Sys,
       "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>"
       "[INST] Who are you [/INST]"},
      {ChatFamily::kLlama2SysBos,
       "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>"
       "<s>[INST] Who are you [/INST]"},
      {ChatFamily::kLlama2SysStrip,
       "[INST] <<SYS>>\nYou are a helpful assistant\n<</SYS>>\n\nHello [/INST]Hi there</s>"
       "[INST] Who are you [/INST]"},
      {ChatFamily::kMistralV1,
       " [INST] You are a helpful assistant\n\nHello [/INST] Hi there</s>"
       " [INST] Who are you [/INST]"},
      {ChatFamily::kMistralV3,
       "[INST] You are a helpful assistant\n\nHello[/INST] Hi there</s>"
       "[INST] Who are you[/INST]"},
      {ChatFamily::kMistralV3Tekken,
       "[INST]You are a helpful assistant\n\nHello[/INST]Hi there</s>"
       "[INST]Who are you[/INST]"},
      {ChatFamily::kMistralV7,
       "[SYSTEM_PROMPT] You are a helpful assistant[/SYSTEM_PROMPT][INST] Hello[/INST] Hi there</s>"
       "[INST] Who are you[/INST]"},
      {ChatFamily::kMistralV7Tekken,
       "[SYSTEM_PROMPT]You are a helpful assistant[/SYSTEM_PROMPT][INST]Hello[/INST]Hi there</s>"
       "[INST]Who are you[/INST]"},
      {ChatFamily::kGemma,
       "<start_of_turn>user\nYou are a helpful assistant\n\nHello<end_of_turn>\n"
       "<start_of_turn>model\nHi there<end_of_turn>\n"
       "<start_of_turn>user\nWho are you<end_of_turn>\n<start_of_turn>model\n"},
      {ChatFamily::kPhi3,
       "<|system|>\nYou are a helpful assistant<|end|>\n<|user|>\nHello<|end|>\n"
       "<|assistant|>\nHi there<|end|>\n<|user|>\nWho are you<|end|>\n<|assistant|>\n"},
      {ChatFamily::kPhi4,
       "<|im_start|>system<|im_sep|>You are a helpful assistant<|im_end|>"
       "<|im_start|>user<|im_sep|>Hello<|im_end|><|im_start|>assistant<|im_sep|>Hi there<|im_end|>"
       "<|im_start|>user<|im_sep|>Who are you<|im_end|><|im_start|>assistant<|im_sep|>"},
      {ChatFamily::kQwen35,
       "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello"
       "<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nWho are you"
       "<|im_end|>\n<|im_start|>assistant\n"},
  };
  ASSERT_EQ(std::size(cases), ChatFamilyNames().size()) << "a family without a case";
  for (const Expected& c : cases) {
    SCOPED_TRACE(ChatFamilyName(c.family));
    EXPECT_EQ(FormatChat(c.family, kConversation, /*add_generation_prompt=*/true), c.text);
  }
}

TEST(ChatTemplateTest, GenerationPromptOnlyWhereTheFamilyHasOne) {
  const std::vector<ChatMessage> user = {{"user", "Hi"}};
  EXPECT_EQ(FormatChat(ChatFamily::kChatMl, user, false), "<|im_start|>user\nHi<|im_end|>\n");
  EXPECT_EQ(FormatChat(ChatFamily::kGemma, user, false), "<start_of_turn>user\nHi<end_of_turn>\n");
  EXPECT_EQ(FormatChat(ChatFamily::kLlama3, user, false),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>");
  EXPECT_EQ(FormatChat(ChatFamily::kPhi3, user, false), "<|user|>\nHi<|end|>\n");
  // The [INST] families end the user turn with [/INST]: the answer follows it directly.
  for (ChatFamily f : {ChatFamily::kLlama2Sys, ChatFamily::kMistralV3, ChatFamily::kMistralV7}) {
    EXPECT_EQ(FormatChat(f, user, true), FormatChat(f, user, false)) << ChatFamilyName(f);
  }
  // No family writes BOS itself: the tokenizer adds it when the vocabulary asks.
  for (std::string_view name : ChatFamilyNames()) {
    const std::string text = FormatChat(*ChatFamilyFromName(name), user, true);
    EXPECT_FALSE(text.starts_with("<s>")) << name;
    EXPECT_FALSE(text.starts_with("<bos>")) << name;
    EXPECT_FALSE(text.starts_with("<|begin_of_text|>")) << name;
  }
}

TEST(ChatTemplateTest, TrimsWhereTheFamilyTrims) {
  const std::vector<ChatMessage> msgs = {{"user", " Hi "}, {"assistant", "  Hey  "}};
  EXPECT_EQ(FormatChat(ChatFamily::kChatMl, msgs, false),
            "<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\n  Hey  <|im_end|>\n");
  EXPECT_EQ(FormatChat(ChatFamily::kLlama3, msgs, false),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHey<|eot_id|>");
  EXPECT_EQ(FormatChat(ChatFamily::kGemma, msgs, false),
            "<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\nHey<end_of_turn>\n");
  // v3 trims only the answer; v3-tekken trims nothing.
  EXPECT_EQ(FormatChat(ChatFamily::kMistralV3, msgs, false), "[INST]  Hi [/INST] Hey</s>");
  EXPECT_EQ(FormatChat(ChatFamily::kMistralV3Tekken, msgs, false), "[INST] Hi [/INST]  Hey  </s>");
  EXPECT_EQ(FormatChat(ChatFamily::kLlama2SysStrip, msgs, false), "[INST] Hi [/INST]Hey</s>");
  EXPECT_EQ(FormatChat(ChatFamily::kLlama2Sys, msgs, false), "[INST]  Hi  [/INST]  Hey  </s>");
}

TEST(ChatTemplateTest, GemmaSystemWaitsForAUserTurn) {
  const std::vector<ChatMessage> msgs = {{"system", " Be brief. "}, {"user", "Hi"}};
  EXPECT_EQ(FormatChat(ChatFamily::kGemma, msgs, true),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
  // A system message alone is not written (there is no user turn to fold it into).
  EXPECT_EQ(FormatChat(ChatFamily::kGemma, std::vector<ChatMessage>{{"system", "x"}}, true),
            "<start_of_turn>model\n");
}

TEST(ChatTemplateTest, ModelFamilyFromHeader) {
  GgufHeader h;
  auto none = ChatFamilyForModel(h, "tiny.gguf", "");
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(none.status().message(), HasSubstr("tiny.gguf"));
  EXPECT_THAT(none.status().message(), HasSubstr("tokenizer.chat_template"));
  // An override needs no template in the file.
  auto forced = ChatFamilyForModel(h, "tiny.gguf", "gemma");
  ASSERT_TRUE(forced.ok()) << forced.status().message();
  EXPECT_EQ(*forced, ChatFamily::kGemma);

  h.kvs.push_back({std::string(kChatTemplateKey), GgufValue::Uint32(3)});
  auto wrong_type = ChatFamilyForModel(h, "tiny.gguf", "");
  ASSERT_FALSE(wrong_type.ok());
  EXPECT_THAT(wrong_type.status().message(), HasSubstr("not a string"));

  h.kvs.back().value = GgufValue::String(chat_samples::kQwen25);
  EXPECT_EQ(*ChatFamilyForModel(h, "tiny.gguf", ""), ChatFamily::kChatMl);
  EXPECT_EQ(*ChatFamilyForModel(h, "tiny.gguf", "llama3"), ChatFamily::kLlama3);

  // A qwen35 model's ChatML template lays tools out as Qwen3.5 does.
  h.kvs.push_back({"general.architecture", GgufValue::String("qwen35moe")});
  EXPECT_EQ(*ChatFamilyForModel(h, "tiny.gguf", ""), ChatFamily::kQwen35);
  EXPECT_EQ(*ChatFamilyForModel(h, "tiny.gguf", "chatml"), ChatFamily::kChatMl);
  h.kvs.pop_back();

  h.kvs.back().value = GgufValue::String("{{ messages }}");
  auto unknown = ChatFamilyForModel(h, "tiny.gguf", "");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("tiny.gguf: tokenizer.chat_template:"));
  EXPECT_THAT(unknown.status().message(), HasSubstr("not recognised"));
}

// The ids the laid-out text tokenizes to (BOS from the vocabulary, specials parsed) are
// llama.cpp's: these were printed by llama_chat_apply_template + llama_tokenize(add_special,
// parse_special) on the same model and conversation.
TEST(ChatTemplateTest, TokenIdsMatchLlamaCpp) {
  constexpr const char* kModel = "models/llama-2-tiny-random.gguf";
  KV_REQUIRE_ASSET(kModel);
  auto file = GgufFile::Open(::kvasir::testing::AssetPath(kModel));
  ASSERT_TRUE(file.ok()) << file.status().message();
  auto tok = Tokenizer::FromGguf(file->header(), kModel);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  const struct {
    ChatFamily family;
    std::vector<int32_t> ids;
  } cases[] = {
      // One BOS from the tokenizer, "</s>" and the later "<s>" parsed to their ids (2, 1).
      {ChatFamily::kLlama2SysBos,
       {1,     518,   25580, 29962, 3532,  14816, 29903, 6778,  13,   3492, 526,
        263,   8444,  20255, 13,    29966, 829,   14816, 29903, 6778, 13,   13,
        10994, 518,   29914, 25580, 29962, 18567, 727,   2,     1,    518,  25580,
        29962, 11644, 526,   366,   518,   29914, 25580, 29962}},
      {ChatFamily::kMistralV7,
       {1,     518,   14816, 1254,  12665, 29918, 29925, 3491,  7982,  29962, 887,  526,
        263,   8444,  20255, 29961, 29914, 14816, 1254,  12665, 29918, 29925, 3491, 7982,
        3816,  25580, 29962, 15043, 29961, 29914, 25580, 29962, 6324,  727,   2,    518,
        25580, 29962, 11644, 526,   366,   29961, 29914, 25580, 29962}},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(ChatFamilyName(c.family));
    const std::string text = FormatChat(c.family, kConversation, /*add_generation_prompt=*/true);
    EXPECT_EQ((*tok)->Encode(text, /*add_special=*/true, /*parse_special=*/true), c.ids);
  }
}

}  // namespace
}  // namespace kvasir
