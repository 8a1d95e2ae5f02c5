// Two-sample chi-square test of token histograms, for the tests that check speculation keeps the
// sampled distribution.
#pragma once

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

}  // namespace kvasir::spec
