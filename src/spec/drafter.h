// Drafters for speculative decoding: something cheap that guesses the next few tokens of a
// session, which the target model then checks in one batch (spec/decoder.h). A drafter is
// deterministic (the same history gives the same guess), so the verifier treats each guess as a
// certainty and speculative rejection sampling stays exact.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "model/layer_window.h"

namespace kvasir::spec {

class Drafter {
 public:
  virtual ~Drafter() = default;
  // "ngram", "model": the name in statistics and messages.
  virtual const char* name() const = 0;
  // Up to max_tokens tokens guessed to follow `history` (the prompt and every token decided so
  // far, the last one included). Fewer, or none, when it has no guess. Errors come only from a
  // draft model's window. Not thread-safe: one session's drafter is called from one thread.
  virtual Result<std::vector<int32_t>> Propose(std::span<const int32_t> history,
                                               int max_tokens) = 0;
};

// What --draft asked for.
enum class DraftKind { kNone, kNgram, kModel, kAuto };

// "none", "ngram", "model", "auto" -> kind; anything else is refused naming the choices.
Result<DraftKind> ParseDraftKind(const std::string& text);

struct DraftOptions {
  DraftKind kind = DraftKind::kNone;
  std::string model_path;  // the draft GGUF (kind kModel, or kAuto when set)
  int max_tokens = 4;      // K: tokens drafted per step
  int n_threads = 1;       // the draft model's window
  std::string backend = "cpu";
};

// The drafter the options ask for next to `target` (auto: a draft model when model_path is set,
// else prompt lookup), or null for none. A draft model whose vocabulary differs from the target's
// is refused, naming both sizes.
Result<std::unique_ptr<Drafter>> MakeDrafter(const DraftOptions& options,
                                             const LayerWindow& target);

}  // namespace kvasir::spec
