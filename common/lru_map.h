// LruMap: a bounded map that evicts the least recently used entry when full.
// Used for every per-peer or per-row cache that must stay bounded in a long-running
// process (dedup windows, DC-ASGD backups, admission counters). Not thread-safe:
// the owner locks.
#ifndef ONLINEPS_COMMON_LRU_MAP_H_
#define ONLINEPS_COMMON_LRU_MAP_H_

#include <cstddef>
#include <functional>
#include <list>
#include <unordered_map>
#include <utility>

namespace onlineps {

template <typename K, typename V, typename Hash = std::hash<K>>
class LruMap {
 public:
  explicit LruMap(size_t capacity) : capacity_(capacity == 0 ? 1 : capacity) {}

  size_t size() const { return index_.size(); }
  size_t capacity() const { return capacity_; }
  size_t evictions() const { return evictions_; }

  // Returns the entry and marks it most recently used, or nullptr.
  V* Find(const K& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return nullptr;
    order_.splice(order_.begin(), order_, it->second);
    return &it->second->second;
  }

  // The least recently used entry (the next to be evicted), or nullptr when empty.
  const std::pair<K, V>* Oldest() const { return order_.empty() ? nullptr : &order_.back(); }

  // Inserts or replaces; evicts the least recently used entry when full.
  V& Put(const K& key, V value) {
    if (V* v = Find(key)) {
      *v = std::move(value);
      return *v;
    }
    if (index_.size() >= capacity_) EvictOldest();
    order_.emplace_front(key, std::move(value));
    index_.emplace(key, order_.begin());
    return order_.front().second;
  }

  bool Erase(const K& key) {
    auto it = index_.find(key);
    if (it == index_.end()) return false;
    order_.erase(it->second);
    index_.erase(it);
    return true;
  }

  // Removes entries, oldest first, while pred(key, value) is true; stops at the first
  // entry for which it is false (entries are in recency order).
  template <typename Pred>
  size_t EvictWhile(Pred pred) {
    size_t n = 0;
    while (!order_.empty() && pred(order_.back().first, order_.back().second)) {
      index_.erase(order_.back().first);
      order_.pop_back();
      ++n;
    }
    return n;
  }

  // Visits entries from most to least recently used.
  template <typename Fn>
  void ForEach(Fn fn) const {
    for (const auto& kv : order_) fn(kv.first, kv.second);
  }

  void Clear() {
    order_.clear();
    index_.clear();
  }

 private:
  void EvictOldest() {
    index_.erase(order_.back().first);
    order_.pop_back();
    ++evictions_;
  }

  size_t capacity_;
  size_t evictions_ = 0;
  std::list<std::pair<K, V>> order_;
  std::unordered_map<K, typename std::list<std::pair<K, V>>::iterator, Hash> index_;
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_LRU_MAP_H_
