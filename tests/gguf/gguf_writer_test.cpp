// GgufWriter: round trips of every value type and several tensor types, and real-model rewrites.
#include "gguf/gguf_writer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "gguf_test_util.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using ::testing::HasSubstr;
using testing::SampleKvs;
using testing::SampleTensors;
using testing::SampleWriter;

std::vector<uint8_t> FileBytes(const std::string& path) {
  std::string s = testing::ReadFileToString(path);
  return {s.begin(), s.end()};
}

std::vector<std::string> DirEntries(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

TEST(GgufWriterTest, EveryValueTypeRoundTrips) {
  testing::TempDir dir;
  const std::string path = dir.File("sample.gguf");
  ASSERT_TRUE(SampleWriter().Write(path).ok());
  Result<GgufFile> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->version(), 3u);
  const std::vector<GgufKv> want = SampleKvs();
  ASSERT_EQ(f->kvs().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(f->kvs()[i].key, want[i].key);  // insertion order is kept
    EXPECT_EQ(f->kvs()[i].value, want[i].value)
        << want[i].key << " read back as " << f->kvs()[i].value.ToDisplayString();
  }
  const GgufArray* deep = f->GetArray("a.deep");
  ASSERT_NE(deep, nullptr);
  const auto& level1 = std::get<std::vector<GgufValue>>(deep->items);
  const auto& level2 = std::get<std::vector<GgufValue>>(level1.at(0).AsArray()->items);
  EXPECT_EQ(std::get<std::vector<std::string>>(level2.at(0).AsArray()->items)[2], "ccc");
  EXPECT_EQ(*f->GetString("t.string"), std::string("nul\0byte \xe2\x96\x81utf8", 16));
}

TEST(GgufWriterTest, TensorsRoundTripAlignedAndByteIdentical) {
  testing::TempDir dir;
  const std::string path = dir.File("tensors.gguf");
  GgufWriter w = SampleWriter();
  ASSERT_TRUE(w.Write(path).ok());
  Result<GgufFile> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  const std::vector<testing::SampleTensor> want = SampleTensors();
  ASSERT_EQ(f->tensors().size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    const GgufTensorInfo& t = f->tensors()[i];
    SCOPED_TRACE(want[i].name);
    EXPECT_EQ(t.name, want[i].name);
    EXPECT_EQ(t.type, static_cast<uint32_t>(want[i].type));
    EXPECT_EQ(t.n_dims, want[i].ne.size());
    for (size_t j = 0; j < 4; ++j) EXPECT_EQ(t.ne[j], j < want[i].ne.size() ? want[i].ne[j] : 1);
    EXPECT_EQ(t.offset % kGgufDefaultAlignment, 0u);
    std::span<const uint8_t> data = f->TensorData(t);
    EXPECT_TRUE(std::equal(data.begin(), data.end(), want[i].data.begin(), want[i].data.end()));
  }
  // The file starts with exactly the serialised header, and rewriting what was read gives the
  // same bytes.
  const std::vector<uint8_t> bytes = FileBytes(path);
  const std::vector<uint8_t> header = w.SerializeHeader();
  ASSERT_EQ(header.size(), f->header().data_offset);
  EXPECT_TRUE(std::equal(header.begin(), header.end(), bytes.begin()));
  GgufWriter again;
  again.CopyKvs(f->header());
  for (const GgufTensorInfo& t : f->tensors()) {
    ASSERT_TRUE(again
                    .AddTensor(t.name, static_cast<TensorType>(t.type),
                               std::span(t.ne).first(t.n_dims), f->TensorData(t), true)
                    .ok());
  }
  ASSERT_TRUE(again.Write(dir.File("again.gguf")).ok());
  EXPECT_EQ(FileBytes(dir.File("again.gguf")), bytes);
}

TEST(GgufWriterTest, CustomAlignmentIsHonoured) {
  testing::TempDir dir;
  GgufWriter w = SampleWriter();
  w.SetKv("general.alignment", GgufValue::Uint32(256));
  ASSERT_TRUE(w.Write(dir.File("a256.gguf")).ok());
  Result<GgufFile> f = GgufFile::Open(dir.File("a256.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(f->header().alignment, 256u);
  EXPECT_EQ(f->header().data_offset % 256, 0u);
  for (const GgufTensorInfo& t : f->tensors()) EXPECT_EQ(t.offset % 256, 0u) << t.name;
  EXPECT_EQ(f->file_size() % 256, 0u);  // the last tensor is padded too
}

TEST(GgufWriterTest, SetKvReplacesInPlace) {
  GgufWriter w;
  w.SetKv("a", GgufValue::Uint32(1));
  w.SetKv("b", GgufValue::Uint32(2));
  w.SetKv("a", GgufValue::String("x"));
  const std::vector<uint8_t> bytes = w.SerializeHeader();
  Result<GgufHeader> h = ParseGgufHeader(bytes, 0, "w");
  ASSERT_TRUE(h.ok()) << h.status().message();
  ASSERT_EQ(h->kvs.size(), 2u);
  EXPECT_EQ(h->kvs[0].key, "a");
  EXPECT_EQ(h->kvs[0].value, GgufValue::String("x"));
  EXPECT_EQ(h->kvs[1].key, "b");
}

TEST(GgufWriterTest, AddTensorRefusesBadShapesAndSizes) {
  GgufWriter w;
  std::vector<uint8_t> bytes(18 * 2);
  const std::vector<uint64_t> ne = {64};
  ASSERT_TRUE(w.AddTensor("ok", TensorType::kQ4_0, ne, bytes).ok());

  Status dup = w.AddTensor("ok", TensorType::kQ4_0, ne, bytes);
  EXPECT_THAT(dup.message(), HasSubstr("tensor ok: duplicate tensor name"));
  const std::vector<uint64_t> odd = {48};
  Status block = w.AddTensor("odd", TensorType::kQ4_0, odd, bytes);
  EXPECT_THAT(block.message(), HasSubstr("tensor odd: ne[0] = 48 is not a multiple of the q4_0"));
  Status size = w.AddTensor("short", TensorType::kQ4_0, ne, std::span(bytes).first(35));
  EXPECT_THAT(size.message(), HasSubstr("tensor short: 35 bytes of data, but 64 elements of "
                                        "q4_0 take 36 bytes"));
  const std::vector<uint64_t> five = {1, 1, 1, 1, 1};
  Status dims = w.AddTensor("five", TensorType::kF32, five, std::span(bytes).first(4));
  EXPECT_THAT(dims.message(), HasSubstr("tensor five: n_dims 5"));
  const std::vector<uint64_t> huge = {1ull << 32, 1ull << 32};
  Status overflow = w.AddTensor("huge", TensorType::kF32, huge, bytes);
  EXPECT_THAT(overflow.message(), HasSubstr("tensor huge: shape overflows"));
  Status unknown = w.AddTensor("u", static_cast<TensorType>(99), ne, bytes);
  EXPECT_THAT(unknown.message(), HasSubstr("tensor u: unknown tensor type id 99"));
}

TEST(GgufWriterTest, WriteErrorsNameThePathAndLeaveNoTemporaryFile) {
  testing::TempDir dir;
  const std::string path = dir.File("missing-dir/out.gguf");
  Status st = SampleWriter().Write(path);
  ASSERT_FALSE(st.ok());
  EXPECT_THAT(st.message(), HasSubstr(path));
  EXPECT_THAT(st.message(), HasSubstr("No such file or directory"));

  GgufWriter bad = SampleWriter();
  bad.SetKv("general.alignment", GgufValue::Uint32(48));
  st = bad.Write(dir.File("bad.gguf"));
  EXPECT_THAT(st.message(), HasSubstr("general.alignment 48 is not a power of two in [1, 1048576]"));
  EXPECT_TRUE(DirEntries(dir.path()).empty());
}

TEST(GgufWriterTest, WriteReplacesAnExistingFileWhole) {
  testing::TempDir dir;
  const std::string path = dir.File("model.gguf");
  ASSERT_TRUE(SampleWriter().Write(path).ok());
  GgufWriter small;
  small.SetKv("general.architecture", GgufValue::String("tiny"));
  ASSERT_TRUE(small.Write(path).ok());
  EXPECT_EQ(DirEntries(dir.path()), std::vector<std::string>{"model.gguf"});
  Result<GgufFile> f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status().message();
  EXPECT_EQ(*f->GetString("general.architecture"), "tiny");
  EXPECT_TRUE(f->tensors().empty());
}

// Rewriting a real model's kvs and tensors (borrowed from the mapping) parses back equal; since
// the layout rules are the same, the bytes are identical to the original.
TEST(GgufWriterTest, RewritingRealModelsReproducesThem) {
  KV_REQUIRE_ASSET("models/stories260K.gguf");
  testing::TempDir dir;
  for (const char* name : {"stories260K.gguf", "stories260K-q8_0.gguf", "synth-llama-q4_k_m.gguf",
                           "synth-qwen3-q4_0.gguf"}) {
    SCOPED_TRACE(name);
    const std::string src = testing::AssetPath(std::string("models/") + name);
    Result<GgufFile> in = GgufFile::Open(src);
    ASSERT_TRUE(in.ok()) << in.status().message();
    GgufWriter w;
    w.CopyKvs(in->header());
    for (const GgufTensorInfo& t : in->tensors()) {
      Status st = w.AddTensor(t.name, static_cast<TensorType>(t.type),
                              std::span(t.ne).first(t.n_dims), in->TensorData(t), true);
      ASSERT_TRUE(st.ok()) << st.message();
    }
    const std::string out_path = dir.File(name);
    ASSERT_TRUE(w.Write(out_path).ok());
    Result<GgufFile> out = GgufFile::Open(out_path);
    ASSERT_TRUE(out.ok()) << out.status().message();
    ASSERT_EQ(out->kvs().size(), in->kvs().size());
    for (size_t i = 0; i < in->kvs().size(); ++i) {
      EXPECT_EQ(out->kvs()[i].key, in->kvs()[i].key);
      EXPECT_EQ(out->kvs()[i].value, in->kvs()[i].value) << in->kvs()[i].key;
    }
    ASSERT_EQ(out->tensors().size(), in->tensors().size());
    for (size_t i = 0; i < in->tensors().size(); ++i) {
      const GgufTensorInfo& a = in->tensors()[i];
      const GgufTensorInfo& b = out->tensors()[i];
      EXPECT_EQ(b.name, a.name);
      EXPECT_EQ(b.ne, a.ne);
      EXPECT_EQ(b.type, a.type);
      EXPECT_EQ(b.offset, a.offset) << a.name;
      std::span<const uint8_t> da = in->TensorData(a), db = out->TensorData(b);
      EXPECT_TRUE(std::equal(da.begin(), da.end(), db.begin(), db.end())) << a.name;
    }
    EXPECT_EQ(FileBytes(out_path), FileBytes(src));
  }
}

}  // namespace
}  // namespace kvasir
