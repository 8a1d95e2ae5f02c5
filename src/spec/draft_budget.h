// How many tokens to draft next, from the acceptance measured so far in one session: a drafter
// that is mostly right drafts up to the cap, one that is mostly wrong drafts less, and one that is
// almost never right pauses (for 4, 8, ... up to 64 steps, then tries one token again), so that a
// session is not slowed by verify rows that are thrown away. Pure; one per session.
#pragma once

namespace kvasir::spec {

class DraftBudget {
 public:
  // max_tokens: the cap (--draft-max), >= 0. Not adaptive: always the cap.
  explicit DraftBudget(int max_tokens, bool adaptive = true);

  // Tokens to draft this step: 0 while paused, else 1..max_tokens. Counts a paused step.
  int Next();
  // The outcome of a step that drafted `drafted` (> 0) tokens of which `accepted` were taken.
  void Record(int drafted, int accepted);

  double acceptance() const { return acceptance_; }  // the running estimate, 0..1

 private:
  int max_tokens_;
  bool adaptive_;
  double acceptance_ = 0.6;  // per drafted token, an exponential average over steps
  int paused_for_ = 0;       // steps left without drafting
  int next_pause_ = 4;       // the length of the next pause
};

}  // namespace kvasir::spec
