#include "ps/replica_core.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <tuple>

#include "common/hash.h"

namespace onlineps::ps {

namespace {

// Flags of replication messages (their own ops, so no clash with request flags).
constexpr uint32_t kFlagSteppingDown = 1u << 1;  // primary -> backups: re-read etcd now
constexpr uint32_t kFlagLeaving = 1u << 2;       // backup -> primary (kReplStatus): I stop
// A re-syncing backup starts holding commits (joining) only this close to the primary:
// the entries after its ack fit in this many bytes, which it applies in milliseconds.
constexpr size_t kJoinBytes = size_t{16} << 20;
// Memory a log entry holds beyond its payload, as max_log_bytes counts it: the frame
// vector's allocation, and per frame the shared owner (control block and allocation).
constexpr size_t kEntryOverheadBytes = 32;
constexpr size_t kFrameOverheadBytes = 64;

std::string Hex(uint64_t v) { return IncarnationHex(v); }
uint64_t FromHex(const std::string& s) { return ParseIncarnation(s); }

uint64_t SpecU64(const Header& h, const char* key) {
  auto it = h.spec.find(key);
  return it == h.spec.end() ? 0 : ParseSpecU64(it->second).value_or(0);
}

}  // namespace

ReplicaCore::ReplicaCore(ReplicaConfig config, ReplicaEnv* env)
    : config_(std::move(config)),
      env_(env),
      group_(config_.group),
      followers_(config_.members.size()) {}

void ReplicaCore::Start(uint64_t now) {
  if (role_ != Role::kNew) return;
  role_ = Role::kFollower;
  if (config_.restored) {
    lsn_ = config_.restored_lsn;
    log_epoch_ = config_.restored_log_epoch;
    // A checkpoint of an unclean stop may be older than what this replica acknowledged:
    // its lsn only ranks it; it reloads from the primary before anything else.
    need_snapshot_ = !config_.restored_exact;
    has_data_ = true;
  }
  epoch_ = log_epoch_;
  leaderless_since_ms_ = now;
  counters_.incarnation = config_.incarnation;
  counters_.restored_in_place = config_.restored && config_.restored_exact;
  counters_.restored_lsn = config_.restored ? config_.restored_lsn : 0;
  LeaseTick(now);
  read_now_ = true;
}

// ------------------------------------------------------------------------------ KvStore

uint64_t ReplicaCore::Call(uint64_t now, KvPurpose purpose, KvCall call) {
  const uint64_t id = next_id_++;
  Pending p;
  p.purpose = purpose;
  p.sent_ms = now;
  p.deadline_ms = now + config_.kv_timeout_ms;
  pending_[id] = std::move(p);
  env_->Kv(id, std::move(call));
  return id;
}

void ReplicaCore::KvFailed(uint64_t now, uint64_t id, const Pending& p, const std::string& why) {
  counters_.kv_errors++;
  if (kv_warned_ms_ == 0 || now >= kv_warned_ms_ + kKvWarnEveryMs) {
    spdlog::warn(
        "replica {}: etcd call failed: {}{}; until etcd answers this replica cannot join, "
        "lead or stay in its group",
        config_.index, why,
        kv_failures_unwarned_ == 0
            ? std::string()
            : fmt::format(" ({} more failures since the last warning)", kv_failures_unwarned_));
    kv_warned_ms_ = std::max<uint64_t>(now, 1);
    kv_failures_unwarned_ = 0;
  } else {
    ++kv_failures_unwarned_;
    spdlog::debug("replica {}: etcd call failed: {}", config_.index, why);
  }
  switch (p.purpose) {
    case KvPurpose::kGrant:
      grant_id_ = 0;
      break;
    case KvPurpose::kKeepAlive:
      keepalive_id_ = 0;
      if (late_keepalives_.size() >= 8) late_keepalives_.erase(late_keepalives_.begin());
      late_keepalives_[id] = p.sent_ms;  // its answer may still come, and count
      break;
    case KvPurpose::kRevoke:
      revoke_id_ = 0;
      break;
    case KvPurpose::kRegister:
      register_id_ = 0;
      break;
    case KvPurpose::kRead:
      read_id_ = 0;
      break;
    case KvPurpose::kRemoveStale:
      remove_stale_id_ = 0;
      break;
    case KvPurpose::kResign:
      break;
    case KvPurpose::kCampaign:
      // It may have won: the next read shows it (and ApplyView takes the leadership).
      campaign_id_ = 0;
      if (role_ == Role::kCampaigning) role_ = Role::kFollower;
      read_now_ = true;
      break;
    case KvPurpose::kSetIsr:
      // It may have been written: its members stay counted (isr_writing_) until a later
      // write succeeds, after which this one can never apply.
      isr_id_ = 0;
      read_now_ = true;
      break;
  }
  (void)now;
}

void ReplicaCore::OnKv(uint64_t now, uint64_t id, const KvResult& r) {
  auto it = pending_.find(id);
  if (it == pending_.end()) {
    // Timed out already. A late renewal still counts from when it was sent.
    auto late = late_keepalives_.find(id);
    if (late != late_keepalives_.end()) {
      if (r.status.ok() && r.ttl_s > 0 && lease_ != 0 && r.lease == lease_) {
        lease_deadline_ms_ = std::max(lease_deadline_ms_,
                                      late->second + static_cast<uint64_t>(r.ttl_s) * 1000 * 3 / 4);
      }
      late_keepalives_.erase(late);
    }
    return;
  }
  Pending p = std::move(it->second);
  pending_.erase(it);
  if (!r.status.ok()) return KvFailed(now, id, p, r.status.ToString());
  switch (p.purpose) {
    case KvPurpose::kGrant:
      grant_id_ = 0;
      if (role_ == Role::kStopped) return;
      lease_ = r.lease;
      lease_ttl_ms_ = static_cast<uint64_t>(std::max<int64_t>(r.ttl_s, 1)) * 1000;
      lease_deadline_ms_ = p.sent_ms + lease_ttl_ms_ * 3 / 4;
      last_keepalive_ms_ = now;
      registered_ = false;
      Register(now);
      return;
    case KvPurpose::kKeepAlive:
      keepalive_id_ = 0;
      if (role_ == Role::kStopped || lease_ == 0) return;
      if (r.ttl_s <= 0) {
        spdlog::warn("replica {}: its etcd lease expired", config_.index);
        lease_ = 0;
        registered_ = false;
        if (role_ == Role::kPrimary || role_ == Role::kEstablishing) {
          StepDown(now, "its etcd lease expired");
        }
        return;
      }
      lease_ttl_ms_ = static_cast<uint64_t>(r.ttl_s) * 1000;
      lease_deadline_ms_ = std::max(lease_deadline_ms_, p.sent_ms + lease_ttl_ms_ * 3 / 4);
      return;
    case KvPurpose::kRevoke:
      revoke_id_ = 0;
      return;
    case KvPurpose::kRegister:
      register_id_ = 0;
      if (r.succeeded) {
        registered_ = true;
        registered_as_ =
            Registration{config_.incarnation, log_epoch_, lsn_, need_snapshot_, has_data_};
      }
      return;
    case KvPurpose::kRead:
      read_id_ = 0;
      ApplyView(now, r.entries, id);
      return;
    case KvPurpose::kCampaign:
      campaign_id_ = 0;
      if (role_ == Role::kCampaigning) role_ = Role::kFollower;
      campaign_unclean_ = p.unclean;
      // Won or lost, the read in the same transaction says who leads; ApplyView takes
      // the leadership when it is this replica's.
      ApplyView(now, r.entries, id);
      campaign_unclean_ = false;
      return;
    case KvPurpose::kSetIsr:
      isr_id_ = 0;
      if (role_ != Role::kPrimary && role_ != Role::kEstablishing) return;
      if (r.succeeded) {
        isr_ = p.isr;
        isr_writing_.clear();
        isr_absent_ = false;
        for (const KvEntry& e : r.entries)
          if (e.key == group_.isr_key()) isr_mod_revision_ = e.mod_revision;
        if (role_ == Role::kEstablishing) {
          role_ = Role::kPrimary;
          spdlog::warn("replica {}: primary of epoch {} at lsn {}", config_.index, epoch_, lsn_);
        }
      }
      ApplyView(now, r.entries, id);
      ReleaseCommitted();
      return;
    case KvPurpose::kRemoveStale:
      remove_stale_id_ = 0;
      read_now_ = true;
      return;
    case KvPurpose::kResign:
      read_now_ = true;
      return;
  }
}

void ReplicaCore::ApplyView(uint64_t now, const std::vector<KvEntry>& entries, uint64_t call_id) {
  if (role_ == Role::kStopped) return;
  // Answers can overtake each other: a read issued before a write must not undo what
  // the write's own answer taught (calls are numbered in the order they were made).
  if (call_id < view_call_id_) return;
  view_call_id_ = call_id;
  std::vector<std::string> skipped;
  const View v = group_.Parse(entries, &skipped);
  for (const std::string& key : skipped) {
    spdlog::warn("replica {}: etcd key {} does not hold what onlineps writes there; ignored",
                 config_.index, key);
  }
  view_ = v;
  view_valid_ = true;
  view_ms_ = now;

  if (!v.has_leader) {
    leader_known_ = false;
    if (leaderless_since_ms_ == 0) leaderless_since_ms_ = now;
    if (role_ == Role::kPrimary || role_ == Role::kEstablishing) {
      StepDown(now, "its leadership is gone from etcd (lease expired or revoked)");
    }
    return;
  }
  leaderless_since_ms_ = 0;
  if (!leader_known_ || leader_.epoch != v.leader.epoch) ClearEarly();
  leader_known_ = true;
  leader_ = v.leader;
  const bool mine = v.leader.index == config_.index && v.leader.incarnation == config_.incarnation;
  if (role_ == Role::kPrimary || role_ == Role::kEstablishing) {
    if (!mine || v.leader.epoch != epoch_) {
      StepDown(now, "etcd names replica " + std::to_string(v.leader.index) + " of epoch " +
                        std::to_string(v.leader.epoch) + " as primary");
      return;
    }
    if (isr_id_ == 0 && v.has_isr && v.isr_epoch == epoch_ &&
        v.isr_mod_revision > isr_mod_revision_) {
      // A write whose answer was lost did land.
      isr_ = v.isr;
      isr_mod_revision_ = v.isr_mod_revision;
      isr_absent_ = false;
      isr_writing_.clear();
      if (role_ == Role::kEstablishing) role_ = Role::kPrimary;
    }
    return;
  }
  if (mine && v.leader.lease == lease_) {
    // This replica holds the leadership on its current lease: a campaign whose answer was
    // lost, or a lease that outlived a step-down. Take it back while the lease is valid.
    if (lease_ != 0 && now < lease_deadline_ms_ && role_ != Role::kNew) {
      Won(now, v.leader.epoch, campaign_unclean_);
    }
    return;
  }
  if (v.leader.index == config_.index && remove_stale_id_ == 0 &&
      stale_leader_removed_ != v.leader.epoch) {
    // The leadership of this replica's previous process (it restarted faster than that
    // lease expires; with a clean stop, even under the same incarnation): that process
    // is gone and its lease is not ours, so free the key now.
    spdlog::warn(
        "replica {}: removing the leadership of epoch {} held by my previous process "
        "(incarnation {})",
        config_.index, v.leader.epoch, Hex(v.leader.incarnation));
    stale_leader_removed_ = v.leader.epoch;
    KvCall call;
    call.kind = KvCall::Kind::kTxn;
    call.txn = group_.RemoveLeader(v.leader.epoch, v.epoch_base);
    remove_stale_id_ = Call(now, KvPurpose::kRemoveStale, std::move(call));
    return;
  }
  epoch_ = std::max(epoch_, v.leader.epoch);
}

void ReplicaCore::LeaseTick(uint64_t now) {
  if (lease_ == 0) {
    if (grant_id_ == 0) {
      KvCall call;
      call.kind = KvCall::Kind::kGrant;
      call.ttl_s = static_cast<int64_t>((config_.lease_ms + 999) / 1000);
      grant_id_ = Call(now, KvPurpose::kGrant, std::move(call));
    }
    return;
  }
  if (keepalive_id_ == 0 && now - last_keepalive_ms_ >= lease_ttl_ms_ / 4) {
    KvCall call;
    call.kind = KvCall::Kind::kKeepAlive;
    call.lease = lease_;
    keepalive_id_ = Call(now, KvPurpose::kKeepAlive, std::move(call));
    last_keepalive_ms_ = now;
  }
  if (now >= lease_deadline_ms_ && (role_ == Role::kPrimary || role_ == Role::kEstablishing)) {
    StepDown(now, "its etcd lease could not be renewed for " +
                      std::to_string(now - lease_deadline_ms_ + lease_ttl_ms_ * 3 / 4) + " ms");
  }
}

void ReplicaCore::Register(uint64_t now) {
  if (lease_ == 0 || register_id_ != 0) return;
  KvCall call;
  call.kind = KvCall::Kind::kTxn;
  call.txn = group_.Register(config_.index, config_.members[config_.index],
                             Registration{config_.incarnation, log_epoch_, lsn_, need_snapshot_,
                                          has_data_, 0, highest_epoch()},
                             lease_);
  register_id_ = Call(now, KvPurpose::kRegister, std::move(call));
  last_register_ms_ = now;
}

bool ReplicaCore::InIsr(const View& v) const {
  return std::find(v.isr.begin(), v.isr.end(), Member{config_.index, config_.incarnation}) !=
         v.isr.end();
}

void ReplicaCore::MaybeCampaign(uint64_t now) {
  if (role_ != Role::kFollower || applying_ || campaign_id_ != 0) return;
  if (!view_valid_ || view_.has_leader || now - view_ms_ > 3 * config_.heartbeat_ms + 100) return;
  if (lease_ == 0 || now >= lease_deadline_ms_ || !registered_) return;
  // A replica whose registration is stale (its state changed) re-registers first, so the
  // others rank it by what it holds now.
  const Registration current{config_.incarnation, log_epoch_, lsn_, need_snapshot_, has_data_};
  if (registered_as_.log_epoch != current.log_epoch || registered_as_.lsn != current.lsn ||
      registered_as_.need != current.need || registered_as_.data != current.data) {
    if (now - last_register_ms_ >= config_.heartbeat_ms) Register(now);
    return;
  }
  auto rank = [](uint32_t index, const Registration& r) {
    return std::make_tuple(r.log_epoch, r.lsn, r.data ? 1 : 0, r.need ? 0 : 1,
                           -static_cast<int64_t>(index));
  };
  auto best = [&]() -> int64_t {
    int64_t who = -1;
    std::tuple<uint64_t, uint64_t, int, int, int64_t> top{};
    for (const auto& [index, reg] : view_.members) {
      if (index >= config_.members.size()) continue;
      if (who < 0 || rank(index, reg) > top) {
        who = index;
        top = rank(index, reg);
      }
    }
    return who;
  };
  auto wait = [&](const std::string& why) {
    if (now - last_wait_log_ms_ >= 10000) {
      spdlog::warn("replica {}: no primary; {}", config_.index, why);
      last_wait_log_ms_ = now;
    }
  };
  if (view_.has_isr) {
    // An ISR member holds every acknowledged update, even when its history cannot be
    // continued by a stream (need_snapshot_: its followers then reload from it).
    if (InIsr(view_)) return Campaign(now, false, "in-sync replica");
    // Every ISR member came back as a new incarnation: their memory is gone, so the most
    // recent state anywhere is the best that is left. A member is known gone when its
    // index registered another incarnation after the ISR was written (a replica registers
    // before it can enter the ISR, so an older registration of another incarnation may be
    // a predecessor's that outlived it).
    auto mine = view_.members.find(config_.index);
    if (mine != view_.members.end() && mine->second.mod_revision < view_.isr_mod_revision) {
      if (now - last_register_ms_ >= config_.heartbeat_ms) Register(now);  // seen as alive
      return;
    }
    std::string isr_text;
    for (const Member& m : view_.isr) {
      isr_text +=
          (isr_text.empty() ? "" : ",") + std::to_string(m.index) + "@" + Hex(m.incarnation);
    }
    for (const Member& m : view_.isr) {
      auto reg = view_.members.find(m.index);
      if (reg == view_.members.end() || reg->second.incarnation == m.incarnation ||
          reg->second.mod_revision < view_.isr_mod_revision) {
        return wait("waiting for an in-sync replica (ISR " + isr_text + ")");
      }
    }
    // An unclean election is the last resort: rank everyone, so wait for every replica to
    // register (or unclean_wait_ms), as a replica whose lease lapsed re-registers. Rank
    // only registrations written after the ISR: a live replica keeps the registration of
    // its start (say, empty) while it follows a primary, and re-registers what it holds
    // only when it finds no primary (above, and when its state differs). Ranked by such
    // an old registration, a replica that re-synced from the lost ISR members (and left
    // the ISR only to reload, say) lost to a restarted one with an older checkpoint, and
    // the updates it alone held were gone (seed 26152).
    size_t fresh = 0;
    for (const auto& [index, reg] : view_.members) {
      if (index < config_.members.size() && reg.mod_revision > view_.isr_mod_revision) fresh++;
    }
    const bool all = fresh >= config_.members.size();
    if (!all && now - leaderless_since_ms_ < config_.unclean_wait_ms) {
      return wait("every in-sync replica restarted; waiting for all replicas to register");
    }
    if (best() == config_.index) {
      return Campaign(now, true,
                      "every in-sync replica (" + isr_text +
                          ") restarted without its state; this replica holds the most recent "
                          "state left (epoch " +
                          std::to_string(log_epoch_) + ", lsn " + std::to_string(lsn_) + ")");
    }
    return wait("every in-sync replica restarted; a replica with more recent state takes over");
  }
  // A new group: wait for every replica (or bootstrap_wait_ms), then the best one starts.
  // A replica holding data means etcd lost the group's records (wiped or replaced) while
  // the replicas kept their checkpoints: forming the group is then an unclean election,
  // and one not registered yet may hold the newest state, so it is waited for as long
  // (unclean_wait_ms). Before, a replica 4 s late was overwritten by an older one's
  // snapshot.
  const bool all = view_.members.size() >= config_.members.size();
  bool data = has_data_;
  for (const auto& [index, reg] : view_.members) data = data || reg.data;
  const uint64_t wait_ms = data ? std::max(config_.bootstrap_wait_ms, config_.unclean_wait_ms)
                                : config_.bootstrap_wait_ms;
  if (!all && now - leaderless_since_ms_ < wait_ms) {
    if (data)
      wait("no group in etcd, but replicas hold data; waiting for all replicas to register");
    return;
  }
  if (best() == config_.index)
    Campaign(now, false, all ? "new group" : "new group (not all replicas registered)");
}

void ReplicaCore::Campaign(uint64_t now, bool unclean, const std::string& why) {
  spdlog::info("replica {}: campaigning for primary: {}", config_.index, why);
  KvCall call;
  call.kind = KvCall::Kind::kTxn;
  // A new group's epochs start above every epoch a replica registered (and the base
  // before, should a group have formed without writing its ISR): after etcd lost its data,
  // revisions start over, and epochs of the new history must still rank above the old.
  // Above the epochs the replicas followed too, not only those they logged: a primary
  // elected after the last update has a higher epoch than its log, and its clients,
  // which saw it, took a new primary below it for a deposed one (for good).
  uint64_t base = std::max({view_.epoch_base, log_epoch_, highest_epoch()});
  for (const auto& [index, reg] : view_.members) {
    base = std::max({base, reg.log_epoch, reg.epoch});
  }
  call.txn = group_.Campaign(view_, Member{config_.index, config_.incarnation},
                             config_.members[config_.index], lease_, base);
  role_ = Role::kCampaigning;
  campaign_id_ = Call(now, KvPurpose::kCampaign, std::move(call));
  pending_[campaign_id_].unclean = unclean;
}

void ReplicaCore::Won(uint64_t now, uint64_t epoch, bool unclean) {
  role_ = Role::kEstablishing;
  epoch_ = epoch;
  leader_ = Leader{config_.index, config_.incarnation, epoch};
  leader_known_ = true;
  if (need_snapshot_) {
    // Elected on a state no stream can continue (restored, or an update applied after it
    // stopped leading): no backup shares its history, so they all reload from it.
    need_snapshot_ = false;
    log_epoch_ = epoch;
  }
  start_log_epoch_ = log_epoch_;
  start_lsn_ = lsn_;
  // Unknown until the members kept in the ISR acknowledge: a retried push already in this
  // replica's state (a duplicate) is answered only once they have it too.
  committed_ = 0;
  log_.clear();
  log_bytes_ = 0;
  for (Follower& f : followers_) {
    f = Follower{};
    f.next = lsn_ + 1;
    f.last_ack_ms = now;
  }
  // The members of the old ISR that etcd still sees alive stay in it, counted for commits
  // from the start: each holds every acknowledged update, so the ISR never shrinks to a
  // new primary alone while others could take over. One that cannot follow this primary's
  // history reloads, and leaves the ISR meanwhile.
  for (const Member& m : view_.isr) {
    auto reg = view_.members.find(m.index);
    if (m.index == config_.index || m.index >= followers_.size() || reg == view_.members.end() ||
        reg->second.incarnation != m.incarnation) {
      continue;
    }
    Follower& f = followers_[m.index];
    f.inc_known = true;
    f.inc = m.incarnation;
    f.want = true;
  }
  isr_.clear();
  isr_writing_.clear();
  isr_absent_ = !view_.has_isr;
  isr_mod_revision_ = view_.isr_mod_revision;
  counters_.promotions++;
  if (unclean) counters_.unclean_elections++;
  spdlog::warn("replica {}: won the election{}: epoch {} at lsn {}", config_.index,
               unclean ? " (unclean: updates only the lost replicas had are gone)" : "", epoch,
               lsn_);
  WriteIsr(now);
}

void ReplicaCore::WriteIsr(uint64_t now) {
  if (isr_id_ != 0) return;
  std::vector<Member> desired{Member{config_.index, config_.incarnation}};
  {
    for (size_t m = 0; m < followers_.size(); ++m) {
      if (m != config_.index && followers_[m].want) {
        desired.push_back(Member{static_cast<uint32_t>(m), followers_[m].inc});
      }
    }
  }
  std::sort(desired.begin(), desired.end());
  if (role_ == Role::kPrimary && desired == isr_ && isr_writing_.empty()) return;
  KvCall call;
  call.kind = KvCall::Kind::kTxn;
  call.txn = group_.WriteIsr(epoch_, view_.epoch_base, isr_absent_, isr_mod_revision_, desired);
  for (const Member& m : desired)
    if (std::find(isr_writing_.begin(), isr_writing_.end(), m) == isr_writing_.end())
      isr_writing_.push_back(m);
  isr_id_ = Call(now, KvPurpose::kSetIsr, std::move(call));
  pending_[isr_id_].isr = desired;
}

// ------------------------------------------------------------------------------ ticks

void ReplicaCore::Tick(uint64_t now) {
  if (role_ == Role::kNew) return;
  std::vector<uint64_t> expired;
  for (const auto& [id, p] : pending_)
    if (now >= p.deadline_ms) expired.push_back(id);
  for (uint64_t id : expired) {
    Pending p = std::move(pending_[id]);
    pending_.erase(id);
    KvFailed(now, id, p, "no answer in " + std::to_string(config_.kv_timeout_ms) + " ms");
  }
  if (role_ == Role::kStopped) return;
  LeaseTick(now);
  if (lease_ != 0 && !registered_ && register_id_ == 0) Register(now);
  if ((read_now_ || now - last_read_ms_ >= config_.heartbeat_ms) && read_id_ == 0) {
    KvCall call;
    call.kind = KvCall::Kind::kRange;
    call.prefix = config_.group;
    read_id_ = Call(now, KvPurpose::kRead, std::move(call));
    last_read_ms_ = now;
    read_now_ = false;
  }
  if (role_ == Role::kPrimary || role_ == Role::kEstablishing) {
    PrimaryTick(now);
  } else if (role_ == Role::kFollower) {
    MaybeCampaign(now);
  }
}

uint64_t ReplicaCore::NextTickMs(uint64_t now) const {
  return now + std::max<uint64_t>(config_.heartbeat_ms / 4, 5);
}

void ReplicaCore::PrimaryTick(uint64_t now) {
  for (size_t m = 0; m < followers_.size(); ++m) {
    if (m == config_.index) continue;
    FollowerTick(now, m, followers_[m]);
    if (role_ != Role::kPrimary && role_ != Role::kEstablishing) return;
  }
  // Trim what every streaming backup has; a backup waiting for a snapshot, or re-syncing
  // from one, pins the entries after the snapshot's lsn (or its ack). The caps bound
  // memory for ones that lag; the entry cap spares pinned entries: a backup whose load
  // took longer than max_log_entries pushes found the entries after its snapshot gone,
  // was sent another, and under steady writes never rejoined.
  uint64_t keep_after = lsn_, pinned_after = lsn_;
  for (size_t m = 0; m < followers_.size(); ++m) {
    if (m == config_.index) continue;
    const Follower& f = followers_[m];
    if (f.state == FollowState::kStream) keep_after = std::min(keep_after, f.acked);
    if (f.state == FollowState::kSnapshot) pinned_after = std::min(pinned_after, f.pin);
    if (f.state == FollowState::kStream && f.resyncing) {
      pinned_after = std::min(pinned_after, std::max(f.acked, f.snapshot_at));
    }
  }
  keep_after = std::min(keep_after, pinned_after);
  while (!log_.empty() &&
         (log_.front().lsn <= keep_after ||
          (log_.size() > config_.max_log_entries && log_.front().lsn <= pinned_after) ||
          log_bytes_ > config_.max_log_bytes)) {
    log_bytes_ -= log_.front().bytes;
    log_.pop_front();
  }
  WriteIsr(now);
  ReleaseCommitted();
}

void ReplicaCore::FollowerTick(uint64_t now, size_t m, Follower& f) {
  if (f.want && now - f.last_ack_ms > config_.follower_timeout_ms) {
    spdlog::warn("replica {}: backup {} silent for {} ms; removing it from the ISR", config_.index,
                 m, now - f.last_ack_ms);
    f.want = false;
    f.state = FollowState::kProbe;
  } else if (!f.want && f.state != FollowState::kProbe &&
             now - f.last_ack_ms > 2 * config_.follower_timeout_ms) {
    f.state = FollowState::kProbe;  // a silent catching-up backup no longer pins the log
  }
  if (f.joining && (f.want || f.state != FollowState::kStream)) f.joining = false;
  // A joining backup holds every commit: it must keep acknowledging, and reach the commit
  // point within the follower timeout. Else commits go on without it, and it tries again
  // after twice as long as the time before (from 2x the follower timeout, at most 32x).
  if (f.joining && (now - f.join_ms > config_.follower_timeout_ms ||
                    now - f.progress_ms > 4 * config_.heartbeat_ms)) {
    f.join_wait_ms = f.join_wait_ms == 0
                         ? 2 * config_.follower_timeout_ms
                         : std::min(2 * f.join_wait_ms, 32 * config_.follower_timeout_ms);
    spdlog::warn(
        "replica {}: backup {} did not catch up in {} ms (last progress {} ms ago); commits "
        "no longer wait for it; it tries again in {} ms",
        config_.index, m, now - f.join_ms, now - f.progress_ms, f.join_wait_ms);
    f.joining = false;
  }
  if (f.state == FollowState::kStream) {
    const uint64_t first = log_.empty() ? lsn_ + 1 : log_.front().lsn;
    if (f.next < first) return RequestSnapshot(now, m, f);  // the entries it needs are gone
    if (f.next > f.acked + 1 && now - f.progress_ms > 4 * config_.heartbeat_ms) {
      // Lost in flight: resend. An entry the caps trimmed since cannot be: resent from
      // the log's first, the backup waited for it for ever (and commits for the backup).
      if (!f.awaiting_load && f.acked + 1 < first) return RequestSnapshot(now, m, f);
      f.next = std::max(f.acked + 1, first);
      f.progress_ms = now;
    }
    while (f.next <= lsn_ && f.next <= f.acked + config_.window) {
      env_->Send(m, log_[f.next - first].frames);
      f.next++;
      f.last_send_ms = now;
    }
  }
  if (now - f.last_heartbeat_ms >= config_.heartbeat_ms) {
    Header h;
    h.op = Op::kReplicate;
    h.seq = lsn_;
    h.base_version = log_epoch_;
    SendTo(m, h);
    f.last_heartbeat_ms = now;
  }
}

void ReplicaCore::RequestSnapshot(uint64_t now, size_t m, Follower& f) {
  f.snapshot_rx = 0;
  f.state = FollowState::kSnapshot;
  f.want = false;
  f.joining = false;
  f.awaiting_load = false;
  f.snapshot_token = next_token_++;
  f.pin = lsn_;
  f.snapshot_ms = now;
  env_->TakeSnapshot(m, f.snapshot_token);
}

void ReplicaCore::OnSnapshot(uint64_t now, size_t m, uint64_t token,
                             const StatusOr<std::string>& bytes, uint64_t at) {
  if ((role_ != Role::kPrimary && role_ != Role::kEstablishing) || m >= followers_.size()) return;
  Follower& f = followers_[m];
  if (f.state != FollowState::kSnapshot || f.snapshot_token != token) return;
  const uint64_t first = log_.empty() ? lsn_ + 1 : log_.front().lsn;
  if (!bytes.ok() || at > lsn_ || at + 1 < first) {
    spdlog::error("replica {}: snapshot for backup {} not sent: {}", config_.index, m,
                  bytes.ok() ? "its lsn is outside the log" : bytes.status().ToString());
    f.state = FollowState::kProbe;
    return;
  }
  // In parts of snapshot_chunk_bytes: a shard's state can be far larger than one message
  // may be. The backup puts them together in any order and loads once it has them all.
  const std::string& state = *bytes;
  const size_t chunk = std::max<size_t>(config_.snapshot_chunk_bytes, 1);
  const size_t parts = std::max<size_t>((state.size() + chunk - 1) / chunk, 1);
  const uint64_t id = (config_.incarnation << 20) ^ (++snapshot_serial_);
  for (size_t i = 0; i < parts; ++i) {
    Header h;
    h.op = Op::kReplSnapshot;
    h.seq = at;
    h.base_version = EntryEpoch(at);
    h.spec = {{"snap", std::to_string(id)},
              {"part", std::to_string(i)},
              {"parts", std::to_string(parts)},
              {"bytes", std::to_string(state.size())}};
    SendTo(m, h, {Frame::FromString(state.substr(i * chunk, chunk))});
  }
  f.state = FollowState::kStream;
  f.awaiting_load = true;
  f.resyncing = true;
  f.snapshot_at = at;
  f.snapshot_bytes = state.size();
  f.acked = 0;
  f.next = at + 1;
  f.progress_ms = f.last_send_ms = f.snapshot_ms = now;
  counters_.snapshots_sent++;
  spdlog::info("replica {}: sent backup {} a snapshot at lsn {} ({} bytes in {} part(s))",
               config_.index, m, at, state.size(), parts);
}

uint64_t ReplicaCore::EntryEpoch(uint64_t lsn) const {
  return lsn <= start_lsn_ ? start_log_epoch_ : epoch_;
}

bool ReplicaCore::Consistent(uint64_t log_epoch, uint64_t lsn) const {
  if (log_epoch == start_log_epoch_ && lsn == start_lsn_) return true;
  return log_epoch == epoch_ && lsn > start_lsn_ && lsn <= lsn_;
}

void ReplicaCore::OnReply(uint64_t now, size_t m, const Header& r) {
  if ((role_ != Role::kPrimary && role_ != Role::kEstablishing) || m >= followers_.size() ||
      m == config_.index) {
    return;
  }
  if (r.code != StatusCode::kOk || r.epoch != epoch_) {
    if (r.epoch > epoch_) read_now_ = true;  // maybe deposed: etcd says
    if (auto grp = r.spec.find("grp");
        grp != r.spec.end() && grp->second != GroupId() && now - last_group_log_ms_ >= 10000) {
      // Configured as another group: two groups in different etcd namespaces each elect a
      // primary, both acknowledging writes for the same shard.
      spdlog::error(
          "replica {}: replica {} ({}) belongs to another replica group: every replica of a "
          "shard needs the same --etcd-prefix, --shard-index, --num-shards and --replicas "
          "list. This group runs without it, and it may serve as a primary of its own",
          config_.index, m, config_.members[m]);
      last_group_log_ms_ = now;
    }
    if ((r.code == StatusCode::kTooLarge || r.code == StatusCode::kMalformed) &&
        now - last_refusal_log_ms_ >= 10000) {
      // Not a matter of epochs: the backup cannot take what is sent (a smaller
      // --max-message-mb there?). Say so; it will not re-sync until that changes.
      spdlog::warn("replica {}: backup {} refused a replication message: {}", config_.index, m,
                   r.message);
      last_refusal_log_ms_ = now;
    }
    return;
  }
  auto inc_it = r.spec.find("inc");
  if (inc_it == r.spec.end()) return;
  const uint64_t inc = FromHex(inc_it->second);
  const uint64_t lsn = SpecU64(r, "lsn"), le = SpecU64(r, "le");
  const bool need = r.spec.count("need") > 0;
  Follower& f = followers_[m];
  if (!f.inc_known || f.inc != inc) {
    if (f.inc_known) {
      spdlog::warn("replica {}: backup {} restarted (incarnation {} -> {}); catching it up",
                   config_.index, m, Hex(f.inc), Hex(inc));
    }
    f = Follower{};
    f.inc_known = true;
    f.inc = inc;
    f.next = lsn_ + 1;
  }
  f.last_ack_ms = now;
  const uint64_t first = log_.empty() ? lsn_ + 1 : log_.front().lsn;
  switch (f.state) {
    case FollowState::kSnapshot:
      break;  // waiting for the snapshot to be taken
    case FollowState::kProbe:
      if (!need && Consistent(le, lsn) && lsn + 1 >= first) {
        f.state = FollowState::kStream;
        f.acked = lsn;
        f.next = lsn + 1;
        f.progress_ms = now;
        f.resyncing = false;  // lagging in the stream: the entry cap applies
      } else {
        RequestSnapshot(now, m, f);
      }
      break;
    case FollowState::kStream:
      if (f.awaiting_load) {
        if (!need && lsn >= f.snapshot_at && Consistent(le, lsn)) {
          f.awaiting_load = false;
        } else {
          // Parts arriving count as progress; the load itself gets time by size (at
          // 20 MB/s, far below what a load takes).
          const uint64_t rx = SpecU64(r, "snap_rx");
          if (rx > f.snapshot_rx) {
            f.snapshot_rx = rx;
            f.snapshot_ms = now;
          }
          if (now - f.snapshot_ms > config_.follower_timeout_ms + f.snapshot_bytes / 20000) {
            RequestSnapshot(now, m, f);
          }
          break;
        }
      }
      if (need || !Consistent(le, lsn)) {
        RequestSnapshot(now, m, f);
        break;
      }
      if (lsn > f.acked) {
        f.acked = lsn;
        f.progress_ms = now;
      }
      if (!f.want && !f.joining && config_.sync && lsn_ - f.acked <= config_.window &&
          BytesAfter(f.acked) <= kJoinBytes &&
          (f.join_ms == 0 || now - f.join_ms >= f.join_wait_ms)) {
        // Under a steady stream of updates the commit point moves on as fast as the backup
        // applies, so an ack that reaches it is a matter of luck (seconds under saturating
        // writers). Counted from now on, commits wait for it and it reaches them within a
        // window (of entries and bytes); it joins the ISR only then, so the ISR still holds
        // every acknowledged update. FollowerTick ends a join that stalls.
        f.joining = true;
        f.join_ms = now;
      }
      // Async mode: the commit point is the primary's last entry, which a backup under
      // steady writes reaches only by luck; an acknowledged update not yet streamed is
      // lost on failover there anyway, so a backup streaming within a window joins.
      if (!f.want &&
          (f.acked >= committed_ || (!config_.sync && lsn_ - f.acked <= config_.window))) {
        f.want = true;  // counted for commits from now on; added to the ISR next
        f.join_ms = f.join_wait_ms = 0;
        f.resyncing = false;
        spdlog::info("replica {}: backup {} caught up at lsn {}; adding it to the ISR",
                     config_.index, m, f.acked);
      }
      break;
  }
  ReleaseCommitted();
}

bool ReplicaCore::Counted(size_t m) const {
  const Follower& f = followers_[m];
  return (f.joining && f.state == FollowState::kStream) || InSync(m);
}

size_t ReplicaCore::BytesAfter(uint64_t lsn) const {
  size_t bytes = 0;
  const uint64_t first = log_.empty() ? lsn_ + 1 : log_.front().lsn;
  for (size_t i = lsn < first ? 0 : lsn + 1 - first; i < log_.size(); ++i) bytes += log_[i].bytes;
  return bytes;
}

bool ReplicaCore::InSync(size_t m) const {
  const Follower& f = followers_[m];
  if (f.want) return true;
  // A member the ISR names (or a write of it may name) counts until that write removing it
  // lands, even when this reign has not heard from it yet (its incarnation unknown: Won
  // reset it, and an older write, answered or adopted later, named it).
  auto named = [&](const std::vector<Member>& v) {
    return std::any_of(v.begin(), v.end(), [&](const Member& x) {
      return x.index == m && (!f.inc_known || x.incarnation == f.inc);
    });
  };
  return named(isr_) || named(isr_writing_);
}

uint64_t ReplicaCore::CommitLsn() const {
  if (!config_.sync) return lsn_;
  if (isr_.size() < config_.min_insync) return committed_;
  uint64_t c = lsn_;
  for (size_t m = 0; m < followers_.size(); ++m) {
    if (m != config_.index && Counted(m)) c = std::min(c, followers_[m].acked);
  }
  return c;
}

void ReplicaCore::ReleaseCommitted() {
  if (role_ != Role::kPrimary) return;
  committed_ = std::max(committed_, CommitLsn());
  while (!waiters_.empty() && waiters_.front().lsn <= committed_) {
    completions_.emplace_back(std::move(waiters_.front().done), Status::Ok());
    waiters_.pop_front();
  }
}

void ReplicaCore::FailWaiters(const Status& st) {
  for (Waiter& w : waiters_) completions_.emplace_back(std::move(w.done), st);
  waiters_.clear();
}

void ReplicaCore::StepDown(uint64_t now, const std::string& why) {
  spdlog::warn("replica {}: stepping down from primary of epoch {}: {}", config_.index, epoch_,
               why);
  const bool lost_lease = now >= lease_deadline_ms_;
  role_ = Role::kFollower;
  counters_.step_downs++;
  FailWaiters(NotPrimary("not primary any more (" + why + ")"));
  log_.clear();
  log_bytes_ = 0;
  for (Follower& f : followers_) f = Follower{};
  isr_.clear();
  isr_writing_.clear();
  leader_known_ = false;
  read_now_ = true;
  if (lost_lease && lease_ != 0) {
    // Give the leadership up in etcd too, should etcd still hold it.
    KvCall call;
    call.kind = KvCall::Kind::kTxn;
    call.txn = group_.RemoveLeader(epoch_, view_.epoch_base);
    Call(now, KvPurpose::kResign, std::move(call));
  }
}

void ReplicaCore::SendTo(size_t m, Header h, Frames payload) {
  h.epoch = epoch_;
  h.sender = config_.index;
  Frames frames;
  frames.reserve(1 + payload.size());
  frames.push_back(Frame::FromString(EncodeHeader(h)));
  for (Frame& f : payload) frames.push_back(std::move(f));
  env_->Send(m, std::move(frames));
}

// ------------------------------------------------------------------------------ clients

Status ReplicaCore::CheckPrimary(uint64_t now, uint64_t client_epoch,
                                 std::optional<uint32_t>* primary) {
  if (client_epoch > epoch_) read_now_ = true;  // verify with etcd; never trusted alone
  if (role_ == Role::kPrimary && now < lease_deadline_ms_) return Status::Ok();
  if (role_ == Role::kEstablishing || role_ == Role::kPrimary) {
    return Unavailable("replica " + std::to_string(config_.index) + " is taking over as primary");
  }
  if (role_ == Role::kStopped) {
    return NotPrimary("shard replica shutting down; retry on the new primary");
  }
  if (leader_known_ && leader_.index != config_.index && leader_.index < config_.members.size()) {
    // Clients read the index from the reply's "pri" field; the text is for people.
    if (primary != nullptr) *primary = static_cast<uint32_t>(leader_.index);
    return NotPrimary("not primary; primary is replica " + std::to_string(leader_.index) + " (" +
                      config_.members[leader_.index] + ")");
  }
  return NotPrimary("not primary; no primary known (election in progress)");
}

uint64_t ReplicaCore::Append(const Frames& request) {
  if (role_ != Role::kPrimary) {
    // Applied while this replica stopped leading: its state now holds an update no
    // history has, so it must reload from the primary.
    need_snapshot_ = true;
    return ++lsn_;
  }
  Header h;
  h.op = Op::kReplicate;
  h.epoch = epoch_;
  h.seq = ++lsn_;
  h.sender = config_.index;
  h.base_version = log_epoch_;  // the epoch of the entry before it
  log_epoch_ = epoch_;
  has_data_ = true;
  Entry e{lsn_, {}};
  e.frames.reserve(1 + request.size());
  e.frames.push_back(Frame::FromString(EncodeHeader(h)));
  for (const Frame& f : request) e.frames.push_back(f);
  // What the entry holds in memory, not only its payload: under max_log_bytes, a log of
  // tiny pushes (which a backup re-syncing from a snapshot may keep past max_log_entries)
  // would otherwise hold several times the cap in bookkeeping.
  e.bytes = sizeof(Entry) + kEntryOverheadBytes;
  for (const Frame& f : e.frames) e.bytes += sizeof(Frame) + kFrameOverheadBytes + f.size();
  log_bytes_ += e.bytes;
  log_.push_back(std::move(e));
  return lsn_;
}

void ReplicaCore::WhenCommitted(uint64_t lsn, Done done) {
  if (role_ != Role::kPrimary) {
    completions_.emplace_back(std::move(done),
                              NotPrimary("not primary any more; retry on the new primary"));
    return;
  }
  ReleaseCommitted();
  if (lsn <= committed_) {
    completions_.emplace_back(std::move(done), Status::Ok());
    return;
  }
  waiters_.push_back(Waiter{lsn, std::move(done)});
}

std::vector<std::pair<ReplicaCore::Done, Status>> ReplicaCore::TakeCompletions() {
  std::vector<std::pair<Done, Status>> out;
  out.swap(completions_);
  return out;
}

// ------------------------------------------------------------------------------ backups

Header ReplicaCore::StatusReply(const Header& req) const {
  Header r = MakeReply(req, Status::Ok());
  r.epoch = epoch_;
  r.spec = {{"role", role_ == Role::kPrimary ? "primary" : "backup"},
            {"inc", Hex(config_.incarnation)},
            {"lsn", std::to_string(lsn_)},
            {"le", std::to_string(log_epoch_)}};
  if (need_snapshot_) r.spec["need"] = "snapshot";
  return r;
}

std::string ReplicaCore::GroupId() const {
  std::string all = config_.group;
  for (const std::string& m : config_.members) all += "|" + m;
  return Hex(HashString(all));
}

Header ReplicaCore::Refuse(const Header& req, StatusCode code, const std::string& why) {
  Header r = StatusReply(req);
  r.spec["grp"] = GroupId();  // lets a sender of another group see that it is one
  r.code = code;
  r.message = why;
  return r;
}

ReplicaCore::Action ReplicaCore::BeginMessage(uint64_t now, const Header& h, const Frames& frames,
                                              Header* reply) {
  (void)now;
  if (role_ == Role::kStopped || role_ == Role::kNew) {
    *reply = Refuse(h, StatusCode::kUnavailable, "replica not running");
    return Action::kReply;
  }
  if (!registered_ && h.op != Op::kReplStatus) {
    // Registered first, so that whenever this incarnation is in the ISR, etcd has seen it
    // (the test for "every ISR member is gone" relies on it).
    *reply = Refuse(h, StatusCode::kUnavailable, "replica not registered in etcd yet");
    return Action::kReply;
  }
  if (h.op == Op::kReplStatus) {
    if ((h.flags & kFlagLeaving) && (role_ == Role::kPrimary || role_ == Role::kEstablishing) &&
        h.sender < followers_.size() && h.sender != config_.index) {
      Follower& f = followers_[h.sender];
      auto inc = h.spec.find("inc");
      if (inc != h.spec.end() && f.inc_known && f.inc == FromHex(inc->second)) {
        spdlog::info("replica {}: backup {} is leaving; removing it from the ISR", config_.index,
                     h.sender);
        // Still counted through the ISR until the write that removes it lands.
        f.want = false;
        f.state = FollowState::kProbe;
      }
    }
    *reply = StatusReply(h);
    return Action::kReply;
  }
  if (role_ == Role::kPrimary || role_ == Role::kEstablishing || role_ == Role::kCampaigning) {
    if (h.epoch > epoch_) read_now_ = true;
    counters_.fenced_messages++;
    *reply =
        Refuse(h, StatusCode::kFailedPrecondition,
               "replica " + std::to_string(config_.index) +
                   " is primary or campaigning; replication from replica " +
                   std::to_string(h.sender) + " (epoch " + std::to_string(h.epoch) + ") refused");
    return Action::kReply;
  }
  if (!leader_known_ || h.epoch != leader_.epoch || h.sender != leader_.index) {
    if (!leader_known_ || h.epoch > leader_.epoch) read_now_ = true;
    counters_.fenced_messages++;
    *reply = Refuse(h, StatusCode::kFailedPrecondition,
                    "epoch " + std::to_string(h.epoch) + " from replica " +
                        std::to_string(h.sender) + " is not the primary etcd names (" +
                        (leader_known_ ? "replica " + std::to_string(leader_.index) + ", epoch " +
                                             std::to_string(leader_.epoch)
                                       : std::string("none known")) +
                        ")");
    return Action::kReply;
  }
  epoch_ = h.epoch;
  if (h.flags & kFlagSteppingDown) {
    read_now_ = true;
    *reply = StatusReply(h);
    return Action::kReply;
  }
  if (h.op == Op::kReplSnapshot) {
    if (frames.size() < 2) {
      *reply = Refuse(h, StatusCode::kMalformed, "snapshot without a state frame");
      return Action::kReply;
    }
    if (synced_epoch_ == h.epoch &&
        (h.seq < synced_lsn_ || (h.seq == synced_lsn_ && !need_snapshot_))) {
      // A duplicate or delayed snapshot of this primary's history: loading it would take
      // this replica back in time, under updates it has already acknowledged. (A snapshot
      // this primary sends on purpose is taken at or past what this replica applied of its
      // history; an update applied after this replica stopped leading, whose lsn_ is past
      // that, is no part of it: compared with lsn_, an idle primary's snapshot was ignored.)
      *reply = StatusReply(h);
      return Action::kReply;
    }
    if (!AddSnapshotPart(h, frames[1], reply)) return Action::kReply;
    applying_ = true;
    return Action::kLoad;
  }
  if (frames.size() >= 2 && !need_snapshot_ && h.seq == lsn_ + 1) {
    if (h.base_version == log_epoch_) {
      applying_ = true;
      return Action::kApply;
    }
    need_snapshot_ = true;  // the entry before it differs: another history
    ClearEarly();
  } else if (frames.size() >= 2 && !need_snapshot_ && h.seq > lsn_ + 1 &&
             h.seq <= lsn_ + config_.window && early_.size() < config_.window) {
    size_t bytes = 0;
    for (const Frame& f : frames) bytes += f.size();
    if (early_bytes_ + bytes <= config_.max_log_bytes / 4 &&
        early_.emplace(h.seq, std::make_pair(h, frames)).second) {
      early_bytes_ += bytes;  // overtook an earlier entry: kept until its turn
    }
  }
  // A heartbeat, a duplicate, a gap or a replica that needs a snapshot: the ack says
  // where this replica is.
  *reply = StatusReply(h);
  return Action::kReply;
}

bool ReplicaCore::AddSnapshotPart(const Header& h, const Frame& part, Header* reply) {
  const uint64_t id = SpecU64(h, "snap"), index = SpecU64(h, "part");
  const uint64_t parts = std::max<uint64_t>(SpecU64(h, "parts"), 1);
  const uint64_t total = SpecU64(h, "bytes");
  const uint64_t chunk = std::max<size_t>(config_.snapshot_chunk_bytes, 1);
  if (total > config_.max_snapshot_bytes) {
    *reply = Refuse(h, StatusCode::kTooLarge,
                    "snapshot of " + std::to_string(total) + " bytes exceeds the limit of " +
                        std::to_string(config_.max_snapshot_bytes));
    return false;
  }
  // The primary cuts parts by its own chunk (from its --max-message-mb), which may be
  // smaller than this replica's: bound the count by the smallest part a shard sends.
  const uint64_t min_chunk = std::min<uint64_t>(chunk, uint64_t{64} << 10);
  if (index >= parts || parts > total / min_chunk + 1 || part.size() > chunk) {
    *reply = Refuse(h, StatusCode::kMalformed,
                    "snapshot part " + std::to_string(index) + " of " + std::to_string(parts) +
                        " does not fit");
    return false;
  }
  if (id != snap_.id || h.epoch != snap_.epoch) {  // a new snapshot: the old one is gone
    snap_ = SnapshotAssembly{};
    snap_.id = id;
    snap_.epoch = h.epoch;
    snap_.parts.resize(parts);
    snap_.have.resize(parts);
    snap_.total = total;
  }
  if (snap_.parts.size() != parts || snap_.total != total) {
    *reply = Refuse(h, StatusCode::kMalformed, "snapshot parts disagree on its size");
    return false;
  }
  if (!snap_.have[index]) {
    snap_.have[index] = true;
    snap_.parts[index] = part.ToString();
    snap_.received++;
    snap_.bytes += part.size();
  }
  if (snap_.received < parts) {
    *reply = StatusReply(h);
    reply->spec["snap_rx"] = std::to_string(snap_.received);
    return false;
  }
  if (snap_.bytes != total) {
    snap_ = SnapshotAssembly{};
    *reply = Refuse(h, StatusCode::kMalformed, "snapshot parts do not add up to its size");
    return false;
  }
  load_.clear();
  load_.reserve(total);
  for (std::string& p : snap_.parts) {
    load_ += p;
    std::string().swap(p);
  }
  snap_ = SnapshotAssembly{};
  return true;
}

std::string ReplicaCore::TakeLoad() {
  std::string out;
  out.swap(load_);
  return out;
}

void ReplicaCore::ClearEarly() {
  early_.clear();
  early_bytes_ = 0;
}

void ReplicaCore::EraseFirstEarly() {
  for (const Frame& f : early_.begin()->second.second) early_bytes_ -= f.size();
  early_.erase(early_.begin());
}

bool ReplicaCore::NextEarly(Header* h, Frames* frames) {
  while (!early_.empty() && early_.begin()->first <= lsn_) EraseFirstEarly();
  if (early_.empty() || need_snapshot_ || early_.begin()->first != lsn_ + 1) return false;
  auto& [header, f] = early_.begin()->second;
  if (header.base_version != log_epoch_ || !leader_known_ || header.epoch != leader_.epoch) {
    ClearEarly();
    return false;
  }
  *h = header;
  *frames = f;
  EraseFirstEarly();
  applying_ = true;
  return true;
}

Header ReplicaCore::FinishMessage(uint64_t now, const Header& h, const Status& outcome) {
  (void)now;
  applying_ = false;
  if (h.op == Op::kReplSnapshot || !outcome.ok()) ClearEarly();
  if (h.op == Op::kReplSnapshot) {
    if (outcome.ok()) {
      lsn_ = h.seq;
      log_epoch_ = h.base_version;
      need_snapshot_ = false;
      has_data_ = true;
      synced_epoch_ = h.epoch;
      synced_lsn_ = h.seq;
      counters_.snapshots_loaded++;
      spdlog::info("replica {}: loaded a snapshot at lsn {} of epoch {}", config_.index, h.seq,
                   h.epoch);
    } else {
      need_snapshot_ = true;
      spdlog::error("replica {}: snapshot not loaded: {}", config_.index, outcome.ToString());
    }
  } else if (outcome.ok()) {
    lsn_ = h.seq;
    log_epoch_ = h.epoch;
    has_data_ = true;
    synced_epoch_ = h.epoch;
    synced_lsn_ = h.seq;
  } else {
    // The primary applied it; failing here means the states differ: start over.
    need_snapshot_ = true;
    spdlog::error("replica {}: logged update {} not applied ({}); reloading", config_.index, h.seq,
                  outcome.ToString());
  }
  return StatusReply(h);
}

void ReplicaCore::Stop(uint64_t now) {
  if (role_ == Role::kStopped) return;
  if (role_ == Role::kPrimary || role_ == Role::kEstablishing) {
    for (size_t m = 0; m < followers_.size(); ++m) {
      if (m == config_.index) continue;
      Header h;
      h.op = Op::kReplicate;
      h.flags = kFlagSteppingDown;
      h.seq = lsn_;
      h.base_version = log_epoch_;
      SendTo(m, h);
    }
  } else if (leader_known_ && leader_.index != config_.index &&
             leader_.index < config_.members.size()) {
    Header h;
    h.op = Op::kReplStatus;
    h.flags = kFlagLeaving;
    h.spec = {{"inc", Hex(config_.incarnation)}};
    SendTo(leader_.index, h);
  }
  FailWaiters(NotPrimary("shard replica shutting down; retry on the new primary"));
  role_ = Role::kStopped;
  if (lease_ != 0) {
    // Revoking the lease deletes the leadership and the registration at once, so another
    // in-sync replica can take over without waiting for the lease to expire.
    KvCall call;
    call.kind = KvCall::Kind::kRevoke;
    call.lease = lease_;
    revoke_id_ = Call(now, KvPurpose::kRevoke, std::move(call));
    lease_ = 0;
  }
}

ReplicaStats ReplicaCore::Stats() const {
  ReplicaStats s = counters_;
  s.primary = role_ == Role::kPrimary;
  s.epoch = epoch_;
  s.lsn = lsn_;
  s.committed = role_ == Role::kPrimary ? committed_ : lsn_;
  s.isr_size = static_cast<uint32_t>(role_ == Role::kPrimary ? isr_.size() : view_.isr.size());
  for (size_t m = 0; m < followers_.size(); ++m) {
    if (m != config_.index && role_ == Role::kPrimary && InSync(m)) s.in_sync_backups++;
  }
  return s;
}

}  // namespace onlineps::ps
