// End-to-end tests of the kvasir binary's text front end: chat templates on generate and run, and
// `kvasir tokenize`.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "kvasir_process.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::AssetPath;
using testing::Describe;
using testing::ExpectRuntimeError;
using testing::ExpectUsageError;
using testing::RunResult;
using testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr const char* kStories = "models/stories260K.gguf";

RunResult Kvasir(const std::vector<std::string>& args) { return testing::RunKvasir(args); }

// ---- chat templates ---------------------------------------------------------------------------

// "prompt:    N tokens" from generate's summary, or -1.
int PromptTokens(const RunResult& r) {
  const size_t at = r.err.find("prompt:    ");
  return at == std::string::npos ? -1 : std::atoi(r.err.c_str() + at + 11);
}

// A copy of stories260K (tensors and all) whose tokenizer.chat_template is `chat_template`.
std::string StoriesWithTemplate(const TempDir& dir, const std::string& chat_template) {
  auto stories = GgufFile::Open(AssetPath(kStories));
  EXPECT_TRUE(stories.ok()) << stories.status().message();
  GgufWriter w;
  w.CopyKvs(stories->header());
  w.SetKv("tokenizer.chat_template", GgufValue::String(chat_template));
  for (const GgufTensorInfo& t : stories->tensors()) {
    EXPECT_TRUE(w.AddTensor(t.name, static_cast<TensorType>(t.type),
                            std::span<const uint64_t>(t.ne.data(), t.n_dims),
                            stories->TensorData(t))
                    .ok());
  }
  const std::string path = dir.File("chat.gguf");
  EXPECT_TRUE(w.Write(path).ok());
  return path;
}

TEST(CliTest, ChatOnAModelWithoutATemplateFailsClearly) {
  KV_REQUIRE_ASSET(kStories);
  const std::string model = AssetPath(kStories);
  RunResult r = Kvasir({"generate", "-m", model, "--chat", "-p", "hi", "-n", "1"});
  ExpectRuntimeError(r, "generate", model);
  EXPECT_THAT(r.err, HasSubstr("no tokenizer.chat_template"));
  EXPECT_THAT(r.err, HasSubstr("--chat-template NAME"));
  EXPECT_EQ(r.out, "");
  // -sys alone asks for the chat format too.
  ExpectRuntimeError(Kvasir({"generate", "-m", model, "-sys", "Be kind.", "-p", "hi", "-n", "1"}),
                     "generate", "no tokenizer.chat_template");
  ExpectRuntimeError(Kvasir({"run", "-m", model, "--chat", "-p", "hi", "-n", "1"}), "run",
                     "no tokenizer.chat_template");
}

TEST(CliTest, ChatWithAForcedTemplateChangesThePrompt) {
  KV_REQUIRE_ASSET(kStories);
  const std::string model = AssetPath(kStories);
  const std::vector<std::string> base = {
      "generate", "-m", model, "-p", "Once upon a time", "-n", "2", "--temp", "0", "-t", "1"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> args = base;
    args.insert(args.end(), extra.begin(), extra.end());
    return Kvasir(args);
  };
  RunResult plain = with({});
  ASSERT_EQ(plain.code, 0) << Describe(plain);
  EXPECT_EQ(PromptTokens(plain), 5);
  // The vocabulary has no <|im_start|> token: the markers tokenize as text, the prompt grows.
  RunResult chat = with({"--chat", "--chat-template", "chatml"});
  ASSERT_EQ(chat.code, 0) << Describe(chat);
  EXPECT_GT(PromptTokens(chat), 5);
  // --chat-template alone implies --chat.
  RunResult forced = with({"--chat-template", "chatml"});
  ASSERT_EQ(forced.code, 0) << Describe(forced);
  EXPECT_EQ(PromptTokens(forced), PromptTokens(chat));
  // -sys (llama.cpp's spelling) and --system add a system turn and imply --chat.
  RunResult sys = with({"-sys", "Be kind.", "--chat-template", "chatml"});
  ASSERT_EQ(sys.code, 0) << Describe(sys);
  EXPECT_GT(PromptTokens(sys), PromptTokens(chat));
  RunResult system = with({"--system", "Be kind.", "--chat-template", "chatml"});
  EXPECT_EQ(PromptTokens(system), PromptTokens(sys));
  // Another family lays the same turn out differently.
  RunResult gemma = with({"--chat-template", "gemma"});
  ASSERT_EQ(gemma.code, 0) << Describe(gemma);
  EXPECT_GT(PromptTokens(gemma), 5);
  EXPECT_NE(PromptTokens(gemma), PromptTokens(chat));

  ExpectUsageError(with({"--chat-template", "vicuna"}), "generate", "--chat-template");
}

TEST(CliTest, ChatUsesTheTemplateInTheFile) {
  KV_REQUIRE_ASSET(kStories);
  TempDir dir;
  const std::string chatml = StoriesWithTemplate(
      dir,
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + "
      "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt "
      "%}{{ '<|im_start|>assistant\n' }}{% endif %}");
  RunResult own = Kvasir(
      {"generate", "-m", chatml, "--chat", "-p", "Once upon a time", "-n", "2", "--temp", "0"});
  ASSERT_EQ(own.code, 0) << Describe(own);
  RunResult forced = Kvasir({"generate", "-m", AssetPath(kStories), "--chat-template", "chatml",
                             "-p", "Once upon a time", "-n", "2", "--temp", "0"});
  ASSERT_EQ(forced.code, 0) << Describe(forced);
  EXPECT_EQ(PromptTokens(own), PromptTokens(forced));
  EXPECT_EQ(own.out, forced.out);

  const std::string odd = StoriesWithTemplate(dir, "{{ messages | my_own_format }}");
  RunResult r = Kvasir({"generate", "-m", odd, "--chat", "-p", "hi", "-n", "1"});
  ExpectRuntimeError(r, "generate", odd);
  EXPECT_THAT(r.err, HasSubstr("not recognised"));
  EXPECT_THAT(r.err, HasSubstr("<|im_start|>"));
  // An override still works on such a file.
  RunResult over =
      Kvasir({"generate", "-m", odd, "--chat-template", "llama3", "-p", "hi", "-n", "1"});
  EXPECT_EQ(over.code, 0) << Describe(over);
}

TEST(CliTest, ChatOnARingNeedsANamedTemplate) {
  // The client has no model file: refused before it connects to anything.
  ExpectUsageError(Kvasir({"generate", "--ring", "127.0.0.1:1", "--chat", "-p", "hi"}), "generate",
                   "--chat-template NAME");
  ExpectUsageError(Kvasir({"generate", "--market", "http://127.0.0.1:1", "--model", "x", "-sys",
                           "Be kind.", "-p", "hi"}),
                   "generate", "--chat-template NAME");
}

TEST(CliTest, RunChatGivesTheLocalPrompt) {
  KV_REQUIRE_ASSET(kStories);
  const std::string model = AssetPath(kStories);
  RunResult local =
      Kvasir({"generate", "-m", model, "-sys", "Be kind.", "--chat-template", "llama3", "-p",
              "Once upon a time", "-n", "4", "--temp", "0", "-t", "1"});
  ASSERT_EQ(local.code, 0) << Describe(local);
  RunResult ring =
      Kvasir({"run", "-m", model, "--stages", "2", "-sys", "Be kind.", "--chat-template", "llama3",
              "-p", "Once upon a time", "-n", "4", "--temp", "0", "-t", "1", "-c", "256"});
  ASSERT_EQ(ring.code, 0) << Describe(ring);
  EXPECT_GT(PromptTokens(ring), 5);
  EXPECT_EQ(PromptTokens(ring), PromptTokens(local));
  EXPECT_EQ(ring.out, local.out);
  ExpectUsageError(Kvasir({"run", "-m", model, "--chat-template", "nope", "-p", "hi"}), "run",
                   "--chat-template");
}

// ---- tokenize --------------------------------------------------------------------------------

constexpr const char* kGpt2Vocab = "vocab/ggml-vocab-gpt-2.gguf";
constexpr const char* kQwen2Vocab = "vocab/ggml-vocab-qwen2.gguf";

TEST(CliTest, TokenizePrintsIdsOnOneLine) {
  KV_REQUIRE_ASSET(kGpt2Vocab);
  RunResult r = Kvasir({"tokenize", "-m", AssetPath(kGpt2Vocab), "-p", "Hello world"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  EXPECT_EQ(r.out, "15496 995\n");
  // The same text from a file, bytes as they are.
  TempDir dir;
  const std::string text = dir.File("text.txt");
  std::ofstream(text, std::ios::binary) << "Hello world";
  RunResult f = Kvasir({"tokenize", "-m", AssetPath(kGpt2Vocab), "-f", text});
  ASSERT_EQ(f.code, 0) << Describe(f);
  EXPECT_EQ(f.out, "15496 995\n");
}

TEST(CliTest, TokenizePiecesAreEscaped) {
  KV_REQUIRE_ASSET(kGpt2Vocab);
  RunResult r = Kvasir({"tokenize", "-m", AssetPath(kGpt2Vocab), "-p", "Hello\n\tx", "--pieces"});
  ASSERT_EQ(r.code, 0) << Describe(r);
  // One line per token; the newline and tab pieces are written as \n and \t.
  EXPECT_EQ(r.out, "15496\tHello\n198\t\\n\n197\t\\t\n87\tx\n");
}

TEST(CliTest, TokenizeSpecialTokensAndBos) {
  KV_REQUIRE_ASSET(kQwen2Vocab);
  KV_REQUIRE_ASSET(kStories);
  const std::string chat = "<|im_start|>user";
  RunResult parsed =
      Kvasir({"tokenize", "-m", AssetPath(kQwen2Vocab), "-p", chat, "--parse-special"});
  ASSERT_EQ(parsed.code, 0) << Describe(parsed);
  EXPECT_THAT(parsed.out, StartsWith("151644 "));
  RunResult plain = Kvasir({"tokenize", "-m", AssetPath(kQwen2Vocab), "-p", chat});
  ASSERT_EQ(plain.code, 0) << Describe(plain);
  EXPECT_THAT(plain.out, Not(HasSubstr("151644")));
  // An SPM model adds BOS (1) unless --no-bos.
  RunResult bos = Kvasir({"tokenize", "-m", AssetPath(kStories), "-p", "Once"});
  ASSERT_EQ(bos.code, 0) << Describe(bos);
  EXPECT_THAT(bos.out, StartsWith("1 "));
  RunResult no_bos = Kvasir({"tokenize", "-m", AssetPath(kStories), "-p", "Once", "--no-bos"});
  ASSERT_EQ(no_bos.code, 0) << Describe(no_bos);
  EXPECT_EQ(bos.out, "1 " + no_bos.out);
}

TEST(CliTest, TokenizeErrors) {
  TempDir dir;
  const std::string missing = "/nonexistent/dir/vocab.gguf";
  ExpectRuntimeError(Kvasir({"tokenize", "-m", missing, "-p", "hi"}), "tokenize", missing);
  ExpectUsageError(Kvasir({"tokenize", "-m", missing, "-p", "hi", "-f", dir.File("t")}), "tokenize",
                   "either -p or -f");
  ExpectUsageError(Kvasir({"tokenize", "-m", missing}), "tokenize", "-p TEXT or -f FILE");
  ExpectUsageError(Kvasir({"tokenize", "-p", "hi"}), "tokenize", "model");
  // A GGUF without tokenizer metadata.
  const std::string bare = dir.File("bare.gguf");
  GgufWriter w;
  w.SetKv("general.architecture", GgufValue::String("llama"));
  ASSERT_TRUE(w.Write(bare).ok());
  ExpectRuntimeError(Kvasir({"tokenize", "-m", bare, "-p", "hi"}), "tokenize",
                     "tokenizer.ggml.model is missing");
  // An -f that cannot be read is named, and checked before the model is opened.
  const std::string no_text = dir.File("no-such-text.txt");
  ExpectRuntimeError(Kvasir({"tokenize", "-m", bare, "-f", no_text}), "tokenize", no_text);
  ExpectRuntimeError(Kvasir({"tokenize", "-m", bare, "-f", dir.path()}), "tokenize", dir.path());
}

}  // namespace
}  // namespace kvasir
