// The prompts of the speculation ring tests: some repeat themselves (prompt lookup finds them),
// some do not; eight, for eight sessions at once.
#pragma once

#include <string>
#include <vector>

namespace kvasir::testing {

inline const std::vector<std::string>& SpecPrompts() {
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

}  // namespace kvasir::testing
