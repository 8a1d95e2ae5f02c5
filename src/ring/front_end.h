// The head's client front end, the parts that need no links: a request's prompt tokens and their
// checks, stop strings over the generated text, and a token as the client sees it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "ring/messages.h"
#include "tokenizer/tokenizer.h"

namespace kvasir::ring {

// The prompt's token ids (special tokens in the text are parsed). Refuses an empty prompt and one
// that leaves no room for a generated token in `n_ctx` (kTooLarge), naming the sizes.
Result<std::vector<int32_t>> EncodePrompt(const Tokenizer& tokenizer, const GenerateMsg& request,
                                          int n_ctx);

// Watches generated text for stop strings. Holds only the tail a stop string could still
// complete, so memory stays bounded however long the generation.
class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops = {});
  // Adds the next piece; true once some stop string occurs in the text so far.
  bool Feed(std::string_view piece);
  bool empty() const { return stops_.empty(); }

 private:
  std::vector<std::string> stops_;
  size_t keep_ = 0;  // bytes of tail to keep: the longest stop string less one
  std::string tail_;
};

// The TOKEN the head sends its client for `t` from the ring: with its text piece and the prompt
// length, and finished with reason "stop string" (and no piece) when it completes a stop string.
TokenMsg PresentToken(const TokenMsg& t, const Tokenizer& tokenizer, int n_prompt,
                      StopMatcher* stops);

}  // namespace kvasir::ring
