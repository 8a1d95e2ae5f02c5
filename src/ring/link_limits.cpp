#include "ring/link_limits.h"

#include <algorithm>

#include "ring/wire.h"

namespace kvasir::ring {

uint32_t MaxPromptBytes(const Tokenizer& tokenizer, int n_ctx) {
  // A token's text in the vocabulary is at least as long as the input it stands for: SPM's word
  // marker is 3 bytes for a space, a byte token "<0x0A>" 6 for one byte, byte-level BPE 1-2 per
  // byte.
  uint64_t longest = 4;
  for (int32_t id = 0; id < tokenizer.n_vocab(); ++id) {
    longest = std::max<uint64_t>(longest, tokenizer.TokenText(id).size());
  }
  const uint64_t tokens = static_cast<uint64_t>(std::max(n_ctx, 1));
  return static_cast<uint32_t>(std::min<uint64_t>(wire::kMaxPromptBytes, longest * tokens));
}

uint32_t MaxClientPayload(uint32_t max_prompt_bytes) {
  const uint64_t extra = sizeof(wire::SamplingExtraWire) +
                         uint64_t{wire::kMaxLogitBias} * sizeof(wire::LogitBiasWire) +
                         sizeof(wire::SamplingOutputWire) + wire::kMaxGrammarBytes;
  // With kGenerateClientCount, the 16-byte receipt id the client picked.
  const uint64_t generate = sizeof(wire::GenerateBody) + 16 + uint64_t{max_prompt_bytes} +
                            kMaxClientStopBytes + extra;
  const uint64_t error = sizeof(wire::ErrorBody) + wire::kMaxErrorMessage;
  return static_cast<uint32_t>(std::min<uint64_t>(wire::kMaxPayload, std::max(generate, error)));
}

uint32_t MaxStagePayload(int n_ctx, int n_embd) {
  const uint64_t rows = static_cast<uint64_t>(std::max(n_ctx, 1));
  const uint64_t width = static_cast<uint64_t>(std::max(n_embd, 1));
  const uint64_t hidden = sizeof(wire::HiddenBody) + rows * width * sizeof(float);
  const uint64_t open = sizeof(wire::OpenSessionBody) + uint64_t{kMaxOpenPromptTokens} * 4 +
                        sizeof(wire::SamplingExtraWire) +
                        uint64_t{wire::kMaxLogitBias} * sizeof(wire::LogitBiasWire) +
                        sizeof(wire::SamplingOutputWire) + wire::kMaxGrammarBytes;
  const uint64_t stats =
      sizeof(wire::StatsBody) +
      uint64_t{wire::kMaxStatsRecords} *
          (sizeof(wire::StageStats) + sizeof(wire::DraftStatsWire) + sizeof(wire::RepairStatsWire));
  const uint64_t receipt = sizeof(wire::ReceiptBody) + sizeof(wire::ClientCount) +
                           uint64_t{wire::kMaxReceiptLines} * sizeof(wire::ReceiptLine);
  return static_cast<uint32_t>(
      std::min<uint64_t>(wire::kMaxPayload, std::max({hidden, open, stats, receipt})));
}

}  // namespace kvasir::ring
