// ReplicaCore: the replication protocol of one replica of a PS shard, as a deterministic
// state machine: no threads, no clock, no I/O. Time comes in as arguments; messages,
// coordination calls and snapshots go out through a ReplicaEnv, and their results come
// back as calls. ps/replication.h runs it in a shard process (real ZeroMQ, real etcd);
// tests/ps/replica_sim.h runs several in one thread under a seeded fault scheduler.
//
// The protocol (docs/reliability.md, "Shard replication"; docs/protocol.md):
// - Membership and election live in a KvStore (etcd), under the group's key prefix:
//   `members/<i>` (each replica's registration, on its own lease), `leader` (the primary's
//   record, on the primary's lease) and `isr` (the in-sync replicas). The epoch is the
//   store revision that created `leader`: no message can forge or overflow it.
// - Only a replica named in `isr` (index and incarnation) may take `leader`, by a
//   transaction that checks `isr` has not changed since it was read. Only the primary
//   changes `isr`, by a transaction that checks it still holds `leader` in its epoch.
// - Sync mode: an update is acknowledged once every replica counted for commits has it;
//   a backup is counted before it is added to `isr` and stops being counted only after it
//   was removed, so every acknowledged update is on every `isr` member.
// - A replica's incarnation changes whenever it restarts without a clean stop: a new
//   incarnation is never in `isr`, so it cannot be elected until the primary has caught
//   it up (snapshot, then the stream) and added it back.
// - When every `isr` member has come back as a new incarnation (all lost their memory),
//   the replica with the most recent state is elected (an "unclean" election, counted).
//
// Not thread-safe: the owner serializes every call.
#ifndef ONLINEPS_PS_REPLICA_CORE_H_
#define ONLINEPS_PS_REPLICA_CORE_H_

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/frame.h"
#include "common/kv_store.h"
#include "common/status.h"
#include "common/wire.h"
#include "ps/replica_group.h"

namespace onlineps::ps {

struct ReplicaConfig {
  // Endpoints of every replica of this shard, this one included, in the same order on
  // every replica; two or more.
  std::vector<std::string> members;
  uint32_t index = 0;  // this replica's position in `members`
  // Key prefix of this group in the KvStore, ending in '/'.
  std::string group = "/onlineps/default/shard-0-of-1/";
  bool sync = true;  // acknowledge an update only once every counted backup has it
  // Sync mode: updates wait (are not acknowledged) while fewer replicas than this are in
  // the ISR, the primary included.
  uint32_t min_insync = 1;
  uint64_t heartbeat_ms = 100;          // primary -> backups; also the KvStore poll period
  uint64_t lease_ms = 2000;             // the KvStore lease (whole seconds, rounded up)
  uint64_t follower_timeout_ms = 2000;  // a silent backup leaves the ISR after this
  uint64_t kv_timeout_ms = 1000;        // a KvStore call unanswered this long failed
  // A new group (no ISR yet) waits this long for every replica to register before the
  // best of those that did is elected.
  uint64_t bootstrap_wait_ms = 5000;
  // When every ISR member is gone, the unclean election waits this long for every replica
  // to register (a cleanly stopped or partitioned one may hold more than those present).
  uint64_t unclean_wait_ms = 30000;
  // Entries kept for lagging backups (then: snapshot); a backup re-syncing from a snapshot
  // keeps those after it until it joins the ISR, up to max_log_bytes.
  size_t max_log_entries = 65536;
  size_t max_log_bytes = size_t{256} << 20;           // and their bytes; a backup holds up to 1/4
                                                      // of it in entries that arrived early
  size_t window = 512;                                // entries in flight to one backup
  size_t snapshot_chunk_bytes = size_t{16} << 20;     // a snapshot is sent in parts this big
  uint64_t max_snapshot_bytes = uint64_t{256} << 30;  // a backup refuses larger snapshots

  // This process: its incarnation (random, unless it restored a clean stop's state),
  // and the state it restored (log epoch and lsn; `exact` after a clean stop, else an
  // approximation used only to rank replicas when every ISR member was lost).
  uint64_t incarnation = 1;
  uint64_t restored_log_epoch = 0, restored_lsn = 0;
  bool restored = false, restored_exact = false;
  // The highest epoch it followed or led before this start (its sidecar's; 0: unknown):
  // only for the epoch base of a group formed again (etcd lost its data).
  uint64_t restored_epoch = 0;
};

struct ReplicaStats {
  bool primary = false;
  uint64_t epoch = 0, lsn = 0, committed = 0, incarnation = 0;
  uint32_t in_sync_backups = 0, isr_size = 0;
  uint64_t promotions = 0, step_downs = 0, snapshots_sent = 0, snapshots_loaded = 0;
  uint64_t unclean_elections = 0, kv_errors = 0, fenced_messages = 0;
  // This process's start: restored a clean stop's checkpoint in place (incarnation and
  // log position kept; it may still reload if it is behind the primary), and the lsn it
  // restored (0 when it started without one).
  bool restored_in_place = false;
  uint64_t restored_lsn = 0;
};

// One KvStore call the core wants made; its result goes to ReplicaCore::OnKv.
struct KvCall {
  enum class Kind { kGrant, kKeepAlive, kRevoke, kRange, kTxn };
  Kind kind = Kind::kRange;
  int64_t ttl_s = 0;   // kGrant
  uint64_t lease = 0;  // kKeepAlive, kRevoke
  std::string prefix;  // kRange
  KvTxn txn;           // kTxn
};

class ReplicaEnv {
 public:
  virtual ~ReplicaEnv() = default;
  // A replication message (header first) to `member`. Never blocks; may be lost.
  virtual void Send(size_t member, Frames frames) = 0;
  // Starts a KvStore call; its result is passed to OnKv(id, ...) later, never from here.
  virtual void Kv(uint64_t id, KvCall call) = 0;
  // Starts a snapshot of the shard for `member`; the result is passed to OnSnapshot
  // (member, token, ...) later, never from here.
  virtual void TakeSnapshot(size_t member, uint64_t token) = 0;
};

class ReplicaCore {
 public:
  using Done = std::function<void(const Status&)>;

  ReplicaCore(ReplicaConfig config, ReplicaEnv* env);

  // Starts: grants a lease, registers, reads the group. Call once.
  void Start(uint64_t now);
  // Leaves: a primary gives up its leadership at once (the lease is revoked), a backup
  // tells the primary it is leaving. Waiting updates fail with NOT_PRIMARY. Idempotent.
  void Stop(uint64_t now);
  // Periodic work; call every few milliseconds (heartbeat_ms / 4 or less).
  void Tick(uint64_t now);
  // When the next Tick is due at the latest.
  uint64_t NextTickMs(uint64_t now) const;

  // Results of the env's calls.
  void OnKv(uint64_t now, uint64_t id, const KvResult& result);
  void OnSnapshot(uint64_t now, size_t member, uint64_t token, const StatusOr<std::string>& bytes,
                  uint64_t lsn);
  // A reply from `member` to a replication message.
  void OnReply(uint64_t now, size_t member, const Header& reply);

  // A replication message received (kReplicate, kReplSnapshot, kReplStatus). Either the
  // reply is ready (kReply), or the caller must apply the logged update (kApply: frames
  // from index 1 are the original request) or load the snapshot TakeLoad() returns (kLoad:
  // the last of its parts came), then call FinishMessage with the outcome. One message at
  // a time.
  enum class Action { kReply, kApply, kLoad };
  Action BeginMessage(uint64_t now, const Header& h, const Frames& frames, Header* reply);
  Header FinishMessage(uint64_t now, const Header& h, const Status& outcome);
  // After kLoad: the whole snapshot, put together from its parts.
  std::string TakeLoad();
  // After FinishMessage: a logged update that arrived before its predecessor and is next
  // now. The caller applies it (frames from index 1) and calls FinishMessage with its
  // header; the reply of that last call is the one to send. False when there is none.
  bool NextEarly(Header* h, Frames* frames);

  // Client requests. OK when this replica is the primary and may serve; NOT_PRIMARY
  // naming the primary it knows (docs/protocol.md), its index then also in `*primary`
  // when not null; UNAVAILABLE while it is taking over. A higher epoch from a client
  // only makes the replica re-read the KvStore.
  Status CheckPrimary(uint64_t now, uint64_t client_epoch,
                      std::optional<uint32_t>* primary = nullptr);
  // Primary: logs an applied update (request frames, header first); returns its lsn.
  uint64_t Append(const Frames& request);
  // Runs `done` once `lsn` is committed (or fails it when this replica stops leading).
  // Callbacks are queued: the caller runs them with TakeCompletions, outside its lock.
  void WhenCommitted(uint64_t lsn, Done done);
  std::vector<std::pair<Done, Status>> TakeCompletions();

  bool primary() const { return role_ == Role::kPrimary; }
  // Primary, or named in the ISR (index and incarnation) of the last read of etcd.
  bool in_sync() const { return primary() || (view_valid_ && InIsr(view_)); }
  uint64_t epoch() const { return epoch_; }
  uint64_t lsn() const { return lsn_; }
  uint64_t log_epoch() const { return log_epoch_; }
  // The highest epoch this replica followed or led, this process or (restored) before.
  uint64_t highest_epoch() const { return std::max(epoch_, config_.restored_epoch); }
  uint64_t incarnation() const { return config_.incarnation; }
  bool stopped() const { return role_ == Role::kStopped; }
  // Its state is no point of the group's history (it must reload, or its followers must).
  bool needs_snapshot() const { return need_snapshot_; }
  // The leader's index known from the KvStore, or -1.
  int64_t leader_index() const { return leader_known_ ? leader_.index : -1; }
  // Whether Stop's lease revocation has been answered (or given up on).
  bool stop_settled() const { return role_ == Role::kStopped && revoke_id_ == 0; }
  ReplicaStats Stats() const;

 private:
  enum class Role { kNew, kFollower, kCampaigning, kEstablishing, kPrimary, kStopped };
  enum class FollowState { kProbe, kSnapshot, kStream };
  using Member = GroupMember;
  using Leader = GroupLeader;
  using Registration = GroupRegistration;
  using View = GroupView;
  struct Follower {
    bool inc_known = false;
    uint64_t inc = 0;
    FollowState state = FollowState::kProbe;
    uint64_t next = 1, acked = 0, pin = 0;
    uint64_t last_ack_ms = 0, last_send_ms = 0, last_heartbeat_ms = 0, snapshot_ms = 0;
    uint64_t progress_ms = 0;  // when acked last grew
    uint64_t snapshot_token = 0, snapshot_at = 0, snapshot_bytes = 0, snapshot_rx = 0;
    bool awaiting_load = false;  // a snapshot was sent; acks before its load are stale
    // Re-syncing from a snapshot sent to it, until it joins the ISR: the entries after the
    // snapshot (or its ack) stay in the log past max_log_entries (not past max_log_bytes).
    bool resyncing = false;
    bool want = false;  // should be in the ISR (counted for commits from now on)
    // Streaming within a window of the log, not in the ISR yet: counted for commits, so
    // that they wait for it and it can reach them (see OnReply).
    bool joining = false;
    uint64_t join_ms = 0;       // when it last started joining (0: never, or it joined)
    uint64_t join_wait_ms = 0;  // after a failed join, the wait before the next (doubles)
  };
  struct Entry {
    uint64_t lsn;
    Frames frames;  // kReplicate header + request frames
    size_t bytes = 0;
  };
  struct Waiter {
    uint64_t lsn;
    Done done;
  };
  enum class KvPurpose {
    kGrant,
    kKeepAlive,
    kRevoke,
    kRegister,
    kRead,
    kCampaign,
    kSetIsr,
    kRemoveStale,
    kResign
  };
  struct Pending {
    KvPurpose purpose;
    uint64_t deadline_ms, sent_ms;
    std::vector<Member> isr;  // kSetIsr: the set being written
    bool unclean = false;     // kCampaign
  };

  // KvStore.
  uint64_t Call(uint64_t now, KvPurpose purpose, KvCall call);
  void KvFailed(uint64_t now, uint64_t id, const Pending& p, const std::string& why);
  // `call_id`: the call that read it; answers to older calls than the last applied are
  // ignored.
  void ApplyView(uint64_t now, const std::vector<KvEntry>& entries, uint64_t call_id);
  void LeaseTick(uint64_t now);
  void Register(uint64_t now);
  void MaybeCampaign(uint64_t now);
  void Campaign(uint64_t now, bool unclean, const std::string& why);
  void Won(uint64_t now, uint64_t epoch, bool unclean);
  void WriteIsr(uint64_t now);

  // Primary.
  void PrimaryTick(uint64_t now);
  void FollowerTick(uint64_t now, size_t m, Follower& f);
  void RequestSnapshot(uint64_t now, size_t m, Follower& f);
  // Whether a backup at (log_epoch, lsn) holds a prefix of this primary's history that
  // the stream can continue.
  bool Consistent(uint64_t log_epoch, uint64_t lsn) const;
  // In the ISR, or to be added to it: what the primary reports as an in-sync backup.
  bool InSync(size_t m) const;
  // Counted for commits: in sync, or joining (a re-syncing backup that commits wait for).
  bool Counted(size_t m) const;
  // Bytes of the log entries after `lsn` (all, if it is before the log's first).
  size_t BytesAfter(uint64_t lsn) const;
  uint64_t CommitLsn() const;
  void ReleaseCommitted();
  void StepDown(uint64_t now, const std::string& why);
  void FailWaiters(const Status& st);
  void SendTo(size_t m, Header h, Frames payload = {});
  uint64_t EntryEpoch(uint64_t lsn) const;

  // Backup.
  Header StatusReply(const Header& req) const;
  Header Refuse(const Header& req, StatusCode code, const std::string& why);
  // A hash of this replica's group key and member list: equal on every replica of a group.
  std::string GroupId() const;
  void ClearEarly();
  // Keeps one part of a snapshot; true when the snapshot is whole (in load_).
  bool AddSnapshotPart(const Header& h, const Frame& part, Header* reply);
  void EraseFirstEarly();
  bool InIsr(const View& v) const;

  const ReplicaConfig config_;
  ReplicaEnv* const env_;
  const ReplicaGroup group_;

  Role role_ = Role::kNew;
  uint64_t epoch_ = 0;      // of the primary this replica follows or is
  uint64_t lsn_ = 0;        // last update applied (backup) or logged (primary)
  uint64_t log_epoch_ = 0;  // epoch of the primary that logged update lsn_
  bool need_snapshot_ = false;
  bool applying_ = false;  // between BeginMessage and FinishMessage: no campaign
  bool has_data_ = false;  // restored a checkpoint, or applied or logged an update
  // Epoch of the primary whose history this backup continues (it loaded that primary's
  // snapshot or applied one of its entries): its older snapshots are stale. synced_lsn_:
  // the last update of that history it holds (lsn_ may be past it: an update applied
  // after it stopped leading, Append).
  uint64_t synced_epoch_ = 0, synced_lsn_ = 0;
  // Entries that overtook an earlier one (at most `window`), by lsn.
  std::map<uint64_t, std::pair<Header, Frames>> early_;
  size_t early_bytes_ = 0;
  // The snapshot being received, by part.
  struct SnapshotAssembly {
    uint64_t id = 0, epoch = 0, total = 0, bytes = 0, received = 0;
    std::vector<std::string> parts;
    std::vector<bool> have;
  };
  SnapshotAssembly snap_;
  std::string load_;  // a whole snapshot, for TakeLoad

  // KvStore state.
  uint64_t next_id_ = 1;
  std::map<uint64_t, Pending> pending_;
  std::map<uint64_t, uint64_t> late_keepalives_;  // timed-out renewals: id -> sent_ms
  uint64_t lease_ = 0, lease_ttl_ms_ = 0, lease_deadline_ms_ = 0;
  uint64_t grant_id_ = 0, keepalive_id_ = 0, revoke_id_ = 0, read_id_ = 0, register_id_ = 0;
  uint64_t isr_id_ = 0, campaign_id_ = 0, remove_stale_id_ = 0;
  uint64_t last_keepalive_ms_ = 0, last_read_ms_ = 0, last_register_ms_ = 0;
  bool read_now_ = false, registered_ = false;
  Registration registered_as_;
  View view_;
  uint64_t view_call_id_ = 0;  // the call that read view_
  bool view_valid_ = false;
  uint64_t view_ms_ = 0;
  bool leader_known_ = false;
  Leader leader_;
  uint64_t leaderless_since_ms_ = 0;
  uint64_t last_wait_log_ms_ = 0, last_refusal_log_ms_ = 0, last_group_log_ms_ = 0;
  uint64_t stale_leader_removed_ = 0;  // epoch of my previous incarnation's leader key
  bool campaign_unclean_ = false;      // while a campaign's answer is applied

  // Primary.
  std::vector<Follower> followers_;  // by member index
  std::deque<Entry> log_;            // lsns (log_.front().lsn ..]
  size_t log_bytes_ = 0;
  std::deque<Waiter> waiters_;  // by lsn
  std::vector<std::pair<Done, Status>> completions_;
  uint64_t committed_ = 0;
  uint64_t start_log_epoch_ = 0, start_lsn_ = 0;  // this primary's state when elected
  std::vector<Member> isr_;                       // as in the KvStore (this epoch)
  uint64_t isr_mod_revision_ = 0;
  bool isr_absent_ = true;
  std::vector<Member> isr_writing_;  // being written (counted until known)
  uint64_t next_token_ = 1, snapshot_serial_ = 0;

  ReplicaStats counters_;
  // etcd failures are warned about once per kKvWarnEveryMs (the rest at debug level), so
  // an unreachable etcd is visible in the log without flooding it.
  static constexpr uint64_t kKvWarnEveryMs = 10000;
  uint64_t kv_warned_ms_ = 0;
  uint64_t kv_failures_unwarned_ = 0;
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_REPLICA_CORE_H_
