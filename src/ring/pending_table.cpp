#include "ring/pending_table.h"

#include <arpa/inet.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace kvasir::ring {
namespace {

constexpr size_t kMaxExpected = 4;  // predecessor addresses remembered

}  // namespace

PendingTable::PendingTable(Limits limits) : limits_(limits) {}

std::string PendingTable::AddressKey(const std::string& address) {
  in_addr v4{};
  if (inet_pton(AF_INET, address.c_str(), &v4) == 1) return address;
  in6_addr v6{};
  if (inet_pton(AF_INET6, address.c_str(), &v6) != 1) return address;
  char text[INET6_ADDRSTRLEN] = {0};
  if (IN6_IS_ADDR_V4MAPPED(&v6)) {
    std::memcpy(&v4, v6.s6_addr + 12, 4);
    inet_ntop(AF_INET, &v4, text, sizeof(text));
    return text;
  }
  // One host usually holds a whole /64: count it as one address.
  std::memset(v6.s6_addr + 8, 0, 8);
  inet_ntop(AF_INET6, &v6, text, sizeof(text));
  return fmt::format("{}/64", text);
}

bool PendingTable::IsExpected(const std::string& key) const {
  return std::find(expected_.begin(), expected_.end(), key) != expected_.end();
}

void PendingTable::Expect(const std::string& address) {
  const std::string key = AddressKey(address);
  std::erase(expected_, key);
  expected_.push_back(key);
  while (expected_.size() > kMaxExpected) expected_.pop_front();
}

PendingTable::Admission PendingTable::Admit(const std::string& address, Clock::time_point now) {
  Admission a;
  const std::string key = AddressKey(address);
  const bool expected = IsExpected(key);
  auto evict = [&](uint64_t id) {
    a.evicted.push_back(id);
    Remove(id);
  };
  const auto own = per_key_.find(key);
  if (own != per_key_.end() && own->second >= limits_.per_address) {
    if (!expected) {
      a.refusal = fmt::format("too many connections in their handshake from {} ({})", address,
                              own->second);
      return a;
    }
    // The predecessor's newest connection is the one that matters.
    for (const auto& [id, e] : entries_) {
      if (e.key == key) {
        evict(id);
        break;
      }
    }
  }
  const size_t capacity =
      static_cast<size_t>(expected ? limits_.slots : limits_.slots - limits_.reserved);
  if (entries_.size() >= capacity) {
    // Room comes from the address holding the most slots (the newcomer's own included), oldest
    // connection first; expected addresses are never evicted for others.
    std::map<std::string, std::pair<int, uint64_t>> unexpected;  // key -> count, oldest id
    for (const auto& [id, e] : entries_) {
      if (e.expected) continue;
      auto [it, inserted] = unexpected.try_emplace(e.key, 0, id);
      ++it->second.first;
    }
    const std::pair<int, uint64_t>* victim = nullptr;
    for (const auto& [k, v] : unexpected) {
      if (victim == nullptr || v.first > victim->first ||
          (v.first == victim->first && v.second < victim->second)) {
        victim = &v;
      }
    }
    if (victim == nullptr) {
      a.refusal = fmt::format("too many connections in their handshake ({})", entries_.size());
      return a;
    }
    evict(victim->second);
  }
  a.admitted = true;
  a.id = next_id_++;
  entries_.emplace(a.id, Entry{key, now, expected});
  ++per_key_[key];
  return a;
}

void PendingTable::Remove(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  auto k = per_key_.find(it->second.key);
  if (k != per_key_.end() && --k->second <= 0) per_key_.erase(k);
  entries_.erase(it);
}

std::vector<uint64_t> PendingTable::Expired(Clock::time_point now) const {
  std::vector<uint64_t> out;
  const bool pressure = under_pressure();
  for (const auto& [id, e] : entries_) {
    const auto limit = pressure && !e.expected ? limits_.pressure_deadline : limits_.deadline;
    if (now - e.start >= limit) out.push_back(id);
  }
  return out;
}

}  // namespace kvasir::ring
