// A map that remembers at most `capacity` entries: inserting into a full map forgets the entry
// inserted longest ago. For state a peer makes a stage keep (sessions closed and waiting for
// their receipt, receipts sent around), so that it stays bounded whatever the peer does. Not
// thread-safe.
#pragma once

#include <cstddef>
#include <iterator>
#include <list>
#include <map>
#include <optional>
#include <utility>

#include "base/check.h"

namespace kvasir::ring {

template <typename K, typename V>
class RecentMap {
 public:
  explicit RecentMap(size_t capacity) : capacity_(capacity) {
    KV_CHECK(capacity > 0, "RecentMap of capacity 0");
  }

  // Inserts or replaces the value of `key`, which becomes the newest entry.
  void Put(const K& key, V value) {
    if (auto it = index_.find(key); it != index_.end()) {
      order_.erase(it->second);
      index_.erase(it);
    }
    order_.emplace_back(key, std::move(value));
    index_.emplace(key, std::prev(order_.end()));
    if (order_.size() > capacity_) {
      index_.erase(order_.front().first);
      order_.pop_front();
    }
  }

  // Removes `key` and returns its value; nothing when it is not (or no longer) here.
  std::optional<V> Take(const K& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return std::nullopt;
    std::optional<V> value(std::move(it->second->second));
    order_.erase(it->second);
    index_.erase(it);
    return value;
  }

  bool contains(const K& key) const { return index_.count(key) != 0; }
  size_t size() const { return order_.size(); }

 private:
  using Order = std::list<std::pair<K, V>>;
  size_t capacity_;
  Order order_;  // oldest first
  std::map<K, typename Order::iterator> index_;
};

}  // namespace kvasir::ring
