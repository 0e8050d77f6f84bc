#include "worker/param_cache.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <unordered_map>
#include <utility>

#include "common/clock.h"
#include "common/partition.h"

namespace onlineps::worker {
namespace {

constexpr uint64_t kNoRow = std::numeric_limits<uint64_t>::max();
// A shard silent this long past its watch's wait no longer counts as sending notices.
constexpr int64_t kLiveMarginMs = 1000;
// The version a first watch names: never the shard's, so it is answered at once.
constexpr uint64_t kNeverHeard = std::numeric_limits<uint64_t>::max();
// A failed watch is sent again after this long (a shard down, restarting, refusing).
constexpr int64_t kWatchRetryMs = 250;

int64_t Now() { return static_cast<int64_t>(NowMs()); }

ParamCacheStats One(uint64_t ParamCacheStats::*counter) {
  ParamCacheStats d;
  d.*counter = 1;
  return d;
}

ParamCacheStats Times(uint64_t ParamCacheStats::*counter, uint64_t n) {
  ParamCacheStats d;
  d.*counter = n;
  return d;
}

// Raises each shard's newest version seen; extra entries from a peer with a different
// shard count are ignored rather than trusted.
void Raise(ps::VersionVector* newest, const ps::VersionVector& seen) {
  const size_t n = std::min(newest->size(), seen.size());
  for (size_t s = 0; s < n; ++s) (*newest)[s] = std::max((*newest)[s], seen[s]);
}

// The client writes as many floats as the PS spec says, so a table registered here with
// another size would overflow the buffer: checked once per table before its first pull.
// `evicts` (optional) learns whether the shards drop rows by themselves (TTL): that
// changes a row without a push, so no notice tells of it. Rows evicted for max_rows go
// in the notice of the push that evicted them.
Status CheckShape(ps::PsClient* client, const std::string& table, ps::TableKind kind, uint64_t size,
                  std::atomic<bool>* checked, std::atomic<bool>* evicts = nullptr) {
  if (checked->load()) return Status::Ok();
  auto spec = client->OpenTable(table);
  if (!spec.ok()) return spec.status().WithContext("reading the spec");
  const bool dense = kind == ps::TableKind::kDense;
  const uint64_t have = dense ? spec->size() : spec->dim;
  if (spec->kind != kind || have != size) {
    return ShapeMismatch(std::string("registered in the cache as ") +
                         (dense ? "dense of size " : "sparse of dim ") + std::to_string(size) +
                         ", the PS has another kind or shape");
  }
  if (evicts != nullptr) evicts->store(spec->ttl_ms > 0);
  checked->store(true);
  return Status::Ok();
}

}  // namespace

// How long at most the refresher leaves a dense table to the replies of this worker's own
// pushes in flight (ParamCache::BeginOwnPush; a loopback push takes ~1 ms). Reads check
// their own bound meanwhile: only the background refresh waits.
constexpr int64_t kOwnPushHoldMs = 1000;

struct ParamCache::DenseEntry {
  std::string name;
  uint64_t size = 0;
  FreshnessBound bound;
  std::atomic<bool> shape_checked{false};
  std::mutex pull_mu;  // held for a whole pull: concurrent misses wait for one pull
  Mutex mu;            // never held across a pull
  std::shared_ptr<const DenseSnapshot> snapshot GUARDED_BY(mu);
  ps::VersionVector newest GUARDED_BY(mu);   // per shard: from pulls and push replies
  int64_t last_read_ms GUARDED_BY(mu) = -1;  // -1: never read (not hot)
  uint64_t pulls GUARDED_BY(mu) = 0;         // successful pulls: the last snapshot's pull_id
  uint64_t attempts GUARDED_BY(mu) = 0;      // pulls started
  Status last_status GUARDED_BY(mu);         // of the last pull that ended
  uint64_t generation GUARDED_BY(mu) = 0;  // bumped by Invalidate: a pull begun before is not kept
  int64_t stale_since_ms GUARDED_BY(mu) = -1;  // when a newer version was first known; -1: not
  std::unique_ptr<DenseLayout> layout GUARDED_BY(mu);  // the shards' slices: made at first need
  int own_pushes GUARDED_BY(mu) = 0;  // this worker's pushes whose replies bring its values
  int64_t own_push_since_ms GUARDED_BY(mu) = 0;  // when own_pushes last rose from 0
};

struct ParamCache::SparseEntry {
  struct Row {
    std::vector<float> values;
    uint64_t version = 0;
    int64_t fetched_ms = 0;
  };
  explicit SparseEntry(size_t capacity) : rows(capacity) {}
  std::string name;
  uint32_t dim = 0;
  FreshnessBound bound;
  std::atomic<bool> shape_checked{false};
  // The shards evict rows by TTL without a push, hence without a notice: its rows stay
  // under the age bound even while notices flow.
  std::atomic<bool> evicts{false};
  Mutex mu;  // never held across a pull
  LruMap<uint64_t, Row> rows GUARDED_BY(mu);
  ps::VersionVector newest GUARDED_BY(mu);
  // Per shard: the version of the last notice. Every row still cached is current at it
  // (a notice drops the rows it names), so a row read counts as of this version at least:
  // a row nobody pushes for an hour is not an hour stale.
  ps::VersionVector confirmed GUARDED_BY(mu);
  uint64_t generation GUARDED_BY(mu) = 0;
};

// Watch callbacks outlive nothing: they find the cache here, null once it stopped.
struct ParamCache::Alive {
  Mutex mu;
  ParamCache* cache GUARDED_BY(mu) = nullptr;
};

ParamCache::ParamCache(ps::PsClient* client, ParamCacheOptions options)
    : client_(client),
      options_(std::move(options)),
      num_shards_(static_cast<uint32_t>(client->num_shards())),
      live_until_(new std::atomic<int64_t>[num_shards_]),
      alive_(std::make_shared<Alive>()) {
  MutexLock lock(&watch_mu_);  // not shared yet; for the analysis
  watching_.assign(num_shards_, false);
  watch_retry_ms_.assign(num_shards_, 0);
  known_.resize(num_shards_);
  incarnation_.resize(num_shards_);
  for (uint32_t s = 0; s < num_shards_; ++s) live_until_[s].store(0);
}

ParamCache::~ParamCache() { Stop(); }

FreshnessBound ParamCache::BoundOf(const std::string& table, const FreshnessBound& def) const {
  auto it = options_.tables.find(table);
  return it == options_.tables.end() ? def : it->second;
}

void ParamCache::AddDense(const std::string& table, uint64_t size) {
  auto e = std::make_unique<DenseEntry>();
  e->name = table;
  e->size = size;
  e->bound = BoundOf(table, options_.dense);
  {
    MutexLock lock(&e->mu);  // not shared yet; for the analysis
    e->newest.assign(num_shards_, 0);
  }
  dense_.insert_or_assign(table, std::move(e));
  MutexLock lock(&watch_mu_);
  for (auto& known : known_) known[table] = kNeverHeard;
}

void ParamCache::AddSparse(const std::string& table, uint32_t dim) {
  auto e = std::make_unique<SparseEntry>(options_.max_sparse_rows);
  e->name = table;
  e->dim = dim;
  e->bound = BoundOf(table, options_.sparse);
  {
    MutexLock lock(&e->mu);  // not shared yet; for the analysis
    e->newest.assign(num_shards_, 0);
    e->confirmed.assign(num_shards_, 0);
  }
  sparse_.insert_or_assign(table, std::move(e));
  MutexLock lock(&watch_mu_);
  for (auto& known : known_) known[table] = kNeverHeard;
}

void ParamCache::Start() {
  if (options_.refresh_interval_ms <= 0 && !options_.notices) return;
  {
    MutexLock lock(&alive_->mu);
    alive_->cache = this;
  }
  const int64_t interval = options_.refresh_interval_ms > 0 ? options_.refresh_interval_ms : 50;
  refresher_.Start(
      std::chrono::milliseconds(interval), [this] { Tick(); },
      /*tick_first=*/options_.notices);
}

void ParamCache::Stop() {
  {
    // Waits for a watch callback in progress; later ones find no cache.
    MutexLock lock(&alive_->mu);
    alive_->cache = nullptr;
  }
  refresher_.Stop();
}

bool ParamCache::Live(uint32_t shard, int64_t now) const {
  return options_.notices && live_until_[shard].load(std::memory_order_relaxed) > now;
}

bool ParamCache::Fresh(const FreshnessBound& b, int64_t fetched_ms, uint64_t version,
                       uint64_t newest, int64_t now, bool live) const {
  if (!live && b.max_age_ms >= 0 && now - fetched_ms > b.max_age_ms) return false;
  // With notices, a version the shard announced is stale at once unless a looser
  // version bound was asked for.
  const int64_t behind = live && b.max_versions_behind < 0 ? 0 : b.max_versions_behind;
  if (behind >= 0 && newest > version && newest - version > static_cast<uint64_t>(behind)) {
    return false;
  }
  return true;
}

// REQUIRES(e.mu) here: the header cannot name a member of the incomplete DenseEntry.
bool ParamCache::FreshDense(const DenseEntry& e, int64_t now, bool grace) const REQUIRES(e.mu) {
  if (!e.snapshot) return false;
  const DenseSnapshot& s = *e.snapshot;
  const bool in_grace =
      grace && e.stale_since_ms >= 0 && now - e.stale_since_ms < options_.notice_grace_ms;
  // Shards version independently: the copy is only as fresh as its most lagging shard.
  for (uint32_t i = 0; i < num_shards_; ++i) {
    const uint64_t v = i < s.versions.size() ? s.versions[i] : 0;
    const bool live = Live(i, now);
    // With notices only a version can make the copy stale, and the grace applies to it.
    if (!Fresh(e.bound, s.fetched_ms, v, e.newest[i], now, live) && !(live && in_grace)) {
      return false;
    }
  }
  return true;
}

void ParamCache::Adopt(DenseEntry* e, std::shared_ptr<const DenseSnapshot> snap) const
    REQUIRES(e->mu) {
  bool covers = true;
  for (size_t s = 0; s < e->newest.size(); ++s) {
    covers &= s < snap->versions.size() && snap->versions[s] >= e->newest[s];
  }
  // A notice that came during the pull keeps the copy stale since it came.
  if (covers) e->stale_since_ms = -1;
  e->snapshot = std::move(snap);
}

void ParamCache::RaiseDense(DenseEntry* e, size_t shard, uint64_t version, int64_t now) const
    REQUIRES(e->mu) {
  if (shard >= e->newest.size() || version <= e->newest[shard]) return;
  e->newest[shard] = version;
  const bool behind = e->snapshot && (shard >= e->snapshot->versions.size() ||
                                      e->snapshot->versions[shard] < version);
  if (behind && e->stale_since_ms < 0) e->stale_since_ms = now;
}

StatusOr<std::shared_ptr<const DenseSnapshot>> ParamCache::Dense(const std::string& table) {
  auto it = dense_.find(table);
  if (it == dense_.end()) return NotFound("ParamCache: no dense table '" + table + "'");
  DenseEntry* e = it->second.get();
  const int64_t now = Now();
  uint64_t attempts;
  {
    MutexLock lock(&e->mu);
    e->last_read_ms = now;
    if (FreshDense(*e, now, /*grace=*/true)) {
      AddStats(One(&ParamCacheStats::dense_hits));
      return e->snapshot;
    }
    attempts = e->attempts;
  }
  std::lock_guard<std::mutex> pull(e->pull_mu);
  {
    // Judged at this read's arrival time: a pull that finished while this one waited
    // is within the bound for it, so concurrent misses share that one pull.
    MutexLock lock(&e->mu);
    if (FreshDense(*e, now, /*grace=*/true)) {
      AddStats(One(&ParamCacheStats::dense_hits));
      return e->snapshot;
    }
    // They share its failure too: retrying one by one would make the last of n
    // readers of a dead shard wait n timeouts.
    if (e->attempts != attempts && !e->last_status.ok()) return e->last_status;
  }
  auto snap = PullDense(e);
  if (snap.ok()) AddStats(One(&ParamCacheStats::dense_pulls));
  return snap;
}

// A dense pull in flight: started by StartPull, installed by FinishPull.
struct ParamCache::PendingPull {
  DenseEntry* entry = nullptr;
  uint64_t generation = 0;
  std::shared_ptr<DenseSnapshot> snap;
  ps::Ticket ticket;
  Status status;  // set when the pull could not start
};

ParamCache::PendingPull ParamCache::StartPull(DenseEntry* e) {
  PendingPull p;
  p.entry = e;
  {
    MutexLock lock(&e->mu);
    p.generation = e->generation;
    ++e->attempts;
  }
  p.status = CheckShape(client_, e->name, ps::TableKind::kDense, e->size, &e->shape_checked);
  p.snap = std::make_shared<DenseSnapshot>();
  p.snap->values.resize(e->size);
  // Stamped before the request: the values are at least this fresh, never fresher.
  p.snap->fetched_ms = Now();
  if (p.status.ok()) {
    p.ticket = client_->PullDense(e->name, p.snap->values.data(), &p.snap->versions);
  }
  return p;
}

StatusOr<std::shared_ptr<const DenseSnapshot>> ParamCache::FinishPull(PendingPull& p) {
  DenseEntry* e = p.entry;
  Status st = p.status.ok() ? p.ticket.Wait() : p.status;
  MutexLock lock(&e->mu);
  e->last_status = st.WithContext("ParamCache: pull of dense table '" + e->name + "'");
  if (!st.ok()) return e->last_status;
  p.snap->pull_id = ++e->pulls;
  Raise(&e->newest, p.snap->versions);
  if (e->generation == p.generation) Adopt(e, p.snap);
  return std::shared_ptr<const DenseSnapshot>(p.snap);
}

StatusOr<std::shared_ptr<const DenseSnapshot>> ParamCache::PullDense(DenseEntry* e) {
  PendingPull p = StartPull(e);
  return FinishPull(p);
}

StatusOr<std::vector<std::shared_ptr<const DenseSnapshot>>> ParamCache::DenseAll(
    const std::vector<std::string>& tables) {
  std::vector<DenseEntry*> entries;
  for (const std::string& t : tables) {
    auto it = dense_.find(t);
    if (it == dense_.end()) return NotFound("ParamCache: no dense table '" + t + "'");
    entries.push_back(it->second.get());
  }
  const int64_t now = Now();
  std::vector<std::shared_ptr<const DenseSnapshot>> out(entries.size());
  std::vector<size_t> stale;
  for (size_t i = 0; i < entries.size(); ++i) {
    MutexLock lock(&entries[i]->mu);
    entries[i]->last_read_ms = now;
    if (FreshDense(*entries[i], now, /*grace=*/true)) {
      out[i] = entries[i]->snapshot;
    } else {
      stale.push_back(i);
    }
  }
  AddStats(Times(&ParamCacheStats::dense_hits, entries.size() - stale.size()));
  if (stale.empty()) return out;
  // Pull locks in the callers' table order (every caller passes the model's order), so
  // two DenseAll calls never wait on each other in a cycle.
  std::vector<std::unique_lock<std::mutex>> held;
  std::vector<PendingPull> pulls;
  for (size_t i : stale) {
    held.emplace_back(entries[i]->pull_mu);
    {
      MutexLock lock(&entries[i]->mu);
      if (FreshDense(*entries[i], now, /*grace=*/true)) {
        out[i] = entries[i]->snapshot;  // a concurrent reader's pull served this one
        continue;
      }
    }
    pulls.push_back(StartPull(entries[i]));  // all in flight at once: one round trip
  }
  Status first;
  size_t pulled = 0;
  for (PendingPull& p : pulls) {
    auto snap = FinishPull(p);
    if (!snap.ok()) {
      if (first.ok()) first = snap.status();
      continue;
    }
    ++pulled;
    const size_t i = std::find(entries.begin(), entries.end(), p.entry) - entries.begin();
    out[i] = std::move(*snap);
  }
  AddStats(Times(&ParamCacheStats::dense_pulls, pulled));
  ONLINEPS_RETURN_IF_ERROR(first);
  return out;
}

Status ParamCache::Sparse(const std::string& table, const uint64_t* keys, size_t n, float* out,
                          ps::VersionVector* base, ps::VersionVector* read) {
  auto it = sparse_.find(table);
  if (it == sparse_.end()) return NotFound("ParamCache: no sparse table '" + table + "'");
  SparseEntry* e = it->second.get();
  const int64_t now = Now();
  const size_t dim = e->dim;
  ps::VersionVector mins(num_shards_, kNoRow);
  std::vector<size_t> missing;
  ParamCacheStats delta;
  std::vector<char> live(num_shards_);
  for (uint32_t s = 0; s < num_shards_; ++s) live[s] = Live(s, now) && !e->evicts.load();
  {
    MutexLock lock(&e->mu);
    for (size_t i = 0; i < n; ++i) {
      const uint32_t shard = ShardOfKey(keys[i], num_shards_);
      const SparseEntry::Row* r = e->rows.Find(keys[i]);
      // With notices a row is dropped when a push changes it: the shard's version, which
      // every push to any of its rows raises, says nothing about this one.
      const bool fresh =
          r != nullptr &&
          (live[shard] ? e->bound.max_versions_behind < 0 ||
                             Fresh(e->bound, r->fetched_ms, r->version, e->newest[shard], now, true)
                       : Fresh(e->bound, r->fetched_ms, r->version, e->newest[shard], now, false));
      if (!fresh) {
        missing.push_back(i);
        continue;
      }
      std::memcpy(out + i * dim, r->values.data(), dim * sizeof(float));
      mins[shard] = std::min(mins[shard], std::max(r->version, e->confirmed[shard]));
    }
  }
  delta.sparse_hits = n - missing.size();
  delta.sparse_misses = missing.size();
  Status st = missing.empty() ? Status::Ok() : PullRows(e, keys, missing, out, &mins, &delta);
  AddStats(delta);
  ONLINEPS_RETURN_IF_ERROR(st);
  if (read != nullptr) {
    read->resize(num_shards_);
    for (uint32_t s = 0; s < num_shards_; ++s) (*read)[s] = mins[s] == kNoRow ? 0 : mins[s];
  }
  if (base != nullptr) {
    // A shard none of the rows came from gets the newest version seen there: it adds
    // nothing to a push's staleness and never drags a min over several reads to 0.
    MutexLock lock(&e->mu);
    base->resize(num_shards_);
    for (uint32_t s = 0; s < num_shards_; ++s) {
      (*base)[s] = mins[s] == kNoRow ? e->newest[s] : mins[s];
    }
  }
  return Status::Ok();
}

Status ParamCache::PullRows(SparseEntry* e, const uint64_t* keys,
                            const std::vector<size_t>& missing, float* out, ps::VersionVector* mins,
                            ParamCacheStats* delta) {
  ONLINEPS_RETURN_IF_ERROR(
      CheckShape(client_, e->name, ps::TableKind::kSparse, e->dim, &e->shape_checked, &e->evicts)
          .WithContext("ParamCache: pull of sparse table '" + e->name + "'"));
  const size_t dim = e->dim;
  // A key repeated in one call is pulled once.
  std::unordered_map<uint64_t, size_t> slot;
  std::vector<uint64_t> uniq;
  for (size_t i : missing) {
    if (slot.emplace(keys[i], uniq.size()).second) uniq.push_back(keys[i]);
  }
  std::vector<float> buf(uniq.size() * dim);
  ps::VersionVector versions;
  uint64_t generation;
  {
    MutexLock lock(&e->mu);
    generation = e->generation;
  }
  const int64_t fetched = Now();
  Status st = client_->PullSparse(e->name, uniq.data(), uniq.size(), buf.data(), &versions).Wait();
  if (!st.ok()) return st.WithContext("ParamCache: pull of sparse table '" + e->name + "'");
  delta->sparse_pulls = 1;
  versions.resize(num_shards_, 0);
  MutexLock lock(&e->mu);
  Raise(&e->newest, versions);
  if (e->generation == generation) {
    const size_t evicted = e->rows.evictions();
    for (size_t j = 0; j < uniq.size(); ++j) {
      const uint64_t v = versions[ShardOfKey(uniq[j], num_shards_)];
      e->rows.Put(uniq[j], {std::vector<float>(buf.begin() + j * dim, buf.begin() + (j + 1) * dim),
                            v, fetched});
    }
    delta->sparse_evictions = e->rows.evictions() - evicted;
  }
  for (size_t i : missing) {
    std::memcpy(out + i * dim, buf.data() + slot[keys[i]] * dim, dim * sizeof(float));
    const uint32_t shard = ShardOfKey(keys[i], num_shards_);
    (*mins)[shard] = std::min((*mins)[shard], versions[shard]);
  }
  return Status::Ok();
}

void ParamCache::ObserveVersions(const std::string& table, const ps::VersionVector& versions) {
  if (auto it = dense_.find(table); it != dense_.end()) {
    const int64_t now = Now();
    MutexLock lock(&it->second->mu);
    for (size_t s = 0; s < versions.size(); ++s) RaiseDense(it->second.get(), s, versions[s], now);
  }
  if (auto it = sparse_.find(table); it != sparse_.end()) {
    MutexLock lock(&it->second->mu);
    Raise(&it->second->newest, versions);
  }
}

void ParamCache::InstallDense(const std::string& table, std::vector<float> values,
                              const ps::VersionVector& versions, int64_t sent_ms) {
  auto it = dense_.find(table);
  if (it == dense_.end() || values.size() != it->second->size) return;
  DenseEntry* e = it->second.get();
  auto snap = std::make_shared<DenseSnapshot>();
  snap->values = std::move(values);
  snap->versions = versions;
  snap->versions.resize(num_shards_, 0);
  snap->fetched_ms = sent_ms;
  MutexLock lock(&e->mu);
  if (e->snapshot) {
    const DenseSnapshot& cur = *e->snapshot;
    bool newer = false, older = false;
    for (uint32_t s = 0; s < num_shards_; ++s) {
      const uint64_t have = s < cur.versions.size() ? cur.versions[s] : 0;
      newer |= s >= cur.versions.size() || snap->versions[s] > have;
      older |= snap->versions[s] < have;
    }
    if (!newer) return;  // a concurrent learn's push, answered later, was newer
    if (older) {
      // Newer on some shards only: two learns' pushes reached the shards in different
      // orders. Each shard's slices are kept from the copy that is newer there, so that
      // no shard goes back to a version a read of this worker already saw.
      if (e->layout == nullptr)
        e->layout = std::make_unique<DenseLayout>(e->name, e->size, num_shards_);
      for (uint32_t s = 0; s < num_shards_; ++s) {
        if (s >= cur.versions.size() || snap->versions[s] >= cur.versions[s]) continue;
        for (const DenseSlice& sl : e->layout->SlicesOf(s)) {
          std::copy(cur.values.begin() + static_cast<std::ptrdiff_t>(sl.offset),
                    cur.values.begin() + static_cast<std::ptrdiff_t>(sl.offset + sl.length),
                    snap->values.begin() + static_cast<std::ptrdiff_t>(sl.offset));
        }
        snap->versions[s] = cur.versions[s];
      }
      snap->fetched_ms = std::min(snap->fetched_ms, cur.fetched_ms);
    }
  }
  snap->pull_id = ++e->pulls;
  Raise(&e->newest, snap->versions);
  Adopt(e, std::move(snap));
  ++e->generation;  // a pull begun before this push would bring the values before it
}

void ParamCache::InstallRows(const std::string& table, const uint64_t* keys, size_t n,
                             const float* values, const ps::VersionVector& versions,
                             int64_t sent_ms) {
  auto it = sparse_.find(table);
  if (it == sparse_.end()) return;
  SparseEntry* e = it->second.get();
  const size_t dim = e->dim;
  MutexLock lock(&e->mu);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t shard = ShardOfKey(keys[i], num_shards_);
    const uint64_t v = shard < versions.size() ? versions[shard] : 0;
    if (e->newest[shard] > v) {
      // A notice of a later push to this shard came first: it may have named this row
      // already, and these values may predate that push. Let the next read pull it.
      e->rows.Erase(keys[i]);
      continue;
    }
    e->rows.Put(keys[i],
                {std::vector<float>(values + i * dim, values + (i + 1) * dim), v, sent_ms});
  }
  Raise(&e->newest, versions);
  ++e->generation;  // a pull begun before this push would bring the rows before it
}

void ParamCache::BeginOwnPush(const std::string& table) {
  if (auto it = dense_.find(table); it != dense_.end()) {
    MutexLock lock(&it->second->mu);
    if (it->second->own_pushes++ == 0) it->second->own_push_since_ms = Now();
  }
}

void ParamCache::EndOwnPush(const std::string& table) {
  auto it = dense_.find(table);
  if (it == dense_.end()) return;
  {
    MutexLock lock(&it->second->mu);
    if (--it->second->own_pushes > 0) return;
  }
  refresher_.Wake();
}

void ParamCache::Invalidate(const std::string& table) {
  if (auto it = dense_.find(table); it != dense_.end()) {
    MutexLock lock(&it->second->mu);
    it->second->snapshot.reset();
    it->second->stale_since_ms = -1;
    ++it->second->generation;
  }
  if (auto it = sparse_.find(table); it != sparse_.end()) {
    MutexLock lock(&it->second->mu);
    it->second->rows.Clear();
    ++it->second->generation;
  }
}

void ParamCache::InvalidateRows(const std::string& table, const uint64_t* keys, size_t n) {
  auto it = sparse_.find(table);
  if (it == sparse_.end()) return;
  MutexLock lock(&it->second->mu);
  for (size_t i = 0; i < n; ++i) it->second->rows.Erase(keys[i]);
  ++it->second->generation;
}

bool ParamCache::RefreshWanted(DenseEntry* e, int64_t now) const {
  bool all_live = true;
  for (uint32_t s = 0; s < num_shards_; ++s) all_live &= Live(s, now);
  MutexLock lock(&e->mu);
  if (e->last_read_ms < 0 || now - e->last_read_ms > options_.hot_window_ms) return false;
  if (!e->snapshot) return true;
  // Refreshing at half the age bound leaves the other half for the pull to land before
  // a read would find the copy stale and wait. Not needed while notices flow.
  const int64_t max_age = e->bound.max_age_ms;
  if (!all_live && max_age >= 0 && now - e->snapshot->fetched_ms >= max_age / 2) return true;
  // A notice of this worker's own push in flight: its reply brings the values
  // (EndOwnPush looks again). Not for longer than kOwnPushHoldMs, so that a stream of
  // pushes always in flight (or replies that install nothing) cannot hold refreshes off.
  if (e->own_pushes > 0 && now - e->own_push_since_ms < kOwnPushHoldMs) return false;
  return !FreshDense(*e, now, /*grace=*/false);
}

void ParamCache::Tick() {
  if (options_.notices) IssueWatches(Now());
  RefreshDue();
}

void ParamCache::IssueWatches(int64_t now) {
  std::vector<std::pair<uint32_t, std::map<std::string, uint64_t>>> due;
  {
    MutexLock lock(&watch_mu_);
    for (uint32_t s = 0; s < num_shards_; ++s) {
      if (watching_[s] || watch_retry_ms_[s] > now || known_[s].empty()) continue;
      watching_[s] = true;
      due.emplace_back(s, known_[s]);
    }
  }
  for (auto& [shard, known] : due) {
    auto reply = std::make_shared<ps::WatchReply>();
    client_->Watch(shard, known, std::chrono::milliseconds(options_.notice_wait_ms), reply.get(),
                   [alive = alive_, shard = shard, reply](const Status& st) {
                     MutexLock lock(&alive->mu);
                     if (alive->cache != nullptr) alive->cache->OnNotice(shard, st, *reply);
                   });
  }
}

void ParamCache::OnNotice(uint32_t shard, const Status& st, const ps::WatchReply& reply) {
  const int64_t now = Now();
  if (!st.ok()) {
    {
      MutexLock lock(&watch_mu_);
      watching_[shard] = false;
      watch_retry_ms_[shard] = now + kWatchRetryMs;
    }
    spdlog::debug("watch of shard {} failed: {}", shard, st.ToString());
    AddStats(One(&ParamCacheStats::watch_errors));
    return;
  }
  ParamCacheStats delta;
  // Another incarnation: the shard restarted (or another replica took over), maybe from
  // an older checkpoint whose history went on elsewhere up to the very versions this
  // worker holds. Nothing held of it can be trusted: dropped, as when a version went back.
  bool restarted = false;
  if (!reply.incarnation.empty()) {
    MutexLock lock(&watch_mu_);
    restarted = !incarnation_[shard].empty() && incarnation_[shard] != reply.incarnation;
    incarnation_[shard] = reply.incarnation;
  }
  if (restarted) {
    spdlog::warn("shard {} restarted or failed over (new incarnation); dropping what is held of it",
                 shard);
  }
  // A version below one this worker saw of the shard (its own push replies and pulls
  // included, which a watch does not name) means the shard went back: it restarted from
  // an older checkpoint, or a replica behind took over. What is held of it may be gone
  // there: dropped, and pulled again when read.
  auto went_back = [&](const std::string& table, uint64_t version, uint64_t seen) {
    spdlog::warn(
        "shard {} reports version {} of '{}', below the {} this worker saw: it went back "
        "(restarted from an older checkpoint?); dropping what is held of it",
        shard, version, table, seen);
  };
  for (const auto& [table, version] : reply.versions) {
    if (auto it = dense_.find(table); it != dense_.end()) {
      DenseEntry* e = it->second.get();
      MutexLock lock(&e->mu);
      if (restarted || version < e->newest[shard]) {
        if (version < e->newest[shard]) went_back(table, version, e->newest[shard]);
        e->newest[shard] = version;
        e->snapshot.reset();
        ++e->generation;
        delta.notices = 1;
      } else if (version > e->newest[shard]) {
        RaiseDense(e, shard, version, now);
        delta.notices = 1;
      }
      continue;
    }
    auto it = sparse_.find(table);
    if (it == sparse_.end()) continue;
    SparseEntry* e = it->second.get();
    MutexLock lock(&e->mu);
    const bool back = restarted || version < e->newest[shard];
    if (version < e->newest[shard]) {
      went_back(table, version, e->newest[shard]);
      e->newest[shard] = version;
    }
    e->newest[shard] = std::max(e->newest[shard], version);
    std::vector<uint64_t> drop;
    if (back || reply.all_keys.count(table) != 0) {
      e->rows.ForEach([&](uint64_t key, const SparseEntry::Row&) {
        if (ShardOfKey(key, num_shards_) == shard) drop.push_back(key);
      });
    } else if (auto k = reply.keys.find(table); k != reply.keys.end()) {
      drop = k->second;
    } else {
      e->confirmed[shard] = std::max(e->confirmed[shard], version);  // nothing changed
      continue;
    }
    for (uint64_t key : drop) delta.rows_noticed += e->rows.Erase(key) ? 1 : 0;
    ++e->generation;  // a pull in flight may carry the rows as they were before
    e->confirmed[shard] = version;
    delta.notices = 1;
  }
  {
    MutexLock lock(&watch_mu_);
    watching_[shard] = false;
    watch_retry_ms_[shard] = 0;
    for (const auto& [table, version] : reply.versions) known_[shard][table] = version;
  }
  live_until_[shard].store(now + options_.notice_wait_ms + kLiveMarginMs);
  AddStats(delta);
  refresher_.Wake();  // the next watch, and a pull of hot dense tables that changed
}

void ParamCache::RefreshDue() {
  for (auto& [name, entry] : dense_) {
    DenseEntry* e = entry.get();
    if (!RefreshWanted(e, Now())) continue;
    std::unique_lock<std::mutex> pull(e->pull_mu, std::try_to_lock);
    if (!pull.owns_lock()) continue;         // a reader is pulling it right now
    if (!RefreshWanted(e, Now())) continue;  // and may just have finished
    auto snap = PullDense(e);
    if (snap.ok()) {
      AddStats(One(&ParamCacheStats::refresher_pulls));
    } else {
      // The next read pulls again and reports the error to its caller.
      spdlog::debug("refresh of '{}' failed: {}", name, snap.status().ToString());
    }
  }
}

void ParamCache::AddStats(const ParamCacheStats& d) {
  MutexLock lock(&stats_mu_);
  stats_.dense_hits += d.dense_hits;
  stats_.dense_pulls += d.dense_pulls;
  stats_.refresher_pulls += d.refresher_pulls;
  stats_.sparse_hits += d.sparse_hits;
  stats_.sparse_misses += d.sparse_misses;
  stats_.sparse_pulls += d.sparse_pulls;
  stats_.sparse_evictions += d.sparse_evictions;
  stats_.notices += d.notices;
  stats_.watch_errors += d.watch_errors;
  stats_.rows_noticed += d.rows_noticed;
}

ParamCacheStats ParamCache::stats() const {
  ParamCacheStats s;
  {
    MutexLock lock(&stats_mu_);
    s = stats_;
  }
  for (const auto& [name, e] : sparse_) {
    MutexLock lock(&e->mu);
    s.sparse_rows += e->rows.size();
  }
  const int64_t now = Now();
  for (uint32_t shard = 0; shard < num_shards_; ++shard) s.shards_noticing += Live(shard, now);
  return s;
}

}  // namespace onlineps::worker
