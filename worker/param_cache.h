// ParamCache: the worker's view of the model, pulled from the PS on demand. Every read
// is within a freshness bound; a stale or missing table or row is pulled before the read
// returns. With notices (the default) each shard tells the cache when a table changes
// (one watch per shard, docs/protocol.md "21 · watch"): while a shard's notices flow, a
// copy of its part is fresh until a notice says otherwise (dense: a newer version; sparse:
// the keys pushed), and the refresher re-pulls hot dense tables at once. Where notices
// do not flow (a shard down or too old to answer watches), the bound is the age and/or
// versions behind the newest version seen (from pulls and this worker's push replies),
// and the refresher re-pulls dense tables read recently at half their max age. Sparse
// rows sit in a bounded LRU per table. Thread-safe. Concurrent misses on one dense table
// share one pull.
#ifndef ONLINEPS_WORKER_PARAM_CACHE_H_
#define ONLINEPS_WORKER_PARAM_CACHE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/lru_map.h"
#include "common/mutex.h"
#include "common/periodic_thread.h"
#include "common/status.h"
#include "ps/ps_client.h"

namespace onlineps::worker {

struct FreshnessBound {
  int64_t max_age_ms = 500;          // -1: no age bound
  int64_t max_versions_behind = -1;  // -1: no version bound; 0: the newest version seen
};

struct ParamCacheOptions {
  FreshnessBound dense;                          // default for dense tables
  FreshnessBound sparse;                         // default for sparse tables
  std::map<std::string, FreshnessBound> tables;  // per-table overrides, by table name
  size_t max_sparse_rows = 1 << 20;              // per sparse table
  // Refresher: every interval, re-pull dense tables read within hot_window_ms whose
  // copy is older than half their max age. 0 disables the refresher.
  int64_t refresh_interval_ms = 50;
  int64_t hot_window_ms = 5000;
  // Table-change notices (see above). false: the age/version bound alone, as when no
  // shard answers watches.
  bool notices = true;
  // A shard answers a watch with no change after this long (a heartbeat); a shard silent
  // for this plus 1 s counts as not sending notices, and the age bound applies again.
  int64_t notice_wait_ms = 1000;
  // A read may still use a dense copy for this long after a notice (or this worker's
  // push reply) said it changed, while the refresher pulls the new one: reads rarely
  // wait, and none is served a copy stale by more than this plus a pull. 0: reads
  // wait for the pull as soon as a change is known.
  int64_t notice_grace_ms = 5;
};

// An immutable copy of a dense table. Shared by concurrent readers; replaced, never
// modified, on refresh.
struct DenseSnapshot {
  std::vector<float> values;
  ps::VersionVector versions;  // per shard, as pulled
  int64_t fetched_ms = 0;
  uint64_t pull_id = 0;  // increases with every pull of this table
};

struct ParamCacheStats {
  uint64_t dense_hits = 0, dense_pulls = 0, refresher_pulls = 0;
  uint64_t sparse_hits = 0, sparse_misses = 0, sparse_pulls = 0, sparse_evictions = 0;
  uint64_t notices = 0;       // watch answers saying some table changed
  uint64_t watch_errors = 0;  // watches that failed (shard down, refused); retried
  uint64_t rows_noticed = 0;  // cached sparse rows dropped because a notice named them
  size_t sparse_rows = 0;
  size_t shards_noticing = 0;  // shards whose notices flow now
};

class ParamCache {
 public:
  // `client` must outlive the cache.
  ParamCache(ps::PsClient* client, ParamCacheOptions options);
  ~ParamCache();

  // Registers tables before use. REQUIRES: before Start() and any read.
  void AddDense(const std::string& table, uint64_t size);
  void AddSparse(const std::string& table, uint32_t dim);

  // Starts / stops the background refresher. Stop is idempotent; call both from one
  // thread.
  void Start();
  void Stop();

  // A snapshot within the dense bound, pulling first if needed. Errors: the pull's.
  StatusOr<std::shared_ptr<const DenseSnapshot>> Dense(const std::string& table);
  // Dense() for several tables at once: the stale ones are pulled concurrently (one
  // round trip, not one per table). REQUIRES: every caller lists tables in one fixed
  // order (the model's), so concurrent calls cannot deadlock.
  StatusOr<std::vector<std::shared_ptr<const DenseSnapshot>>> DenseAll(
      const std::vector<std::string>& tables);
  // Fills `out` (n * dim floats) with rows within the sparse bound, pulling the missing
  // or stale ones in one call, and `base` (one entry per shard) with the oldest version
  // any returned row of that shard was read at: the base a gradient on them must carry.
  // `read` (optional) gets the same per shard, 0 where no row came from that shard.
  Status Sparse(const std::string& table, const uint64_t* keys, size_t n, float* out,
                ps::VersionVector* base, ps::VersionVector* read = nullptr);

  // Raises the newest version seen for `table` from a push reply (versions per shard).
  void ObserveVersions(const std::string& table, const ps::VersionVector& versions);
  // Installs what this worker's push wrote, as the shards returned it in their replies
  // (PushOptions::updated), labelled with the reply's versions per shard: reads see the
  // push without pulling it back. A copy newer on every shard is kept instead. `sent_ms`:
  // when the push was sent (the values are at least that fresh).
  void InstallDense(const std::string& table, std::vector<float> values,
                    const ps::VersionVector& versions, int64_t sent_ms);
  // The same for sparse rows: `values` holds n * dim floats, row i for keys[i].
  void InstallRows(const std::string& table, const uint64_t* keys, size_t n, const float* values,
                   const ps::VersionVector& versions, int64_t sent_ms);
  // Bracket a push of this worker whose reply installs the dense table's new values
  // (InstallDense): meanwhile the refresher leaves the table alone, since the notice of
  // that very push would otherwise have it pull back what the reply brings. At the end
  // the refresher looks again (a notice of another worker's later push still needs a pull).
  void BeginOwnPush(const std::string& table);
  void EndOwnPush(const std::string& table);
  // Drops every cached copy (e.g. after local-steps mode pushed a delta).
  void Invalidate(const std::string& table);
  // Drops the cached copies of these rows: after a push to them is acknowledged, so the
  // worker reads its own writes. Pulls already in flight for the table are not kept.
  void InvalidateRows(const std::string& table, const uint64_t* keys, size_t n);

  ParamCacheStats stats() const;
  const ParamCacheOptions& options() const { return options_; }

 private:
  struct DenseEntry;
  struct SparseEntry;
  struct Alive;
  FreshnessBound BoundOf(const std::string& table, const FreshnessBound& def) const;
  // `live`: the shard's notices flow, so only a version it announced makes a copy stale.
  bool Fresh(const FreshnessBound& b, int64_t fetched_ms, uint64_t version, uint64_t newest,
             int64_t now, bool live) const;
  bool Live(uint32_t shard, int64_t now) const;
  // Sends a watch to every shard without one outstanding (and not waiting to retry).
  void IssueWatches(int64_t now);
  // A shard's answer to a watch (on a client thread).
  void OnNotice(uint32_t shard, const Status& st, const ps::WatchReply& reply);
  void Tick();
  // REQUIRES: e.mu held. False when there is no snapshot. `grace`: a copy a notice made
  // stale less than notice_grace_ms ago still counts as fresh (reads, not the refresher).
  bool FreshDense(const DenseEntry& e, int64_t now, bool grace) const;
  // REQUIRES: e.mu held. Raises e.newest[shard] to `version`, noting when the copy
  // became stale.
  void RaiseDense(DenseEntry* e, size_t shard, uint64_t version, int64_t now) const;
  // REQUIRES: e.mu held. Makes `snap` the copy reads get; it is no longer stale when it
  // covers every version known.
  void Adopt(DenseEntry* e, std::shared_ptr<const DenseSnapshot> snap) const;
  // REQUIRES: e->pull_mu held.
  struct PendingPull;
  PendingPull StartPull(DenseEntry* e);
  StatusOr<std::shared_ptr<const DenseSnapshot>> FinishPull(PendingPull& p);
  StatusOr<std::shared_ptr<const DenseSnapshot>> PullDense(DenseEntry* e);
  // Pulls the rows keys[missing[..]] in one call, writes them to `out` and lowers
  // `mins` (per shard) to their versions.
  Status PullRows(SparseEntry* e, const uint64_t* keys, const std::vector<size_t>& missing,
                  float* out, ps::VersionVector* mins, ParamCacheStats* delta);
  bool RefreshWanted(DenseEntry* e, int64_t now) const;
  void RefreshDue();
  void AddStats(const ParamCacheStats& delta);

  // Immutable after Start().
  ps::PsClient* const client_;
  const ParamCacheOptions options_;
  const uint32_t num_shards_;
  std::map<std::string, std::unique_ptr<DenseEntry>> dense_;
  std::map<std::string, std::unique_ptr<SparseEntry>> sparse_;

  mutable Mutex stats_mu_;
  ParamCacheStats stats_ GUARDED_BY(stats_mu_);

  // Notices: per shard, whether a watch is outstanding, when a failed one is retried,
  // and the versions the next watch names.
  Mutex watch_mu_;
  std::vector<bool> watching_ GUARDED_BY(watch_mu_);
  std::vector<int64_t> watch_retry_ms_ GUARDED_BY(watch_mu_);
  std::vector<std::map<std::string, uint64_t>> known_ GUARDED_BY(watch_mu_);
  std::vector<std::string> incarnation_ GUARDED_BY(watch_mu_);  // of the last notice
  std::unique_ptr<std::atomic<int64_t>[]> live_until_;  // per shard: notices flow until then
  std::shared_ptr<Alive> alive_;  // watch callbacks reach the cache only through it

  PeriodicThread refresher_;  // last: stopped before the members it uses go
};

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_PARAM_CACHE_H_
