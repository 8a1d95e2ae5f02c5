// The per-tensor types of each file mix, as llama.cpp's quantizer chooses them for a dense model.
// scripts/quant_mix.py (CTest quant_mix_check) checks `kvasir synth` against those rules, written
// out independently and checked on files llama-quantize made.
#include "model/quant_mix.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace kvasir {
namespace {

using T = TensorType;

MixTensor Tensor(const std::string& name, int n_layer = 8, uint64_t row_len = 2048,
                 bool tied = false, int n_gqa = 1) {
  static thread_local std::string storage;
  storage = name;
  return MixTensor{storage, row_len, 2, n_layer, n_gqa, tied};
}

TEST(QuantMixTest, NamesAndFileTypes) {
  auto m = FileMixFromName("Q4_K_M");
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->mix, FileMix::kQ4_K_M);
  EXPECT_EQ(m->file_type, 15u);
  EXPECT_EQ(m->base, T::kQ4_K);
  EXPECT_EQ(FileMixFromName("q6_k")->file_type, 18u);
  EXPECT_EQ(FileMixFromName("q5_k_m")->file_type, 17u);
  EXPECT_EQ(FileMixFromName("q8_0")->file_type, 7u);
  EXPECT_EQ(FileMixFromName("bf16")->file_type, 32u);
  EXPECT_FALSE(FileMixFromName("q4_k").has_value());
  EXPECT_NE(FileMixNames().find("q4_k_m"), std::string::npos);
}

// In an 8-layer Q4_K_M file, attn_v and ffn_down of layers 0, 3, 6 and 7 get q6_k (the first and
// last eighth, and every third layer after the first eighth); the output matrix is q6_k; the rest,
// token_embd included, is q4_k; vectors stay f32.
TEST(QuantMixTest, Q4KMOnEightLayers) {
  for (int il = 0; il < 8; ++il) {
    const bool more = il == 0 || il == 3 || il == 6 || il == 7;
    const auto name = [il](const char* t) { return fmt::format("blk.{}.{}", il, t); };
    EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, Tensor(name("attn_v.weight"))),
              more ? T::kQ6_K : T::kQ4_K)
        << il;
    EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, Tensor(name("ffn_down.weight"))),
              more ? T::kQ6_K : T::kQ4_K)
        << il;
    EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, Tensor(name("attn_q.weight"))), T::kQ4_K);
    EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, Tensor(name("ffn_gate.weight"))), T::kQ4_K);
    EXPECT_EQ(ChooseTensorType(FileMix::kQ5_K_M, Tensor(name("ffn_down.weight"))),
              more ? T::kQ6_K : T::kQ5_K)
        << il;
  }
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, Tensor("output.weight")), T::kQ6_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, Tensor("token_embd.weight")), T::kQ4_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, Tensor("token_embd.weight", 8, 2048, true)),
            T::kQ6_K);
  MixTensor norm = Tensor("blk.0.attn_norm.weight");
  norm.n_dims = 1;
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, norm), T::kF32);
}

TEST(QuantMixTest, OtherMixes) {
  // q4_0 and the other legacy types still give the output matrix q6_k; q8_0 keeps q8_0.
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_0, Tensor("output.weight")), T::kQ6_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_0, Tensor("blk.0.attn_v.weight")), T::kQ4_0);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ8_0, Tensor("output.weight")), T::kQ8_0);
  EXPECT_EQ(ChooseTensorType(FileMix::kF16, Tensor("output.weight")), T::kF16);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ6_K, Tensor("blk.0.ffn_down.weight")), T::kQ6_K);
  // Q4_K_S: attn_v of the first four layers and ffn_down of the first eighth get q5_k.
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_S, Tensor("blk.3.attn_v.weight")), T::kQ5_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_S, Tensor("blk.4.attn_v.weight")), T::kQ4_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_S, Tensor("blk.0.ffn_down.weight")), T::kQ5_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_S, Tensor("blk.1.ffn_down.weight")), T::kQ4_K);
  // Q2_K: attn_v by the GQA ratio, ffn_down and attn_output q3_k.
  EXPECT_EQ(ChooseTensorType(FileMix::kQ2_K, Tensor("blk.1.attn_v.weight", 8, 2048, false, 4)),
            T::kQ4_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ2_K, Tensor("blk.1.attn_v.weight")), T::kQ3_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ2_K, Tensor("blk.1.ffn_down.weight")), T::kQ3_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ2_K, Tensor("blk.1.attn_output.weight")), T::kQ3_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ3_K_M, Tensor("blk.1.attn_v.weight")), T::kQ5_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ3_K_M, Tensor("blk.2.attn_v.weight")), T::kQ4_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ3_K_M, Tensor("blk.2.attn_output.weight")), T::kQ4_K);
}

// llama.cpp's "70B" class (an 80-layer llama with grouped KV heads): attn_v gets q5_k where the
// mix would give q3_k or q4_k; q6_k stays.
TEST(QuantMixTest, SeventyBClassAttnVGetsQ5K) {
  MixTensor v = Tensor("blk.11.attn_v.weight", 80, 8192, false, 8);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, v), T::kQ4_K);
  v.class_70b = true;
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, v), T::kQ5_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ2_K, v), T::kQ5_K);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ3_K_S, v), T::kQ5_K);
  v.name = "blk.0.attn_v.weight";  // one of the layers that get more bits
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, v), T::kQ6_K);
  v.name = "blk.11.attn_q.weight";
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, v), T::kQ4_K);
}

// Rows that are not whole 256-value superblocks fall back: q4_k -> q5_0, q5_k -> q5_1,
// q6_k -> q8_0, then f16 when even 32 does not divide the row.
TEST(QuantMixTest, PartialSuperblocksFallBack) {
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, Tensor("blk.1.attn_q.weight", 8, 288)), T::kQ5_0);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ5_K_M, Tensor("blk.1.attn_q.weight", 8, 288)), T::kQ5_1);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, Tensor("blk.0.ffn_down.weight", 8, 288)), T::kQ8_0);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, Tensor("output.weight", 8, 288)), T::kQ8_0);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_K_M, Tensor("blk.1.attn_q.weight", 8, 72)), T::kF16);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_0, Tensor("blk.1.attn_q.weight", 8, 72)), T::kF16);
  EXPECT_EQ(ChooseTensorType(FileMix::kQ4_0, Tensor("output.weight", 8, 288)), T::kQ8_0);
}

}  // namespace
}  // namespace kvasir
