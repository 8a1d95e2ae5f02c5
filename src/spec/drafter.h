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
  // "ngram", "model", "mtp": the name in statistics and messages.
  virtual const char* name() const = 0;
  // Up to max_tokens tokens guessed to follow `history` (the prompt and every token decided so
  // far, the last one included). Fewer, or none, when it has no guess. Errors come only from a
  // draft model's window. Not thread-safe: one session's drafter is called from one thread.
  virtual Result<std::vector<int32_t>> Propose(std::span<const int32_t> history,
                                               int max_tokens) = 0;

  // Drafters that read the model's own hidden state (mtp) say so; the decoder then asks the
  // window for it (ForwardInput::want_hidden) and hands over the rows of every position it keeps.
  virtual bool wants_hidden() const { return false; }
  // The hidden rows [n, n_embd] (ForwardOutput::hidden) of the session's positions pos0 ..
  // pos0+n-1, once they are final (prefill rows, and the fed token and accepted drafts of a verify
  // batch). Positions arrive in order; a pos0 below those already given replaces them from there
  // on.
  virtual void ObserveHidden(int pos0, std::span<const float> rows) {}
};

// What --draft asked for.
enum class DraftKind { kNone, kNgram, kModel, kMtp, kAuto };

// "none", "ngram", "model", "mtp", "auto" -> kind; anything else is refused naming the choices.
Result<DraftKind> ParseDraftKind(const std::string& text);

struct DraftOptions {
  DraftKind kind = DraftKind::kNone;
  std::string model_path;  // the draft GGUF (kind kModel, or kAuto when set)
  int max_tokens = 4;      // K: tokens drafted per step
  int n_threads = 1;       // the draft model's window
  std::string backend = "cpu";
  int seq_id = 0;  // mtp: the target window's sequence the session decodes
  // The ring's last stage (ring/spec_tail.h): verify windows of a session in flight at once
  // (--draft-windows), and the acceptance a session needs before it drafts past the first.
  int windows = 1;
  double overlap_min_acceptance = 0.8;
};

// The drafter the options ask for next to `target` (auto: a draft model when model_path is set,
// else the model's own nextn block when the target has one, else prompt lookup), or null for
// none. A draft model whose vocabulary differs from the target's is refused, naming both sizes;
// mtp on a target without a nextn block is refused. An mtp drafter runs on `target` (sequence
// options.seq_id), which must outlive it.
Result<std::unique_ptr<Drafter>> MakeDrafter(const DraftOptions& options, LayerWindow& target);

}  // namespace kvasir::spec
