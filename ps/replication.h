// Replica: primary/backup replication of one PS shard in a shard process. The protocol
// itself is ReplicaCore (ps/replica_core.h: membership and election on etcd, epochs that
// are etcd revisions, an in-sync replica set changed only by the primary, re-sync of
// every restarted replica); this class runs it: a ticker thread, a ZeroMQ client
// transport to the other replicas, an etcd client, and the shard's hooks that apply
// logged updates and take or load snapshots (docs/reliability.md, docs/protocol.md).
//
// Thread-safe. The ShardServer owns one when it has two or more members.
#ifndef ONLINEPS_PS_REPLICATION_H_
#define ONLINEPS_PS_REPLICATION_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/kv_store.h"
#include "common/mutex.h"
#include "common/periodic_thread.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"
#include "ps/replica_core.h"

namespace onlineps::ps {

struct ReplicationOptions {
  // Endpoints of every replica of this shard, this one included, in the same order on
  // every replica. Fewer than two: the shard is not replicated.
  std::vector<std::string> members;
  uint32_t index = 0;       // this replica's position in `members`
  bool sync = true;         // acknowledge a push only once every in-sync backup has it
  uint32_t min_insync = 1;  // sync: pushes wait while the ISR is smaller (primary included)
  uint64_t heartbeat_ms = 100;
  uint64_t lease_ms = 2000;             // etcd lease (whole seconds); failover after kill -9
  uint64_t follower_timeout_ms = 2000;  // a silent backup leaves the ISR after this
  size_t max_log_entries = 65536;       // entries kept for lagging backups (then: snapshot)
  size_t window = 512;                  // entries in flight to one backup
  // Every ISR member lost its state: wait this long for every replica to register
  // before the most up-to-date one present is elected.
  uint64_t unclean_wait_ms = 30000;
  // Start on a checkpoint whose sidecar (.ckpt.replica, its place in the group's history)
  // is missing or unreadable; its data then ranks below every known position. Else such
  // a start is refused: the data may be the newest anywhere.
  bool accept_unknown_position = false;
  std::vector<std::string> etcd;                  // etcd endpoints (http://HOST:PORT); required
  std::string etcd_prefix = "/onlineps/default";  // keys of this cluster in etcd
  uint32_t shard = 0, num_shards = 1;             // set by the ShardServer
  TransportOptions transport;                     // to the other replicas (CURVE keys)
  // Tests: a KvStore to use instead of an etcd client built from `etcd`.
  std::shared_ptr<KvStore> kv;
};

// What the shard restored at start (ReplicaConfig's restored_* fields).
struct RestoredReplica {
  bool restored = false, exact = false;
  uint64_t incarnation = 0;  // 0: a new random one
  uint64_t log_epoch = 0, lsn = 0;
  uint64_t epoch = 0;  // the highest epoch it followed or led before (the sidecar's)
};

class Replica {
 public:
  struct Hooks {
    // Serializes the shard's state with updates paused, and returns it with the lsn it
    // holds (from last_lsn(), read while paused).
    std::function<StatusOr<std::string>(uint64_t* lsn)> snapshot;
    // Replaces the shard's state with a snapshot.
    std::function<Status(const std::string& bytes)> load;
    // Applies one logged update (its original request header and frames).
    std::function<Status(const Header& h, const Frames& frames)> apply;
  };
  using Done = std::function<void(const Status&)>;

  Replica(ReplicationOptions options, Hooks hooks, RestoredReplica restored);
  ~Replica();

  // Connects to the other replicas and etcd and starts the ticker. kInvalidArgument for
  // a bad member list or etcd endpoint.
  Status Start();
  // Leaves the group: a primary revokes its lease (a backup takes over at once) and
  // waiting replies fail with NOT_PRIMARY; waits up to 1 s for etcd. Idempotent.
  void Stop();

  bool primary() const;
  uint64_t epoch() const;
  uint64_t last_lsn() const;
  uint64_t log_epoch() const;
  // (log_epoch(), last_lsn()), read together.
  std::pair<uint64_t, uint64_t> position() const;
  // The highest epoch this replica followed or led, in this process or before it.
  uint64_t highest_epoch() const;
  uint64_t incarnation() const { return incarnation_; }
  ReplicaStats Stats() const;
  // Primary, or named in the ISR with this incarnation (as last read from etcd).
  bool InSync() const;
  // Whether the state is a point of the group's history (no reload pending): only then
  // may a clean stop keep this incarnation.
  bool ExactState() const;
  // The group's key prefix in etcd.
  const std::string& group() const { return group_; }

  // OK when this replica is the primary; NOT_PRIMARY naming the primary it knows (its
  // index also in `*primary` when not null); UNAVAILABLE while it takes over. A client's
  // epoch is a hint, never trusted.
  Status CheckPrimary(uint64_t client_epoch, std::optional<uint32_t>* primary = nullptr);
  // Primary: logs an applied update (its request frames, header first) and returns its
  // lsn. Call in apply order (the server serializes apply + Append).
  uint64_t Append(const Frames& request);
  // Runs `done` once `lsn` is on every in-sync backup (at once when async or alone), or
  // with an error when this replica stops being primary first. Never from the caller's
  // stack while a lock of this class is held.
  void WhenCommitted(uint64_t lsn, Done done);
  // A replication message (kReplicate, kReplSnapshot, kReplStatus); fills the reply.
  void Handle(const Header& h, const Frames& frames, Header* reply);

 private:
  class Env;
  // Runs `f` on the core under the lock, then issues the etcd calls and snapshot requests
  // it made and runs the completions it released, outside the lock.
  template <typename F>
  auto WithCore(F f) EXCLUDES(mu_);
  void Flush(std::vector<std::pair<uint64_t, KvCall>> calls,
             std::vector<std::pair<ReplicaCore::Done, Status>> done);
  void SnapshotLoop();  // takes the snapshots the core asks for
  void OnReply(size_t member, Frames&& frames);
  // Applies a logged update (frames from index 1 are the original request).
  Status ApplyEntry(const Frames& frames);
  static Status Guarded(const std::function<Status()>& hook);

  const ReplicationOptions options_;
  const Hooks hooks_;
  const uint64_t incarnation_;
  const std::string group_;
  std::unique_ptr<Env> env_;
  std::shared_ptr<KvStore> kv_;
  std::unique_ptr<ClientTransport> transport_;  // to every member (own index unused)

  mutable Mutex mu_;
  CondVar cv_;
  std::unique_ptr<ReplicaCore> core_ GUARDED_BY(mu_);
  std::vector<std::pair<uint64_t, KvCall>> kv_outbox_ GUARDED_BY(mu_);
  std::deque<std::pair<size_t, uint64_t>> snapshot_todo_ GUARDED_BY(mu_);
  bool stop_ GUARDED_BY(mu_) = false, started_ GUARDED_BY(mu_) = false;
  // One replication message applied at a time (backup). Taken before mu_, and before
  // the locks of the hooks (ShardServer), which take mu_ through Append / last_lsn.
  Mutex apply_mu_ ACQUIRED_BEFORE(mu_);
  std::thread snapshot_thread_;
  PeriodicThread ticker_;  // last: stopped before the members it uses go
};

// The etcd key prefix of shard `shard` of `num_shards` under `etcd_prefix`.
std::string ReplicaGroupKey(const std::string& etcd_prefix, uint32_t shard, uint32_t num_shards);

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_REPLICATION_H_
