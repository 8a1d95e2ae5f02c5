// The reader on the real files in ../shared, and header parsing from prefixes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "gguf/gguf_file.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using ::testing::HasSubstr;

std::vector<std::string> SharedGgufFiles() {
  std::vector<std::string> paths;
  for (const char* dir : {"models", "vocab"}) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(testing::AssetPath(dir), ec)) {
      if (e.path().extension() == ".gguf") paths.push_back(e.path().string());
    }
  }
  std::sort(paths.begin(), paths.end());
  return paths;
}

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::string s = testing::ReadFileToString(path);
  return {s.begin(), s.end()};
}

TEST(GgufReaderTest, EverySharedFileParses) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::vector<std::string> paths = SharedGgufFiles();
  EXPECT_GE(paths.size(), 8u);
  for (const std::string& path : paths) {
    SCOPED_TRACE(path);
    Result<GgufFile> f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status().message();
    EXPECT_EQ(f->version(), 3u);
    EXPECT_EQ(f->header().alignment, 32u);
    EXPECT_EQ(f->header().data_offset % 32, 0u);
    EXPECT_GE(f->header().data_offset, f->header().header_bytes);
    EXPECT_TRUE(f->GetString("general.architecture").ok());
    Result<std::string> model = f->GetString("tokenizer.ggml.model");
    ASSERT_TRUE(model.ok()) << model.status().message();
    const GgufArray* tokens = f->GetArray("tokenizer.ggml.tokens");
    ASSERT_NE(tokens, nullptr);
    EXPECT_EQ(tokens->elem_type, GgufType::kString);
    for (const GgufTensorInfo& t : f->tensors()) {
      EXPECT_EQ(t.offset % 32, 0u) << t.name;
      std::span<const uint8_t> data = f->TensorData(t);
      EXPECT_EQ(data.size(), t.n_bytes) << t.name;
      EXPECT_LE(data.data() + data.size(), f->mapping().data() + f->file_size()) << t.name;
    }
  }
}

TEST(GgufReaderTest, Stories260KMetadataAndTensors) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  Result<GgufFile> f = GgufFile::Open(testing::AssetPath("models/stories260K.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f->GetString("general.architecture"), "llama");
  EXPECT_EQ(*f->GetUint("llama.block_count"), 5u);
  EXPECT_EQ(*f->GetUint("llama.embedding_length"), 64u);
  EXPECT_NEAR(*f->GetFloat("llama.attention.layer_norm_rms_epsilon"), 1e-5, 1e-12);
  EXPECT_EQ(*f->GetUintOr("llama.expert_count", 0), 0u);
  EXPECT_EQ(*f->GetFloatOr("llama.rope.freq_base", 10000.0), 10000.0);

  const GgufArray* tokens = f->GetArray("tokenizer.ggml.tokens");
  ASSERT_NE(tokens, nullptr);
  const auto& strings = std::get<std::vector<std::string>>(tokens->items);
  ASSERT_EQ(strings.size(), 512u);
  EXPECT_EQ(strings[0], "<unk>");
  EXPECT_EQ(strings[1], "<s>");
  const GgufArray* scores = f->GetArray("tokenizer.ggml.scores");
  ASSERT_NE(scores, nullptr);
  EXPECT_EQ(std::get<std::vector<float>>(scores->items).size(), 512u);

  EXPECT_EQ(f->tensors().size(), 48u);
  const GgufTensorInfo* embd = f->FindTensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->n_dims, 2u);
  EXPECT_EQ(embd->ne, (std::array<uint64_t, 4>{64, 512, 1, 1}));
  EXPECT_EQ(embd->type, static_cast<uint32_t>(TensorType::kF32));
  EXPECT_EQ(embd->n_bytes, 64u * 512u * 4u);
  EXPECT_EQ(embd->n_rows(), 512u);
  EXPECT_EQ(f->FindTensor("no.such.tensor"), nullptr);
  EXPECT_EQ(f->Find("no.such.key"), nullptr);
}

TEST(GgufReaderTest, QuantizedTensorSizesFollowBlockGeometry) {
  KV_REQUIRE_ASSET("models/stories260K-q8_0.gguf");
  Result<GgufFile> f = GgufFile::Open(testing::AssetPath("models/stories260K-q8_0.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  const GgufTensorInfo* q = f->FindTensor("blk.0.attn_q.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->type, static_cast<uint32_t>(TensorType::kQ8_0));
  EXPECT_EQ(q->n_bytes, 64u * 64u / 32u * 34u);
  // 172 columns are not a multiple of 32, so ffn_down stays f16.
  const GgufTensorInfo* down = f->FindTensor("blk.0.ffn_down.weight");
  ASSERT_NE(down, nullptr);
  EXPECT_EQ(down->type, static_cast<uint32_t>(TensorType::kF16));
  EXPECT_EQ(down->ne, (std::array<uint64_t, 4>{172, 64, 1, 1}));
  EXPECT_EQ(down->n_bytes, 172u * 64u * 2u);
}

TEST(GgufReaderTest, LlamaVocabScalarArraysAreUnboxed) {
  KV_REQUIRE_ASSET("vocab/ggml-vocab-llama-spm.gguf");
  Result<GgufFile> f = GgufFile::Open(testing::AssetPath("vocab/ggml-vocab-llama-spm.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(f->GetArray("tokenizer.ggml.tokens")->size(), 32000u);
  EXPECT_EQ(std::get<std::vector<float>>(f->GetArray("tokenizer.ggml.scores")->items).size(),
            32000u);
  EXPECT_EQ(std::get<std::vector<int32_t>>(f->GetArray("tokenizer.ggml.token_type")->items)[1], 3);
  EXPECT_EQ(*f->GetBool("tokenizer.ggml.add_bos_token"), true);
}

TEST(GgufReaderTest, TypedGettersNameFileAndKey) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::string path = testing::AssetPath("models/stories260K.gguf");
  Result<GgufFile> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  Result<uint64_t> wrong = f->GetUint("general.architecture");
  ASSERT_FALSE(wrong.ok());
  EXPECT_THAT(wrong.status().message(), HasSubstr(path));
  EXPECT_THAT(wrong.status().message(), HasSubstr("general.architecture"));
  EXPECT_THAT(wrong.status().message(), HasSubstr("expected an unsigned integer, got string"));
  Result<std::string> missing = f->GetString("general.nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("general.nope missing"));
  EXPECT_FALSE(f->GetBool("llama.block_count").ok());
  EXPECT_FALSE(f->GetFloat("tokenizer.ggml.model").ok());
  EXPECT_FALSE(f->GetUintOr("general.architecture", 3).ok());
  EXPECT_EQ(f->GetArray("llama.block_count"), nullptr);
}

TEST(GgufReaderTest, OpenReportsMissingAndEmptyFiles) {
  testing::TempDir dir;
  Result<GgufFile> missing = GgufFile::Open(dir.File("absent.gguf"));
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr("absent.gguf"));
  { std::ofstream(dir.File("empty.gguf")); }
  Result<GgufFile> empty = GgufFile::Open(dir.File("empty.gguf"));
  ASSERT_FALSE(empty.ok());
  EXPECT_THAT(empty.status().message(), HasSubstr("empty.gguf: empty file"));
}

// A caller fetching a remote file grows its prefix as asked until the header parses.
TEST(GgufReaderTest, PrefixParsingAsksForMoreUntilTheHeaderFits) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  const std::vector<uint8_t> file = ReadBytes(testing::AssetPath("models/stories260K.gguf"));
  Result<GgufHeader> full = ParseGgufHeader(file, file.size(), "full");
  ASSERT_TRUE(full.ok()) << full.status().message();

  for (uint64_t file_size : {uint64_t{0}, uint64_t{file.size()}}) {
    SCOPED_TRACE(file_size);
    uint64_t size = 64;
    int tries = 0;
    Result<GgufHeader> h = Status::Error("not tried");
    for (; tries < 32; ++tries) {
      uint64_t needed = 12345;
      h = ParseGgufHeader(std::span(file).first(size), file_size, "remote.gguf", &needed);
      if (h.ok()) {
        EXPECT_EQ(needed, 0u);
        break;
      }
      EXPECT_THAT(h.status().message(), HasSubstr("remote.gguf: "));
      ASSERT_GT(needed, size) << h.status().message();
      ASSERT_LE(needed, file.size());
      size = needed;
    }
    ASSERT_TRUE(h.ok());
    EXPECT_LT(tries, 10);
    EXPECT_GE(size, full->header_bytes);
    EXPECT_EQ(h->header_bytes, full->header_bytes);
    EXPECT_EQ(h->data_offset, full->data_offset);
    ASSERT_EQ(h->kvs.size(), full->kvs.size());
    for (size_t i = 0; i < h->kvs.size(); ++i) EXPECT_EQ(h->kvs[i].value, full->kvs[i].value);
    ASSERT_EQ(h->tensors.size(), full->tensors.size());
    EXPECT_EQ(h->tensors.back().offset, full->tensors.back().offset);
  }
}

TEST(GgufReaderTest, ExactHeaderPrefixParsesWithoutTensorBytes) {
  KV_REQUIRE_ASSET("models/stories260K-q4_0.gguf");
  const std::vector<uint8_t> file = ReadBytes(testing::AssetPath("models/stories260K-q4_0.gguf"));
  Result<GgufHeader> full = ParseGgufHeader(file, file.size(), "full");
  ASSERT_TRUE(full.ok()) << full.status().message();
  const auto prefix = std::span(file).first(full->header_bytes);
  uint64_t needed = 1;
  EXPECT_TRUE(ParseGgufHeader(prefix, 0, "p", &needed).ok());
  EXPECT_EQ(needed, 0u);
  // One byte less is not enough, whether or not the file size is known.
  EXPECT_FALSE(ParseGgufHeader(prefix.first(prefix.size() - 1), 0, "p", &needed).ok());
  EXPECT_GE(needed, full->header_bytes);
  EXPECT_FALSE(ParseGgufHeader(prefix.first(prefix.size() - 1), file.size(), "p", &needed).ok());
  EXPECT_GE(needed, full->header_bytes);
}

}  // namespace
}  // namespace kvasir
