#include "mcp_bridge/context_store.h"

#include <cmath>

#include "common/clock.h"

namespace onlineps::bridge {
namespace {

size_t TextBytes(const std::vector<std::string>& items) {
  size_t n = 0;
  for (const auto& s : items) n += s.size();
  return n;
}

}  // namespace

ContextStore::ContextStore(ContextStoreOptions options)
    : ContextStore(options, [] { return static_cast<int64_t>(NowMs()); }) {}

ContextStore::ContextStore(ContextStoreOptions options, std::function<int64_t()> now_ms)
    : options_(options), now_ms_(std::move(now_ms)) {}

Status ContextStore::CheckLimits(const std::vector<std::string>& items,
                                 const std::vector<float>& features) const {
  if (items.size() > options_.max_items) {
    return InvalidArgument("context would hold " + std::to_string(items.size()) +
                           " items; the limit is " + std::to_string(options_.max_items) +
                           " (--context-max-items)");
  }
  if (size_t bytes = TextBytes(items); bytes > options_.max_bytes) {
    return InvalidArgument("context text would be " + std::to_string(bytes) +
                           " bytes; the limit is " + std::to_string(options_.max_bytes) +
                           " (--context-max-bytes)");
  }
  if (features.size() > options_.max_features) {
    return InvalidArgument("context would hold " + std::to_string(features.size()) +
                           " features; the limit is " + std::to_string(options_.max_features) +
                           " (--context-max-features)");
  }
  for (size_t i = 0; i < features.size(); ++i) {
    if (!std::isfinite(features[i])) {
      return InvalidArgument("features[" + std::to_string(i) + "] is not a finite number");
    }
  }
  return Status::Ok();
}

void ContextStore::ExpireLocked(int64_t now) {
  if (options_.ttl_ms <= 0) return;
  for (auto it = contexts_.begin(); it != contexts_.end();) {
    if (now - it->second.used_ms > options_.ttl_ms) {
      it = contexts_.erase(it);
      ++stats_.expired;
    } else {
      ++it;
    }
  }
  last_sweep_ms_ = now;
}

StatusOr<Context*> ContextStore::Slot(const std::string& session, int64_t now) {
  auto it = contexts_.find(session);
  if (it != contexts_.end()) {
    if (options_.ttl_ms > 0 && now - it->second.used_ms > options_.ttl_ms) {
      it->second = Context();  // expired: start afresh in place
      ++stats_.expired;
    }
    return &it->second;
  }
  if (contexts_.size() >= options_.max_sessions) ExpireLocked(now);
  if (contexts_.size() >= options_.max_sessions) {
    ++stats_.refused;
    return ResourceExhausted("the bridge holds contexts for " + std::to_string(contexts_.size()) +
                             " sessions, the limit (--context-max-sessions); contexts expire "
                             "after --context-ttl-s without use, or clear_context frees one");
  }
  return &contexts_[session];
}

StatusOr<Context> ContextStore::Set(const std::string& session, std::vector<std::string> items,
                                    std::vector<float> features) {
  ONLINEPS_RETURN_IF_ERROR(CheckLimits(items, features));
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = now_ms_();
  ONLINEPS_ASSIGN_OR_RETURN(Context * c, Slot(session, now));
  c->items = std::move(items);
  c->features = std::move(features);
  c->revision = next_revision_++;
  c->used_ms = now;
  return *c;
}

StatusOr<Context> ContextStore::Append(const std::string& session, std::string item,
                                       size_t* dropped) {
  *dropped = 0;
  if (item.size() > options_.max_bytes) {
    return InvalidArgument("text is " + std::to_string(item.size()) +
                           " bytes; a context holds at most " + std::to_string(options_.max_bytes) +
                           " (--context-max-bytes)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = now_ms_();
  ONLINEPS_ASSIGN_OR_RETURN(Context * c, Slot(session, now));
  c->items.push_back(std::move(item));
  size_t bytes = TextBytes(c->items);
  size_t drop = 0;
  while (c->items.size() - drop > options_.max_items || bytes > options_.max_bytes) {
    bytes -= c->items[drop].size();
    ++drop;
  }
  c->items.erase(c->items.begin(), c->items.begin() + static_cast<ptrdiff_t>(drop));
  *dropped = drop;
  stats_.items_dropped += drop;
  c->revision = next_revision_++;
  c->used_ms = now;
  return *c;
}

bool ContextStore::Clear(const std::string& session) {
  std::lock_guard<std::mutex> lock(mu_);
  return contexts_.erase(session) > 0;
}

std::optional<Context> ContextStore::Get(const std::string& session) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = now_ms_();
  if (options_.ttl_ms > 0 && now - last_sweep_ms_ > options_.ttl_ms / 4) ExpireLocked(now);
  auto it = contexts_.find(session);
  if (it == contexts_.end()) return std::nullopt;
  if (options_.ttl_ms > 0 && now - it->second.used_ms > options_.ttl_ms) {
    contexts_.erase(it);
    ++stats_.expired;
    return std::nullopt;
  }
  it->second.used_ms = now;
  return it->second;
}

void ContextStore::Expire() {
  std::lock_guard<std::mutex> lock(mu_);
  ExpireLocked(now_ms_());
}

ContextStats ContextStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ContextStats s = stats_;
  s.sessions = contexts_.size();
  return s;
}

}  // namespace onlineps::bridge
