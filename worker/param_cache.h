// ParamCache: the worker's view of the model, pulled from the PS on demand. Every read
// is within a freshness bound (max age and/or versions behind the newest version this
// worker has seen, from its pulls and its own push replies); a stale or missing table or
// row is pulled before the read returns. A background refresher re-pulls dense tables
// read recently so reads rarely wait. Sparse rows sit in a bounded LRU per table.
// Thread-safe. Concurrent misses on one dense table share one pull.
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
  size_t sparse_rows = 0;
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
  Status Sparse(const std::string& table, const uint64_t* keys, size_t n, float* out,
                ps::VersionVector* base);

  // Raises the newest version seen for `table` from a push reply (versions per shard).
  void ObserveVersions(const std::string& table, const ps::VersionVector& versions);
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
  FreshnessBound BoundOf(const std::string& table, const FreshnessBound& def) const;
  bool Fresh(const FreshnessBound& b, int64_t fetched_ms, uint64_t version, uint64_t newest,
             int64_t now) const;
  // REQUIRES: e.mu held. False when there is no snapshot.
  bool FreshDense(const DenseEntry& e, int64_t now) const;
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

  PeriodicThread refresher_;  // last: stopped before the members it uses go
};

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_PARAM_CACHE_H_
