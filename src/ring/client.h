// A client of a ring: connects to the head stage, sends GENERATE, and receives the tokens as the
// ring produces them. Used by `kvasir generate --ring` and `kvasir run`.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "ring/link.h"
#include "ring/messages.h"

namespace kvasir::ring {

struct GenerateResult {
  int n_prompt = 0;
  int n_generated = 0;
  wire::FinishReason reason = wire::FinishReason::kNone;
  double ttft_ms = 0;    // request sent -> first token received
  double total_ms = 0;   // request sent -> last token received
};

class RingClient {
 public:
  // Connects to the head at HOST:PORT and exchanges HELLO, retrying until `timeout_ms` passes
  // (the ring may still be starting).
  static Result<std::unique_ptr<RingClient>> Connect(const std::string& head, int timeout_ms);

  const wire::Hello& head_hello() const { return head_hello_; }

  // Runs one generation. `on_token` gets each token with its text piece as it arrives.
  Result<GenerateResult> Generate(const GenerateMsg& request,
                                  const std::function<void(const TokenMsg&)>& on_token);
  // Waits until the head reports a closed ring (its probe went all the way around), or the
  // timeout passes.
  Status WaitReady(int timeout_ms);
  // Collects one statistics record per stage, in ring order from the head.
  Result<std::vector<wire::StageStats>> Stats();

 private:
  explicit RingClient(std::unique_ptr<Link> link) : link_(std::move(link)) {}
  std::unique_ptr<Link> link_;
  wire::Hello head_hello_{};
};

}  // namespace kvasir::ring
