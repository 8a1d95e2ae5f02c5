// GgufStreamWriter: tensor bytes arriving in pieces give the same file as GgufWriter::Write.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "gguf/gguf_writer.h"
#include "gguf_test_util.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using ::testing::HasSubstr;
using testing::SampleKvs;
using testing::SampleTensors;

// SampleKvs() plus SampleTensors() declared without their bytes.
GgufWriter DeclaredLayout() {
  GgufWriter w;
  for (GgufKv& kv : SampleKvs()) w.SetKv(kv.key, std::move(kv.value));
  for (const testing::SampleTensor& t : SampleTensors()) {
    Status st = w.DeclareTensor(t.name, t.type, t.ne);
    KV_CHECK(st.ok(), "{}", st.message());
  }
  return w;
}

// Every tensor's bytes back to back, without padding.
std::vector<uint8_t> AllTensorBytes() {
  std::vector<uint8_t> all;
  for (const testing::SampleTensor& t : SampleTensors()) {
    all.insert(all.end(), t.data.begin(), t.data.end());
  }
  return all;
}

size_t FileCount(const std::string& dir) {
  return static_cast<size_t>(std::distance(std::filesystem::directory_iterator(dir), {}));
}

TEST(GgufStreamWriterTest, PiecesCrossingTensorsGiveTheSameFileAsWrite) {
  testing::TempDir dir;
  ASSERT_TRUE(testing::SampleWriter().Write(dir.File("whole.gguf")).ok());
  const GgufWriter layout = DeclaredLayout();
  const std::vector<uint8_t> all = AllTensorBytes();
  for (size_t piece : {size_t{1}, size_t{7}, size_t{100}, all.size()}) {
    SCOPED_TRACE(piece);
    const std::string path = dir.File("streamed.gguf");
    Result<std::unique_ptr<GgufStreamWriter>> w = GgufStreamWriter::Create(layout, path);
    ASSERT_TRUE(w.ok()) << w.status().message();
    EXPECT_EQ((*w)->current_tensor(), 0u);
    for (size_t at = 0; at < all.size(); at += piece) {
      Status st = (*w)->Append(std::span(all).subspan(at, std::min(piece, all.size() - at)));
      ASSERT_TRUE(st.ok()) << st.message();
    }
    EXPECT_EQ((*w)->current_tensor(), SampleTensors().size());
    EXPECT_FALSE(std::filesystem::exists(path));  // only Finish() puts it in place
    Status st = (*w)->Finish();
    ASSERT_TRUE(st.ok()) << st.message();
    EXPECT_EQ(testing::ReadFileToString(path), testing::ReadFileToString(dir.File("whole.gguf")));
    EXPECT_EQ(FileCount(dir.path()), 2u);  // no temporary file left
    std::filesystem::remove(path);
  }
}

TEST(GgufStreamWriterTest, TensorInfosMatchTheWrittenIndex) {
  testing::TempDir dir;
  GgufWriter w = testing::SampleWriter();
  w.SetKv("general.alignment", GgufValue::Uint32(64));
  ASSERT_TRUE(w.Write(dir.File("a.gguf")).ok());
  Result<GgufFile> f = GgufFile::Open(dir.File("a.gguf"));
  ASSERT_TRUE(f.ok()) << f.status().message();
  const std::vector<GgufTensorInfo> infos = w.TensorInfos();
  ASSERT_EQ(infos.size(), f->tensors().size());
  for (size_t i = 0; i < infos.size(); ++i) {
    EXPECT_EQ(infos[i].name, f->tensors()[i].name);
    EXPECT_EQ(infos[i].offset, f->tensors()[i].offset);
    EXPECT_EQ(infos[i].n_bytes, f->tensors()[i].n_bytes);
    EXPECT_EQ(infos[i].offset % 64, 0u);
  }
}

TEST(GgufStreamWriterTest, TooManyOrTooFewBytesAreErrors) {
  testing::TempDir dir;
  const std::string path = dir.File("s.gguf");
  const GgufWriter layout = DeclaredLayout();
  std::vector<uint8_t> all = AllTensorBytes();
  {
    Result<std::unique_ptr<GgufStreamWriter>> w = GgufStreamWriter::Create(layout, path);
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->Append(std::span(all).first(all.size() - 3)).ok());
    Status st = (*w)->Finish();
    EXPECT_THAT(st.message(), HasSubstr(path));
    EXPECT_THAT(st.message(), HasSubstr("tensor i32.4d has 45 of its 48 bytes"));
  }
  {
    all.push_back(0);
    Result<std::unique_ptr<GgufStreamWriter>> w = GgufStreamWriter::Create(layout, path);
    ASSERT_TRUE(w.ok()) << w.status().message();
    Status st = (*w)->Append(all);
    EXPECT_THAT(st.message(), HasSubstr("1 bytes past the end of the last tensor"));
    EXPECT_FALSE((*w)->Finish().ok());
  }
  // Neither the file nor a temporary file is left behind.
  EXPECT_EQ(FileCount(dir.path()), 0u);
}

TEST(GgufStreamWriterTest, AbandonedWriterLeavesNothing) {
  testing::TempDir dir;
  {
    Result<std::unique_ptr<GgufStreamWriter>> w =
        GgufStreamWriter::Create(DeclaredLayout(), dir.File("x.gguf"));
    ASSERT_TRUE(w.ok()) << w.status().message();
    ASSERT_TRUE((*w)->Append(std::vector<uint8_t>(10)).ok());
    EXPECT_EQ(FileCount(dir.path()), 1u);  // the temporary file
  }
  EXPECT_EQ(FileCount(dir.path()), 0u);
}

TEST(GgufStreamWriterTest, WriteRefusesDeclaredOnlyTensors) {
  testing::TempDir dir;
  Status st = DeclaredLayout().Write(dir.File("d.gguf"));
  EXPECT_THAT(st.message(), HasSubstr("tensor f32.vec has no data"));
  GgufWriter w;
  const std::vector<uint64_t> ne = {8};
  ASSERT_TRUE(w.DeclareTensor("a", TensorType::kF32, ne).ok());
  EXPECT_THAT(w.DeclareTensor("a", TensorType::kF32, ne).message(),
              HasSubstr("tensor a: duplicate tensor name"));
  const std::vector<uint64_t> odd = {8};
  EXPECT_THAT(w.DeclareTensor("b", TensorType::kQ8_0, odd).message(),
              HasSubstr("tensor b: ne[0] = 8 is not a multiple of the q8_0 block size 32"));
}

TEST(GgufStreamWriterTest, CreateErrorsNameThePath) {
  testing::TempDir dir;
  const std::string path = dir.File("no/such/dir.gguf");
  Result<std::unique_ptr<GgufStreamWriter>> w = GgufStreamWriter::Create(DeclaredLayout(), path);
  ASSERT_FALSE(w.ok());
  EXPECT_THAT(w.status().message(), HasSubstr(path));
  EXPECT_THAT(w.status().message(), HasSubstr("No such file or directory"));
}

}  // namespace
}  // namespace kvasir
