// Router: places each session on one worker by consistent hashing with bounded loads
// (Mirrokni, Thorup, Zadimoghaddam 2018): a new session walks the hash ring from its
// hash to the first worker holding fewer than ceil(c * m / n) sessions (m sessions
// including the new one, n workers, c = load_factor). A placed session stays where it
// is until its worker leaves; adding a worker moves to it the sessions whose ring
// position it now owns (about 1/N of them), and whatever keeps another worker above
// the bound. Thread-safe.
#ifndef ONLINEPS_MCP_BRIDGE_ROUTER_H_
#define ONLINEPS_MCP_BRIDGE_ROUTER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"

namespace onlineps::bridge {

struct RouterOptions {
  double load_factor = 1.25;  // c >= 1: no worker above ceil(c * mean) sessions
  int virtual_nodes = 160;    // ring points per worker
  // Placed keys of each kind (IsNamedHandle): MCP sessions, and the named handles that
  // clients choose (a tool's `session` argument), bounded apart so that handles cannot
  // shut new MCP sessions out.
  size_t max_sessions = 100000;
  size_t max_handles = 100000;
};

// Whether a routing key is a named handle ("[identity/]s:NAME", a tool's `session`
// argument) rather than an MCP session ("[identity/]m:ID", SessionTable::KeyOf).
bool IsNamedHandle(const std::string& key);

struct RouterStats {
  size_t sessions = 0;
  uint64_t moves = 0;                   // sessions moved by membership changes, in all
  std::map<std::string, size_t> loads;  // worker -> sessions (every member, even 0)
};

class Router {
 public:
  explicit Router(RouterOptions options);
  // As above, reading time (ms, never going backwards) from `now_ms`: lets tests step
  // through idle expiry.
  Router(RouterOptions options, std::function<int64_t()> now_ms);

  // Membership. Add/Remove return false when nothing changed. Both may move sessions.
  bool AddWorker(const std::string& worker);
  bool RemoveWorker(const std::string& worker);
  std::vector<std::string> Workers() const;
  bool HasWorker(const std::string& worker) const;

  // The worker owning `session`, placing it first if needed. kUnavailable when there
  // is no worker; kResourceExhausted past max_sessions (max_handles for a handle).
  StatusOr<std::string> Route(const std::string& session);
  // The owner without placing; "" when the session is not placed.
  std::string OwnerOf(const std::string& session) const;
  // Forgets a session (it ended or expired). Returns whether it was placed.
  bool Release(const std::string& session);
  // Forgets every session not routed for `idle` (placed, or unplaced when the last
  // worker left); returns them. Keeps the placement map bounded when clients stop using
  // session handles without ending them.
  std::vector<std::string> ReleaseIdle(std::chrono::milliseconds idle);

  RouterStats stats() const;

 private:
  struct Point {
    uint64_t hash;
    std::string worker;
  };
  size_t Cap(size_t sessions) const REQUIRES(mu_);
  std::string Place(const std::string& session, uint64_t h, size_t cap) REQUIRES(mu_);
  std::string Preferred(uint64_t h) const REQUIRES(mu_);
  void RebuildRing() REQUIRES(mu_);
  void Assign(const std::string& session, const std::string& worker) REQUIRES(mu_);
  // Moves sessions off workers above the bound: to `prefer` (a joining worker) while it
  // has room, else along the ring.
  void ShedOverload(const std::string& prefer) REQUIRES(mu_);

  const RouterOptions options_;
  mutable Mutex mu_;
  std::vector<Point> ring_ GUARDED_BY(mu_);  // sorted
  std::map<std::string, size_t> loads_ GUARDED_BY(mu_);
  std::unordered_map<std::string, std::string> owner_ GUARDED_BY(mu_);
  size_t handles_ GUARDED_BY(mu_) = 0;  // the keys of owner_ that are named handles
  std::unordered_map<std::string, int64_t> used_ms_ GUARDED_BY(mu_);  // last Route
  const std::function<int64_t()> now_ms_;
  uint64_t moves_ GUARDED_BY(mu_) = 0;
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_ROUTER_H_
