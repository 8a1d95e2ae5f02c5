// Byte-by-byte recognition of a Grammar: a pushdown recognizer whose states are memoised.
//
// A parse position is a stack of grammar positions; ambiguity gives several stacks at once, so a
// matcher state is the set of stacks that are still alive after the bytes so far (each with a
// byte set on top), plus whether an empty stack (the whole grammar matched) is among them. Stacks
// are hash-consed frames (position, parent frame), so equal stacks are one id and a set of stacks
// is a sorted list of ids; each set is interned as a small integer State. Transitions (state,
// byte) -> state are computed once and kept in a 256-entry table per state, so walking the trie of
// a vocabulary costs one table lookup per trie node once the states around the current position
// are known. This is a lazily built finite automaton over the reachable part of the pushdown
// configuration space.
//
// Memory is bounded by MatcherLimits: too many stacks in one state (a very ambiguous grammar),
// frames, states or stacks over all states make the recognizer fail with a kTooLarge status
// (sticky: every later transition is refused), and the transition tables are dropped and rebuilt on
// demand when they outgrow their budget.
//
// Threading: a Recognizer and the Matchers on it are for one thread at a time (transitions are
// memoised on first use). Share the Grammar, not the Recognizer: one per generation.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "grammar/char_classes.h"
#include "grammar/grammar.h"

namespace kvasir::grammar {

struct MatcherLimits {
  size_t max_frames = 1 << 20;  // distinct stack frames remembered
  size_t max_states = 1 << 18;  // distinct states remembered
  // Stacks summed over the states remembered (each costs 8 bytes: its id and the state's key), so
  // that many states of many stacks each cannot add up to gigabytes.
  size_t max_state_stacks = 1 << 22;
  size_t max_table_bytes = 32 << 20;  // transition memo: dropped and rebuilt when over
};

class Recognizer {
 public:
  using State = uint32_t;
  static constexpr State kDead = 0;  // refuses every byte and cannot end

  explicit Recognizer(std::shared_ptr<const Grammar> grammar, const MatcherLimits& limits = {});
  Recognizer(const Recognizer&) = delete;
  Recognizer& operator=(const Recognizer&) = delete;

  // The state before any byte; kDead when the start already exceeds the limits (see status()).
  State start() const { return start_; }

  // The state after `byte` from `s`: kDead when the grammar refuses the byte here, or when a
  // limit is reached (then status() is the error).
  State Next(State s, uint8_t byte) {
    if (const uint32_t* t = tables_[s]) {
      const uint32_t v = t[byte];
      if (v != kUnknown) return v;
    }
    return Compute(s, byte);
  }
  // True when the bytes so far form a complete match of the root rule.
  bool CanEnd(State s) const { return states_[s].accepting; }
  // True when no byte may follow (the match is complete and cannot go on).
  bool MustEnd(State s) const { return states_[s].accepting && states_[s].size == 0; }
  // True when from `s` every string of at most `chars` characters, each starting with a byte of
  // a class in `classes` (char_classes.h) and valid UTF-8, is accepted, prefixes cut inside a
  // character included. A cheap sufficient test (false may also mean "not known"): per state it
  // learns once which classes are safe (all of their characters lead to one same next state) and
  // for how many characters that lasts (a run: the next state's safe classes include them, and so
  // on; unbounded when the next state is the state itself, as in `char*`).
  bool CharsAccepted(State s, uint64_t classes, int chars) {
    if (s < char_info_.size() && char_info_[s].learnt) {
      const CharInfo& info = char_info_[s];
      if ((classes & ~info.safe) != 0) return false;
      if (chars <= info.run) return status_.ok();
      if (info.complete) return false;
      // A lower bound so far: learn further, twice as far as before at least.
      Learn(s, std::max(chars, std::min<int>(kMaxRun, 2 * info.run)));
    } else {
      Learn(s, chars);
    }
    const CharInfo& info = char_info_[s];
    return (classes & ~info.safe) == 0 && chars <= info.run && status_.ok();
  }
  // Number of parse stacks alive in `s`.
  size_t StackCount(State s) const { return states_[s].size + (states_[s].accepting ? 1 : 0); }

  const Status& status() const { return status_; }
  const Grammar& grammar() const { return *grammar_; }
  size_t state_count() const { return states_.size(); }
  size_t frame_count() const { return frames_.size(); }
  size_t MemoryBytes() const;

 private:
  static constexpr uint32_t kUnknown = 0xFFFFFFFFu;
  static constexpr uint32_t kNoPos = 0xFFFFFFFFu;
  struct Frame {
    uint32_t pos;     // index in grammar elements: the next item to match
    uint32_t parent;  // frame to return to; 0 is the bottom (the empty stack)
  };
  struct StateInfo {
    uint32_t offset;  // in tops_
    uint32_t size;
    bool accepting;
  };

  State Compute(State s, uint8_t byte);
  // The state after the top frames of `s` whose byte set is in `sets_taken` (bits over
  // distinct_sets_) advance, or, when sets_taken is 0, those whose set holds `byte`.
  State Step(State s, uint64_t sets_taken, uint8_t byte);
  uint32_t* TableFor(State s);
  uint32_t Intern(uint32_t pos, uint32_t parent);
  void Push(uint32_t frame) { work_.push_back(frame); }
  // Expands the pushed frames until each has a byte set on top (collected in out_).
  void Close();
  State InternState();
  void Fail(Status status);
  // Fills char_info_[s], and that of the states its run goes through, for runs of `want`
  // characters at least where they are that long.
  void Learn(State s, int want);
  State ContinuationsTo(State at, uint8_t lo, uint8_t hi);
  // Which character classes lead from `s` to its usual next state (CharInfo next and safe).
  void LearnClasses(State s);
  bool LeadAccepted(State s, uint8_t lead, State to);

  std::shared_ptr<const Grammar> grammar_;
  const uint32_t* elements_;
  MatcherLimits limits_;
  size_t max_stacks_;
  Status status_;
  State start_ = kDead;

  std::vector<Frame> frames_;
  std::unordered_map<uint64_t, uint32_t> frame_ids_;
  std::vector<StateInfo> states_;
  std::vector<uint32_t> tops_;  // the sorted top frames of every state, back to back
  std::unordered_map<std::string, uint32_t> state_ids_;
  std::vector<uint32_t*> tables_;  // [state] -> 256 transitions, or null until needed
  std::vector<std::unique_ptr<uint32_t[]>> owned_tables_;
  // [state] what CharsAccepted has learnt: the state after an ordinary character (the first of
  // "a0A _-" accepted, else of any ASCII byte), the classes whose every character leads there, and
  // the run: every string of up to `run` characters of those classes is accepted (kMaxRun: any).
  static constexpr uint8_t kMaxRun = 255;
  struct CharInfo {
    uint64_t safe = 0;
    State next = kDead;
    uint8_t run = 0;
    bool has_classes = false;  // next and safe are known
    bool learnt = false;       // run is known: exactly when complete, else a lower bound
    bool complete = false;
  };
  std::vector<CharInfo> char_info_;
  struct SpanMemo {
    State at, to;
    uint8_t lo, hi;
  };
  std::vector<SpanMemo> span_memo_;  // for one LearnClasses
  std::vector<State> chain_;         // scratch for Learn

  // Scratch for Compute.
  std::vector<uint32_t> work_, out_, mark_, distinct_sets_, top_set_;
  uint32_t stamp_ = 0;
  bool accepting_ = false;
  std::string key_;
};

// A position in a generation: a recognizer and a state. Copying is two words, so a sampler can
// checkpoint and try candidates freely. The recognizer must outlive the matcher.
class Matcher {
 public:
  Matcher() = default;
  explicit Matcher(Recognizer* r) : r_(r), state_(r->start()) {}
  Matcher(Recognizer* r, Recognizer::State s) : r_(r), state_(s) {}

  // Advances by `byte` when the grammar allows it here; false (and no change) when refused or
  // when the recognizer has failed (status() tells which).
  bool Accept(uint8_t byte) {
    const Recognizer::State next = r_->Next(state_, byte);
    if (next == Recognizer::kDead) return false;
    state_ = next;
    return true;
  }
  // All of `bytes`, or nothing (false, no change).
  bool AcceptBytes(std::string_view bytes);
  bool CanEnd() const { return r_->CanEnd(state_); }
  bool MustEnd() const { return r_->MustEnd(state_); }
  bool dead() const { return state_ == Recognizer::kDead; }
  const Status& status() const { return r_->status(); }
  Recognizer* recognizer() const { return r_; }
  Recognizer::State state() const { return state_; }

 private:
  Recognizer* r_ = nullptr;
  Recognizer::State state_ = Recognizer::kDead;
};

}  // namespace kvasir::grammar
