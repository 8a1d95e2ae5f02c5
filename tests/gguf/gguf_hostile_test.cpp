// Truncated, corrupted and hostile GGUF bytes: every one gives an error naming the field, never a
// crash or a giant allocation.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "gguf_test_util.h"
#include "test_assets.h"

namespace kvasir {
namespace {

using testing::GgufBytes;
using ::testing::HasSubstr;
using testing::ParseBytes;

constexpr uint32_t kF32 = 0;
constexpr uint32_t kQ4_0 = 2;
constexpr uint32_t kStringType = static_cast<uint32_t>(GgufType::kString);
constexpr uint32_t kArrayType = static_cast<uint32_t>(GgufType::kArray);

std::string ErrorOf(const std::vector<uint8_t>& bytes) {
  Result<GgufHeader> h = ParseBytes(bytes);
  return h.ok() ? "parsed fine" : h.status().message();
}

// A file with one f32 tensor of `n` elements at `offset`, followed by `data_bytes` bytes.
std::vector<uint8_t> OneTensorFile(const std::vector<uint64_t>& ne, uint32_t type, uint64_t offset,
                                   size_t data_bytes) {
  GgufBytes b;
  b.Header(1, 1).KvStr("general.architecture", "llama").Tensor("w", ne, type, offset);
  return b.PadTo(32).Zeros(data_bytes).bytes;
}

TEST(GgufHostileTest, TruncationAtEveryOffsetIsAnError) {
  const std::vector<uint8_t> file = testing::SampleWriter().SerializeHeader();
  Result<GgufHeader> full = ParseGgufHeader(file, 0, "t.gguf");
  ASSERT_TRUE(full.ok()) << full.status().message();
  for (size_t len = 0; len < file.size(); ++len) {
    const std::vector<uint8_t> cut(file.begin(), file.begin() + len);
    // As a whole (truncated) file: always an error, since the tensors lie past its end.
    uint64_t needed = 1;
    Result<GgufHeader> h = ParseGgufHeader(cut, cut.size(), "t.gguf", &needed);
    ASSERT_FALSE(h.ok()) << len;
    EXPECT_THAT(h.status().message(), HasSubstr("t.gguf: "));
    if (len > 0) {  // a file_size of 0 means "unknown"
      EXPECT_EQ(needed, 0u) << "a whole file cannot grow: " << h.status().message();
    }
    // As a prefix of a file of unknown size: an error asking for more until the header fits.
    h = ParseGgufHeader(cut, 0, "t.gguf", &needed);
    if (len < full->header_bytes) {
      ASSERT_FALSE(h.ok()) << len;
      EXPECT_GT(needed, len) << h.status().message();
      EXPECT_THAT(h.status().message(), HasSubstr("retry with"));
    } else {
      EXPECT_TRUE(h.ok()) << len << ": " << h.status().message();
    }
  }
}

TEST(GgufHostileTest, TruncatedFileOnDiskIsAnError) {
  testing::TempDir dir;
  const std::string path = dir.File("cut.gguf");
  ASSERT_TRUE(testing::SampleWriter().Write(path).ok());
  uint64_t last_end = 0;
  {
    Result<GgufFile> whole = GgufFile::Open(path);
    ASSERT_TRUE(whole.ok()) << whole.status().message();
    const GgufTensorInfo& last = whole->tensors().back();
    last_end = whole->header().data_offset + last.offset + last.n_bytes;
  }
  // Cutting the padding after the last tensor is harmless; cutting one byte of its data is not.
  const std::string bytes = testing::ReadFileToString(path);
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), last_end);
  ASSERT_TRUE(GgufFile::Open(path).ok());
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(bytes.data(), last_end - 1);
  Result<GgufFile> f = GgufFile::Open(path);
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(f.status().message(), HasSubstr(path + ": tensor i32.4d: data"));
  EXPECT_THAT(f.status().message(), HasSubstr("past end of file"));
}

TEST(GgufHostileTest, ByteCorruptionNeverCrashes) {
  const std::vector<uint8_t> file = testing::SampleWriter().SerializeHeader();
  for (uint8_t value : {uint8_t{0x00}, uint8_t{0x07}, uint8_t{0x80}, uint8_t{0xff}}) {
    for (size_t i = 0; i < file.size(); ++i) {
      std::vector<uint8_t> bad = file;
      bad[i] = value;
      Result<GgufHeader> h = ParseGgufHeader(bad, 0, "c.gguf");
      if (!h.ok()) {
        EXPECT_THAT(h.status().message(), HasSubstr("c.gguf: "));
      }
    }
  }
}

TEST(GgufHostileTest, HugeStringLength) {
  GgufBytes b;
  b.Header(0, 1).Str("general.name").U32(kStringType).U64(1ull << 60).Zeros(16);
  EXPECT_THAT(ErrorOf(b.bytes),
              HasSubstr("test.gguf: kv 0 (general.name): string length 1152921504606846976 "
                        "exceeds the 16 bytes left at offset 56"));
  // With the file size unknown, such a length is refused rather than asked for.
  uint64_t needed = 1;
  EXPECT_FALSE(ParseGgufHeader(b.bytes, 0, "p", &needed).ok());
  EXPECT_EQ(needed, 0u);
}

// A remote header is fetched in growing prefixes, up to a limit of 256 MiB.
TEST(GgufHostileTest, PrefixRetryIsBoundedByTheHeaderLimit) {
  for (uint64_t len : {uint64_t{100} << 20, uint64_t{300} << 20}) {
    GgufBytes b;
    b.Header(0, 1).Str("general.name").U32(kStringType).U64(len).Zeros(16);
    uint64_t needed = 1;
    Result<GgufHeader> h = ParseGgufHeader(b.bytes, 0, "remote.gguf", &needed);
    ASSERT_FALSE(h.ok());
    EXPECT_THAT(h.status().message(), HasSubstr(fmt::format("kv 0 (general.name): string length "
                                                            "{} exceeds the 16 bytes left",
                                                            len)));
    if (len < (uint64_t{256} << 20)) {
      EXPECT_EQ(needed, 56 + len);
    } else {
      EXPECT_EQ(needed, 0u);
    }
  }
}

TEST(GgufHostileTest, HugeKeyLength) {
  GgufBytes b;
  b.Header(0, 1).U64(~0ull).Zeros(20);
  EXPECT_THAT(ErrorOf(b.bytes), HasSubstr("test.gguf: kv 0: key length 18446744073709551615 "
                                          "exceeds the 20 bytes left at offset 32"));
}

TEST(GgufHostileTest, HugeArrayCounts) {
  GgufBytes b;
  b.Header(0, 1).Str("tokenizer.ggml.tokens").U32(kArrayType).U32(kStringType).U64(1ull << 40);
  b.Zeros(1234);
  EXPECT_THAT(ErrorOf(b.bytes),
              HasSubstr("test.gguf: kv 0 (tokenizer.ggml.tokens): array of 1099511627776 strings "
                        "exceeds the 1234 bytes left at offset 69"));

  // count * sizeof(f32) overflows 64 bits.
  GgufBytes f;
  f.Header(0, 1).Str("scores").U32(kArrayType).U32(6).U64(1ull << 62).Zeros(8);
  EXPECT_THAT(ErrorOf(f.bytes),
              HasSubstr("kv 0 (scores): array of 4611686018427387904 f32 values exceeds"));

  GgufBytes nested;
  nested.Header(0, 1).Str("n").U32(kArrayType).U32(kArrayType).U64(1ull << 50).Zeros(100);
  EXPECT_THAT(ErrorOf(nested.bytes), HasSubstr("kv 0 (n): array of 1125899906842624 arrays"));
}

TEST(GgufHostileTest, HugeCountsOfKvsAndTensors) {
  GgufBytes kvs;
  kvs.Header(0, 1ull << 61).Zeros(64);
  EXPECT_THAT(ErrorOf(kvs.bytes),
              HasSubstr("test.gguf: 2305843009213693952 kvs and 0 tensors exceeds"));
  GgufBytes k2;
  k2.Header(0, 1ull << 40).Zeros(64);
  EXPECT_THAT(ErrorOf(k2.bytes),
              HasSubstr("1099511627776 kvs and 0 tensors exceeds the 64 bytes left at offset 24"));
  GgufBytes tensors;
  tensors.Header(~0ull, 0).Zeros(64);
  EXPECT_THAT(ErrorOf(tensors.bytes), HasSubstr("0 kvs and 18446744073709551615 tensors exceeds"));
}

TEST(GgufHostileTest, BadMagicAndVersions) {
  GgufBytes magic;
  magic.U32(0x46554746).U32(3).U64(0).U64(0);
  EXPECT_THAT(ErrorOf(magic.bytes), HasSubstr("test.gguf: bad magic 0x46554746"));
  EXPECT_THAT(ErrorOf({'G', 'G'}), HasSubstr("test.gguf: magic (4 bytes) exceeds the 2 bytes"));
  GgufBytes v1;
  v1.Header(0, 0, 1);
  EXPECT_THAT(ErrorOf(v1.bytes), HasSubstr("test.gguf: GGUF version 1 is not supported"));
  GgufBytes v4;
  v4.Header(0, 0, 4);
  EXPECT_THAT(ErrorOf(v4.bytes), HasSubstr("unsupported GGUF version 4 (expected 2 or 3)"));
  GgufBytes big_endian;
  big_endian.Header(0, 0, 0x03000000);
  EXPECT_THAT(ErrorOf(big_endian.bytes), HasSubstr("big-endian GGUF files are not supported"));
  GgufBytes v2;
  v2.Header(0, 1, 2).KvU32("x", 1);
  EXPECT_TRUE(ParseBytes(v2.bytes).ok());
}

TEST(GgufHostileTest, BadAlignment) {
  for (uint32_t a : {0u, 3u, 48u, 1u << 21, 1u << 31}) {
    GgufBytes b;
    b.Header(0, 2).KvStr("general.architecture", "llama").KvU32("general.alignment", a);
    EXPECT_THAT(ErrorOf(b.bytes), HasSubstr(fmt::format("test.gguf: kv 1 (general.alignment): {} "
                                                        "is not a power of two in [1, 1048576]",
                                                        a)));
  }
  GgufBytes s;
  s.Header(0, 1).KvStr("general.alignment", "32");
  EXPECT_THAT(ErrorOf(s.bytes), HasSubstr("kv 0 (general.alignment): expected an unsigned "
                                          "integer, got string"));
  GgufBytes ok;
  ok.Header(1, 1).KvU32("general.alignment", 64).Tensor("w", {16}, kF32, 0).PadTo(64).Zeros(64);
  Result<GgufHeader> h = ParseBytes(ok.bytes);
  ASSERT_TRUE(h.ok()) << h.status().message();
  EXPECT_EQ(h->alignment, 64u);
  EXPECT_EQ(h->data_offset, 64u * 2);
}

TEST(GgufHostileTest, UnknownValueTypes) {
  GgufBytes b;
  b.Header(0, 1).Str("k").U32(13).U32(0);
  EXPECT_THAT(ErrorOf(b.bytes), HasSubstr("kv 0 (k): unknown value type 13 at offset 33"));
  GgufBytes a;
  a.Header(0, 1).Str("k").U32(kArrayType).U32(77).U64(0);
  EXPECT_THAT(ErrorOf(a.bytes), HasSubstr("kv 0 (k): unknown array element type 77"));
}

TEST(GgufHostileTest, DeepNestingIsCapped) {
  GgufBytes b;
  b.Header(0, 1).Str("deep").U32(kArrayType);
  for (int i = 0; i < 9; ++i) b.U32(kArrayType).U64(1);
  b.U32(0).U64(0);
  EXPECT_THAT(ErrorOf(b.bytes), HasSubstr("kv 0 (deep): item 0: item 0: item 0: item 0: item 0: "
                                          "item 0: item 0: item 0: arrays nested deeper than 8"));
  GgufBytes ok;
  ok.Header(0, 1).Str("deep").U32(kArrayType);
  for (int i = 0; i < 7; ++i) ok.U32(kArrayType).U64(1);
  ok.U32(0).U64(0);
  EXPECT_TRUE(ParseBytes(ok.bytes).ok()) << ErrorOf(ok.bytes);
}

TEST(GgufHostileTest, DuplicateKeysAndTensorNames) {
  GgufBytes keys;
  keys.Header(0, 2).KvU32("a.b", 1).KvU32("a.b", 2);
  EXPECT_THAT(ErrorOf(keys.bytes), HasSubstr("test.gguf: kv 1 (a.b): duplicate key"));
  GgufBytes names;
  names.Header(2, 0).Tensor("w", {8}, kF32, 0).Tensor("w", {8}, kF32, 32).PadTo(32).Zeros(64);
  EXPECT_THAT(ErrorOf(names.bytes), HasSubstr("test.gguf: tensor w: duplicate tensor name"));
}

TEST(GgufHostileTest, UnknownTensorType) {
  EXPECT_THAT(ErrorOf(OneTensorFile({32}, 99, 0, 1024)),
              HasSubstr("test.gguf: tensor w: unknown tensor type id 99"));
  EXPECT_THAT(ErrorOf(OneTensorFile({32}, 4, 0, 1024)),  // q4_2: removed from the format
              HasSubstr("tensor w: unknown tensor type id 4"));
}

TEST(GgufHostileTest, TensorOffsetPastEndAndMisaligned) {
  EXPECT_TRUE(ParseBytes(OneTensorFile({8}, kF32, 0, 32)).ok());
  EXPECT_THAT(ErrorOf(OneTensorFile({8}, kF32, 0, 31)),
              HasSubstr("tensor w: data [128, 160) (32 bytes at data offset 0) past end of file "
                        "(size 159)"));
  EXPECT_THAT(ErrorOf(OneTensorFile({8}, kF32, 1ull << 40, 32)), HasSubstr("past end of file"));
  EXPECT_THAT(ErrorOf(OneTensorFile({8}, kF32, ~0ull << 5, 32)), HasSubstr("past end of file"));
  EXPECT_THAT(ErrorOf(OneTensorFile({8}, kF32, 16, 64)),
              HasSubstr("tensor w: offset 16 is not a multiple of the alignment 32"));
}

TEST(GgufHostileTest, ShapeOverflowAndBadDims) {
  EXPECT_THAT(ErrorOf(OneTensorFile({1ull << 32, 1ull << 32, 4}, kF32, 0, 0)),
              HasSubstr("tensor w: shape [4294967296, 4294967296, 4] overflows"));
  // 2^62 f32 elements fit int64, but their 2^64 bytes do not fit u64.
  EXPECT_THAT(ErrorOf(OneTensorFile({1ull << 31, 1ull << 31}, kF32, 0, 0)),
              HasSubstr("tensor w: shape [2147483648, 2147483648] of f32 overflows"));
  EXPECT_THAT(ErrorOf(OneTensorFile({8, 1ull << 63}, kF32, 0, 0)),
              HasSubstr("tensor w: ne[1] = 9223372036854775808 exceeds the int64 range"));
  EXPECT_THAT(ErrorOf(OneTensorFile({8, 1, 1, 1, 1}, kF32, 0, 64)),
              HasSubstr("tensor w: n_dims 5 exceeds the maximum of 4"));
  EXPECT_THAT(ErrorOf(OneTensorFile({33, 2}, kQ4_0, 0, 64)),
              HasSubstr("tensor w: ne[0] = 33 is not a multiple of the q4_0 block size 32"));
  // A zero-sized dimension is a valid empty tensor.
  Result<GgufHeader> empty = ParseBytes(OneTensorFile({8, 0}, kF32, 0, 0));
  ASSERT_TRUE(empty.ok()) << empty.status().message();
  EXPECT_EQ(empty->tensors[0].n_bytes, 0u);
}

TEST(GgufHostileTest, TensorNameTruncated) {
  GgufBytes b;
  b.Header(1, 0).U64(500).Zeros(30);
  EXPECT_THAT(ErrorOf(b.bytes),
              HasSubstr("test.gguf: tensor 0: name length 500 exceeds the 30 bytes left"));
}

}  // namespace
}  // namespace kvasir
