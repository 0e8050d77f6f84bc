#include "worker/context_store.h"

#include <utility>

#include "common/clock.h"
#include "worker/worker_client.h"

namespace onlineps::worker {
namespace {

int64_t MonotonicNowMs() { return static_cast<int64_t>(NowMs()); }

// The start of the last `max_bytes` bytes of `s`, moved forward to a UTF-8 character
// boundary so a cut never leaves half a character for the tokenizer.
size_t TailStart(const std::string& s, size_t max_bytes) {
  size_t start = s.size() - max_bytes;
  while (start < s.size() && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) ++start;
  return start;
}

}  // namespace

ContextStore::ContextStore(ContextStoreOptions options)
    : ContextStore(std::move(options), MonotonicNowMs) {}

ContextStore::ContextStore(ContextStoreOptions options, std::function<int64_t()> now)
    : options_(std::move(options)), now_(std::move(now)), sessions_(options_.max_sessions) {}

Status ContextStore::CheckSession(const std::string& session) const {
  if (session.empty()) return InvalidArgument("session id is empty");
  if (session.size() > options_.max_session_id_bytes) {
    return InvalidArgument("session id is " + std::to_string(session.size()) +
                           " bytes, over the limit max_session_id_bytes = " +
                           std::to_string(options_.max_session_id_bytes));
  }
  return Status::Ok();
}

void ContextStore::Trim(SessionContext* c) {
  auto& items = c->items;
  size_t bytes = 0;
  for (const auto& s : items) bytes += s.size();
  while (!items.empty() && (items.size() > options_.max_items || bytes > options_.max_bytes)) {
    if (items.size() > 1 || options_.max_bytes == 0) {
      bytes -= items.front().size();
      items.pop_front();
      ++stats_.items_dropped;
      continue;
    }
    // One item alone over the byte bound: its newest text is what matters.
    std::string& only = items.front();
    only.erase(0, TailStart(only, options_.max_bytes));
    bytes = only.size();
  }
}

SessionContext* ContextStore::FindLive(const std::string& session, int64_t now) {
  // ttl_ms <= 0 disables expiry: a zero TTL would make every context vanish at once.
  if (options_.ttl_ms <= 0) return sessions_.Find(session);
  auto idle = [&](const std::string&, const SessionContext& c) {
    return now - c.updated_ms > options_.ttl_ms;
  };
  // Every use moves a session to the front and stamps it, so the idle ones form the
  // tail: sweeping it costs O(expired), cheap enough for every read.
  stats_.expired += sessions_.EvictWhile(idle);
  SessionContext* c = sessions_.Find(session);
  if (c != nullptr && idle(session, *c)) {  // an injected clock that stepped back
    sessions_.Erase(session);
    ++stats_.expired;
    return nullptr;
  }
  return c;
}

Status ContextStore::Set(const std::string& session, std::vector<std::string> items,
                         std::vector<float> features, uint64_t revision) {
  ONLINEPS_RETURN_IF_ERROR(CheckSession(session));
  if (features.size() > options_.max_features) {
    return InvalidArgument(
        "context has " + std::to_string(features.size()) +
        " features, over the limit max_features = " + std::to_string(options_.max_features));
  }
  // Refused here, not by every later pass of the session.
  if (options_.model_features > 0 && !features.empty() &&
      features.size() != options_.model_features) {
    return InvalidArgument("context has " + std::to_string(features.size()) +
                           " features; the model takes " + std::to_string(options_.model_features) +
                           " (its context_dim) or none");
  }
  const int64_t now = now_();
  SessionContext c;
  c.items.assign(std::make_move_iterator(items.begin()), std::make_move_iterator(items.end()));
  c.features = std::move(features);
  c.updated_ms = now;
  c.revision = revision;
  MutexLock lock(&mu_);
  FindLive(session, now);  // sweeps expired sessions before one may be evicted for room
  Trim(&c);
  sessions_.Put(session, std::move(c));
  return Status::Ok();
}

Status ContextStore::Append(const std::string& session, std::string item) {
  ONLINEPS_RETURN_IF_ERROR(CheckSession(session));
  const int64_t now = now_();
  MutexLock lock(&mu_);
  SessionContext* c = FindLive(session, now);
  if (c == nullptr) c = &sessions_.Put(session, SessionContext{});
  c->items.push_back(std::move(item));
  c->updated_ms = now;
  c->revision = 0;  // no longer what the bridge sent
  Trim(c);
  return Status::Ok();
}

bool ContextStore::Clear(const std::string& session) {
  MutexLock lock(&mu_);
  if (FindLive(session, now_()) == nullptr) return false;
  return sessions_.Erase(session);
}

std::optional<SessionContext> ContextStore::Get(const std::string& session) {
  const int64_t now = now_();
  MutexLock lock(&mu_);
  SessionContext* c = FindLive(session, now);
  if (c == nullptr) return std::nullopt;
  c->updated_ms = now;
  return *c;
}

namespace {
ContextInput InputOf(const SessionContext& c) {
  ContextInput in;
  for (size_t i = 0; i < c.items.size(); ++i) {
    if (i > 0) in.text += ' ';
    in.text += c.items[i];
  }
  in.features = c.features;
  return in;
}
}  // namespace

ContextInput ContextStore::Input(const std::string& session) {
  const int64_t now = now_();
  MutexLock lock(&mu_);
  SessionContext* c = FindLive(session, now);
  if (c == nullptr) return ContextInput{};
  c->updated_ms = now;
  return InputOf(*c);
}

StatusOr<ContextInput> ContextStore::InputAt(const std::string& session, uint64_t revision) {
  const int64_t now = now_();
  MutexLock lock(&mu_);
  SessionContext* c = FindLive(session, now);
  if (c == nullptr || c->revision != revision) {
    return FailedPrecondition(
        "this worker " + std::string(kContextNotHeld) + " " + std::to_string(revision) +
        (c == nullptr ? " (it holds none: restarted, or dropped as idle or for room)"
                      : " (it holds revision " + std::to_string(c->revision) + ")"));
  }
  c->updated_ms = now;
  return InputOf(*c);
}

void ContextStore::Expire() {
  const int64_t now = now_();
  MutexLock lock(&mu_);
  if (options_.ttl_ms <= 0) return;
  stats_.expired += sessions_.EvictWhile([&](const std::string&, const SessionContext& c) {
    return now - c.updated_ms > options_.ttl_ms;
  });
}

ContextStoreStats ContextStore::stats() const {
  MutexLock lock(&mu_);
  ContextStoreStats s = stats_;
  s.sessions = sessions_.size();
  s.evicted_lru = sessions_.evictions();
  return s;
}

}  // namespace onlineps::worker
