#include "ps/shard_metrics.h"

namespace onlineps::ps {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;

ShardServer::Metrics::Metrics(prometheus::Registry& r)
    : requests_(BuildCounter()
                    .Name("onlineps_ps_requests_total")
                    .Help("Requests handled by this shard, by op and result code")
                    .Register(r)),
      duration_family_(BuildHistogram()
                           .Name("onlineps_ps_request_duration_seconds")
                           .Help("Time from decoding a request to queuing its reply")
                           .Register(r)),
      staleness_family_(BuildHistogram()
                            .Name("onlineps_ps_push_staleness")
                            .Help("Staleness tau = table version at apply - base version, per "
                                  "push, by table")
                            .Register(r)),
      duplicates_(BuildCounter()
                      .Name("onlineps_ps_duplicate_pushes_total")
                      .Help("Retried pushes recognised by (sender, seq) and not applied again")
                      .Register(r)
                      .Add({})),
      checkpoints_(BuildCounter()
                       .Name("onlineps_ps_checkpoints_total")
                       .Help("Checkpoints written, by result")
                       .Register(r)),
      checkpoint_seconds_(BuildGauge()
                              .Name("onlineps_ps_last_checkpoint_duration_seconds")
                              .Help("Duration of the last successful checkpoint")
                              .Register(r)
                              .Add({})),
      checkpoint_bytes_(BuildGauge()
                            .Name("onlineps_ps_last_checkpoint_bytes")
                            .Help("Size of the last successful checkpoint")
                            .Register(r)
                            .Add({})),
      checkpoint_deltas_(BuildGauge()
                             .Name("onlineps_ps_checkpoint_deltas")
                             .Help("Deltas (incremental checkpoints) written after the last full "
                                   "checkpoint; a restore reads them all after it")
                             .Register(r)
                             .Add({})),
      checkpoint_time_(BuildGauge()
                           .Name("onlineps_ps_last_checkpoint_success_timestamp_seconds")
                           .Help("Unix time of the last successful checkpoint (of the start "
                                 "until the first; 0 without a checkpoint directory)")
                           .Register(r)
                           .Add({})),
      checkpoint_interval_(BuildGauge()
                               .Name("onlineps_ps_checkpoint_interval_seconds")
                               .Help("--checkpoint-interval-s: periodic checkpoints every so "
                                     "many seconds (0: on demand and at shutdown only)")
                               .Register(r)
                               .Add({})),
      held_(BuildGauge()
                .Name("onlineps_ps_held_replies")
                .Help("Block-mode push replies waiting for slower workers")
                .Register(r)
                .Add({})),
      dedup_senders_(BuildGauge()
                         .Name("onlineps_ps_dedup_senders")
                         .Help("Senders whose exactly-once window is kept")
                         .Register(r)
                         .Add({})),
      ready_(BuildGauge()
                 .Name("onlineps_ps_ready")
                 .Help("1 when the shard has restored its checkpoint and is serving")
                 .Register(r)
                 .Add({})),
      memory_budget_(BuildGauge()
                         .Name("onlineps_ps_memory_budget_bytes")
                         .Help("--max-memory-mb: table state past which new tables and pushes "
                               "creating sparse rows are refused (0: no budget)")
                         .Register(r)
                         .Add({})),
      memory_used_(BuildGauge()
                       .Name("onlineps_ps_memory_used_bytes")
                       .Help("Table state counted against the memory budget: the tables' "
                             "memory bytes, summed (0 without a budget)")
                       .Register(r)
                       .Add({})),
      memory_refusals_(BuildCounter()
                           .Name("onlineps_ps_memory_budget_refusals_total")
                           .Help("Requests refused RESOURCE_EXHAUSTED for the memory budget, by "
                                 "op (create_table, push_sparse)")
                           .Register(r)),
      refused_create_(memory_refusals_.Add({{"op", "create_table"}})),
      refused_push_(memory_refusals_.Add({{"op", "push_sparse"}})),
      table_version_(BuildGauge()
                         .Name("onlineps_ps_table_version")
                         .Help("Updates applied to the table on this shard")
                         .Register(r)),
      table_rows_(BuildGauge()
                      .Name("onlineps_ps_table_rows")
                      .Help("Sparse rows held on this shard")
                      .Register(r)),
      table_memory_(BuildGauge()
                        .Name("onlineps_ps_table_memory_bytes")
                        .Help("Approximate bytes of parameters and state on this shard")
                        .Register(r)),
      backup_misses_(BuildCounter()
                         .Name("onlineps_ps_dc_backup_misses_total")
                         .Help("DC-ASGD pushes applied without compensation (no backup)")
                         .Register(r)),
      clipped_pushes_(BuildCounter()
                          .Name("onlineps_ps_clipped_pushes_total")
                          .Help("Pushes scaled down to the table's clip_norm on this shard")
                          .Register(r)),
      replica_gauges_(BuildGauge()
                          .Name("onlineps_ps_replica")
                          .Help("Replication state of this replica, by field: primary (1 or 0), "
                                "epoch (the etcd revision of its election), lsn, committed_lsn, "
                                "in_sync_backups, isr_size, restored_in_place (1: this process "
                                "restored a clean stop's checkpoint in place, with its "
                                "incarnation and log position; it may still reload from the "
                                "primary if it is behind), restored_lsn")
                          .Register(r)),
      replica_events_(BuildCounter()
                          .Name("onlineps_ps_replica_events_total")
                          .Help("Replication events of this replica: promotion, step_down, "
                                "snapshot_sent, snapshot_loaded, unclean_election (every in-sync "
                                "replica had lost its state), fenced_message (replication from a "
                                "replica etcd does not name as primary), etcd_error")
                          .Register(r)) {
  for (size_t op = 0; op < kOps; ++op) {
    durations_[op] =
        &duration_family_.Add({{"op", std::string(OpName(static_cast<Op>(op)))}},
                              prometheus::Histogram::BucketBoundaries{
                                  1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1});
  }
  // Both results exist from the start, so that increase() sees the first failure.
  checkpoints_.Add({{"result", "ok"}});
  checkpoints_.Add({{"result", "error"}});
}

void ShardServer::Metrics::ObserveStaleness(const std::string& table, uint64_t tau) {
  prometheus::Histogram* h = nullptr;
  {
    MutexLock lock(&staleness_mu_);
    auto it = staleness_.find(table);
    if (it == staleness_.end()) {
      h = &staleness_family_.Add(
          {{"table", table}},
          prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 1024});
      staleness_.emplace(table, h);
    } else {
      h = it->second;
    }
  }
  h->Observe(static_cast<double>(tau));
}

void ShardServer::Metrics::SetCheckpointPolicy(double interval_s) {
  checkpoint_interval_.Set(interval_s);
  checkpoint_time_.SetToCurrentTime();
}

void ShardServer::Metrics::CountRequest(Op op, StatusCode code) {
  const size_t o = static_cast<size_t>(op), c = static_cast<size_t>(code);
  if (o >= kOps || c >= kCodes) return;
  prometheus::Counter* counter = counters_[o][c].load(std::memory_order_acquire);
  if (counter == nullptr) {
    MutexLock lock(&mu_);
    counter = &requests_.Add(
        {{"op", std::string(OpName(op))}, {"code", std::string(StatusCodeName(code))}});
    counters_[o][c].store(counter, std::memory_order_release);
  }
  counter->Increment();
}

void ShardServer::Metrics::ObserveDuration(Op op, double seconds) {
  const size_t o = static_cast<size_t>(op);
  if (o < kOps) durations_[o]->Observe(seconds);
}

void ShardServer::Metrics::CountCheckpoint(bool ok, double seconds, uint64_t bytes) {
  MutexLock lock(&mu_);
  checkpoints_.Add({{"result", ok ? "ok" : "error"}}).Increment();
  if (ok) {
    checkpoint_time_.SetToCurrentTime();
    checkpoint_seconds_.Set(seconds);
    checkpoint_bytes_.Set(static_cast<double>(bytes));
  }
}

void ShardServer::Metrics::SetMemory(uint64_t budget, uint64_t used) {
  memory_budget_.Set(static_cast<double>(budget));
  memory_used_.Set(static_cast<double>(used));
}

void ShardServer::Metrics::CountMemoryRefusal(Op op) {
  (op == Op::kCreateTable ? refused_create_ : refused_push_).Increment();
}

void ShardServer::Metrics::UpdateTable(const std::string& name, const TableStats& s) {
  MutexLock lock(&mu_);
  table_version_.Add({{"table", name}}).Set(static_cast<double>(s.version));
  table_rows_.Add({{"table", name}}).Set(static_cast<double>(s.rows));
  table_memory_.Add({{"table", name}}).Set(static_cast<double>(s.memory_bytes));
  // The tables count since they were created (or restored); the counters add what is new.
  auto& [misses_seen, clipped_seen] = table_seen_[name];
  prometheus::Counter& misses = backup_misses_.Add({{"table", name}});
  if (s.backup_misses > misses_seen)
    misses.Increment(static_cast<double>(s.backup_misses - misses_seen));
  misses_seen = s.backup_misses;
  prometheus::Counter& clipped = clipped_pushes_.Add({{"table", name}});
  if (s.clipped_pushes > clipped_seen)
    clipped.Increment(static_cast<double>(s.clipped_pushes - clipped_seen));
  clipped_seen = s.clipped_pushes;
}

void ShardServer::Metrics::UpdateReplica(const ReplicaStats& s) {
  MutexLock lock(&mu_);
  const std::pair<const char*, double> gauges[] = {
      {"primary", s.primary ? 1 : 0},
      {"epoch", static_cast<double>(s.epoch)},
      {"lsn", static_cast<double>(s.lsn)},
      {"committed_lsn", static_cast<double>(s.committed)},
      {"in_sync_backups", static_cast<double>(s.in_sync_backups)},
      {"isr_size", static_cast<double>(s.isr_size)},
      {"restored_in_place", s.restored_in_place ? 1.0 : 0.0},
      {"restored_lsn", static_cast<double>(s.restored_lsn)}};
  for (const auto& [field, value] : gauges) replica_gauges_.Add({{"field", field}}).Set(value);
  const std::tuple<const char*, uint64_t, uint64_t*> events[] = {
      {"promotion", s.promotions, &replica_seen_.promotions},
      {"step_down", s.step_downs, &replica_seen_.step_downs},
      {"snapshot_sent", s.snapshots_sent, &replica_seen_.snapshots_sent},
      {"snapshot_loaded", s.snapshots_loaded, &replica_seen_.snapshots_loaded},
      {"unclean_election", s.unclean_elections, &replica_seen_.unclean_elections},
      {"fenced_message", s.fenced_messages, &replica_seen_.fenced_messages},
      {"etcd_error", s.kv_errors, &replica_seen_.kv_errors}};
  for (const auto& [event, now, seen] : events) {
    prometheus::Counter& c = replica_events_.Add({{"event", event}});
    if (now > *seen) c.Increment(static_cast<double>(now - *seen));
    *seen = now;
  }
}

}  // namespace onlineps::ps
