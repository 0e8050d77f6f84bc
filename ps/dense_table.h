// DenseTable: this shard's slices of a dense tensor, stored concatenated in tensor
// order, with optimizer/policy state, an optional Polyak average and an optional
// accumulation buffer. One mutex per table: a push is a single vectorized pass.
#ifndef ONLINEPS_PS_DENSE_TABLE_H_
#define ONLINEPS_PS_DENSE_TABLE_H_

#include <atomic>
#include <memory>
#include <optional>
#include <vector>

#include "common/lru_map.h"
#include "common/mutex.h"
#include "ps/rule_set.h"
#include "ps/ssp_clock.h"
#include "ps/table.h"

namespace onlineps::ps {

class DenseTable : public Table {
 public:
  DenseTable(const TableSpec& spec, RuleSet rules, uint32_t shard, uint32_t num_shards);

  const TableSpec& spec() const override { return spec_; }
  uint64_t version() const override;
  uint64_t local_elements() const override { return n_; }
  StatusOr<PullResult> Pull(const PullRequest& req) override;
  StatusOr<PushResult> Push(const PushRequest& req) override;
  bool Releasable(uint64_t sender, uint64_t now_ms) override;
  TableStats Stats() const override;
  void Save(ByteWriter* w) const override;
  Status Load(ByteReader* r) override;

 private:
  // Applies one gradient (already compensated if needed).
  // Takes mu_, at once or not at all when `no_wait` (false: not taken).
  bool LockUnlessNoWait(bool no_wait) TRY_ACQUIRE(true, mu_);
  // The push's tau, bound check and apply (or accumulation); fills res.
  Status ApplyPushLocked(const PushRequest& req, const float* values, PushResult* res)
      REQUIRES(mu_);
  void ApplyLocked(const float* g, const float* w_bak, float lr_scale) REQUIRES(mu_);
  void ApplyDeltaLocked(const float* delta) REQUIRES(mu_);
  // Adds g (compensated against w_bak) to the accumulator; returns
  // true when K pushes are in and the sum was applied.
  bool AccumulateLocked(const float* g, const float* w_bak, uint64_t tau) REQUIRES(mu_);
  void AfterApplyLocked() REQUIRES(mu_);
  std::vector<float*> Slots(std::vector<float>& storage, int slots);

  // Immutable after construction.
  const TableSpec spec_;
  const RuleSet rules_;
  const uint64_t n_;

  friend class TableTestPeer;  // tests hold the lock as a long apply would
  mutable Mutex mu_;
  uint64_t version_ GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> published_version_{0};  // version_, read without the lock
  std::vector<float> w_ GUARDED_BY(mu_);
  std::vector<float> opt_state_ GUARDED_BY(mu_), pol_state_ GUARDED_BY(mu_);  // slot-major
  std::vector<float*> opt_slots_, pol_slots_;
  std::vector<float> avg_ GUARDED_BY(mu_);  // Polyak average
  std::vector<float> acc_ GUARDED_BY(mu_);  // accumulation sum
  uint32_t acc_count_ GUARDED_BY(mu_) = 0;
  uint64_t acc_tau_sum_ GUARDED_BY(mu_) = 0;
  LruMap<uint64_t, std::vector<float>> backups_ GUARDED_BY(mu_);  // DC-ASGD w_bak
  uint64_t backup_misses_ GUARDED_BY(mu_) = 0;
  std::atomic<uint64_t> clipped_pushes_{0};
  std::vector<float> scratch_ GUARDED_BY(mu_);
  std::optional<SspClock> ssp_;  // block mode only; has its own lock
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_DENSE_TABLE_H_
