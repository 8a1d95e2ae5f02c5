// Two-sample chi-square test of token histograms, for the tests that check speculation keeps the
// sampled distribution.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

namespace kvasir::spec {

// Two-sample chi-square statistic of histograms a and b (categories with fewer than 10 draws in
// all pooled into one) and its degrees of freedom.
inline std::pair<double, int> ChiSquare2(const std::map<int32_t, int>& a,
                                         const std::map<int32_t, int>& b, int na, int nb) {
  std::map<int32_t, std::pair<int, int>> both;
  for (auto [t, n] : a) both[t].first += n;
  for (auto [t, n] : b) both[t].second += n;
  std::vector<std::pair<int, int>> cats;
  std::pair<int, int> rest{0, 0};
  for (auto [t, ab] : both) {
    if (ab.first + ab.second >= 10) {
      cats.push_back(ab);
    } else {
      rest.first += ab.first;
      rest.second += ab.second;
    }
  }
  if (rest.first + rest.second > 0) cats.push_back(rest);
  const double ka = std::sqrt(static_cast<double>(nb) / na), kb = 1.0 / ka;
  double x2 = 0;
  for (auto [x, y] : cats) x2 += (ka * x - kb * y) * (ka * x - kb * y) / (x + y);
  return {x2, static_cast<int>(cats.size()) - 1};
}

// The chi-square value a statistic with `df` degrees of freedom exceeds with probability 1e-4
// (Wilson-Hilferty).
inline double Critical(int df) {
  const double z = 3.719, h = 2.0 / (9.0 * df);
  return df * std::pow(1.0 - h + z * std::sqrt(h), 3);
}

// Token histograms of a run of steps, one per step: the draws of the plain path and of the
// speculative path, `runs` of each.
struct StepHistograms {
  explicit StepHistograms(int steps) : plain(steps), spec(steps) {}
  // Counts run `a` (plain) and run `b` (speculative), one token per step.
  void Add(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
    for (size_t s = 0; s < plain.size(); ++s) {
      plain[s][a[s]]++;
      spec[s][b[s]]++;
    }
  }
  // At every step the two paths draw from the same distribution (the chi-square statistic under
  // Critical, after `runs` draws of each).
  void ExpectSameDistributions(int runs) const {
    for (size_t s = 0; s < plain.size(); ++s) {
      const auto [x2, df] = ChiSquare2(plain[s], spec[s], runs, runs);
      ASSERT_GT(df, 0) << "step " << s;
      EXPECT_LT(x2, Critical(df)) << "step " << s << ": " << df << " degrees of freedom";
    }
  }
  std::vector<std::map<int32_t, int>> plain, spec;
};

}  // namespace kvasir::spec
