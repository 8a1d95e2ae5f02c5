// What a client sees of the generated text: whole UTF-8 characters only, and nothing of a stop
// string. The text that could still be the start of a stop string is held back until the next
// piece tells, so a stream never shows part of a stop string and then takes it back. Memory is
// bounded by the longest stop string, however long the generation.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/tokenizer.h"

namespace kvasir::serve {

// Stop strings over text that arrives in pieces.
class StopFilter {
 public:
  explicit StopFilter(std::vector<std::string> stops = {});
  // Adds `text` and returns what is now safe to show: everything except a tail that is a proper
  // prefix of some stop string. Once a stop string occurs, returns the text before its first
  // occurrence, stopped() turns true, and later calls return "".
  std::string Push(std::string_view text);
  // At the end of the generation without a stop: the text held back.
  std::string Flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;  // at most the longest stop string less one byte, between calls
  bool stopped_ = false;
};

// Token pieces in, text for the client out: Utf8Stream, then StopFilter.
class GeneratedText {
 public:
  explicit GeneratedText(std::vector<std::string> stops = {}) : stops_(std::move(stops)) {}
  std::string Push(std::string_view piece);
  // At the end: what is left (an incomplete character becomes U+FFFD), unless a stop ended it.
  std::string Finish();
  bool stopped() const { return stops_.stopped(); }

 private:
  Utf8Stream utf8_;
  StopFilter stops_;
};

}  // namespace kvasir::serve
