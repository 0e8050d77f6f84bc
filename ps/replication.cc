#include "ps/replication.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/clock.h"

namespace onlineps::ps {

namespace {

// Flags of replication messages (their own op, so no clash with the request flags).
constexpr uint32_t kFlagInSync = 1u << 0;        // primary -> backup: you are counted for commits
constexpr uint32_t kFlagSteppingDown = 1u << 1;  // primary -> backup: elect now, I am leaving

uint64_t SpecUint(const std::map<std::string, std::string>& spec, const std::string& key) {
  auto it = spec.find(key);
  if (it == spec.end()) return 0;
  try {
    return std::stoull(it->second);
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

Replica::Replica(ReplicationOptions options, Hooks hooks, bool restored)
    : options_(std::move(options)), hooks_(std::move(hooks)), followers_(options_.members.size()) {
  // A replica that restored a checkpoint holds state the new primary may not share: it
  // reloads on joining, but may still be elected when no replica has newer state.
  has_state_ = restored;
}

Replica::~Replica() { Stop(); }

Status Replica::Start() {
  if (options_.members.size() < 2 || options_.index >= options_.members.size()) {
    return InvalidArgument("replication needs two or more members and an index below their count");
  }
  TransportOptions topts = options_.transport;
  topts.linger = std::chrono::milliseconds(200);  // a step-down notice should get out
  transport_ = NewClientTransport(options_.members, topts);
  ONLINEPS_RETURN_IF_ERROR(transport_->Connect(
      options_.members, [this](size_t m, Frames&& f) { OnReply(m, std::move(f)); }));
  {
    std::lock_guard<std::mutex> lock(mu_);
    started_ = true;
    last_primary_ms_ = NowMs();
  }
  thread_ = std::thread([this] { Loop(); });
  spdlog::info("replica {} of {} ({}), {} replication; electing a primary after {} ms",
               options_.index, options_.members.size(), options_.members[options_.index],
               options_.sync ? "sync" : "async", options_.lease_ms);
  return Status::Ok();
}

void Replica::Stop() {
  std::vector<Waiter> failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!started_ || stop_) return;
    stop_ = true;
    if (primary_) {
      // Planned: tell the backups to elect at once instead of after the lease.
      for (size_t m = 0; m < options_.members.size(); ++m) {
        if (m == options_.index) continue;
        Header h;
        h.op = Op::kReplicate;
        h.flags = kFlagSteppingDown;
        SendLocked(m, h);
      }
      primary_ = false;
    }
    for (auto& w : waiters_) failed.push_back(std::move(w));
    waiters_.clear();
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  for (auto& w : failed)
    w.done(
        Status(StatusCode::kNotPrimary, "shard replica shutting down; retry on the new primary"));
  transport_->Close();
}

bool Replica::primary() const {
  std::lock_guard<std::mutex> lock(mu_);
  return primary_;
}

uint64_t Replica::epoch() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_;
}

uint64_t Replica::last_lsn() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lsn_;
}

ReplicaStats Replica::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  ReplicaStats s = counters_;
  s.primary = primary_;
  s.epoch = epoch_;
  s.lsn = lsn_;
  s.committed = primary_ ? CommitLsnLocked() : lsn_;
  for (size_t m = 0; m < followers_.size(); ++m) s.in_sync_backups += followers_[m].in_sync;
  return s;
}

Status Replica::CheckPrimary(uint64_t client_epoch) {
  std::vector<Waiter> failed;
  Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (primary_ && client_epoch > epoch_) {
      StepDownLocked(client_epoch, "a client knows epoch " + std::to_string(client_epoch));
      failed.swap(stepped_down_);
    }
    if (!primary_) {
      // Clients parse "primary is replica K" (docs/protocol.md, "Replication").
      st = Status(StatusCode::kNotPrimary,
                  primary_index_ >= 0
                      ? "not primary; primary is replica " + std::to_string(primary_index_) + " (" +
                            options_.members[primary_index_] + ")"
                      : "not primary; no primary known (election in progress)");
    }
  }
  for (auto& w : failed) w.done(st);
  return st;
}

uint64_t Replica::Append(const Frames& request) {
  std::lock_guard<std::mutex> lock(mu_);
  Header h;
  h.op = Op::kReplicate;
  h.epoch = epoch_;
  h.seq = ++lsn_;
  h.sender = options_.index;
  Entry e{lsn_, {}};
  e.frames.reserve(1 + request.size());
  e.frames.push_back(Frame::FromString(EncodeHeader(h)));
  for (const Frame& f : request) e.frames.push_back(f);
  log_.push_back(std::move(e));
  has_state_ = true;
  cv_.notify_all();
  return lsn_;
}

void Replica::WhenCommitted(uint64_t lsn, Done done) {
  Status st;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!primary_ || stop_) {
      st = Status(StatusCode::kNotPrimary, "not primary any more; retry on the new primary");
    } else if (lsn > CommitLsnLocked()) {
      waiters_.push_back(Waiter{lsn, std::move(done)});
      return;
    }
  }
  done(st);
}

uint64_t Replica::CommitLsnLocked() const {
  uint64_t c = lsn_;
  if (!options_.sync) return c;
  for (size_t m = 0; m < followers_.size(); ++m) {
    if (m != options_.index && followers_[m].in_sync) c = std::min(c, followers_[m].acked);
  }
  return c;
}

void Replica::ReleaseCommittedLocked(std::vector<Waiter>* ready) {
  committed_ = std::max(committed_, CommitLsnLocked());
  while (!waiters_.empty() && waiters_.front().lsn <= committed_) {
    ready->push_back(std::move(waiters_.front()));
    waiters_.pop_front();
  }
}

void Replica::StepDownLocked(uint64_t epoch, const std::string& why) {
  spdlog::warn(
      "replica {}: stepping down from primary of epoch {}: {}; reloading from the new "
      "primary",
      options_.index, epoch_, why);
  primary_ = false;
  epoch_ = std::max(epoch_, epoch);
  need_snapshot_ = true;  // updates it applied alone may be missing on the new primary
  in_sync_ = false;
  primary_index_ = -1;
  last_primary_ms_ = NowMs();
  probe_sent_ms_ = 0;
  log_.clear();
  for (auto& w : waiters_) stepped_down_.push_back(std::move(w));
  waiters_.clear();
  counters_.step_downs++;
}

void Replica::SendLocked(size_t member, Header h, Frames payload) {
  h.epoch = epoch_;
  h.sender = options_.index;
  Frames frames;
  frames.reserve(1 + payload.size());
  frames.push_back(Frame::FromString(EncodeHeader(h)));
  for (Frame& f : payload) frames.push_back(std::move(f));
  Status st = transport_->Send(member, std::move(frames));
  if (!st.ok()) spdlog::debug("replication send to {} failed: {}", member, st.ToString());
}

Header Replica::StatusReplyLocked(const Header& req) const {
  Header r = MakeReply(req, Status::Ok());
  r.epoch = epoch_;
  r.spec = {{"role", primary_ ? "primary" : "backup"},
            {"lsn", std::to_string(lsn_)},
            {"eligible", EligibleLocked() ? "1" : "0"},
            {"fresh", has_state_ || epoch_ > 0 ? "0" : "1"}};
  if (need_snapshot_) r.spec["need"] = "snapshot";
  return r;
}

void Replica::Handle(const Header& h, const Frames& frames, Header* reply) {
  std::lock_guard<std::mutex> apply(apply_mu_);
  std::unique_lock<std::mutex> lock(mu_);
  if (h.op == Op::kReplStatus) {
    *reply = StatusReplyLocked(h);
    return;
  }
  if (h.epoch < epoch_) {
    *reply = StatusReplyLocked(h);
    reply->code = StatusCode::kFailedPrecondition;
    reply->message = "fenced: epoch " + std::to_string(h.epoch) + " is older than this replica's " +
                     std::to_string(epoch_);
    return;
  }
  const uint64_t now = NowMs();
  if (h.flags & kFlagSteppingDown) {
    if (!primary_ && static_cast<int64_t>(h.sender) == primary_index_) {
      last_primary_ms_ = 0;  // elect now
      primary_index_ = -1;
    }
    *reply = StatusReplyLocked(h);
    return;
  }
  if (primary_ && h.epoch == epoch_) {
    *reply = StatusReplyLocked(h);
    reply->code = StatusCode::kFailedPrecondition;
    reply->message = "two primaries in epoch " + std::to_string(epoch_);
    return;
  }
  std::vector<Waiter> failed;
  if (primary_) {
    StepDownLocked(h.epoch, "replica " + std::to_string(h.sender) + " is primary of epoch " +
                                std::to_string(h.epoch));
    failed.swap(stepped_down_);
  } else if (h.epoch > epoch_ && has_state_) {
    need_snapshot_ = true;  // a new primary's history may differ from ours past some lsn
  }
  epoch_ = h.epoch;
  primary_index_ = static_cast<int64_t>(h.sender);
  last_primary_ms_ = now;
  probe_sent_ms_ = 0;
  if (h.op == Op::kReplSnapshot || frames.size() == 1) in_sync_ = h.flags & kFlagInSync;
  if (h.op == Op::kReplSnapshot) {
    if (frames.size() < 2) {
      *reply = StatusReplyLocked(h);
      reply->code = StatusCode::kMalformed;
      reply->message = "snapshot without a state frame";
    } else {
      lock.unlock();
      Status st = hooks_.load(frames[1].ToString());
      lock.lock();
      if (st.ok()) {
        lsn_ = h.seq;
        need_snapshot_ = false;
        has_state_ = true;
        counters_.snapshots_loaded++;
        spdlog::info("replica {}: loaded a snapshot at lsn {} of epoch {} ({} bytes)",
                     options_.index, h.seq, epoch_, frames[1].size());
      } else {
        spdlog::error("replica {}: snapshot not loaded: {}", options_.index, st.ToString());
      }
    }
  } else if (!need_snapshot_ && frames.size() == 1 && h.seq < lsn_) {
    need_snapshot_ = true;  // ahead of the primary: updates it never had
  } else if (!need_snapshot_ && frames.size() >= 2 && h.seq == lsn_ + 1) {
    auto inner = DecodeHeader(frames[1].data(), frames[1].size());
    Status st = inner.status();
    if (inner.ok()) {
      Frames request(frames.begin() + 1, frames.end());
      lock.unlock();
      st = hooks_.apply(*inner, request);
      lock.lock();
    }
    if (st.ok()) {
      lsn_ = h.seq;
      has_state_ = true;
    } else {
      // The primary applied it; failing here means the states differ: start over.
      spdlog::error("replica {}: logged update {} not applied ({}); reloading", options_.index,
                    h.seq, st.ToString());
      need_snapshot_ = true;
    }
  }
  // Otherwise a duplicate (seq <= lsn) or a gap: the ack below tells the primary where
  // this replica is.
  if (reply->code == StatusCode::kOk) *reply = StatusReplyLocked(h);
  lock.unlock();
  for (auto& w : failed) w.done(Status(StatusCode::kNotPrimary, "not primary any more"));
}

void Replica::OnReply(size_t member, Frames&& frames) {
  if (frames.empty() || member >= followers_.size()) return;
  auto r = DecodeHeader(frames[0].data(), frames[0].size());
  if (!r.ok() || r->op != Op::kReply) return;
  std::vector<Waiter> ready, failed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const uint64_t now = NowMs();
    const bool is_primary = r->spec.count("role") && r->spec.at("role") == "primary";
    const uint64_t lsn = SpecUint(r->spec, "lsn");
    peers_[member] = Peer{is_primary,
                          SpecUint(r->spec, "eligible") == 1,
                          SpecUint(r->spec, "fresh") == 1,
                          r->epoch,
                          lsn,
                          now};
    if (primary_ && r->epoch > epoch_) {
      StepDownLocked(r->epoch, "replica " + std::to_string(member) + " knows epoch " +
                                   std::to_string(r->epoch));
      failed.swap(stepped_down_);
    } else if (primary_ && r->epoch == epoch_ && r->code == StatusCode::kOk) {
      Follower& f = followers_[member];
      f.last_ack_ms = now;
      if (r->spec.count("need")) {
        if (f.state != FollowState::kSnapshot &&
            now - f.snapshot_ms > options_.follower_timeout_ms) {
          f.state = FollowState::kSnapshot;
          f.in_sync = false;
        }
      } else if (f.state == FollowState::kProbe) {
        const uint64_t first = log_.empty() ? lsn_ + 1 : log_.front().lsn;
        if (lsn <= lsn_ && lsn + 1 >= first) {
          f.state = FollowState::kStream;
          f.acked = lsn;
          f.next = lsn + 1;
        } else {
          f.state = FollowState::kSnapshot;
        }
      } else if (f.state == FollowState::kStream) {
        f.acked = std::max(f.acked, lsn);
        if (!f.in_sync && f.acked >= committed_) {
          f.in_sync = true;
          spdlog::info("replica {}: backup {} is in sync at lsn {}", options_.index, member,
                       f.acked);
        }
      }
      ReleaseCommittedLocked(&ready);
    }
  }
  cv_.notify_all();
  for (auto& w : ready) w.done(Status::Ok());
  for (auto& w : failed) w.done(Status(StatusCode::kNotPrimary, "not primary any more"));
}

void Replica::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(std::max<uint64_t>(options_.heartbeat_ms / 4, 5)));
    if (stop_) break;
    const uint64_t now = NowMs();
    if (primary_) {
      PrimaryTick(now, lock);
    } else {
      BackupTick(now, lock);
    }
  }
}

void Replica::PrimaryTick(uint64_t now, std::unique_lock<std::mutex>& lock) {
  std::vector<Waiter> ready;
  for (size_t m = 0; m < followers_.size() && primary_; ++m) {
    if (m == options_.index) continue;
    Follower& f = followers_[m];
    if (f.in_sync && now - f.last_ack_ms > options_.follower_timeout_ms) {
      spdlog::warn("replica {}: backup {} silent for {} ms; no longer waiting for it",
                   options_.index, m, now - f.last_ack_ms);
      f.in_sync = false;
      f.state = FollowState::kProbe;
    }
    if (f.state == FollowState::kSnapshot) {
      lock.unlock();
      uint64_t at = 0;
      auto bytes = hooks_.snapshot(&at);
      lock.lock();
      if (!primary_) return;
      if (!bytes.ok()) {
        spdlog::error("replica {}: snapshot for {} failed: {}", options_.index, m,
                      bytes.status().ToString());
        continue;
      }
      Header h;
      h.op = Op::kReplSnapshot;
      h.seq = at;
      h.flags = f.in_sync ? kFlagInSync : 0;
      SendLocked(m, h, {Frame::FromString(std::move(bytes).value())});
      f.state = FollowState::kStream;
      f.acked = 0;
      f.next = at + 1;
      f.last_send_ms = f.snapshot_ms = now;
      counters_.snapshots_sent++;
      spdlog::info("replica {}: sent backup {} a snapshot at lsn {}", options_.index, m, at);
      continue;
    }
    if (f.state == FollowState::kStream) {
      const uint64_t first = log_.empty() ? lsn_ + 1 : log_.front().lsn;
      if (f.next < first) {
        f.state = FollowState::kSnapshot;  // the entries it needs are gone
        f.in_sync = false;
        continue;
      }
      if (f.next > f.acked + 1 && now - f.last_ack_ms > 4 * options_.heartbeat_ms &&
          now - f.last_send_ms > 4 * options_.heartbeat_ms) {
        f.next = std::max(f.acked + 1, first);  // lost in flight: resend
      }
      while (f.next <= lsn_ && f.next <= f.acked + options_.window) {
        const Entry& e = log_[f.next - first];
        transport_->Send(m, e.frames).ok();
        f.next++;
        f.last_send_ms = now;
      }
    }
    if (now - f.last_heartbeat_ms >= options_.heartbeat_ms) {
      Header h;
      h.op = Op::kReplicate;
      h.seq = lsn_;
      h.flags = f.in_sync ? kFlagInSync : 0;
      SendLocked(m, h);
      f.last_heartbeat_ms = now;
    }
  }
  // Trim what every streaming backup has, and cap the log for the ones that lag.
  uint64_t keep_after = lsn_;
  for (size_t m = 0; m < followers_.size(); ++m) {
    if (m != options_.index && followers_[m].state == FollowState::kStream) {
      keep_after = std::min(keep_after, followers_[m].acked);
    }
  }
  while (!log_.empty() &&
         (log_.front().lsn <= keep_after || log_.size() > options_.max_log_entries)) {
    log_.pop_front();
  }
  ReleaseCommittedLocked(&ready);
  if (!ready.empty()) {
    lock.unlock();
    for (auto& w : ready) w.done(Status::Ok());
    lock.lock();
  }
}

void Replica::BackupTick(uint64_t now, std::unique_lock<std::mutex>& lock) {
  (void)lock;
  if (now - last_primary_ms_ < options_.lease_ms) return;
  const uint64_t collect_ms = std::max<uint64_t>(3 * options_.heartbeat_ms, 100);
  if (probe_sent_ms_ == 0) {
    peers_.clear();
    for (size_t m = 0; m < options_.members.size(); ++m) {
      if (m == options_.index) continue;
      Header h;
      h.op = Op::kReplStatus;
      SendLocked(m, h);
    }
    probe_sent_ms_ = now;
    return;
  }
  if (now - probe_sent_ms_ < collect_ms) return;
  probe_sent_ms_ = 0;
  uint64_t max_epoch = epoch_;
  size_t answered = 0;
  for (const auto& [m, p] : peers_) {
    answered++;
    max_epoch = std::max(max_epoch, p.epoch);
    if (p.primary && p.epoch >= epoch_) {
      primary_index_ = static_cast<int64_t>(m);
      last_primary_ms_ = now;  // it will stream to us; wait another lease
      return;
    }
  }
  auto retry_later = [&](const std::string& why) {
    if (now - last_wait_log_ms_ > 10000) {
      spdlog::warn("replica {}: no primary and not electing myself: {}", options_.index, why);
      last_wait_log_ms_ = now;
    }
    last_primary_ms_ = now - options_.lease_ms / 2;
  };
  if (!EligibleLocked()) return retry_later("this replica may miss committed updates");
  const bool fresh = !has_state_ && epoch_ == 0;
  if (fresh && answered + 1 < options_.members.size()) {
    // A replica with nothing must not win against an absent one that has the model.
    return retry_later("this replica is empty and " +
                       std::to_string(options_.members.size() - 1 - answered) +
                       " replica(s) did not answer");
  }
  for (const auto& [m, p] : peers_) {
    const bool better =
        std::make_tuple(p.epoch, p.lsn, p.fresh ? 0 : 1) >
            std::make_tuple(epoch_, lsn_, fresh ? 0 : 1) ||
        (p.epoch == epoch_ && p.lsn == lsn_ && p.fresh == fresh && m < options_.index);
    if (p.eligible && better) {
      return retry_later("replica " + std::to_string(m) + " is more up to date");
    }
  }
  const uint64_t silent_ms = last_primary_ms_ == 0 ? 0 : now - last_primary_ms_;
  primary_ = true;
  epoch_ = max_epoch + 1;
  primary_index_ = options_.index;
  committed_ = lsn_;
  log_.clear();
  for (auto& f : followers_) f = Follower{FollowState::kProbe, lsn_ + 1, 0, now, 0, 0, 0, false};
  counters_.promotions++;
  spdlog::warn(
      "replica {}: primary of epoch {} at lsn {} (no primary for {} ms; {} of {} "
      "replicas answered)",
      options_.index, epoch_, lsn_, silent_ms, answered + 1, options_.members.size());
}

}  // namespace onlineps::ps
