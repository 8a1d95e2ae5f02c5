// Random edits of a text, for the tests that feed mangled model output to the readers of tool
// calls (tool_output_test.cpp, xml_call_test.cpp).
#pragma once

#include <random>
#include <string>
#include <string_view>

namespace kvasir::testing {

// One to three edits of `*text`, each drawn from `rng`: a character of `alphabet` inserted, a
// character erased, or one replaced by a character of `alphabet`.
inline void Mangle(std::string* text, std::string_view alphabet, std::mt19937_64& rng) {
  for (int edits = 1 + static_cast<int>(rng() % 3); edits > 0; --edits) {
    const size_t at = rng() % (text->size() + 1);
    const char c = alphabet[rng() % alphabet.size()];
    switch (rng() % 3) {
      case 0:
        text->insert(at, 1, c);
        break;
      case 1:
        if (at < text->size()) text->erase(at, 1);
        break;
      default:
        if (at < text->size()) (*text)[at] = c;
    }
  }
}

}  // namespace kvasir::testing
