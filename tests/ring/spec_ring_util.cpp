#include "spec_ring_util.h"

#include <gtest/gtest.h>

#include <cctype>
#include <future>

namespace kvasir::testing {

const std::vector<std::string>& SpecPrompts() {
  static const std::vector<std::string> prompts = {
      "Once upon a time",
      "The cat sat on the mat. The cat sat on the mat. The cat sat",
      "Tom had a red ball",
      "One day, a bird flew. One day, a bird flew. One day,",
      "Lily and Ben went to the park",
      "The sun was hot",
      "A little dog ran and ran and ran and ran and",
      "Mom said"};
  return prompts;
}

spec::DraftOptions DraftWith(spec::DraftKind kind, const std::string& model_path, int max_tokens) {
  spec::DraftOptions o;
  o.kind = kind;
  o.model_path = model_path;
  o.max_tokens = max_tokens;
  return o;
}

std::unique_ptr<LocalRing> StartDraftingRing(const std::string& model, int n_stages,
                                             const spec::DraftOptions& draft) {
  return LocalRing::Start(model, n_stages, wire::Dtype::kF32, 256, 64, 256,
                          [&](int i, ring::StageOptions& o) {
                            if (i == n_stages - 1) o.draft = draft;
                          });
}

std::vector<Generation> GreedyLocally(const std::string& model, int n_predict) {
  std::vector<Generation> local;
  for (const std::string& prompt : SpecPrompts()) {
    local.push_back(GenerateLocally(model, prompt, Greedy(), n_predict));
  }
  return local;
}

void ExpectGreedySessionsEqual(const std::string& head, const std::vector<Generation>& local,
                               int n_predict, const std::string& what) {
  const std::vector<std::string>& prompts = SpecPrompts();
  ASSERT_EQ(local.size(), prompts.size());
  std::vector<std::future<Generation>> futures;
  for (const std::string& prompt : prompts) {
    futures.push_back(std::async(std::launch::async, [&, prompt] {
      return GenerateOnRing(head, prompt, Greedy(), n_predict);
    }));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Generation got = futures[i].get();
    EXPECT_EQ(got.ids, local[i].ids) << what << ": " << prompts[i];
    EXPECT_EQ(got.logits, local[i].logits)
        << what << ": " << prompts[i] << ": verify rows give the logits of single rows";
    EXPECT_EQ(got.text, local[i].text) << what << ": " << prompts[i];
  }
}

void ExpectSampledSessionsEqualOnePass(const std::string& head, const std::string& model,
                                       const std::string& what) {
  const std::vector<std::string>& prompts = SpecPrompts();
  std::vector<std::future<Generation>> futures;
  for (size_t i = 0; i < prompts.size(); ++i) {
    futures.push_back(std::async(std::launch::async, [&, i] {
      SamplingParams p;
      p.temperature = 1.0f;
      p.seed = 77 + i;
      return GenerateOnRing(head, prompts[i], p, 40);
    }));
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const Generation got = futures[i].get();
    EXPECT_EQ(got.logits, TeacherForcedLogits(model, prompts[i], got.ids))
        << what << ": " << prompts[i];
  }
}

void ExpectContinuationsEqualFreshRuns(const std::string& head, const std::string& model) {
  const std::vector<std::string>& prompts = SpecPrompts();
  for (const std::string& prompt : {prompts[0], prompts[0], prompts[4]}) {
    const Generation got = GenerateOnRing(head, prompt, Greedy(), 64);
    const Generation local = GenerateLocally(model, prompt, Greedy(), 64);
    EXPECT_EQ(got.ids, local.ids) << prompt;
    EXPECT_EQ(got.logits, local.logits) << prompt;
  }
}

void ExpectSeededRunRepeats(const std::string& head) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.seed = 1234;
  const std::string& prompt = SpecPrompts()[1];
  const Generation first = GenerateOnRing(head, prompt, p, 48);
  const Generation second = GenerateOnRing(head, prompt, p, 48);
  EXPECT_EQ(first.ids, second.ids);
  EXPECT_EQ(first.logits, second.logits);
  EXPECT_EQ(first.ids.size(), 48u);
}

std::string SpecCaseName(const SpecCase& c) {
  std::string s = c.model.ends_with(".gguf") ? c.model.substr(0, c.model.size() - 5) : c.model;
  for (char& ch : s) {
    if (!std::isalnum(static_cast<unsigned char>(ch))) ch = '_';
  }
  return s + "_" + std::to_string(c.n_stages) + "_stages_" +
         (c.kind == spec::DraftKind::kModel ? "model" : "ngram");
}

}  // namespace kvasir::testing
