// HashTensors: known SHA-256 answers for tensor bytes, each tensor hashed once, progress in pieces,
// a missing tensor named; the manifest helpers that give every rank's tensors their hash.
#include "planner/tensor_hash.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "base/check.h"
#include "base/sha256.h"
#include "gguf/gguf_file.h"
#include "gguf/gguf_writer.h"
#include "planner/manifest.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::TempDir;

std::span<const uint8_t> Bytes(const std::vector<float> &v) {
  return {reinterpret_cast<const uint8_t *>(v.data()), v.size() * sizeof(float)};
}

// A GGUF with "a" = f32 [1, 2, 3, 4], "b" = f32 [0, 0.5, ..., 2.5] and "big" = f32 of `big_n`
// elements i * 0.25.
std::string WriteModel(const TempDir &dir, uint64_t big_n, std::vector<float> *big) {
  GgufWriter w;
  const std::vector<float> a = {1, 2, 3, 4}, b = {0, 0.5f, 1, 1.5f, 2, 2.5f};
  big->resize(big_n);
  for (uint64_t i = 0; i < big_n; ++i) (*big)[i] = float(i) * 0.25f;
  const uint64_t ne_a[] = {4}, ne_b[] = {3, 2}, ne_big[] = {big_n};
  KV_CHECK(w.AddTensor("a", TensorType::kF32, ne_a, Bytes(a)).ok());
  KV_CHECK(w.AddTensor("b", TensorType::kF32, ne_b, Bytes(b)).ok());
  KV_CHECK(w.AddTensor("big", TensorType::kF32, ne_big, Bytes(*big)).ok());
  const std::string path = dir.File("m.gguf");
  KV_CHECK(w.Write(path).ok());
  return path;
}

TEST(HashTensors, KnownAnswersAndEachTensorOnce) {
  TempDir dir;
  std::vector<float> big;
  auto file = GgufFile::Open(WriteModel(dir, 8, &big));
  ASSERT_TRUE(file.ok()) << file.status().message();
  const std::vector<std::string> names = {"a", "b", "a"};  // "a" twice, as a tied embedding is
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  auto hashes = HashTensors(*file, names, [&](uint64_t d, uint64_t t) { calls.push_back({d, t}); });
  ASSERT_TRUE(hashes.ok()) << hashes.status().message();
  ASSERT_EQ(hashes->size(), 2u);
  // Python: hashlib.sha256(struct.pack('<4f', 1, 2, 3, 4)).hexdigest()
  EXPECT_EQ(hashes->at("a"), "ad73b9acd6e4a74b2f5bb5386658ce3bb146cd040a1867646ab3b973fb6632b1");
  EXPECT_EQ(hashes->at("b"), "03b8e98a10217e51d8ecef7919de69ba80c52b25ee49ce0886ecfe0ddeacd4ac");
  // 16 + 24 bytes, "a" counted once; the last call reports the end.
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back(), std::make_pair(uint64_t{40}, uint64_t{40}));
}

TEST(HashTensors, HugeTensorIsHashedInPiecesWithProgress) {
  TempDir dir;
  std::vector<float> big;
  const uint64_t n = kHashPieceBytes / 4 * 2 + 1000;  // two pieces and a bit
  auto file = GgufFile::Open(WriteModel(dir, n, &big));
  ASSERT_TRUE(file.ok()) << file.status().message();
  std::vector<uint64_t> done;
  const std::vector<std::string> names = {"big"};
  auto hashes = HashTensors(*file, names, [&](uint64_t d, uint64_t t) {
    EXPECT_EQ(t, n * 4);
    done.push_back(d);
  });
  ASSERT_TRUE(hashes.ok()) << hashes.status().message();
  EXPECT_EQ(hashes->at("big"), Sha256Hex(Sha256Of(Bytes(big))));
  EXPECT_EQ(done, (std::vector<uint64_t>{kHashPieceBytes, 2 * kHashPieceBytes, n * 4}));
}

TEST(HashTensors, MissingTensorIsNamed) {
  TempDir dir;
  std::vector<float> big;
  const std::string path = WriteModel(dir, 8, &big);
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  const std::vector<std::string> names = {"a", "blk.9.attn_q.weight"};
  auto hashes = HashTensors(*file, names);
  ASSERT_FALSE(hashes.ok());
  EXPECT_EQ(hashes.status().message(), path + ": tensor 'blk.9.attn_q.weight' is not in the file");
}

TEST(HashTensors, ManifestGetsAHashForEveryTensorOfEveryRank) {
  Manifest m;
  m.ranks.resize(2);
  m.ranks[0].rank = 0;
  m.ranks[0].tensors = {{"blk.0.w", {}}, {"token_embd.weight", {}}};
  m.ranks[1].rank = 1;
  m.ranks[1].tensors = {{"blk.1.w", {}}, {"output_norm.weight", {}}, {"token_embd.weight", {}}};
  EXPECT_EQ(ManifestTensorNames(m), (std::vector<std::string>{"blk.0.w", "token_embd.weight",
                                                              "blk.1.w", "output_norm.weight"}));
  std::map<std::string, std::string> hashes = {{"blk.0.w", std::string(64, '0')},
                                               {"token_embd.weight", std::string(64, 'e')},
                                               {"blk.1.w", std::string(64, '1')}};
  Status s = SetManifestHashes(&m, hashes);
  EXPECT_EQ(s.message(), "rank 1: tensor output_norm.weight has no sha256");
  hashes["output_norm.weight"] = std::string(64, 'f');
  ASSERT_TRUE(SetManifestHashes(&m, hashes).ok());
  EXPECT_EQ(m.ranks[0].tensors[1].sha256, std::string(64, 'e'));
  EXPECT_EQ(m.ranks[1].tensors[2].sha256, std::string(64, 'e'));
  EXPECT_EQ(m.ranks[1].tensors[1].sha256, std::string(64, 'f'));
}

}  // namespace
}  // namespace kvasir
