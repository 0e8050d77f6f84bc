// ShardServer: one parameter-server shard. Owns its tables, serves the wire protocol
// (docs/protocol.md) over a ServerTransport, measures staleness, deduplicates pushes,
// checkpoints, and exports metrics. Start() / Stop(); Stop drains queued requests,
// releases held replies and writes a final checkpoint. Thread-safe.
#ifndef ONLINEPS_PS_SHARD_SERVER_H_
#define ONLINEPS_PS_SHARD_SERVER_H_

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/file_io.h"
#include "common/mutex.h"
#include "common/periodic_thread.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"
#include "ps/checkpoint_queue.h"
#include "ps/dedup.h"
#include "ps/memory_budget.h"
#include "ps/replication.h"
#include "ps/table.h"
#include "ps/watchers.h"

namespace prometheus {
class Registry;
}

namespace onlineps::ps {

struct ShardServerOptions {
  uint32_t shard = 0;
  uint32_t num_shards = 1;
  std::string listen = "tcp://127.0.0.1:7000";
  int handler_threads = 2;
  // mem:// listen only: requests (of any size) run on the sending client's thread when
  // its lane is idle, their replies reach the client there too
  // (TransportOptions::mem_run_on_sender); for in-process shards whose callers hold no
  // shard-related locks and wait for each answer, such as the replay's.
  bool run_on_sender = false;
  CurveOptions curve;  // CurveZMQ on the listening socket (common/curve.h); off by default
  // Soft limit: larger requests get TOO_LARGE. The transport disconnects at 2x.
  size_t max_message_bytes = size_t{256} << 20;
  std::string checkpoint_dir;          // empty: no checkpoints
  uint64_t checkpoint_interval_s = 0;  // 0: only on demand and at Stop
  bool restore = true;                 // load checkpoint_dir/shard-I-of-N.ckpt at Start
  // Incremental checkpoints: a checkpoint writes only what changed since the one before
  // (a delta, PATH.d<N>) unless this many files make the chain already (the full
  // checkpoint and its deltas), there is no full checkpoint yet, the deltas add up to
  // the full one's size, or half the rows changed. 1: every checkpoint is full.
  uint32_t checkpoint_full_every = 8;
  size_t max_senders = 16384;       // dedup windows kept (1 KiB each)
  size_t max_held_replies = 65536;  // block mode: replies waiting for slow workers
  size_t max_watches = 4096;        // table-change watches held at once (op watch)
  uint64_t maintenance_interval_ms = 50;
  // Bytes of table state (the tables' stat.memory_bytes, summed) past which creating a
  // table, or a sparse push creating rows, is refused RESOURCE_EXHAUSTED; pushes to
  // existing rows and pulls go on. A backup applies its primary's log regardless.
  // 0: no budget. (onlineps_ps derives it from the cgroup limit: ps/memory_budget.h.)
  uint64_t max_memory_bytes = 0;
  // Primary/backup replication of this shard (ps/replication.h); off with < 2 members.
  ReplicationOptions replication;
  // With CURVE: public keys, besides this shard's own, allowed to send replication
  // messages (replicas with certificates of their own). Everyone else is refused.
  std::vector<std::string> replica_keys;
};

class ShardServer {
 public:
  class Metrics;
  ShardServer(ShardServerOptions options, std::shared_ptr<prometheus::Registry> registry);
  ~ShardServer();

  // Restores the checkpoint (if any), binds, and starts serving. Returns the endpoint.
  StatusOr<std::string> Start();
  // Drains, checkpoints (when a directory is set) and stops. Idempotent.
  void Stop();
  // After Stop(): whether the final checkpoint was wanted and could not be written.
  bool final_checkpoint_failed() const { return final_checkpoint_failed_.load(); }
  // Writes a checkpoint now; returns its path (a delta's, PATH.dN, or PATH). With
  // `skip_if_unchanged` (periodic checkpoints), writes nothing when nothing changed since
  // the last one and returns that one's path.
  StatusOr<std::string> Checkpoint(bool skip_if_unchanged = false);

  bool ready() const { return ready_.load(); }
  // /readyz: OK while serving and, when replicated, primary or in the in-sync replica
  // set (a backup re-syncing after a restart is not ready, so a rollout or drain waits
  // for it before stopping the next replica).
  Status Readiness() const;
  // Null when the shard is not replicated.
  const Replica* replica() const { return replica_.get(); }
  std::string checkpoint_path() const;
  std::shared_ptr<Table> FindTable(const std::string& name) const;

 private:
  friend class ShardServerTestPeer;  // loads a snapshot as a re-syncing replica does

  // No checkpoint of this shard count: warns of one written with another count.
  void WarnOfOtherShardCounts() const;
  // Start: the restored tables are over the memory budget. Says by how much, and which.
  void WarnOverBudget() const;
  struct Held {
    std::shared_ptr<Table> table;
    uint64_t sender;
    std::string peer;
    Frames reply;
    uint64_t deadline_ms;
  };
  using TableMap = std::map<std::string, std::shared_ptr<Table>>;

  void Handle(Incoming&& in);
  // `commit_lsn`: set when the reply must wait for replication of that log entry.
  Status Dispatch(const Header& h, const Frames& frames, Header* reply, Frames* out,
                  std::string_view peer, bool* held, uint64_t* commit_lsn);
  // push_batch: each sub-push through Dispatch, its reply appended to `out`.
  static constexpr size_t kMaxBatchPushes = 1024;
  Status DispatchBatch(const Header& h, const Frames& frames, Header* reply, Frames* out,
                       std::string_view peer, uint64_t* commit_lsn);
  // Whether CreateTable made the table or found an equal one (the reply's "created" or
  // "exists", docs/protocol.md).
  enum class Created { kNew, kExisted };
  // `from_log`: a backup applying its primary's log (never refused for the budget).
  StatusOr<Created> CreateTable(const Header& h, Header* reply, bool from_log = false);
  // The tables' memory_bytes, summed (MemoryBudget::Measure).
  uint64_t TableBytes() const;
  // Reserves the bytes a sparse push of `req` may add and returns them (the caller
  // settles the reservation: MemoryBudget::Settle), or RESOURCE_EXHAUSTED, nothing
  // reserved, when the rows it would create pass the budget.
  StatusOr<uint64_t> AdmitGrowth(const std::string& table, Table& t, const PushRequest& req);
  // Reserves `bytes` of the memory budget, measuring the tables first when a try fails
  // and the count may hold pushes' upper bounds. False: past the budget.
  bool ReserveMeasured(uint64_t bytes);
  // Replicated shards: builds replica_ from the options and the checkpoint's sidecar.
  Status MakeReplica(bool restored, const std::string& tip);
  // The sidecar describes `file`, the last file of the checkpoint chain, of that size,
  // which holds the replica's log `position` (Replica::position).
  void WriteSidecar(bool clean, const std::string& file, uint64_t checkpoint_bytes,
                    std::pair<uint64_t, uint64_t> position);
  // Whether the checkpoint cut now, with the tables' `changes`, is a full one (else a
  // delta).
  bool WantFullCheckpoint(const ChangeStats& changes) REQUIRES(ckpt_mu_);
  // Table::PrepareSnapshot of every table, before a snapshot's cut (outside the gate).
  void PrepareSnapshots();
  // The change sets of every table, summed.
  static ChangeStats ChangesOf(const TableMap& tables);
  bool ReplicationAllowed(const std::string& client_key) const;
  // Replicated shards: applies a client update in log order and logs it.
  Status ApplyLogged(const Header& h, const Frames& frames, std::shared_ptr<Table> t, Header* reply,
                     bool* hold, uint64_t* commit_lsn, bool* evicted,
                     std::vector<float>* values_after);
  // Replica hooks: a backup applies a logged update; snapshots save / load all state.
  Status ApplyReplicated(const Header& h, const Frames& frames);
  StatusOr<std::string> Snapshot(uint64_t* lsn);
  Status LoadSnapshot(const std::string& bytes);
  // Dense or sparse, by the table's kind (the op was checked against it).
  Status Pull(const Header& h, const Frames& frames, Table& t, Header* reply, Frames* out);
  // Replicated shards: a pull that records a DC-ASGD copy is logged like an update.
  Status PullMaybeLogged(const Header& h, const Frames& frames, Table& t, Header* reply,
                         Frames* out);
  bool RecordsBackup(const Header& h, const Table& t) const;
  // RETURN_VALUES: appends the parameters the push `h` wrote, as they are now, to `out`.
  Status AppendValues(const Header& h, const Frames& frames, Table& t, Frames* out);
  // `applied`: the push was new and applied (not a duplicate, not refused).
  // `evicted` (optional): set when the push evicted rows to stay under max_rows.
  // `values_after` (optional, RETURN_VALUES): the parameters as the push left them, read
  // under the locks it applied under; left empty when they were not read that way (a
  // duplicate, a sparse push only accumulated): AppendValues reads them then.
  // `from_log`: a backup applying its primary's log (Dedup::Begin's refuse_forgotten).
  Status Push(const Header& h, const Frames& frames, std::shared_ptr<Table> t, Header* reply,
              bool* hold, bool* applied, bool* evicted = nullptr,
              std::vector<float>* values_after = nullptr, bool from_log = false);
  // Push under the apply gate: exactly-once check, apply, staleness (`evicted` optional).
  // `values_read`: req.values_after was filled.
  Status PushGated(const Header& h, std::shared_ptr<Table> t, const PushRequest& req, Header* reply,
                   bool* hold, bool* applied, bool* evicted, bool* values_read, bool from_log)
      REQUIRES_SHARED(apply_gate_);
  Status Info(const Header& h, Header* reply);
  // A client with the shard list in the wrong order would write rows to the wrong shard.
  Status CheckKeysOwned(const std::string& table, const uint64_t* keys, size_t n) const;
  void SendReply(const std::string& peer, const Header& reply, Frames payload);
  void HoldReply(Held held);
  void ReleaseHeld(bool all);
  // One pass of the maintenance thread; the times of its last checkpoint and stats.
  void MaintenanceTick(uint64_t* last_ckpt, uint64_t* last_stats);
  std::shared_ptr<const TableMap> tables() const;

  // Immutable after construction.
  const ShardServerOptions options_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<Metrics> metrics_;

  std::unique_ptr<ServerTransport> transport_;
  std::unique_ptr<Replica> replica_;  // null when not replicated
  // Held from Start on: a second process on the same checkpoint file is refused.
  std::optional<FileLock> checkpoint_lock_;
  std::unique_ptr<Watchers> watchers_;           // table-change notices; answers through transport_
  std::unique_ptr<CheckpointQueue> ckpt_queue_;  // checkpoint ops; answers through transport_
  // Lock order: ckpt_mu_ -> order_mu_ -> apply_gate_ -> tables_mu_ -> held_mu_ (each
  // ACQUIRED_BEFORE the next); maint_mu_ is never held with another. order_mu_ is held
  // across Replica::Append, so it also comes before the Replica's own locks. ckpt_mu_ is
  // held while a snapshot is written (a checkpoint, or a replica's copy), never by an
  // update.
  // Replicated shards apply and log updates one at a time, so backups see the same order.
  Mutex order_mu_ ACQUIRED_BEFORE(apply_gate_);
  Dedup dedup_;
  MemoryBudget memory_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> final_checkpoint_failed_{false};

  // Serializes writers of tables_; readers atomic_load the snapshot without it.
  mutable Mutex tables_mu_ ACQUIRED_BEFORE(held_mu_);
  std::shared_ptr<const TableMap> tables_;  // copy-on-write; atomic_load/atomic_store

  Mutex held_mu_;
  std::vector<Held> held_ GUARDED_BY(held_mu_);

  Mutex ckpt_mu_ ACQUIRED_BEFORE(order_mu_);  // one snapshot being written at a time
  // The checkpoint chain on disk: the full checkpoint and the deltas after it.
  struct Chain {
    uint64_t tip_trailer = 0;  // the last file's trailing checksum; 0: no full one yet
    std::string tip;           // the last file
    uint64_t deltas = 0;       // deltas after the full checkpoint
    uint64_t base_bytes = 0, delta_bytes = 0;
    uint64_t updates = 0;  // updates_ at the last file's cut
  };
  Chain chain_ GUARDED_BY(ckpt_mu_);
  // The tables' change sets no longer describe the files (a replica's tables were
  // replaced, or a checkpoint failed after its cut): the next checkpoint is full.
  std::atomic<bool> force_full_checkpoint_{false};
  // Pushes (applied, queued or refused) and table creations since the start; a periodic
  // checkpoint that finds it and the tables' change sets as the last cut left them
  // writes nothing.
  std::atomic<uint64_t> updates_{0};
  // Shared by pushes (dedup check through commit), exclusive while a checkpoint is
  // written: the file never holds a push its dedup windows miss, or the reverse.
  SharedMutex apply_gate_ ACQUIRED_BEFORE(tables_mu_);

  Mutex maint_mu_;
  bool started_ GUARDED_BY(maint_mu_) = false;
  PeriodicThread maintenance_;  // last: stopped before the members it uses go
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_SHARD_SERVER_H_
