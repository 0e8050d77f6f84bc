// Prometheus metrics of a shard (names in docs/protocol.md#metrics). Counters for each
// (op, code) are created on first use and cached, so the hot path takes no lock after
// warm-up. Thread-safe.
#ifndef ONLINEPS_PS_SHARD_METRICS_H_
#define ONLINEPS_PS_SHARD_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <array>
#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "common/mutex.h"
#include "common/status.h"
#include "common/wire.h"
#include "ps/replication.h"
#include "ps/shard_server.h"
#include "ps/table.h"

namespace onlineps::ps {

class ShardServer::Metrics {
 public:
  explicit Metrics(prometheus::Registry& registry);

  void CountRequest(Op op, StatusCode code);
  void ObserveDuration(Op op, double seconds);
  // Per table: its histogram is created on the table's first push.
  void ObserveStaleness(const std::string& table, uint64_t tau);
  void CountDuplicate() { duplicates_.Increment(); }
  // Checkpoints are written every `interval_s` (0: only on demand); the age of the last
  // success counts from now until the first one.
  void SetCheckpointPolicy(double interval_s);
  void CountCheckpoint(bool ok, double seconds, uint64_t bytes);
  void SetCheckpointDeltas(uint64_t n) { checkpoint_deltas_.Set(static_cast<double>(n)); }
  // A periodic checkpoint found nothing changed: the files on disk are current.
  void CheckpointCurrent() { checkpoint_time_.SetToCurrentTime(); }
  void SetHeld(size_t n) { held_.Set(static_cast<double>(n)); }
  void SetDedupSenders(size_t n) { dedup_senders_.Set(static_cast<double>(n)); }
  void SetReady(bool ready) { ready_.Set(ready ? 1 : 0); }
  void UpdateTable(const std::string& name, const TableStats& s);
  // The memory budget (0: none) and the table state counted against it.
  void SetMemory(uint64_t budget, uint64_t used);
  // A create_table or push_sparse refused for the memory budget.
  void CountMemoryRefusal(Op op);
  // Replicated shards only: role, epoch, log positions, in-sync backups and the
  // promotion / step-down / snapshot counters (first call registers them).
  void UpdateReplica(const ReplicaStats& s);

 private:
  static constexpr size_t kOps = static_cast<size_t>(kLastOp) + 1, kCodes = 19;
  prometheus::Family<prometheus::Counter>& requests_;
  prometheus::Family<prometheus::Histogram>& duration_family_;
  prometheus::Family<prometheus::Histogram>& staleness_family_;
  prometheus::Counter& duplicates_;
  prometheus::Family<prometheus::Counter>& checkpoints_;
  prometheus::Gauge& checkpoint_seconds_;
  prometheus::Gauge& checkpoint_bytes_;
  prometheus::Gauge& checkpoint_deltas_;
  prometheus::Gauge& checkpoint_time_;
  prometheus::Gauge& checkpoint_interval_;
  prometheus::Gauge& held_;
  prometheus::Gauge& dedup_senders_;
  prometheus::Gauge& ready_;
  prometheus::Gauge& memory_budget_;
  prometheus::Gauge& memory_used_;
  prometheus::Family<prometheus::Counter>& memory_refusals_;
  prometheus::Counter& refused_create_;
  prometheus::Counter& refused_push_;
  prometheus::Family<prometheus::Gauge>& table_version_;
  prometheus::Family<prometheus::Gauge>& table_rows_;
  prometheus::Family<prometheus::Gauge>& table_memory_;
  prometheus::Family<prometheus::Counter>& backup_misses_;
  prometheus::Family<prometheus::Counter>& clipped_pushes_;
  prometheus::Family<prometheus::Gauge>& replica_gauges_;
  prometheus::Family<prometheus::Counter>& replica_events_;
  ReplicaStats replica_seen_ GUARDED_BY(mu_);  // what the counters already count
  // Per table: backup misses and clipped pushes the counters already count.
  std::map<std::string, std::pair<uint64_t, uint64_t>> table_seen_ GUARDED_BY(mu_);
  Mutex staleness_mu_;  // a push's lookup; never held with mu_
  std::map<std::string, prometheus::Histogram*, std::less<>> staleness_ GUARDED_BY(staleness_mu_);
  std::array<prometheus::Histogram*, kOps> durations_{};
  std::array<std::array<std::atomic<prometheus::Counter*>, kCodes>, kOps> counters_{};
  Mutex mu_;  // creation of new series
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_SHARD_METRICS_H_
