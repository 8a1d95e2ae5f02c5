// Helpers of the speculation ring tests (spec_ring_test.cpp, spec_ring_overlap_test.cpp,
// spec_ring_mtp_test.cpp): the prompts, a ring whose last stage drafts, and the check that eight
// greedy sessions at once get exactly one process's output without speculation.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ring_test_util.h"
#include "spec/drafter.h"

namespace kvasir::testing {

// The prompts of the speculation ring tests: some repeat themselves (prompt lookup finds them),
// some do not; eight, for eight sessions at once.
const std::vector<std::string>& SpecPrompts();

// What a last stage drafts with: `kind`, the draft model `model_path` (kind kModel), at most
// `max_tokens` tokens a step; the rest as spec::DraftOptions has them.
spec::DraftOptions DraftWith(spec::DraftKind kind, const std::string& model_path = "",
                             int max_tokens = 4);

// A LocalRing of `model` over `n_stages` (f32 activations, the context and batch sizes of every
// speculation ring test) whose last stage drafts with `draft`; nullptr when it does not start.
std::unique_ptr<LocalRing> StartDraftingRing(const std::string& model, int n_stages,
                                             const spec::DraftOptions& draft);

// Each of SpecPrompts() generated greedily for `n_predict` tokens by one process with the whole
// model and no speculation: what the rings must reproduce.
std::vector<Generation> GreedyLocally(const std::string& model, int n_predict);

// Each of SpecPrompts() as a greedy session of `n_predict` tokens on the ring at `head`, all at
// once: each session's ids, logits and text equal `local`'s (GreedyLocally). `what` names the
// ring in failures.
void ExpectGreedySessionsEqual(const std::string& head, const std::vector<Generation>& local,
                               int n_predict, const std::string& what);

// Each of SpecPrompts() as a session of 40 tokens at temperature 1 (seed 77 + its index) on the
// ring at `head`, all at once: at every token, each session's logit equals the one a single pass
// of the whole `model` gives over the same sequence (no rejected row left a trace in any stage).
void ExpectSampledSessionsEqualOnePass(const std::string& head, const std::string& model,
                                       const std::string& what);

// Sessions one after another on the ring at `head`, greedy, 64 tokens: "Once upon a time" twice
// (the second one continues from what the prompt cache kept of the first) and "Lily and Ben went
// to the park"; each one's ids and logits equal a fresh run of `model` in one process.
void ExpectContinuationsEqualFreshRuns(const std::string& head, const std::string& model);

// The same request at temperature 0.8 with a seed, twice on the ring at `head`: 48 tokens, the
// same ids and logits both times (what is drafted and guessed follows from the session's tokens,
// never from timing).
void ExpectSeededRunRepeats(const std::string& head);

// A case of the parameterised speculation ring tests: a model file of the assets' models/, the
// ring's stages, and what its last stage drafts with.
struct SpecCase {
  std::string model;
  int n_stages;
  spec::DraftKind kind;
};
// The case's test name: the model file without ".gguf" (non-alphanumerics as '_'), the stages
// and the draft kind, as "stories260K_3_stages_model".
std::string SpecCaseName(const SpecCase& c);

}  // namespace kvasir::testing
