// ContextStore: the authoritative copy of every session's context (text items and
// feature values), held by the bridge and sent to the worker that owns the session.
// Bounded: at most max_sessions sessions, each dropped after ttl_ms without use, each
// with at most max_items items, max_bytes of text and max_features features. A call
// past a limit fails with an error naming the limit and changes nothing, except that
// Append keeps a rolling window (it drops the oldest items and says how many).
// With Persist, every change is in the state directory before it returns, so contexts
// survive a bridge restart. A context is known by the hash of its session key
// (StateDir::HashOf), in memory as on disk: the store holds no session key, and a context
// loaded from the directory is found when a call brings its key. Thread-safe.
#ifndef ONLINEPS_MCP_BRIDGE_CONTEXT_STORE_H_
#define ONLINEPS_MCP_BRIDGE_CONTEXT_STORE_H_

#include <array>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "mcp_bridge/state_dir.h"

namespace onlineps::bridge {

struct ContextStoreOptions {
  size_t max_sessions = 10000;
  // Contexts one identity holds (SessionTable::IdentityOf of the session key); keys
  // without one are not counted. 0: no limit.
  size_t max_per_identity = 0;
  int64_t ttl_ms = 30 * 60 * 1000;  // <= 0: never expire
  size_t max_items = 16;            // the worker keeps 16 by default too
  size_t max_bytes = 16 * 1024;
  size_t max_features = 4096;
};

struct Context {
  std::vector<std::string> items;  // oldest first
  std::vector<float> features;
  uint64_t revision = 0;  // bumped by every change; lets the bridge know a worker's copy is current
  std::string owner;      // the identity it counts for ("" none): SessionTable::IdentityOf
  int64_t used_ms = 0;
  int64_t touched_ms = 0;  // when the state directory last learned of a use
};

struct ContextStats {
  size_t sessions = 0;
  uint64_t expired = 0, refused = 0, items_dropped = 0;
  uint64_t save_errors = 0;  // changes refused because the state directory failed
};

class ContextStore {
 public:
  explicit ContextStore(ContextStoreOptions options);
  ContextStore(ContextStoreOptions options, std::function<int64_t()> now_ms);

  // Loads the contexts already in `dir` (dropping, with a warning, those past the limits
  // or unreadable; expired ones silently) and keeps every change there from now on.
  // Returns how many were loaded. Call before serving; `dir` outlives the store.
  size_t Persist(StateDir* dir);

  // Replaces the context. kInvalidArgument naming the limit past one;
  // kResourceExhausted when the store is full of live sessions.
  StatusOr<Context> Set(const std::string& session, std::vector<std::string> items,
                        std::vector<float> features);
  // Adds one item; drops the oldest past max_items / max_bytes (counted in *dropped).
  StatusOr<Context> Append(const std::string& session, std::string item, size_t* dropped);
  bool Clear(const std::string& session);
  std::optional<Context> Get(const std::string& session);

  void Expire();
  ContextStats stats() const;
  const ContextStoreOptions& options() const { return options_; }

 private:
  Status CheckLimits(const std::vector<std::string>& items,
                     const std::vector<float>& features) const;
  // Applies `edit` to the session's context (a fresh one when there is none or it
  // expired), saves it, then publishes it. Calls of one session are serialized.
  StatusOr<Context> Change(const std::string& session, const std::function<void(Context*)>& edit);
  // The live context of the session hashed to `id`, or null when there is none (then
  // checks there is room for one).
  StatusOr<const Context*> Current(const std::string& id, const std::string& owner, int64_t now)
      REQUIRES(mu_);
  void CountOwner(const std::string& owner, int delta) REQUIRES(mu_);
  size_t HeldBy(const std::string& owner) const REQUIRES(mu_);  // contexts counted for owner
  void ExpireLocked(int64_t now) REQUIRES(mu_);
  void Drop(std::unordered_map<std::string, Context>::iterator it) REQUIRES(mu_);
  // Removes the files of contexts dropped from memory (taken from dropped_ under mu_),
  // unless one came back since. Holds no lock when called.
  void RemoveFiles(const std::vector<std::string>& ids);
  Mutex& IoLock(const std::string& id);

  const ContextStoreOptions options_;
  const std::function<int64_t()> now_ms_;
  mutable Mutex mu_;
  std::unordered_map<std::string, Context> contexts_ GUARDED_BY(mu_);  // by key hash
  std::unordered_map<std::string, size_t> per_owner_ GUARDED_BY(mu_);  // counted contexts
  ContextStats stats_ GUARDED_BY(mu_);
  uint64_t next_revision_ GUARDED_BY(mu_) = 1;
  int64_t last_sweep_ms_ GUARDED_BY(mu_) = 0;
  std::vector<std::string> dropped_ GUARDED_BY(mu_);  // files to remove (hashes)
  StateDir* dir_ = nullptr;                           // set before serving
  // Serializes the changes of one session (and its file) without holding mu_ over I/O.
  // Taken before mu_, one at a time.
  std::array<Mutex, 64> io_mu_;
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_CONTEXT_STORE_H_
