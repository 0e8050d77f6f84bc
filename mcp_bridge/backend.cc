#include "mcp_bridge/backend.h"

#include <spdlog/spdlog.h>

#include <optional>

#include "common/await.h"

namespace onlineps::bridge {

using nlohmann::json;

namespace {
size_t TextBytes(const std::vector<std::string>& items) {
  size_t n = 0;
  for (const std::string& s : items) n += s.size();
  return n;
}
}  // namespace

Backend::Backend(BackendOptions options, Router* router, WorkerPool* pool, ContextStore* contexts)
    : options_(options), router_(router), pool_(pool), contexts_(contexts) {}

std::chrono::milliseconds Backend::TimeoutOf(Op op) const {
  return op == Op::kLearn ? options_.learn_timeout : options_.infer_timeout;
}

Status Backend::EnsureContext(const std::string& session, const std::string& worker) {
  return Await<Status>([&](std::function<void(Status)> then) {
    EnsureContextAsync(session, worker, [then](Status s, bool) { then(std::move(s)); });
  });
}

void Backend::EnsureContextAsync(const std::string& session, const std::string& worker,
                                 std::function<void(Status, bool held)> then) {
  std::optional<Context> ctx = contexts_->Get(session);
  const bool held = ctx.has_value();
  const uint64_t incarnation = pool_->Incarnation(worker);
  const auto now = std::chrono::steady_clock::now();
  bool current = false;
  {
    MutexLock lock(&mu_);
    auto it = copies_.find(session);
    current = (!ctx && it == copies_.end()) ||  // nothing here, nothing there
              (ctx && it != copies_.end() && it->second.worker == worker &&
               it->second.incarnation == incarnation && it->second.revision == ctx->revision &&
               now - it->second.at < options_.context_resync);
  }
  // Outside the lock: `then` sends the call, and its answer (or a refusal) may run the
  // session's next call on this very thread, which comes back here.
  if (current) return then(Status::Ok(), held);
  json body = {{"session", session}};
  Op op = Op::kContextClear;
  if (ctx) {
    op = Op::kContextSet;
    body["items"] = ctx->items;
    body["features"] = ctx->features;
    body["revision"] = ctx->revision;
  }
  const std::optional<uint64_t> revision =
      ctx ? std::optional<uint64_t>(ctx->revision) : std::nullopt;
  const size_t items = ctx ? ctx->items.size() : 0, bytes = ctx ? TextBytes(ctx->items) : 0;
  pool_->CallAsync(
      worker, op, body, options_.infer_timeout,
      [this, session, worker, incarnation, revision, now, then, held, items,
       bytes](StatusOr<json> r) {
        if (revision) {
          // A worker whose own context limits are below the bridge's refuses the context
          // (features) or keeps only its newest part (items, bytes): the call must not
          // run on what the worker kept, and the error names both sides' limits.
          if (Status fits = ContextFits(worker, r, items, bytes); !fits.ok()) {
            return then(InvalidArgument(fits.message() + "; the call was not sent"), held);
          }
        }
        if (!r.ok()) {
          // Nothing of the call itself was sent: say so with a code that means "not done".
          // A worker too busy to take the context (calls in flight at the cap) is not a
          // worker gone: that stays "busy", so nothing probes it or moves its sessions.
          const std::string why = "sending the session's context to " + worker + " failed (" +
                                  r.status().ToString() + "); the call was not sent";
          return then(r.status().code() == StatusCode::kResourceExhausted ? ResourceExhausted(why)
                                                                          : Unavailable(why),
                      held);
        }
        {
          MutexLock lock(&mu_);
          if (revision) {
            copies_[session] = Copy{worker, incarnation, *revision, now};
          } else {
            copies_.erase(session);
          }
        }
        then(Status::Ok(), held);
      });
}

Status Backend::ContextFits(const std::string& worker, const StatusOr<json>& reply, size_t items,
                            size_t bytes) const {
  const ContextStoreOptions& limits = contexts_->options();
  const std::string bridge = "; this bridge's --context-max-items is " +
                             std::to_string(limits.max_items) + ", --context-max-bytes " +
                             std::to_string(limits.max_bytes) + ", --context-max-features " +
                             std::to_string(limits.max_features) +
                             ": lower them to the workers' (or raise the workers' "
                             "--context-max-items and --context-max-bytes)";
  if (!reply.ok()) {
    if (reply.status().code() != StatusCode::kInvalidArgument) return Status::Ok();
    return InvalidArgument("worker " + worker + " refused the session's context (" +
                           reply.status().message() + ")" + bridge);
  }
  // What the worker kept (a worker that does not say is taken at its word).
  const json kept = reply->is_object() ? reply->value("items", json()) : json();
  if (!kept.is_array()) return Status::Ok();
  size_t kept_bytes = 0;
  for (const json& item : kept)
    kept_bytes += item.is_string() ? item.get_ref<const std::string&>().size() : 0;
  if (kept.size() >= items && kept_bytes >= bytes) return Status::Ok();
  return InvalidArgument("worker " + worker + " kept " + std::to_string(kept.size()) + " of the " +
                         std::to_string(items) + " items (" + std::to_string(kept_bytes) + " of " +
                         std::to_string(bytes) +
                         " bytes) of the session's context: its --context-max-items or "
                         "--context-max-bytes is below the context" +
                         bridge);
}

std::string Backend::AnyWorker() {
  const std::vector<std::string> workers = router_->Workers();
  if (workers.empty()) return "";
  return workers[next_any_.fetch_add(1, std::memory_order_relaxed) % workers.size()];
}

void Backend::Attempt(const std::string& session, Op op, std::shared_ptr<const json> body,
                      RoutedDone done, Tried* tried) {
  std::string worker;
  *tried = Tried();
  if (session.empty()) {
    worker = AnyWorker();
    if (worker.empty()) return done(Unavailable("no healthy worker"));
  } else {
    StatusOr<std::string> owner = router_->Route(session);
    if (!owner.ok()) return done(owner.status());
    worker = std::move(*owner);
  }
  *tried = Tried{worker, pool_->Incarnation(worker)};
  // A call that got no reply (or could not be sent) has the worker probed first, so the
  // retry finds the ring without it when it is gone; a worker already out of the ring
  // (its calls were ended when it left) is not probed again. `done` is shared by the
  // paths below.
  auto finish = std::make_shared<RoutedDone>(std::move(done));
  auto failed = [this, worker, finish](const Status& s) {
    const StatusCode c = s.code();
    if ((c != StatusCode::kDeadlineExceeded && c != StatusCode::kUnavailable) ||
        !router_->HasWorker(worker)) {
      return (*finish)(s.WithContext("worker " + worker));
    }
    pool_->ReportFailureAsync(
        worker, [s, worker, finish](bool) { (*finish)(s.WithContext("worker " + worker)); });
  };
  if (session.empty()) {
    return pool_->CallAsync(worker, op, *body, TimeoutOf(op),
                            [worker, finish, failed](StatusOr<json> reply) {
                              if (!reply.ok()) return failed(reply.status());
                              (*finish)(Routed{std::move(*reply), worker, 1});
                            });
  }
  SendWithContext(session, worker, op, std::move(body), finish, failed,
                  /*may_resend_context=*/true);
}

void Backend::SendWithContext(const std::string& session, const std::string& worker, Op op,
                              std::shared_ptr<const json> body, std::shared_ptr<RoutedDone> finish,
                              std::function<void(const Status&)> failed, bool may_resend_context) {
  EnsureContextAsync(session, worker, [=](const Status& context, bool held) {
    if (!context.ok()) return failed(context);
    // The call names the context revision the worker was sent, which it must still hold:
    // a worker that restarted (or dropped the context) since refuses before doing
    // anything, and the context is sent again. The bridge learns of a restart only from
    // its probes, which a worker back within a probe period can slip past.
    const std::optional<uint64_t> revision = SentRevision(session, worker);
    json named;
    bool rewritten = false;
    if (revision) {
      named = *body;
      named["context_revision"] = *revision;
      rewritten = true;
    } else if (!held) {
      // The bridge holds no context for the session: the worker must use none, whatever
      // copy it may still hold that the bridge no longer knows of (the bridge restarted,
      // forgot an idle placement, or the session moved away and back, and the context
      // was cleared meanwhile). Without a session the worker reads no context.
      named = *body;
      named.erase("session");
      rewritten = true;
    }
    pool_->CallAsync(
        worker, op, rewritten ? named : *body, TimeoutOf(op), [=](StatusOr<json> reply) {
          if (!reply.ok() && may_resend_context &&
              reply.status().code() == StatusCode::kFailedPrecondition &&
              reply.status().message().find(::onlineps::worker::kContextNotHeld) !=
                  std::string::npos) {
            spdlog::info(
                "backend: {} no longer holds the context of a session ({}); sending it "
                "again",
                worker, reply.status().message());
            Forget({session});
            return SendWithContext(session, worker, op, body, finish, failed, false);
          }
          if (!reply.ok()) return failed(reply.status());
          (*finish)(Routed{std::move(*reply), worker, 1});
        });
  });
}

std::optional<uint64_t> Backend::SentRevision(const std::string& session,
                                              const std::string& worker) {
  MutexLock lock(&mu_);
  auto it = copies_.find(session);
  if (it == copies_.end() || it->second.worker != worker || it->second.revision == 0) {
    return std::nullopt;
  }
  return it->second.revision;
}

StatusOr<Routed> Backend::Call(const std::string& session, Op op, json body) {
  return Await<StatusOr<Routed>>(
      [&](RoutedDone done) { CallAsync(session, op, std::move(body), std::move(done)); });
}

void Backend::CallAsync(const std::string& session, Op op, json body, RoutedDone done) {
  if (!session.empty()) body["session"] = session;
  auto shared = std::make_shared<const json>(std::move(body));
  auto tried = std::make_shared<Tried>();
  Attempt(
      session, op, shared,
      [this, session, op, shared, tried, done = std::move(done)](StatusOr<Routed> r) mutable {
        // Idempotent ops are retried once on the session's new owner; a learn never is.
        // A call that timed out on a worker still in the ring and still the one it would
        // go to (the probe found the same process answering: it is slow or stuck, not
        // gone) is not sent there again, which would only double the wait. A new process
        // at that address (restarted faster than a probe could take it out of the ring)
        // lost the call: that one is sent again.
        const StatusCode c = r.status().code();
        if (r.ok() || op == Op::kLearn ||
            (c != StatusCode::kDeadlineExceeded && c != StatusCode::kUnavailable)) {
          return done(std::move(r));
        }
        const std::string& worker = tried->worker;
        if (c == StatusCode::kDeadlineExceeded && !worker.empty() && router_->HasWorker(worker) &&
            pool_->Incarnation(worker) == tried->incarnation &&
            (session.empty() ? router_->Workers().size() == 1
                             : router_->OwnerOf(session) == worker)) {
          return done(std::move(r));
        }
        spdlog::info("backend: {} for a session failed ({}); retrying once", OpName(op),
                     r.status().ToString());
        Attempt(
            session, op, shared,
            [tried, done = std::move(done)](StatusOr<Routed> again) {
              if (again.ok()) again->attempts = 2;
              done(std::move(again));
            },
            tried.get());
      },
      tried.get());
}

Status Backend::SyncContext(const std::string& session) {
  std::string worker = router_->OwnerOf(session);
  if (worker.empty()) return Status::Ok();  // sent when the session lands on a worker
  if (!contexts_->Get(session)) {
    // Cleared: dropped where the copy was sent, which is not the owner when the session
    // moved (a worker joined) since.
    const std::string holder = CopyHolder(session);
    if (!holder.empty() && router_->HasWorker(holder)) worker = holder;
  }
  Status s = EnsureContext(session, worker);
  if (!s.ok()) {
    // The bridge's copy is authoritative and already changed: revision 0 matches no
    // context, so the next call re-sends it (or clears the worker's copy).
    MutexLock lock(&mu_);
    Copy& c = copies_[session];
    c.worker = worker;
    c.revision = 0;
  }
  return s;
}

void Backend::Forget(const std::vector<std::string>& sessions) {
  MutexLock lock(&mu_);
  for (const std::string& s : sessions) copies_.erase(s);
}

std::string Backend::CopyHolder(const std::string& session) {
  MutexLock lock(&mu_);
  auto it = copies_.find(session);
  return it == copies_.end() ? std::string() : it->second.worker;
}

void Backend::EndSession(const std::string& session) {
  // The copy is on the worker it was sent to, which is not the owner when the session
  // moved since (a worker joined); one out of the ring is not waited for.
  std::string worker;
  {
    MutexLock lock(&mu_);
    if (auto it = copies_.find(session); it != copies_.end()) {
      worker = it->second.worker;
      copies_.erase(it);
    }
  }
  if (!worker.empty() && router_->HasWorker(worker)) {
    auto r = pool_->Call(worker, Op::kContextClear, {{"session", session}}, options_.infer_timeout);
    if (!r.ok())
      spdlog::debug("backend: clearing an ended session's context: {}", r.status().ToString());
  }
  router_->Release(session);
}

}  // namespace onlineps::bridge
