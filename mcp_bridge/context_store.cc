#include "mcp_bridge/context_store.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

#include "common/clock.h"
#include "mcp_bridge/session_table.h"

namespace onlineps::bridge {
namespace {

constexpr char kKind[] = "contexts";

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

Mutex& ContextStore::IoLock(const std::string& id) {
  return io_mu_[std::hash<std::string>{}(id) % io_mu_.size()];
}

size_t ContextStore::Persist(StateDir* dir) {
  // The most recently used first, so that a smaller --context-max-sessions keeps those.
  std::vector<StateDir::Record> records = dir->Load(kKind);
  MutexLock lock(&mu_);
  const int64_t now = now_ms_();
  for (StateDir::Record& r : records) {
    Context c;
    std::string problem;
    try {
      c.items = r.value.at("items").get<std::vector<std::string>>();
      c.features = r.value.at("features").get<std::vector<float>>();
      c.revision = r.value.value("revision", uint64_t{0});
      c.owner = r.value.value("owner", std::string());
    } catch (const nlohmann::json::exception& e) {
      problem = e.what();
    }
    if (problem.empty()) {
      if (Status s = CheckLimits(c.items, c.features); !s.ok()) problem = s.message();
    }
    if (problem.empty() && contexts_.size() >= options_.max_sessions) {
      problem = "the store is full (--context-max-sessions " +
                std::to_string(options_.max_sessions) + ")";
    }
    const bool expired = options_.ttl_ms > 0 && r.age_ms > options_.ttl_ms;
    if (expired || !problem.empty()) {
      if (expired) {
        ++stats_.expired;
      } else {
        spdlog::warn("contexts: dropping the saved context {}: {}", r.hash.substr(0, 12), problem);
      }
      dir->Remove(kKind, r.hash);
      continue;
    }
    c.used_ms = c.touched_ms = now - r.age_ms;
    next_revision_ = std::max(next_revision_, c.revision + 1);
    CountOwner(c.owner, +1);
    contexts_[r.hash] = std::move(c);
  }
  dir_ = dir;
  return contexts_.size();
}

void ContextStore::Drop(std::unordered_map<std::string, Context>::iterator it) {
  if (dir_) dropped_.push_back(it->first);
  CountOwner(it->second.owner, -1);
  contexts_.erase(it);
}

size_t ContextStore::HeldBy(const std::string& owner) const {
  auto it = per_owner_.find(owner);
  return it == per_owner_.end() ? 0 : it->second;
}

void ContextStore::CountOwner(const std::string& owner, int delta) {
  if (owner.empty()) return;
  auto it = per_owner_.try_emplace(owner, 0).first;
  it->second += delta;
  if (it->second == 0) per_owner_.erase(it);
}

void ContextStore::ExpireLocked(int64_t now) {
  if (options_.ttl_ms <= 0) return;
  for (auto it = contexts_.begin(); it != contexts_.end();) {
    auto next = std::next(it);
    if (now - it->second.used_ms > options_.ttl_ms) {
      Drop(it);
      ++stats_.expired;
    }
    it = next;
  }
  last_sweep_ms_ = now;
}

void ContextStore::RemoveFiles(const std::vector<std::string>& ids) {
  for (const std::string& id : ids) {
    // A change of that session in the meantime wrote the file again: keep it.
    MutexLock io(&IoLock(id));
    MutexLock lock(&mu_);
    if (!contexts_.count(id)) dir_->Remove(kKind, id);
  }
}

StatusOr<const Context*> ContextStore::Current(const std::string& id, const std::string& owner,
                                               int64_t now) {
  auto it = contexts_.find(id);
  if (it != contexts_.end()) {
    if (options_.ttl_ms > 0 && now - it->second.used_ms > options_.ttl_ms) {
      ++stats_.expired;  // expired: start afresh (the change rewrites its file)
      return static_cast<const Context*>(nullptr);
    }
    return static_cast<const Context*>(&it->second);
  }
  if (!owner.empty() && options_.max_per_identity != 0 &&
      HeldBy(owner) >= options_.max_per_identity) {
    ExpireLocked(now);
    if (HeldBy(owner) >= options_.max_per_identity) {
      ++stats_.refused;
      return ResourceExhausted(
          "identity '" + owner + "' holds contexts for " + std::to_string(HeldBy(owner)) +
          " sessions, its limit (--max-sessions-per-client); clear_context frees one, or they "
          "expire after --context-ttl-s without use");
    }
  }
  if (contexts_.size() >= options_.max_sessions) ExpireLocked(now);
  if (contexts_.size() >= options_.max_sessions) {
    ++stats_.refused;
    return ResourceExhausted("the bridge holds contexts for " + std::to_string(contexts_.size()) +
                             " sessions, the limit (--context-max-sessions); contexts expire "
                             "after --context-ttl-s without use, or clear_context frees one");
  }
  return static_cast<const Context*>(nullptr);
}

StatusOr<Context> ContextStore::Change(const std::string& session,
                                       const std::function<void(Context*)>& edit) {
  const std::string id = StateDir::HashOf(session);
  const std::string owner = SessionTable::IdentityOf(session);
  std::vector<std::string> dropped;  // by Current making room
  StatusOr<Context> out = [&]() -> StatusOr<Context> {
    MutexLock io(&IoLock(id));
    Context next;
    {
      MutexLock lock(&mu_);
      const int64_t now = now_ms_();
      StatusOr<const Context*> current = Current(id, owner, now);
      dropped.swap(dropped_);
      if (!current.ok()) return current.status();
      if (*current) next = **current;
      next.owner = owner;
      edit(&next);
      next.revision = next_revision_++;
      next.used_ms = next.touched_ms = now;
    }
    if (dir_) {
      Status saved = dir_->Put(kKind, id,
                               {{"items", next.items},
                                {"features", next.features},
                                {"revision", next.revision},
                                {"owner", next.owner}});
      if (!saved.ok()) {
        MutexLock lock(&mu_);
        ++stats_.save_errors;
        return saved;  // nothing changed
      }
    }
    MutexLock lock(&mu_);
    auto [it, inserted] = contexts_.insert_or_assign(id, next);
    if (inserted) CountOwner(next.owner, +1);
    return next;
  }();
  RemoveFiles(dropped);  // the session's I/O lock is released: Remove takes others
  return out;
}

StatusOr<Context> ContextStore::Set(const std::string& session, std::vector<std::string> items,
                                    std::vector<float> features) {
  ONLINEPS_RETURN_IF_ERROR(CheckLimits(items, features));
  return Change(session, [&](Context* c) {
    c->items = std::move(items);
    c->features = std::move(features);
  });
}

StatusOr<Context> ContextStore::Append(const std::string& session, std::string item,
                                       size_t* dropped) {
  *dropped = 0;
  if (item.size() > options_.max_bytes) {
    return InvalidArgument("text is " + std::to_string(item.size()) +
                           " bytes; a context holds at most " + std::to_string(options_.max_bytes) +
                           " (--context-max-bytes)");
  }
  StatusOr<Context> c = Change(session, [&](Context* c) {
    c->items.push_back(std::move(item));
    size_t bytes = TextBytes(c->items);
    size_t drop = 0;
    while (c->items.size() - drop > options_.max_items || bytes > options_.max_bytes) {
      bytes -= c->items[drop].size();
      ++drop;
    }
    c->items.erase(c->items.begin(), c->items.begin() + static_cast<ptrdiff_t>(drop));
    *dropped = drop;
  });
  if (c.ok() && *dropped > 0) {
    MutexLock lock(&mu_);
    stats_.items_dropped += *dropped;
  }
  return c;
}

bool ContextStore::Clear(const std::string& session) {
  const std::string id = StateDir::HashOf(session);
  MutexLock io(&IoLock(id));
  bool had = false;
  {
    MutexLock lock(&mu_);
    if (auto it = contexts_.find(id); it != contexts_.end()) {
      CountOwner(it->second.owner, -1);
      contexts_.erase(it);
      had = true;
    }
  }
  if (dir_ && had) dir_->Remove(kKind, id);
  return had;
}

std::optional<Context> ContextStore::Get(const std::string& session) {
  const std::string id = StateDir::HashOf(session);
  std::optional<Context> out;
  bool touch = false;
  std::vector<std::string> dropped;
  {
    MutexLock lock(&mu_);
    const int64_t now = now_ms_();
    if (options_.ttl_ms > 0 && now - last_sweep_ms_ > options_.ttl_ms / 4) ExpireLocked(now);
    auto it = contexts_.find(id);
    if (it != contexts_.end() && options_.ttl_ms > 0 &&
        now - it->second.used_ms > options_.ttl_ms) {
      Drop(it);
      ++stats_.expired;
    } else if (it != contexts_.end()) {
      it->second.used_ms = now;
      // The file's time is its last use: move it now and then, not on every read.
      touch = dir_ && options_.ttl_ms > 0 && now - it->second.touched_ms > options_.ttl_ms / 8;
      if (touch) it->second.touched_ms = now;
      out = it->second;
    }
    dropped.swap(dropped_);
  }
  if (touch) dir_->Touch(kKind, id);
  RemoveFiles(dropped);
  return out;
}

void ContextStore::Expire() {
  std::vector<std::string> dropped;
  {
    MutexLock lock(&mu_);
    ExpireLocked(now_ms_());
    dropped.swap(dropped_);
  }
  RemoveFiles(dropped);
}

ContextStats ContextStore::stats() const {
  MutexLock lock(&mu_);
  ContextStats s = stats_;
  s.sessions = contexts_.size();
  return s;
}

}  // namespace onlineps::bridge
