// SparseTable: embedding rows keyed by uint64 id that hash to this shard. Rows are
// created lazily on their first (or N-th, with admission) push with a deterministic
// initializer, expire by TTL, and are evicted LRU under a row cap. Rows live in 16
// lock stripes so pushes to different rows proceed in parallel, each stripe a RowStore
// (contiguous records, an incrementally grown index); the version is one atomic
// counter per table.
#ifndef ONLINEPS_PS_SPARSE_TABLE_H_
#define ONLINEPS_PS_SPARSE_TABLE_H_

#include <atomic>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/hash.h"
#include "common/lru_map.h"
#include "common/mutex.h"
#include "ps/row_store.h"
#include "ps/rule_set.h"
#include "ps/ssp_clock.h"
#include "ps/table.h"

namespace onlineps::ps {

class SparseTable : public Table {
 public:
  SparseTable(const TableSpec& spec, RuleSet rules);
  ~SparseTable() override;

  const TableSpec& spec() const override { return spec_; }
  uint64_t version() const override { return version_.load(); }
  uint64_t local_elements() const override { return 0; }
  StatusOr<PullResult> Pull(const PullRequest& req) override;
  StatusOr<PushResult> Push(const PushRequest& req) override;
  bool Releasable(uint64_t sender, uint64_t now_ms) override;
  void Maintain(uint64_t now_ms) override;
  TableStats Stats() const override;
  uint64_t BytesPerNewRow() const override;
  uint64_t NewRows(const uint64_t* keys, size_t n) override;
  void Save(ByteWriter* w) const override;
  Status Load(ByteReader* r) override;
  std::unique_ptr<TableSnapshot> BeginSnapshot(SnapshotKind kind) override;
  ChangeStats Changes() const override;
  void PrepareSnapshot() override;
  Status LoadDelta(ByteReader* r) override;

 private:
  struct Stripe;
  // Where a record keeps its metadata (ps/row_store.h): the key, then the LRU links of a
  // table that can drop rows, then the Polyak step count of an averaged table.
  struct Layout {
    bool lru = false;
    size_t header_bytes = 8;
    size_t avg_count_offset = 0;  // 0: no Polyak average
  };
  static Layout LayoutOf(const TableSpec& spec);
  friend class SparseSnapshot;
  friend class TableTestPeer;  // tests hold the stripe locks as a long apply would
  void SaveAccumulator(ByteWriter* w) const;
  struct BackupKey {
    uint64_t sender, key;
    bool operator==(const BackupKey& o) const { return sender == o.sender && key == o.key; }
  };
  struct BackupHash {
    size_t operator()(const BackupKey& k) const;
  };

  Stripe& StripeOf(uint64_t key) const { return *stripes_[StripeIndex(key)]; }
  // Low bits of the key's mix (the shard choice uses the high bits of the same mix). A
  // power-of-two count (the default 16) masks instead of dividing: the same stripe, but
  // a 64-bit division per key was a seventh of a 10,000-key push.
  size_t StripeIndex(uint64_t key) const {
    const uint64_t h = Mix64(key);
    return (num_stripes_ & (num_stripes_ - 1)) == 0 ? h & (num_stripes_ - 1) : h % num_stripes_;
  }
  // Calls fn(stripe, i) for every key index i, with key i's stripe locked; each stripe
  // is locked once per call. With `no_wait`, every stripe the keys touch is try-locked
  // first: when one is taken, nothing is called and the result is false. `then`
  // (optional) is called like fn once fn has run for every key of that stripe, still
  // under its lock (but for one stripe without no_wait: under a lock taken again).
  // `parallel`: fn and then may run for different stripes at once (they touch only the
  // stripe and the key's own output); a large call without no_wait then applies about
  // half of its keys' stripes on the ApplyHelper's thread.
  struct NoThen {
    void operator()(Stripe&, uint32_t) const {}
  };
  template <typename Fn, typename Then = NoThen>
  bool ForEachKeyByStripe(const uint64_t* keys, size_t n, Fn fn, bool no_wait = false,
                          Then then = {}, bool parallel = false) const;
  // no_wait: try-locks stripes [0, num_stripes_) where `touched[i]`, in order; false (and
  // none left locked) when one is taken.
  bool TryLockStripes(const bool* touched) const;
  void UnlockStripes(const bool* touched) const;
  // How FindOrCreate counts a touch of a missing row for admission (admit_after > 1):
  // kCount, one more (a push's first occurrence of the key); kNone, none and not admitted
  // (a later occurrence); kAdmitIfCounted, none, admitted if counted enough already (an
  // accumulated sum, whose pushes were counted as they came: CountTouch).
  enum class Touch { kCount, kNone, kAdmitIfCounted };
  // REQUIRES: stripe locked. Slot of key, creating the row if admitted; -1 if not.
  // A row evicted to make room is added to `evicted`.
  int64_t FindOrCreate(Stripe& s, uint64_t key, uint64_t now_ms, std::vector<uint64_t>* evicted,
                       Touch touch = Touch::kCount);
  // REQUIRES: stripe locked, admit_after > 1. Counts a push's touch of key when its row
  // is missing (at most admit_after).
  void CountTouch(Stripe& s, uint64_t key);
  // Most bytes of values the accumulated sum holds before it is applied early: those of
  // max_rows rows, else of the admission candidates with admit_after > 1, at least 16
  // MiB; 0 (no bound) for a table without either, where every key of it becomes a row.
  uint64_t PendingBytesCap() const;
  // step_average: a Polyak table's average takes its step for this push (false for all
  // but the last occurrence of a key the push repeats).
  void ApplyRow(Stripe& s, uint32_t slot, uint64_t sender, const float* g, bool delta,
                float lr_scale, uint64_t step, bool compensate, bool step_average);
  // DC-ASGD for accumulation: rewrites g (a private copy) row by row.
  void CompensateEach(const PushRequest& req, float* g);
  Status LoadAccumulator(ByteReader* r, uint64_t version);
  // Load (delta false) or LoadDelta: per stripe the dropped keys (delta only), then the
  // rows, each created or overwritten; a delta's rows count as most recently touched.
  Status LoadBody(ByteReader* r, bool delta);
  // Push after the shape, finiteness and clip checks.
  StatusOr<PushResult> PushChecked(const PushRequest& req);
  StatusOr<PushResult> Accumulate(const PushRequest& req, uint64_t tau);
  void ApplyAccumulated(float lr_scale, uint64_t now_ms, std::vector<uint64_t>* evicted)
      REQUIRES(acc_mu_);
  // The keys of acc_ in ascending order, the order the sum is applied and saved in: the
  // order rows are created and touched in decides which rows a row cap evicts, and a
  // table restored from a checkpoint (or a replica's snapshot) rebuilds acc_ in another
  // iteration order, yet must evict what the original does.
  std::vector<uint64_t> AccumulatedKeys() const REQUIRES(acc_mu_);

  // Immutable after construction.
  const TableSpec spec_;
  const RuleSet rules_;
  const uint32_t dim_;
  const uint32_t row_floats_;  // w, optimizer slots, policy slots, Polyak average
  const size_t num_stripes_;
  const size_t rows_per_stripe_;  // 0: no cap
  const Layout layout_;

  std::vector<std::unique_ptr<Stripe>> stripes_;
  std::atomic<uint64_t> version_{0};
  std::atomic<uint64_t> backup_misses_{0};
  std::atomic<uint64_t> clipped_pushes_{0};

  mutable Mutex acc_mu_;  // accumulation (accumulate > 1) only
  std::unordered_map<uint64_t, std::vector<float>> acc_ GUARDED_BY(acc_mu_);
  uint32_t acc_count_ GUARDED_BY(acc_mu_) = 0;
  uint64_t acc_tau_sum_ GUARDED_BY(acc_mu_) = 0;

  std::optional<SspClock> ssp_;
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_SPARSE_TABLE_H_
