#include "mcp_bridge/router.h"

#include <algorithm>
#include <cmath>

#include "common/clock.h"
#include "common/partition.h"

namespace onlineps::bridge {

bool IsNamedHandle(const std::string& key) {
  const size_t slash = key.find('/');  // identities hold none
  return key.compare(slash == std::string::npos ? 0 : slash + 1, 2, "s:") == 0;
}

Router::Router(RouterOptions options)
    : Router(options, [] { return static_cast<int64_t>(NowMs()); }) {}

Router::Router(RouterOptions options, std::function<int64_t()> now_ms)
    : options_(options), now_ms_(std::move(now_ms)) {}

size_t Router::Cap(size_t sessions) const {
  if (loads_.empty()) return 0;
  const double c = std::max(1.0, options_.load_factor);
  const double mean = static_cast<double>(sessions) / static_cast<double>(loads_.size());
  return std::max<size_t>(1, static_cast<size_t>(std::ceil(c * mean - 1e-9)));
}

void Router::RebuildRing() {
  ring_.clear();
  for (const auto& [worker, load] : loads_) {
    for (int i = 0; i < options_.virtual_nodes; ++i) {
      ring_.push_back({HashString(worker + "#" + std::to_string(i)), worker});
    }
  }
  std::sort(ring_.begin(), ring_.end(), [](const Point& a, const Point& b) {
    return a.hash != b.hash ? a.hash < b.hash : a.worker < b.worker;
  });
}

std::string Router::Preferred(uint64_t h) const {
  auto it = std::lower_bound(ring_.begin(), ring_.end(), h,
                             [](const Point& p, uint64_t v) { return p.hash < v; });
  if (it == ring_.end()) it = ring_.begin();
  return it->worker;
}

// Walks the ring clockwise from h to the first worker below `cap`. The walk visits
// every point at most once, so it ends even when all workers are full (then the
// least loaded one takes the session).
std::string Router::Place(const std::string& session, uint64_t h, size_t cap) {
  auto start = std::lower_bound(ring_.begin(), ring_.end(), h,
                                [](const Point& p, uint64_t v) { return p.hash < v; });
  const size_t first = static_cast<size_t>(start - ring_.begin());
  for (size_t i = 0; i < ring_.size(); ++i) {
    const Point& p = ring_[(first + i) % ring_.size()];
    if (loads_[p.worker] < cap) return p.worker;
  }
  return std::min_element(loads_.begin(), loads_.end(),
                          [](const auto& a, const auto& b) { return a.second < b.second; })
      ->first;
}

void Router::Assign(const std::string& session, const std::string& worker) {
  auto [it, inserted] = owner_.try_emplace(session, worker);
  if (inserted && IsNamedHandle(session)) ++handles_;
  if (!inserted) {
    if (it->second == worker) return;
    if (auto old = loads_.find(it->second); old != loads_.end() && old->second > 0) --old->second;
    it->second = worker;
  }
  ++loads_[worker];
}

StatusOr<std::string> Router::Route(const std::string& session) {
  MutexLock lock(&mu_);
  if (auto it = owner_.find(session); it != owner_.end()) {
    used_ms_[session] = now_ms_();
    return it->second;
  }
  if (loads_.empty()) return Unavailable("no healthy worker to route session to");
  if (IsNamedHandle(session)) {
    if (handles_ >= options_.max_handles) {
      return ResourceExhausted(
          "router holds " + std::to_string(handles_) +
          " named session handles, the limit (twice the larger of --max-sessions and "
          "--context-max-sessions); a handle unused for --session-idle-s is released");
    }
  } else if (owner_.size() - handles_ >= options_.max_sessions) {
    return ResourceExhausted("router holds " + std::to_string(owner_.size() - handles_) +
                             " sessions, the limit (--max-sessions)");
  }
  const std::string worker = Place(session, HashString(session), Cap(owner_.size() + 1));
  Assign(session, worker);
  used_ms_[session] = now_ms_();
  return worker;
}

std::string Router::OwnerOf(const std::string& session) const {
  MutexLock lock(&mu_);
  auto it = owner_.find(session);
  return it == owner_.end() ? std::string() : it->second;
}

bool Router::Release(const std::string& session) {
  MutexLock lock(&mu_);
  auto it = owner_.find(session);
  if (it == owner_.end()) {
    used_ms_.erase(session);  // unplaced when the last worker left
    return false;
  }
  if (auto l = loads_.find(it->second); l != loads_.end() && l->second > 0) --l->second;
  owner_.erase(it);
  if (IsNamedHandle(session)) --handles_;
  used_ms_.erase(session);
  return true;
}

std::vector<std::string> Router::ReleaseIdle(std::chrono::milliseconds idle) {
  std::vector<std::string> idle_sessions;
  {
    MutexLock lock(&mu_);
    const int64_t cutoff = now_ms_() - idle.count();
    for (const auto& [s, t] : used_ms_) {
      if (t < cutoff) idle_sessions.push_back(s);
    }
  }
  // Those unplaced when the last worker left too: the caller forgets what it holds for
  // them (Backend::Forget), or keeps it for ever.
  for (const std::string& s : idle_sessions) Release(s);
  return idle_sessions;
}

// Sessions are visited in hash order so the result does not depend on insertion order.
static std::vector<std::pair<uint64_t, std::string>> ByHash(
    const std::unordered_map<std::string, std::string>& owner) {
  std::vector<std::pair<uint64_t, std::string>> v;
  v.reserve(owner.size());
  for (const auto& [s, w] : owner) v.emplace_back(HashString(s), s);
  std::sort(v.begin(), v.end());
  return v;
}

void Router::ShedOverload(const std::string& prefer) {
  const size_t cap = Cap(owner_.size());
  for (const auto& [h, s] : ByHash(owner_)) {
    const std::string w = owner_[s];  // a copy: erased below
    if (loads_[w] <= cap) continue;
    --loads_[w];  // take it out before choosing so it is not placed back
    owner_.erase(s);
    // A joining worker with room takes the overflow, so sessions move only to it.
    const auto p = loads_.find(prefer);
    const std::string dest = p != loads_.end() && p->second < cap ? prefer : Place(s, h, cap);
    owner_[s] = dest;
    ++loads_[dest];
    if (dest != w) ++moves_;
  }
}

bool Router::AddWorker(const std::string& worker) {
  MutexLock lock(&mu_);
  if (!loads_.emplace(worker, 0).second) return false;
  RebuildRing();
  const size_t cap = Cap(owner_.size());
  for (const auto& [h, s] : ByHash(owner_)) {
    if (loads_[worker] >= cap) break;
    if (Preferred(h) != worker) continue;
    Assign(s, worker);
    ++moves_;
  }
  ShedOverload(worker);
  return true;
}

bool Router::RemoveWorker(const std::string& worker) {
  MutexLock lock(&mu_);
  if (loads_.erase(worker) == 0) return false;
  RebuildRing();
  std::vector<std::pair<uint64_t, std::string>> orphans;
  for (const auto& [h, s] : ByHash(owner_)) {
    if (owner_[s] == worker) orphans.emplace_back(h, s);
  }
  for (const auto& [h, s] : orphans) {
    owner_.erase(s);
    if (IsNamedHandle(s)) --handles_;  // Assign counts it again
    if (loads_.empty()) continue;      // the last worker left: its sessions are unplaced
    const std::string dest = Place(s, h, Cap(owner_.size() + 1));
    Assign(s, dest);
    ++moves_;
  }
  return true;
}

std::vector<std::string> Router::Workers() const {
  MutexLock lock(&mu_);
  std::vector<std::string> out;
  for (const auto& [w, load] : loads_) out.push_back(w);
  return out;
}

bool Router::HasWorker(const std::string& worker) const {
  MutexLock lock(&mu_);
  return loads_.count(worker) > 0;
}

RouterStats Router::stats() const {
  MutexLock lock(&mu_);
  RouterStats s;
  s.sessions = owner_.size();
  s.moves = moves_;
  s.loads = loads_;
  return s;
}

}  // namespace onlineps::bridge
