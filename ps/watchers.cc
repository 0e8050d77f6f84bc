#include "ps/watchers.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "ps/replica_group.h"

namespace onlineps::ps {
namespace {

constexpr char kWaitKey[] = "wait_ms";
constexpr char kTablePrefix[] = "t.";
constexpr char kKeysPrefix[] = "k.";
constexpr char kIncarnationKey[] = "inc";
// A watch names at most this many tables, or as many as the shard holds when it holds
// more (a worker names every table it holds of the shard in one watch).
constexpr size_t kMaxTablesPerWatch = 1024;
constexpr size_t kMaxTableNameBytes = 128;  // as TableSpec's names

StatusOr<uint64_t> ParseU64(const std::string& what, const std::string& s) {
  const std::optional<uint64_t> v = ParseSpecU64(s);
  if (!v) return InvalidArgument("watch: " + what + " '" + s + "' is not an unsigned integer");
  return *v;
}

// The version from which on every push's keys are remembered when recording starts now.
// An accumulating table's next version also applies pushes queued before, unrecorded.
uint64_t RecordedSince(const Table& t) { return t.version() + (t.spec().accumulate > 1 ? 1 : 0); }

}  // namespace

Watchers::Watchers(WatchersOptions options, TablesFn tables, ReplyFn reply)
    : options_(options),
      tables_(std::move(tables)),
      reply_(std::move(reply)),
      incarnation_(IncarnationHex(NewIncarnation())) {}

Watchers::ChangeLog* Watchers::LogOf(const std::string& table) {
  MutexLock lock(&logs_mu_);
  auto& log = logs_[table];
  if (!log) log = std::make_unique<ChangeLog>();
  return log.get();
}

Status Watchers::Watch(const std::string& peer, const Header& req, uint64_t now_ms) {
  Held w;
  w.peer = peer;
  w.req = req;
  uint64_t wait_ms = 1000;
  for (const auto& [k, v] : req.spec) {
    if (k == kWaitKey) {
      ONLINEPS_ASSIGN_OR_RETURN(wait_ms, ParseU64("wait_ms", v));
    } else if (k.rfind(kTablePrefix, 0) == 0 && k.size() > 2) {
      if (k.size() - 2 > kMaxTableNameBytes) {
        // No table has such a name, and a held watch keeps the names it was given.
        return InvalidArgument("watch names a table of " + std::to_string(k.size() - 2) +
                               " characters; table names have at most " +
                               std::to_string(kMaxTableNameBytes));
      }
      ONLINEPS_ASSIGN_OR_RETURN(w.known[k.substr(2)], ParseU64("version of " + k.substr(2), v));
    } else {
      return InvalidArgument("watch: unknown spec key '" + k + "' (expected wait_ms, t.<table>)");
    }
  }
  if (w.known.empty()) return InvalidArgument("watch names no table (spec keys t.<table>)");
  w.req.spec.clear();  // parsed into `known`: a held watch keeps its names once
  const std::shared_ptr<const TableMap> tables = tables_();
  const size_t most = std::max(kMaxTablesPerWatch, tables->size());
  if (w.known.size() > most) {
    return InvalidArgument("watch names " + std::to_string(w.known.size()) + " tables; at most " +
                           std::to_string(most) + " (1,024, or the " +
                           std::to_string(tables->size()) + " tables this shard holds)");
  }
  w.deadline_ms = now_ms + std::min(wait_ms, options_.max_wait_ms);
  // From now on the keys of pushes to the named sparse tables are remembered.
  for (const auto& [name, version] : w.known) {
    auto it = tables->find(name);
    if (it == tables->end() || it->second->spec().kind != TableKind::kSparse) continue;
    ChangeLog* log = LogOf(name);
    {
      MutexLock lock(&log->mu);
      if (log->active) continue;  // the common case: no need to stop the pushes
    }
    WriterLock gate(&log->gate);  // no push between the version read and recording
    MutexLock lock(&log->mu);
    if (!log->active) {
      log->active = true;
      log->since = RecordedSince(*it->second);
    }
  }
  {
    MutexLock lock(&mu_);
    if (stopped_) return Unavailable("shard is stopping");
    if (!Differs(w, *tables)) {
      if (held_.size() >= options_.max_watches) {
        return ResourceExhausted("this shard holds " + std::to_string(held_.size()) +
                                 " watches already; poll by age instead");
      }
      // Held watches name at most as many tables in all as max_watches of 1,024 each:
      // watches of more tables each leave room for fewer of them.
      const size_t most_names = options_.max_watches * kMaxTablesPerWatch;
      if (held_names_ + w.known.size() > most_names) {
        return ResourceExhausted("the watches this shard holds name " +
                                 std::to_string(held_names_) + " tables in all; this one's " +
                                 std::to_string(w.known.size()) + " would pass " +
                                 std::to_string(most_names) + "; poll by age instead");
      }
      held_names_ += w.known.size();
      held_.push_back(std::move(w));
      num_held_.store(held_.size());
      return Status::Ok();
    }
  }
  Answer(w);
  return Status::Ok();
}

bool Watchers::Differs(const Held& w, const TableMap& tables) const {
  for (const auto& [name, version] : w.known) {
    auto it = tables.find(name);
    const uint64_t now = it == tables.end() ? 0 : it->second->version();
    if (now != version) return true;
  }
  return false;
}

void Watchers::Answer(const Held& w) {
  Header reply = MakeReply(w.req, Status::Ok());
  reply.spec[kIncarnationKey] = incarnation_;
  Frames keys_frames;
  const std::shared_ptr<const TableMap> tables = tables_();
  for (const auto& [name, known] : w.known) {
    auto it = tables->find(name);
    if (it == tables->end()) {
      reply.spec[kTablePrefix + name] = "0";
      continue;
    }
    const Table& t = *it->second;
    if (t.spec().kind != TableKind::kSparse) {
      reply.spec[kTablePrefix + name] = std::to_string(t.version());
      continue;
    }
    ChangeLog* log = LogOf(name);
    WriterLock gate(&log->gate);  // no push between its version and its keys
    MutexLock lock(&log->mu);
    const uint64_t v = t.version();
    reply.spec[kTablePrefix + name] = std::to_string(v);
    if (v == known) continue;
    if (!log->active || v < known || known < log->since) {
      reply.spec[kKeysPrefix + name] = "all";
      continue;
    }
    std::vector<uint64_t> keys;
    for (const ChangeLog::Entry& e : log->entries) {
      if (e.to <= known) continue;
      keys.insert(keys.end(), e.keys.begin(), e.keys.end());
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    reply.spec[kKeysPrefix + name] = std::to_string(1 + keys_frames.size());
    keys_frames.push_back(Frame::FromVector(std::move(keys)));
  }
  reply_(w.peer, reply, std::move(keys_frames));
}

StatusOr<PushResult> Watchers::ApplySparse(const std::string& table, const uint64_t* keys, size_t n,
                                           const std::function<StatusOr<PushResult>()>& apply) {
  ChangeLog* log = LogOf(table);
  ReaderLock gate(&log->gate);
  StatusOr<PushResult> res = apply();
  if (!res.ok() || res->would_block) return res;  // nothing applied
  MutexLock lock(&log->mu);
  if (!log->active) return res;
  // A queued (accumulated) push becomes visible with the next version.
  const uint64_t to = res->queued ? res->version + 1 : res->version;
  // The rows the push evicted changed too (they read as new rows now).
  std::vector<uint64_t> changed(keys, keys + n);
  changed.insert(changed.end(), res->evicted.begin(), res->evicted.end());
  if (changed.size() > options_.max_logged_keys) {
    log->entries.clear();
    log->keys = 0;
    log->since = std::max(log->since, to);
    return res;
  }
  log->keys += changed.size();
  log->entries.push_back({to, std::move(changed)});
  while (log->keys > options_.max_logged_keys) {
    log->since = std::max(log->since, log->entries.front().to);
    log->keys -= log->entries.front().keys.size();
    log->entries.pop_front();
  }
  return res;
}

void Watchers::Changed(const std::string& table, std::string_view pusher) {
  if (num_held_.load() == 0) return;
  const std::shared_ptr<const TableMap> tables = tables_();
  auto it = tables->find(table);
  if (it == tables->end()) return;
  const uint64_t version = it->second->version();
  AnswerHeld([&](const Held& w) {
    auto k = w.known.find(table);
    return k != w.known.end() && k->second != version && w.peer != pusher;
  });
}

void Watchers::Expire(uint64_t now_ms) {
  if (num_held_.load() == 0) return;
  AnswerHeld([&](const Held& w) { return w.deadline_ms <= now_ms; });
}

void Watchers::AnswerHeld(const std::function<bool(const Held&)>& due) {
  std::vector<Held> ready;
  {
    MutexLock lock(&mu_);
    for (size_t i = 0; i < held_.size();) {
      if (due(held_[i])) {
        held_names_ -= held_[i].known.size();
        ready.push_back(std::move(held_[i]));
        held_[i] = std::move(held_.back());
        held_.pop_back();
      } else {
        ++i;
      }
    }
    num_held_.store(held_.size());
  }
  for (const Held& w : ready) Answer(w);
}

void Watchers::Reset() {
  const std::shared_ptr<const TableMap> tables = tables_();
  {
    MutexLock lock(&logs_mu_);
    for (auto& [name, log] : logs_) {
      auto it = tables->find(name);
      WriterLock gate(&log->gate);
      MutexLock l(&log->mu);
      log->entries.clear();
      log->keys = 0;
      log->since = it == tables->end() ? 0 : RecordedSince(*it->second);
    }
  }
  Expire(std::numeric_limits<uint64_t>::max());
}

void Watchers::Stop() {
  {
    MutexLock lock(&mu_);
    stopped_ = true;
  }
  Expire(std::numeric_limits<uint64_t>::max());
}

size_t Watchers::held() const { return num_held_.load(); }

}  // namespace onlineps::ps
