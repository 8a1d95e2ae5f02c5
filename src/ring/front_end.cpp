// The head's client front end: prompts, stop strings, tokens as the client sees them.
#include "ring/front_end.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvasir::ring {

Result<std::vector<int32_t>> EncodePrompt(const Tokenizer& tokenizer, const GenerateMsg& request,
                                          int n_ctx) {
  std::vector<int32_t> ids = tokenizer.Encode(request.prompt, request.add_special,
                                              /*parse_special=*/true);
  if (ids.empty()) return Error("the prompt is empty");
  if (static_cast<int64_t>(ids.size()) >= n_ctx) {
    return Error(StatusCode::kTooLarge, "the prompt has {} tokens but the context is {}",
                 ids.size(), n_ctx);
  }
  return ids;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (std::string& s : stops) {
    if (s.empty()) continue;
    keep_ = std::max(keep_, s.size() - 1);
    stops_.push_back(std::move(s));
  }
}

bool StopMatcher::Feed(std::string_view piece) {
  if (stops_.empty()) return false;
  tail_.append(piece);
  for (const std::string& stop : stops_) {
    if (tail_.find(stop) != std::string::npos) return true;
  }
  // No stop string ends here; one that ends later starts within the last keep_ bytes.
  if (tail_.size() > keep_) tail_.erase(0, tail_.size() - keep_);
  return false;
}

TokenMsg PresentToken(const TokenMsg& t, const Tokenizer& tokenizer, int n_prompt,
                      StopMatcher* stops) {
  TokenMsg out = t;
  out.piece = tokenizer.TokenToPiece(t.token.id);
  out.token.n_prompt = static_cast<uint32_t>(n_prompt);
  if (t.token.finished == 0 && stops != nullptr && stops->Feed(out.piece)) {
    out.token.finished = 1;
    out.token.reason = static_cast<uint8_t>(wire::FinishReason::kStopString);
    out.piece.clear();
  }
  out.token.piece_bytes = static_cast<uint32_t>(out.piece.size());
  for (TokenLogprob& lp : out.logprobs) lp.piece = tokenizer.TokenToPiece(lp.id);
  return out;
}

}  // namespace kvasir::ring
