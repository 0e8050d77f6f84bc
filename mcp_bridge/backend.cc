#include "mcp_bridge/backend.h"

#include <spdlog/spdlog.h>

namespace onlineps::bridge {

using nlohmann::json;

Backend::Backend(BackendOptions options, Router* router, WorkerPool* pool, ContextStore* contexts)
    : options_(options), router_(router), pool_(pool), contexts_(contexts) {}

std::chrono::milliseconds Backend::TimeoutOf(Op op) const {
  return op == Op::kLearn ? options_.learn_timeout : options_.infer_timeout;
}

Status Backend::EnsureContext(const std::string& session, const std::string& worker) {
  std::optional<Context> ctx = contexts_->Get(session);
  const uint64_t incarnation = pool_->Incarnation(worker);
  const auto now = std::chrono::steady_clock::now();
  {
    MutexLock lock(&mu_);
    auto it = copies_.find(session);
    if (!ctx && it == copies_.end()) return Status::Ok();  // nothing here, nothing there
    if (ctx && it != copies_.end() && it->second.worker == worker &&
        it->second.incarnation == incarnation && it->second.revision == ctx->revision &&
        now - it->second.at < options_.context_resync) {
      return Status::Ok();
    }
  }
  json body = {{"session", session}};
  Op op = Op::kContextClear;
  if (ctx) {
    op = Op::kContextSet;
    body["items"] = ctx->items;
    body["features"] = ctx->features;
  }
  auto r = pool_->Call(worker, op, body, options_.infer_timeout);
  if (!r.ok()) {
    // Nothing of the call itself was sent: say so with a code that means "not done".
    return Unavailable("sending the session's context to " + worker + " failed (" +
                       r.status().ToString() + "); the call was not sent");
  }
  MutexLock lock(&mu_);
  if (ctx) {
    copies_[session] = Copy{worker, incarnation, ctx->revision, now};
  } else {
    copies_.erase(session);
  }
  return Status::Ok();
}

std::string Backend::AnyWorker() {
  const std::vector<std::string> workers = router_->Workers();
  if (workers.empty()) return "";
  return workers[next_any_.fetch_add(1, std::memory_order_relaxed) % workers.size()];
}

StatusOr<Routed> Backend::Attempt(const std::string& session, Op op, const json& body) {
  std::string worker;
  if (session.empty()) {
    worker = AnyWorker();
    if (worker.empty()) return Unavailable("no healthy worker");
  } else {
    ONLINEPS_ASSIGN_OR_RETURN(worker, router_->Route(session));
  }
  Status s = session.empty() ? Status::Ok() : EnsureContext(session, worker);
  StatusOr<json> reply = s.ok() ? pool_->Call(worker, op, body, TimeoutOf(op)) : StatusOr<json>(s);
  if (!reply.ok()) {
    const StatusCode c = reply.status().code();
    if (c == StatusCode::kDeadlineExceeded || c == StatusCode::kUnavailable) {
      pool_->ReportFailure(worker);
    }
    return reply.status().WithContext("worker " + worker);
  }
  return Routed{std::move(*reply), worker, 1};
}

StatusOr<Routed> Backend::Call(const std::string& session, Op op, json body) {
  if (!session.empty()) body["session"] = session;
  StatusOr<Routed> r = Attempt(session, op, body);
  if (r.ok() || op == Op::kLearn) return r;
  const StatusCode c = r.status().code();
  if (c != StatusCode::kDeadlineExceeded && c != StatusCode::kUnavailable) return r;
  spdlog::info("backend: {} for a session failed ({}); retrying once", OpName(op),
               r.status().ToString());
  StatusOr<Routed> again = Attempt(session, op, body);
  if (again.ok()) again->attempts = 2;
  return again;
}

Status Backend::SyncContext(const std::string& session) {
  const std::string worker = router_->OwnerOf(session);
  if (worker.empty()) return Status::Ok();  // sent when the session lands on a worker
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

void Backend::EndSession(const std::string& session) {
  const std::string worker = router_->OwnerOf(session);
  bool had_copy = false;
  {
    MutexLock lock(&mu_);
    had_copy = copies_.erase(session) > 0;
  }
  if (had_copy && !worker.empty()) {
    auto r = pool_->Call(worker, Op::kContextClear, {{"session", session}}, options_.infer_timeout);
    if (!r.ok())
      spdlog::debug("backend: clearing an ended session's context: {}", r.status().ToString());
  }
  router_->Release(session);
}

}  // namespace onlineps::bridge
