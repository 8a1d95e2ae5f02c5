#include "gguf/gguf_value.h"

#include <gtest/gtest.h>

#include <limits>

namespace kvasir {
namespace {

TEST(GgufValueTest, IntegerConversionsRespectRange) {
  EXPECT_EQ(GgufValue::Uint8(200).AsInt(), 200);
  EXPECT_EQ(GgufValue::Int32(-5).AsInt(), -5);
  EXPECT_EQ(GgufValue::Int32(-5).AsUint(), std::nullopt);
  EXPECT_EQ(GgufValue::Uint32(4000000000u).AsUint(), 4000000000u);
  EXPECT_EQ(GgufValue::Uint64(std::numeric_limits<uint64_t>::max()).AsInt(), std::nullopt);
  EXPECT_EQ(GgufValue::Uint64(std::numeric_limits<uint64_t>::max()).AsUint(),
            std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(GgufValue::Int64(std::numeric_limits<int64_t>::min()).AsInt(),
            std::numeric_limits<int64_t>::min());
  // Bools, floats and strings are not integers.
  EXPECT_EQ(GgufValue::Bool(true).AsInt(), std::nullopt);
  EXPECT_EQ(GgufValue::Float32(1.0f).AsUint(), std::nullopt);
  EXPECT_EQ(GgufValue::String("1").AsInt(), std::nullopt);
}

TEST(GgufValueTest, FloatBoolStringArrayAccessors) {
  EXPECT_EQ(GgufValue::Float32(1.5f).AsDouble(), 1.5);
  EXPECT_EQ(GgufValue::Float64(-2.25).AsDouble(), -2.25);
  EXPECT_EQ(GgufValue::Uint32(7).AsDouble(), 7.0);
  EXPECT_EQ(GgufValue::Bool(true).AsDouble(), std::nullopt);
  EXPECT_EQ(GgufValue::Bool(false).AsBool(), false);
  EXPECT_EQ(GgufValue::Uint8(1).AsBool(), std::nullopt);
  ASSERT_NE(GgufValue::String("llama").AsString(), nullptr);
  EXPECT_EQ(*GgufValue::String("llama").AsString(), "llama");
  EXPECT_EQ(GgufValue::Uint8(1).AsString(), nullptr);
  EXPECT_EQ(GgufValue::Uint8(1).AsArray(), nullptr);
  GgufValue a = GgufValue::Array(GgufArray::Of(std::vector<float>{1, 2}));
  ASSERT_NE(a.AsArray(), nullptr);
  EXPECT_EQ(a.AsArray()->size(), 2u);
}

TEST(GgufValueTest, ArrayOfDeducesElementType) {
  EXPECT_EQ(GgufArray::Of(std::vector<float>{}).elem_type, GgufType::kFloat32);
  EXPECT_EQ(GgufArray::Of(std::vector<bool>{true}).elem_type, GgufType::kBool);
  EXPECT_EQ(GgufArray::Of(std::vector<std::string>{"a"}).elem_type, GgufType::kString);
  EXPECT_EQ(GgufArray::Of(std::vector<int64_t>{1}).elem_type, GgufType::kInt64);
  EXPECT_EQ(GgufArray::Of(std::vector<GgufValue>{}).elem_type, GgufType::kArray);
}

TEST(GgufValueTest, DisplayStrings) {
  EXPECT_EQ(GgufValue::String("llama").ToDisplayString(), "\"llama\"");
  EXPECT_EQ(GgufValue::String("a\"b\n").ToDisplayString(), "\"a\\\"b\\x0a\"");
  EXPECT_EQ(GgufValue::Uint8(7).ToDisplayString(), "7");
  EXPECT_EQ(GgufValue::Int8(-7).ToDisplayString(), "-7");
  EXPECT_EQ(GgufValue::Bool(true).ToDisplayString(), "true");
  EXPECT_EQ(GgufValue::Float32(1e-5f).ToDisplayString(), "1e-05");
  GgufValue scores = GgufValue::Array(GgufArray::Of(std::vector<float>(32000, -1.0f)));
  EXPECT_EQ(scores.ToDisplayString(2), "[f32 x 32000] -1, -1, ...");
  EXPECT_EQ(scores.ToDisplayString(0), "[f32 x 32000]");
  GgufValue tokens = GgufValue::Array(GgufArray::Of(std::vector<std::string>{"<s>", "a"}));
  EXPECT_EQ(tokens.ToDisplayString(), "[string x 2] \"<s>\", \"a\"");
  GgufValue nested = GgufValue::Array(GgufArray::Of(
      std::vector<GgufValue>{GgufValue::Array(GgufArray::Of(std::vector<uint32_t>{1, 2}))}));
  EXPECT_EQ(nested.ToDisplayString(), "[array x 1] [u32 x 2]");
  EXPECT_EQ(GgufValue::String(std::string(100, 'x')).ToDisplayString().size(), 48u + 5u);
}

TEST(GgufValueTest, EqualityComparesTypeAndValue) {
  EXPECT_EQ(GgufValue::Uint32(1), GgufValue::Uint32(1));
  EXPECT_NE(GgufValue::Uint32(1), GgufValue::Int32(1));
  EXPECT_NE(GgufValue::Uint32(1), GgufValue::Uint32(2));
  GgufValue a = GgufValue::Array(GgufArray::Of(std::vector<std::string>{"x", "y"}));
  GgufValue b = GgufValue::Array(GgufArray::Of(std::vector<std::string>{"x", "y"}));
  EXPECT_EQ(a, b);
  std::get<GgufArray>(b.value).items = std::vector<std::string>{"x"};
  EXPECT_NE(a, b);
}

TEST(GgufValueTest, TypeNames) {
  EXPECT_STREQ(GgufTypeName(GgufType::kFloat32), "f32");
  EXPECT_STREQ(GgufTypeName(GgufType::kString), "string");
  EXPECT_STREQ(GgufTypeName(GgufType::kUint64), "u64");
  EXPECT_STREQ(GgufTypeName(static_cast<GgufType>(99)), "unknown");
}

}  // namespace
}  // namespace kvasir
