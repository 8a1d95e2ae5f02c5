#include "serve/ring_request.h"

#include <vector>

#include "ring/wire.h"
#include "serve/tool_prompt.h"

namespace kvasir::serve {

std::optional<std::string> PromptText(const CompletionRequest& r,
                                      const std::optional<ChatFamily>& family, ApiError* error) {
  if (r.endpoint == Endpoint::kCompletions) return r.prompt;
  if (!family) {
    *error = BadRequest("chat_template_missing", "messages",
                        "this server has no chat template for its model (the model file has "
                        "none this build recognises, or there is no model file here): start "
                        "kvasir serve with --chat-template NAME, or use /v1/completions");
    return std::nullopt;
  }
  if (NeedsToolLayout(r)) return FormatToolChat(*family, r.messages, r.tools);
  std::vector<ChatMessage> messages;
  messages.reserve(r.messages.size());
  for (const ChatTurn& t : r.messages) messages.push_back({t.role, t.content});
  return FormatChat(*family, messages, /*add_generation_prompt=*/true);
}

ring::GenerateMsg ToGenerate(const CompletionRequest& r, std::string prompt_text, uint64_t seed) {
  const SamplingFields& s = r.sampling;
  ring::GenerateMsg g;
  g.prompt = std::move(prompt_text);
  g.add_special = true;
  g.report_cached = true;
  wire::SamplingWire& w = g.sampling;
  w.temperature = s.temperature;
  w.top_p = s.top_p;
  w.min_p = s.min_p;
  w.repeat_penalty = s.repeat_penalty;
  w.top_k = s.top_k;
  w.repeat_last_n = s.repeat_last_n;
  w.seed = s.seed.value_or(seed);
  if (r.max_tokens) {
    w.max_tokens = static_cast<uint32_t>(*r.max_tokens);
  } else {
    w.max_tokens =
        r.endpoint == Endpoint::kCompletions ? kDefaultCompletionTokens : kUntilContextEnds;
  }
  w.flags = r.ignore_eos ? wire::kSamplingIgnoreEog : 0;
  if (s.presence_penalty != 0 || s.frequency_penalty != 0 || !s.logit_bias.empty()) {
    w.flags |= wire::kSamplingExtra;
    g.extra.presence_penalty = s.presence_penalty;
    g.extra.frequency_penalty = s.frequency_penalty;
    for (const auto& [id, bias] : s.logit_bias) g.extra.logit_bias.push_back({id, bias});
  }
  if (r.logprobs.enabled) {
    w.flags |= wire::kSamplingLogprobs;
    g.extra.top_logprobs = static_cast<uint32_t>(r.logprobs.top);
  }
  if (!r.response_format.grammar.empty()) {
    w.flags |= wire::kSamplingGrammar;
    g.extra.grammar = r.response_format.grammar;
  }
  return g;
}

}  // namespace kvasir::serve
