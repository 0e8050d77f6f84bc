// Backend: runs one worker op for one session on the worker that owns it. Places the
// session (Router), makes sure that worker holds the session's current context (the
// bridge's ContextStore is authoritative; a worker's copy is re-sent when the session
// lands on a new worker, the worker restarted, the context changed, or the copy may
// have expired there) and handles failover: a call that gets no reply reports the
// worker to the pool, and idempotent ops (infer, context) are retried once on the
// session's new owner. Thread-safe.
#ifndef ONLINEPS_MCP_BRIDGE_BACKEND_H_
#define ONLINEPS_MCP_BRIDGE_BACKEND_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "common/wire.h"
#include "mcp_bridge/context_store.h"
#include "mcp_bridge/router.h"
#include "mcp_bridge/worker_pool.h"
#include "worker/worker_client.h"

namespace onlineps::bridge {

struct BackendOptions {
  std::chrono::milliseconds infer_timeout{6000};
  std::chrono::milliseconds learn_timeout{30000};
  // A worker's copy of a context older than this is re-sent (the worker drops idle
  // contexts after its --context-ttl-s, 1800 s by default).
  std::chrono::milliseconds context_resync{600000};
};

struct Routed {
  nlohmann::json reply;
  std::string worker;
  int attempts = 1;
};

class Backend {
 public:
  Backend(BackendOptions options, Router* router, WorkerPool* pool, ContextStore* contexts);

  // Runs `op` with `body` (its "session" field is set to `session`; an empty session
  // has no context and goes to any healthy worker). Errors: the
  // worker's, kUnavailable (no healthy worker), kDeadlineExceeded (no reply: for a learn
  // the outcome is unknown, the caller must say so).
  StatusOr<Routed> Call(const std::string& session, Op op, nlohmann::json body);
  // The same without waiting (the context sent, the failure probe and the retry too):
  // `done` gets the outcome once, on a worker client's thread or the caller's. It must
  // not block.
  using RoutedDone = std::function<void(StatusOr<Routed>)>;
  void CallAsync(const std::string& session, Op op, nlohmann::json body, RoutedDone done);
  // The session ended: forgets its placement and drops the worker's copy of its context.
  void EndSession(const std::string& session);
  // Forgets the worker copies of sessions the router released (idle): their next call
  // re-sends the context wherever they land.
  void Forget(const std::vector<std::string>& sessions);
  // The context changed: pushes it to the owner now (if the session is placed).
  Status SyncContext(const std::string& session);

 private:
  struct Copy {
    std::string worker;
    uint64_t incarnation = 0, revision = 0;
    std::chrono::steady_clock::time_point at;
  };
  // The worker a try went to ("" when none) and its incarnation then.
  struct Tried {
    std::string worker;
    uint64_t incarnation = 0;
  };
  // One try on the session's owner (any worker without a session); *tried is set to the
  // worker chosen before `done` can run.
  void Attempt(const std::string& session, Op op, std::shared_ptr<const nlohmann::json> body,
               RoutedDone done, Tried* tried);
  // After the context: sends `op` naming the context revision the worker holds; once
  // more, with the context re-sent, if the worker says it no longer holds it.
  void SendWithContext(const std::string& session, const std::string& worker, Op op,
                       std::shared_ptr<const nlohmann::json> body,
                       std::shared_ptr<RoutedDone> finish,
                       std::function<void(const Status&)> failed, bool may_resend_context);
  // The revision of the session's context last sent to `worker`, if any.
  std::optional<uint64_t> SentRevision(const std::string& session, const std::string& worker);
  // The worker the session's context was last sent to; "" when none.
  std::string CopyHolder(const std::string& session);
  Status EnsureContext(const std::string& session, const std::string& worker);
  // Makes sure `worker` holds the session's current context, then `then(status, held)`:
  // `held`, whether the bridge holds a context for the session at all.
  void EnsureContextAsync(const std::string& session, const std::string& worker,
                          std::function<void(Status, bool held)> then);
  // Whether `worker`, sent a context of `items` items and `bytes` bytes of text (its
  // context_set reply), holds all of it: kInvalidArgument naming the worker's and this
  // bridge's limits when it refused the context or kept only its newest part.
  Status ContextFits(const std::string& worker, const StatusOr<nlohmann::json>& reply, size_t items,
                     size_t bytes) const;
  std::chrono::milliseconds TimeoutOf(Op op) const;
  std::string AnyWorker();  // round robin, for calls without a session

  const BackendOptions options_;
  Router* const router_;
  WorkerPool* const pool_;
  ContextStore* const contexts_;
  std::atomic<uint64_t> next_any_{0};
  Mutex mu_;
  std::unordered_map<std::string, Copy> copies_ GUARDED_BY(mu_);  // bounded by the sessions
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_BACKEND_H_
