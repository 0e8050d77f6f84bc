// ContextStore: per-session context on a worker (a copy; the bridge holds the
// authoritative one). Bounded: at most max_sessions sessions (LRU), each dropped after
// ttl_ms without use, each holding at most max_items text items and max_bytes of text.
// The context is input to that session's forward passes only; it is never a parameter
// and never leaves the worker in a push. Thread-safe.
#ifndef ONLINEPS_WORKER_CONTEXT_STORE_H_
#define ONLINEPS_WORKER_CONTEXT_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/lru_map.h"
#include "common/mutex.h"
#include "common/status.h"
#include "worker/model.h"

namespace onlineps::worker {

struct ContextStoreOptions {
  size_t max_sessions = 10000;
  int64_t ttl_ms = 30 * 60 * 1000;  // <= 0: sessions never expire
  size_t max_items = 16;            // text items kept per session (oldest dropped first)
  size_t max_bytes = 16 * 1024;     // text bytes kept per session (oldest dropped first)
  size_t max_features = 4096;       // feature values per session (longer is refused)
  // The model's context feature count (Model::context_features): a context with
  // features must have exactly this many. 0: any count up to max_features.
  size_t model_features = 0;
  size_t max_session_id_bytes = 256;
};

struct SessionContext {
  std::deque<std::string> items;  // oldest first
  std::vector<float> features;
  int64_t updated_ms = 0;
  uint64_t revision = 0;  // the bridge's revision of this context; 0: none given, or appended
};

struct ContextStoreStats {
  size_t sessions = 0;
  uint64_t evicted_lru = 0, expired = 0, items_dropped = 0;
};

class ContextStore {
 public:
  explicit ContextStore(ContextStoreOptions options);
  // As above, reading time (ms, never going backwards) from `now` instead of the
  // monotonic clock: lets tests step through TTLs.
  ContextStore(ContextStoreOptions options, std::function<int64_t()> now);

  // Replaces the session's context. Errors: kInvalidArgument (empty or too long session
  // id, too many features, not the model's count), kTooLarge never: text over the bounds
  // keeps its newest part.
  Status Set(const std::string& session, std::vector<std::string> items,
             std::vector<float> features, uint64_t revision = 0);
  // Appends one text item, dropping the oldest items past the bounds.
  Status Append(const std::string& session, std::string item);
  // Removes the session's context. Returns whether there was one.
  bool Clear(const std::string& session);
  // A copy of the session's context, or nullopt (never set, cleared, evicted, expired).
  std::optional<SessionContext> Get(const std::string& session);
  // The input the session's context adds to a forward pass (empty if none).
  ContextInput Input(const std::string& session);
  // The same, only if the session's context is held at `revision` (Set's, > 0): else
  // kFailedPrecondition whose message holds kContextNotHeld (worker_client.h).
  StatusOr<ContextInput> InputAt(const std::string& session, uint64_t revision);

  // Drops sessions idle past the TTL. Called by reads and periodically by the owner.
  void Expire();
  ContextStoreStats stats() const;
  const ContextStoreOptions& options() const { return options_; }

 private:
  Status CheckSession(const std::string& session) const;
  void Trim(SessionContext* c) REQUIRES(mu_);
  SessionContext* FindLive(const std::string& session, int64_t now) REQUIRES(mu_);

  const ContextStoreOptions options_;
  const std::function<int64_t()> now_;
  mutable Mutex mu_;
  LruMap<std::string, SessionContext> sessions_ GUARDED_BY(mu_);
  ContextStoreStats stats_ GUARDED_BY(mu_);
};

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_CONTEXT_STORE_H_
