// Checks of logits against the shared references (../shared/reference, README.md there): how far a
// run's logits are from llama.cpp's and from the exact float64 pass, and whether its greedy picks
// are llama.cpp's wherever the reference's margin makes the pick certain.
//
// Why 2 x the bound: if every logit of ours is within B of the reference's, our top-1 is the
// reference's top-1 at every step where the reference's top-1 leads its top-2 by more than 2 B.
// Steps with a smaller margin may legitimately pick another token and are not checked.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "test_assets.h"

namespace kvasir::testing {

struct ReferenceCase {
  std::string stem;                        // "stories260K.p1"
  nlohmann::json meta;                     // the case's JSON
  std::vector<int32_t> prompt, generated;  // llama.cpp's prompt ids and greedy ids
  std::vector<int32_t> forced;             // prompt + generated[:-1]: the teacher-forced input
  int n_vocab = 0;
  std::vector<float> llamacpp;  // [n_steps, n_vocab] llama.cpp's logits
  std::vector<float> exact;     // [n_steps, n_vocab] the float64 pass; empty if none
  size_t steps() const { return generated.size(); }
  std::span<const float> LlamaRow(size_t s) const {
    return {llamacpp.data() + s * n_vocab, static_cast<size_t>(n_vocab)};
  }
  std::span<const float> ExactRow(size_t s) const {
    return {exact.data() + s * n_vocab, static_cast<size_t>(n_vocab)};
  }
};

inline std::vector<float> ReadF32File(const std::string& path) {
  const std::string raw = ReadFileToString(path);
  std::vector<float> out(raw.size() / 4);
  std::memcpy(out.data(), raw.data(), out.size() * 4);
  return out;
}

// Loads reference/<stem>.json and its logits files (the caller checks the asset exists).
inline ReferenceCase LoadReferenceCase(const std::string& stem) {
  ReferenceCase c;
  c.stem = stem;
  c.meta = nlohmann::json::parse(ReadFileToString(AssetPath("reference/" + stem + ".json")));
  c.prompt = c.meta["prompt_ids"].get<std::vector<int32_t>>();
  c.generated = c.meta["generated_ids"].get<std::vector<int32_t>>();
  c.forced = c.prompt;
  c.forced.insert(c.forced.end(), c.generated.begin(), c.generated.end() - 1);
  c.n_vocab = c.meta["n_vocab"].get<int>();
  c.llamacpp = ReadF32File(AssetPath("reference/" + c.meta["logits_file"].get<std::string>()));
  if (c.meta.contains("exact_f64_logits_file")) {
    c.exact =
        ReadF32File(AssetPath("reference/" + c.meta["exact_f64_logits_file"].get<std::string>()));
  }
  return c;
}

// Top-1 minus top-2 of a row.
inline double Margin(std::span<const float> row) {
  float a = -INFINITY, b = -INFINITY;
  for (float v : row) {
    if (v > a) {
      b = a;
      a = v;
    } else if (v > b) {
      b = v;
    }
  }
  return static_cast<double>(a) - b;
}

inline int32_t RowArgMax(std::span<const float> row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

inline double MaxAbsDiff(std::span<const float> a, std::span<const float> b) {
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    m = std::max(m, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return m;
}

// The bounds a run is held to: largest |ours - llama.cpp| and |ours - exact| (0: no exact
// logits in the case).
struct ReferenceBounds {
  double vs_llamacpp = 0;
  double vs_exact = 0;
};

// What one run gave against a case: `ours(s)` is our row of logits at step s.
struct ReferenceComparison {
  double vs_llamacpp = 0;       // max |ours - llama.cpp|
  double vs_exact = 0;          // max |ours - exact| (0 without exact logits)
  int picks_checked = 0;        // steps whose llama.cpp margin exceeds 2 x bounds.vs_llamacpp
  int exact_picks_checked = 0;  // steps whose exact margin exceeds 2 x bounds.vs_exact
  int steps_checked = 0;        // steps with either check
  std::vector<std::string> wrong_picks;  // "step 3: picked 17, llama.cpp 42 (margin 0.5)"
};

// At a step where llama.cpp's margin exceeds 2 x bounds.vs_llamacpp our pick must be llama.cpp's;
// where the exact margin exceeds 2 x bounds.vs_exact it must be the exact argmax (which is
// llama.cpp's pick but at the steps the case lists in f64_argmax_disagrees_at_steps).
template <typename RowFn>
ReferenceComparison CompareWithReference(const ReferenceCase& c, RowFn ours,
                                         const ReferenceBounds& bounds) {
  ReferenceComparison r;
  auto pick = [&](size_t s, int32_t got, int32_t want, const char* whose, double margin) {
    if (got == want) return;
    r.wrong_picks.push_back("step " + std::to_string(s) + ": picked " + std::to_string(got) + ", " +
                            whose + " " + std::to_string(want) + " (margin " +
                            std::to_string(margin) + ")");
  };
  for (size_t s = 0; s < c.steps(); ++s) {
    const std::span<const float> row = ours(s);
    const int32_t got = RowArgMax(row);
    bool checked = false;
    r.vs_llamacpp = std::max(r.vs_llamacpp, MaxAbsDiff(row, c.LlamaRow(s)));
    if (const double m = Margin(c.LlamaRow(s)); m > 2 * bounds.vs_llamacpp) {
      ++r.picks_checked;
      checked = true;
      pick(s, got, c.generated[s], "llama.cpp", m);
    }
    if (!c.exact.empty()) {
      r.vs_exact = std::max(r.vs_exact, MaxAbsDiff(row, c.ExactRow(s)));
      if (const double m = Margin(c.ExactRow(s)); m > 2 * bounds.vs_exact) {
        ++r.exact_picks_checked;
        checked = true;
        pick(s, got, RowArgMax(c.ExactRow(s)), "exact argmax", m);
      }
    }
    r.steps_checked += checked;
  }
  return r;
}

// How many steps of `c` have a llama.cpp margin above 2 x `bound`.
inline int CertainSteps(const ReferenceCase& c, double bound) {
  int n = 0;
  for (size_t s = 0; s < c.steps(); ++s) n += Margin(c.LlamaRow(s)) > 2 * bound;
  return n;
}

}  // namespace kvasir::testing
