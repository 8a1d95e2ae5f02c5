#include "grammar/recognizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace kvasir::grammar {
namespace {

// The dead state's transitions: every byte leads back to it.
const uint32_t kDeadTable[256] = {};

}  // namespace

Recognizer::Recognizer(std::shared_ptr<const Grammar> grammar, const MatcherLimits& limits)
    : grammar_(std::move(grammar)),
      elements_(grammar_->elements().data()),
      limits_(limits),
      max_stacks_(grammar_->limits().max_stacks) {
  frames_.push_back({kNoPos, 0});  // frame 0: the bottom of every stack
  mark_.push_back(0);
  states_.push_back({0, 0, false});  // state 0: dead
  tables_.push_back(const_cast<uint32_t*>(kDeadTable));
  ++stamp_;
  out_.clear();
  accepting_ = false;
  for (uint32_t alt : grammar_->alternatives(grammar_->root())) {
    Push(elements_[alt] == Grammar::kEnd ? 0 : Intern(alt, 0));
  }
  Close();
  start_ = status_.ok() ? InternState() : kDead;
}

size_t Recognizer::MemoryBytes() const {
  // Hash map nodes counted at about 32 bytes of overhead each; a state's key holds its stacks.
  return frames_.capacity() * sizeof(Frame) + frame_ids_.size() * 32 +
         states_.capacity() * sizeof(StateInfo) + tops_.capacity() * 4 + state_ids_.size() * 64 +
         tops_.size() * 4 + owned_tables_.size() * 256 * 4 + mark_.capacity() * 4 +
         char_info_.capacity() * sizeof(CharInfo);
}

void Recognizer::Fail(Status status) {
  if (!status_.ok()) return;
  status_ = std::move(status);
  // Sticky: with the memo gone every transition goes through Compute, which now refuses.
  owned_tables_.clear();
  std::fill(tables_.begin() + 1, tables_.end(), nullptr);
}

uint32_t Recognizer::Intern(uint32_t pos, uint32_t parent) {
  const uint64_t key = (uint64_t{pos} << 32) | parent;
  auto [it, fresh] = frame_ids_.emplace(key, static_cast<uint32_t>(frames_.size()));
  if (fresh) {
    if (frames_.size() >= limits_.max_frames) {
      frame_ids_.erase(it);
      Fail(Error(StatusCode::kTooLarge,
                 "grammar: the match needs more than {} stack frames (the limit)",
                 limits_.max_frames));
      return 0;
    }
    frames_.push_back({pos, parent});
    mark_.push_back(0);
  }
  return it->second;
}

void Recognizer::Close() {
  while (!work_.empty()) {
    const uint32_t f = work_.back();
    work_.pop_back();
    if (mark_[f] == stamp_) continue;
    mark_[f] = stamp_;
    if (f == 0) {
      accepting_ = true;
      continue;
    }
    const Frame frame = frames_[f];
    const uint32_t item = elements_[frame.pos];
    if (!Grammar::IsRule(item)) {
      out_.push_back(f);
      continue;
    }
    // Call: the return frame is the rest of this alternative, or (a tail call) the parent itself,
    // so right recursion does not deepen the stack.
    const uint32_t ret = elements_[frame.pos + 1] == Grammar::kEnd
                             ? frame.parent
                             : Intern(frame.pos + 1, frame.parent);
    for (uint32_t alt : grammar_->alternatives(item & ~Grammar::kRuleBit)) {
      Push(elements_[alt] == Grammar::kEnd ? ret : Intern(alt, ret));
    }
  }
}

Recognizer::State Recognizer::InternState() {
  if (out_.size() > max_stacks_) {
    Fail(Error(StatusCode::kTooLarge,
               "grammar: {} parse stacks alive at once, over the limit of {} (the grammar is "
               "too ambiguous here)",
               out_.size(), max_stacks_));
    return kDead;
  }
  if (out_.empty() && !accepting_) return kDead;
  std::sort(out_.begin(), out_.end());
  key_.assign(reinterpret_cast<const char*>(out_.data()), out_.size() * sizeof(uint32_t));
  key_.push_back(accepting_ ? '\1' : '\0');
  auto [it, fresh] = state_ids_.emplace(key_, static_cast<uint32_t>(states_.size()));
  if (!fresh) return it->second;
  if (states_.size() >= limits_.max_states) {
    state_ids_.erase(it);
    Fail(Error(StatusCode::kTooLarge, "grammar: the match needs more than {} states (the limit)",
               limits_.max_states));
    return kDead;
  }
  if (tops_.size() + out_.size() > limits_.max_state_stacks) {
    state_ids_.erase(it);
    Fail(Error(StatusCode::kTooLarge,
               "grammar: the match needs more than {} stacks over all its states (the limit)",
               limits_.max_state_stacks));
    return kDead;
  }
  states_.push_back(
      {static_cast<uint32_t>(tops_.size()), static_cast<uint32_t>(out_.size()), accepting_});
  tops_.insert(tops_.end(), out_.begin(), out_.end());
  tables_.push_back(nullptr);
  return it->second;
}

uint32_t* Recognizer::TableFor(State s) {
  if (tables_[s] == nullptr) {
    if ((owned_tables_.size() + 1) * 256 * sizeof(uint32_t) > limits_.max_table_bytes) {
      // The memo is only a cache: dropping it costs recomputation, never correctness.
      owned_tables_.clear();
      std::fill(tables_.begin() + 1, tables_.end(), nullptr);
    }
    owned_tables_.emplace_back(new uint32_t[256]);
    tables_[s] = owned_tables_.back().get();
    std::memset(tables_[s], 0xFF, 256 * sizeof(uint32_t));
  }
  return tables_[s];
}

Recognizer::State Recognizer::Step(State s, uint64_t sets_taken, uint8_t byte) {
  if (++stamp_ == 0) {  // wrapped: old marks could collide with the new stamp
    std::fill(mark_.begin(), mark_.end(), 0);
    stamp_ = 1;
  }
  out_.clear();
  accepting_ = false;
  const StateInfo info = states_[s];
  for (uint32_t k = 0; k < info.size; ++k) {
    const Frame frame = frames_[tops_[info.offset + k]];
    const bool taken = sets_taken != 0 ? ((sets_taken >> top_set_[k]) & 1) != 0
                                       : grammar_->SetHas(elements_[frame.pos], byte);
    if (!taken) continue;
    Push(elements_[frame.pos + 1] == Grammar::kEnd ? frame.parent
                                                   : Intern(frame.pos + 1, frame.parent));
  }
  Close();
  if (!status_.ok()) return kDead;
  return InternState();
}

// All 256 transitions of `s` at once: bytes that the same byte sets of the top frames accept lead
// to the same state, so one closure is computed per group of bytes rather than per byte.
Recognizer::State Recognizer::Compute(State s, uint8_t byte) {
  if (!status_.ok() || s == kDead) return kDead;
  const StateInfo info = states_[s];
  distinct_sets_.clear();
  top_set_.resize(info.size);
  for (uint32_t k = 0; k < info.size; ++k) {
    const uint32_t set = elements_[frames_[tops_[info.offset + k]].pos];
    auto it = std::find(distinct_sets_.begin(), distinct_sets_.end(), set);
    top_set_[k] = static_cast<uint32_t>(it - distinct_sets_.begin());
    if (it == distinct_sets_.end()) distinct_sets_.push_back(set);
  }
  if (distinct_sets_.size() > 64) {  // rare: one byte at a time
    const State next = Step(s, 0, byte);
    if (!status_.ok()) return kDead;
    TableFor(s)[byte] = next;
    return next;
  }
  uint32_t* table = TableFor(s);
  std::pair<uint64_t, State> groups[256];
  int n_groups = 0;
  for (unsigned b = 0; b < 256; ++b) {
    uint64_t sig = 0;
    for (size_t j = 0; j < distinct_sets_.size(); ++j) {
      if (grammar_->SetHas(distinct_sets_[j], static_cast<uint8_t>(b))) sig |= uint64_t{1} << j;
    }
    State next = kDead;
    if (sig != 0) {
      int g = 0;
      while (g < n_groups && groups[g].first != sig) ++g;
      if (g == n_groups) {
        groups[n_groups++] = {sig, Step(s, sig, 0)};
        if (!status_.ok()) return kDead;  // the tables are gone, `table` with them
      }
      next = groups[g].second;
    }
    table[b] = next;
  }
  return table[byte];
}

// Continuation bytes [lo, hi] from `at`: the one state they all lead to, or kDead. Leads of a
// class usually reach the same intermediate states, so the answers are kept for one LearnClasses.
Recognizer::State Recognizer::ContinuationsTo(State at, uint8_t lo, uint8_t hi) {
  for (const SpanMemo& m : span_memo_) {
    if (m.at == at && m.lo == lo && m.hi == hi) return m.to;
  }
  State to = Next(at, lo);
  for (unsigned c = lo + 1u; c <= hi && to != kDead; ++c) {
    if (Next(at, static_cast<uint8_t>(c)) != to) to = kDead;
  }
  span_memo_.push_back({at, to, lo, hi});
  return to;
}

bool Recognizer::LeadAccepted(State s, uint8_t lead, State to) {
  const Utf8Lead shape = Utf8LeadOf(lead);
  State at = Next(s, lead);
  for (int k = 1; k <= shape.continuation && at != kDead; ++k) {
    at = k == 1 ? ContinuationsTo(at, shape.lo, shape.hi) : ContinuationsTo(at, 0x80, 0xBF);
  }
  return at != kDead && at == to;
}

void Recognizer::LearnClasses(State s) {
  if (s < char_info_.size() && char_info_[s].has_classes) return;
  State to = kDead;
  for (uint8_t c : std::string_view("a0A _-")) {
    if ((to = Next(s, c)) != kDead) break;
  }
  for (unsigned b = 0; b < 0x80 && to == kDead; ++b) to = Next(s, static_cast<uint8_t>(b));
  uint64_t seen = 0, failed = 0;
  span_memo_.clear();
  if (to != kDead) {
    for (unsigned b = 0; b < 256; ++b) {
      const uint8_t c = CharClassOf(static_cast<uint8_t>(b));
      if (c == kNoClass || ((failed >> c) & 1)) continue;
      seen |= uint64_t{1} << c;
      const bool ok = b < 0x80 ? Next(s, static_cast<uint8_t>(b)) == to
                               : LeadAccepted(s, static_cast<uint8_t>(b), to);
      if (!ok) failed |= uint64_t{1} << c;
    }
  }
  // Next() may have added states: size the memo only now.
  if (char_info_.size() < states_.size()) char_info_.resize(states_.size());
  CharInfo& info = char_info_[s];
  info.next = to;
  info.safe = seen & ~failed;
  info.has_classes = true;
}

// run(t) is 0 when no class is safe, unbounded on a self-loop, 1 + run(next) when the next
// state's safe classes include t's (a string of t's classes is then one character and a string
// of the next state's), else 1. Computed along the chain of next states, then backwards. The walk
// stops once `want` characters are covered (the run is then a lower bound, extended when a later
// question needs more), and after kMaxRun states (a cycle through several states: a run of 1).
void Recognizer::Learn(State s, int want) {
  std::vector<State>& chain = chain_;
  chain.clear();
  uint8_t run = 0;       // the run of the state after chain.back(), or of chain.back() if fixed
  bool fixed = false;    // chain.back()'s run is `run` itself
  bool complete = true;  // the runs found are exact, not lower bounds
  for (State t = s;;) {
    const int need = want - static_cast<int>(chain.size());  // characters wanted from t
    if (t < char_info_.size() && char_info_[t].learnt &&
        (char_info_[t].complete || char_info_[t].run >= need)) {
      run = char_info_[t].run;
      complete = char_info_[t].complete;
      break;
    }
    LearnClasses(t);
    chain.push_back(t);
    const State next = char_info_[t].next;
    const uint64_t safe = char_info_[t].safe;
    fixed = true;
    if (safe == 0) {
      run = 0;
      break;
    }
    if (next == t) {
      run = kMaxRun;
      break;
    }
    if (chain.size() >= kMaxRun) {
      run = 1;
      break;
    }
    if (need <= 1) {
      run = 1;
      complete = false;
      break;
    }
    LearnClasses(next);
    if ((safe & ~char_info_[next].safe) != 0) {
      run = 1;
      break;
    }
    fixed = false;
    t = next;
  }
  for (size_t k = chain.size(); k-- > 0;) {
    if (!(fixed && k + 1 == chain.size())) {
      run = static_cast<uint8_t>(std::min<int>(kMaxRun, run + 1));
    }
    CharInfo& info = char_info_[chain[k]];
    info.run = run;
    info.complete = complete;
    info.learnt = true;
  }
}

bool Matcher::AcceptBytes(std::string_view bytes) {
  Recognizer::State s = state_;
  for (char c : bytes) {
    s = r_->Next(s, static_cast<uint8_t>(c));
    if (s == Recognizer::kDead) return false;
  }
  state_ = s;
  return true;
}

}  // namespace kvasir::grammar
