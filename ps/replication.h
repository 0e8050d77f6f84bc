// Replica: primary/backup replication of one PS shard (docs/protocol.md, "Replication";
// docs/reliability.md). The replicas of a shard are a fixed list of endpoints; one is
// primary and serves clients, the others are backups that apply the primary's stream of
// updates in the same order, so they hold the same tables, versions and exactly-once
// windows. Each update the primary applies gets the next log index (lsn); in sync mode
// its reply waits until every in-sync backup has applied it.
//
// Epochs fence primaries: a backup that has not heard from its primary for lease_ms asks
// the other replicas for their state and, when it is the most up to date (highest lsn,
// then lowest index), becomes primary under epoch + 1. Every replication message and
// every client request carries the sender's epoch; a replica refuses lower epochs, and a
// primary that sees a higher one steps down and later reloads its state from the new
// primary (a snapshot). A replica that joins or rejoins gets a snapshot of the primary's
// state at some lsn, then the stream from there.
//
// Thread-safe. The ShardServer owns one when it has two or more members.
#ifndef ONLINEPS_PS_REPLICATION_H_
#define ONLINEPS_PS_REPLICATION_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"

namespace onlineps::ps {

struct ReplicationOptions {
  // Endpoints of every replica of this shard, this one included, in the same order on
  // every replica. Fewer than two: the shard is not replicated.
  std::vector<std::string> members;
  uint32_t index = 0;  // this replica's position in `members`
  bool sync = true;    // acknowledge a push only once every in-sync backup has it
  uint64_t heartbeat_ms = 100;
  uint64_t lease_ms = 1000;             // a backup elects a new primary after this silence
  uint64_t follower_timeout_ms = 2000;  // a primary stops waiting for a silent backup
  size_t max_log_entries = 65536;       // entries kept for lagging backups (then: snapshot)
  size_t window = 512;                  // entries in flight to one backup
  TransportOptions transport;           // to the other replicas (CURVE client keys)
};

struct ReplicaStats {
  bool primary = false;
  uint64_t epoch = 0, lsn = 0, committed = 0;
  uint64_t promotions = 0, step_downs = 0, snapshots_sent = 0, snapshots_loaded = 0;
  uint32_t in_sync_backups = 0;
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

  Replica(ReplicationOptions options, Hooks hooks, bool restored);
  ~Replica();

  Status Start();
  void Stop();  // fails waiting replies with UNAVAILABLE; idempotent

  bool primary() const;
  uint64_t epoch() const;
  uint64_t last_lsn() const;
  ReplicaStats Stats() const;
  // NOT_PRIMARY naming the known primary (for clients), or OK when primary. A client
  // request carrying a higher epoch makes a primary step down first.
  Status CheckPrimary(uint64_t client_epoch);

  // Primary: logs an applied update (its request frames, header first) and returns its
  // lsn. Call in apply order (the server serializes apply + Append).
  uint64_t Append(const Frames& request);
  // Runs `done` once `lsn` is on every in-sync backup (at once when async or alone), or
  // with an error when this replica stops being primary first.
  void WhenCommitted(uint64_t lsn, Done done);

  // A replication message (kReplicate, kReplSnapshot, kReplStatus) received by the shard;
  // fills the reply.
  void Handle(const Header& h, const Frames& frames, Header* reply);

 private:
  enum class FollowState { kProbe, kSnapshot, kStream };
  struct Follower {
    FollowState state = FollowState::kProbe;
    uint64_t next = 1;   // next lsn to send (kStream)
    uint64_t acked = 0;  // highest lsn the follower reported applied
    uint64_t last_ack_ms = 0, last_send_ms = 0, snapshot_ms = 0, last_heartbeat_ms = 0;
    bool in_sync = false;  // counted for commits
  };
  struct Entry {
    uint64_t lsn;
    Frames frames;  // kReplicate header + request frames
  };
  struct Waiter {
    uint64_t lsn;
    Done done;
  };
  struct Peer {  // election: what a replica answered to kReplStatus
    bool primary = false, eligible = false, fresh = false;
    uint64_t epoch = 0, lsn = 0, at_ms = 0;
  };

  void Loop();
  void PrimaryTick(uint64_t now, std::unique_lock<std::mutex>& lock);
  void BackupTick(uint64_t now, std::unique_lock<std::mutex>& lock);
  void OnReply(size_t member, Frames&& frames);
  void SendLocked(size_t member, Header h, Frames payload = {});
  void StepDownLocked(uint64_t epoch, const std::string& why);
  void ReleaseCommittedLocked(std::vector<Waiter>* ready);
  uint64_t CommitLsnLocked() const;
  Header StatusReplyLocked(const Header& req) const;
  bool EligibleLocked() const { return in_sync_ && !need_snapshot_; }

  const ReplicationOptions options_;
  const Hooks hooks_;
  std::unique_ptr<ClientTransport> transport_;  // to every member (own index unused)

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false, started_ = false;
  bool primary_ = false;
  uint64_t epoch_ = 0, lsn_ = 0;
  // Backup.
  bool in_sync_ = true;  // may become primary (has every committed update)
  bool need_snapshot_ = false;
  bool has_state_ = false;  // restored a checkpoint or applied an update
  uint64_t last_wait_log_ms_ = 0;
  int64_t primary_index_ = -1;
  uint64_t last_primary_ms_ = 0;
  uint64_t probe_sent_ms_ = 0;  // election in progress since
  std::map<size_t, Peer> peers_;
  // Primary.
  std::vector<Follower> followers_;   // by member index
  std::deque<Entry> log_;             // lsns (log_.front().lsn ..]
  std::deque<Waiter> waiters_;        // by lsn
  std::vector<Waiter> stepped_down_;  // waiters to fail once the lock is released
  uint64_t committed_ = 0;
  ReplicaStats counters_;
  std::mutex apply_mu_;  // one replication message applied at a time (backup)
  std::thread thread_;
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_REPLICATION_H_
