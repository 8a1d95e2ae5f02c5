// HoldBook and GenerationGate (repair.h).
#include "ring/repair.h"

#include <algorithm>

namespace kvasir::ring {

void HoldBook::Hold(std::span<const uint32_t> ids, Clock::time_point now) {
  if (!enabled()) return;
  for (uint32_t id : ids) held_.emplace(id, now);  // emplace keeps an earlier start
}

std::optional<HoldBook::Clock::time_point> HoldBook::since(uint32_t id) const {
  auto it = held_.find(id);
  if (it == held_.end()) return std::nullopt;
  return it->second;
}

std::vector<uint32_t> HoldBook::Expired(Clock::time_point now) {
  std::vector<uint32_t> out;
  for (auto it = held_.begin(); it != held_.end();) {
    if (now - it->second >= timeout_) {
      out.push_back(it->first);
      it = held_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::vector<uint32_t> HoldBook::ids() const {
  std::vector<uint32_t> out;
  out.reserve(held_.size());
  for (const auto& [id, since] : held_) out.push_back(id);
  return out;
}

std::optional<uint32_t> HoldBook::Oldest() const {
  std::optional<uint32_t> oldest;
  Clock::time_point at{};
  for (const auto& [id, since] : held_) {
    if (!oldest || since < at) {
      oldest = id;
      at = since;
    }
  }
  return oldest;
}

Status GenerationGate::Admit(uint64_t generation, std::string_view side, bool newest_linked) {
  std::lock_guard<std::mutex> lock(mu_);
  if (generation < newest_ && newest_linked) {
    return Error(StatusCode::kConflict,
                 "{} of generation {} is older than {}, which took its place: a newer process "
                 "holds this window now",
                 side, generation, newest_);
  }
  newest_ = generation;
  return Status::Ok();
}

uint64_t GenerationGate::newest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return newest_;
}

uint64_t NewGeneration(uint64_t at_least) {
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return std::max<uint64_t>(static_cast<uint64_t>(us), at_least == 0 ? 0 : at_least + 1);
}

}  // namespace kvasir::ring
