// Proofs that a holder has its window's bytes (docs/MARKET.md, "Claims must serve"). When a model
// is added the market keeps a few random byte ranges of each window's tensors (samples, with their
// bytes); each claim is challenged with a fresh nonce and some of those ranges, and the holder
// answers with SHA-256(nonce || bytes of the range) for each, read from its slice. The market then
// needs no access to the model's file to check the answer, and the ranges it keeps are never
// published before a claim is made.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace kvasir::market {

// Samples kept per window, ranges asked per challenge, and the length of each range.
inline constexpr int kSamplesPerWindow = 32;
inline constexpr int kRangesPerChallenge = 4;
inline constexpr uint32_t kSampleBytes = 64;
inline constexpr size_t kProofNonceBytes = 16;

// A byte range of one tensor's data: [offset, offset + length) of the tensor's bytes as stored
// in the GGUF (the same in the model and in any slice of it).
struct ProofRange {
  std::string tensor;
  uint64_t offset = 0;
  uint32_t length = 0;
};

// A range with its bytes, as the market keeps it.
struct RangeSample {
  ProofRange range;
  std::string bytes;  // raw, `range.length` bytes
};

// `count` ranges of up to kSampleBytes spread over the bytes of `tensors` of `file` (each tensor
// picked in proportion to its size), with their bytes. Errors name a tensor the file lacks.
Result<std::vector<RangeSample>> SampleRanges(const GgufFile& file,
                                              const std::vector<std::string>& tensors, int count,
                                              std::mt19937_64& rng);

// SHA-256(nonce || bytes), 64 hex digits.
std::string ProofDigest(std::string_view nonce, std::string_view bytes);

// The holder's answer: ProofDigest of each range read from `slice`. Errors name a range the slice
// does not have (a tensor it lacks, an offset past the tensor's end).
Result<std::vector<std::string>> AnswerChallenge(const GgufFile& slice, std::string_view nonce,
                                                 const std::vector<ProofRange>& ranges);

// Samples as stored (JSON: [{"tensor", "offset", "bytes": hex}]) and back. Parsing refuses
// malformed text with a message naming what is wrong.
std::string SamplesToJson(const std::vector<RangeSample>& samples);
Result<std::vector<RangeSample>> SamplesFromJson(std::string_view text);

}  // namespace kvasir::market
