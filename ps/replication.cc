#include "ps/replication.h"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "common/clock.h"
#include "common/etcd_kv.h"

namespace onlineps::ps {

std::string ReplicaGroupKey(const std::string& etcd_prefix, uint32_t shard, uint32_t num_shards) {
  std::string p = etcd_prefix;
  while (!p.empty() && p.back() == '/') p.pop_back();
  return p + "/shard-" + std::to_string(shard) + "-of-" + std::to_string(num_shards) + "/";
}

// The core's window on the process: messages go out at once (never blocking), etcd calls
// and snapshot requests are queued and issued once the lock is released.
class Replica::Env final : public ReplicaEnv {
 public:
  explicit Env(Replica* r) : r_(r) {}
  void Send(size_t member, Frames frames) override {
    Status st = r_->transport_->Send(member, std::move(frames));
    if (!st.ok()) spdlog::debug("replication send to {} failed: {}", member, st.ToString());
  }
  // The core calls these with r_->mu_ held.
  void Kv(uint64_t id, KvCall call) override REQUIRES(r_->mu_) {
    r_->kv_outbox_.emplace_back(id, std::move(call));
  }
  void TakeSnapshot(size_t member, uint64_t token) override REQUIRES(r_->mu_) {
    // One pending snapshot per backup (the newest request; older tokens are stale).
    auto& todo = r_->snapshot_todo_;
    todo.erase(std::remove_if(todo.begin(), todo.end(),
                              [member](const auto& t) { return t.first == member; }),
               todo.end());
    todo.emplace_back(member, token);
    r_->cv_.SignalAll();
  }

 private:
  Replica* const r_;
};

Replica::Replica(ReplicationOptions options, Hooks hooks, RestoredReplica restored)
    : options_(std::move(options)),
      hooks_(std::move(hooks)),
      incarnation_(restored.exact && restored.incarnation != 0 ? restored.incarnation
                                                               : NewIncarnation()),
      group_(ReplicaGroupKey(options_.etcd_prefix, options_.shard, options_.num_shards)),
      env_(std::make_unique<Env>(this)) {
  ReplicaConfig c;
  c.members = options_.members;
  c.index = options_.index;
  c.group = group_;
  c.sync = options_.sync;
  c.min_insync = options_.min_insync;
  c.heartbeat_ms = options_.heartbeat_ms;
  c.lease_ms = options_.lease_ms;
  c.follower_timeout_ms = options_.follower_timeout_ms;
  c.kv_timeout_ms = std::max<uint64_t>(options_.heartbeat_ms * 5, 1000);
  c.bootstrap_wait_ms = std::max<uint64_t>(2 * options_.lease_ms, 3000);
  c.unclean_wait_ms = options_.unclean_wait_ms;
  c.max_log_entries = options_.max_log_entries;
  c.window = options_.window;
  // Parts of a snapshot stay well under the message limit of the shard that receives them.
  c.snapshot_chunk_bytes = std::max<size_t>(options_.transport.max_message_bytes / 8, 64 << 10);
  c.incarnation = incarnation_;
  c.restored = restored.restored;
  c.restored_exact = restored.exact;
  c.restored_lsn = restored.lsn;
  c.restored_log_epoch = restored.log_epoch;
  c.restored_epoch = restored.epoch;
  core_ = std::make_unique<ReplicaCore>(std::move(c), env_.get());
}

Replica::~Replica() { Stop(); }

template <typename F>
auto Replica::WithCore(F f) {
  std::vector<std::pair<uint64_t, KvCall>> calls;
  std::vector<std::pair<ReplicaCore::Done, Status>> done;
  if constexpr (std::is_void_v<decltype(f(*core_))>) {
    {
      MutexLock lock(&mu_);
      f(*core_);
      calls.swap(kv_outbox_);
      done = core_->TakeCompletions();
    }
    Flush(std::move(calls), std::move(done));
  } else {
    decltype(f(*core_)) out;
    {
      MutexLock lock(&mu_);
      out = f(*core_);
      calls.swap(kv_outbox_);
      done = core_->TakeCompletions();
    }
    Flush(std::move(calls), std::move(done));
    return out;
  }
}

void Replica::Flush(std::vector<std::pair<uint64_t, KvCall>> calls,
                    std::vector<std::pair<ReplicaCore::Done, Status>> done) {
  for (auto& [id, call] : calls) {
    auto cb = [this, id = id](KvResult r) {
      WithCore([&](ReplicaCore& c) { c.OnKv(NowMs(), id, r); });
      cv_.SignalAll();
    };
    switch (call.kind) {
      case KvCall::Kind::kGrant:
        kv_->Grant(call.ttl_s, cb);
        break;
      case KvCall::Kind::kKeepAlive:
        kv_->KeepAlive(call.lease, cb);
        break;
      case KvCall::Kind::kRevoke:
        kv_->Revoke(call.lease, cb);
        break;
      case KvCall::Kind::kRange:
        kv_->Range(call.prefix, cb);
        break;
      case KvCall::Kind::kTxn:
        kv_->Txn(std::move(call.txn), cb);
        break;
    }
  }
  for (auto& [d, st] : done) d(st);
}

Status Replica::Start() {
  if (options_.members.size() < 2 || options_.index >= options_.members.size()) {
    return InvalidArgument("replication needs two or more members and an index below their count");
  }
  kv_ = options_.kv;
  if (!kv_) {
    ONLINEPS_RETURN_IF_ERROR(
        ValidateEtcdEndpoints(options_.etcd).WithContext("--etcd (replicated shards need etcd)"));
    EtcdKvOptions eo;
    eo.endpoints = options_.etcd;
    eo.timeout = std::chrono::milliseconds(std::max<uint64_t>(options_.heartbeat_ms * 5, 1000));
    kv_ = NewEtcdKv(eo);
  }
  TransportOptions topts = options_.transport;
  topts.linger = std::chrono::milliseconds(200);  // a step-down notice should get out
  transport_ = NewClientTransport(options_.members, topts);
  ONLINEPS_RETURN_IF_ERROR(transport_->Connect(
      options_.members, [this](size_t m, Frames&& f) { OnReply(m, std::move(f)); }));
  {
    MutexLock lock(&mu_);
    started_ = true;
  }
  WithCore([](ReplicaCore& c) { c.Start(NowMs()); });
  ticker_.Start(
      std::chrono::milliseconds(std::max<uint64_t>(options_.heartbeat_ms / 4, 5)),
      [this] { WithCore([](ReplicaCore& c) { c.Tick(NowMs()); }); },
      /*tick_first=*/false);
  snapshot_thread_ = std::thread([this] { SnapshotLoop(); });
  spdlog::info(
      "replica {} of {} ({}), {} replication, incarnation {:016x}; membership in etcd under {}",
      options_.index, options_.members.size(), options_.members[options_.index],
      options_.sync ? "sync" : "async", incarnation_, group_);
  return Status::Ok();
}

void Replica::Stop() {
  {
    MutexLock lock(&mu_);
    if (!started_ || stop_) return;
  }
  WithCore([](ReplicaCore& c) { c.Stop(NowMs()); });
  {
    // The revocation frees the leadership at once; wait for etcd (bounded).
    MutexLock lock(&mu_);
    cv_.WaitFor(&mu_, std::chrono::seconds(1),
                [this]() REQUIRES(mu_) { return core_->stop_settled(); });
    stop_ = true;
  }
  cv_.SignalAll();
  ticker_.Stop();
  if (snapshot_thread_.joinable()) snapshot_thread_.join();
  kv_.reset();  // fails what is still queued (the stopped core ignores it)
  transport_->Close();
}

bool Replica::primary() const {
  MutexLock lock(&mu_);
  return core_->primary();
}

uint64_t Replica::epoch() const {
  MutexLock lock(&mu_);
  return core_->epoch();
}

uint64_t Replica::last_lsn() const {
  MutexLock lock(&mu_);
  return core_->lsn();
}

uint64_t Replica::log_epoch() const {
  MutexLock lock(&mu_);
  return core_->log_epoch();
}

std::pair<uint64_t, uint64_t> Replica::position() const {
  MutexLock lock(&mu_);
  return {core_->log_epoch(), core_->lsn()};
}

uint64_t Replica::highest_epoch() const {
  MutexLock lock(&mu_);
  return core_->highest_epoch();
}

bool Replica::InSync() const {
  MutexLock lock(&mu_);
  return core_->in_sync();
}

bool Replica::ExactState() const {
  MutexLock lock(&mu_);
  return !core_->needs_snapshot();
}

ReplicaStats Replica::Stats() const {
  MutexLock lock(&mu_);
  return core_->Stats();
}

Status Replica::CheckPrimary(uint64_t client_epoch, std::optional<uint32_t>* primary) {
  return WithCore([&](ReplicaCore& c) { return c.CheckPrimary(NowMs(), client_epoch, primary); });
}

uint64_t Replica::Append(const Frames& request) {
  return WithCore([&](ReplicaCore& c) { return c.Append(request); });
}

void Replica::WhenCommitted(uint64_t lsn, Done done) {
  WithCore([&](ReplicaCore& c) { c.WhenCommitted(lsn, std::move(done)); });
}

void Replica::Handle(const Header& h, const Frames& frames, Header* reply) {
  MutexLock apply(&apply_mu_);
  const auto action =
      WithCore([&](ReplicaCore& c) { return c.BeginMessage(NowMs(), h, frames, reply); });
  if (action == ReplicaCore::Action::kReply) return;
  Status st = Guarded([&] {
    if (action == ReplicaCore::Action::kApply) return ApplyEntry(frames);
    const std::string state = WithCore([](ReplicaCore& c) { return c.TakeLoad(); });
    return hooks_.load(state);
  });
  *reply = WithCore([&](ReplicaCore& c) { return c.FinishMessage(NowMs(), h, st); });
  // Entries that arrived before this one and are next now.
  Header early;
  Frames early_frames;
  while (WithCore([&](ReplicaCore& c) { return c.NextEarly(&early, &early_frames); })) {
    st = Guarded([&] { return ApplyEntry(early_frames); });
    *reply = WithCore([&](ReplicaCore& c) { return c.FinishMessage(NowMs(), early, st); });
  }
}

// BeginMessage must always be followed by FinishMessage, whatever the hooks do: an
// exception (bad_alloc on a large snapshot) becomes the outcome.
Status Replica::Guarded(const std::function<Status()>& hook) {
  try {
    return hook();
  } catch (const std::bad_alloc&) {
    return ResourceExhausted("out of memory applying a replication message");
  } catch (const std::exception& e) {
    return Internal(std::string("applying a replication message: ") + e.what());
  }
}

Status Replica::ApplyEntry(const Frames& frames) {
  auto inner = DecodeHeader(frames[1].data(), frames[1].size());
  if (!inner.ok()) return inner.status();
  return hooks_.apply(*inner, Frames(frames.begin() + 1, frames.end()));
}

void Replica::OnReply(size_t member, Frames&& frames) {
  if (frames.empty()) return;
  auto r = DecodeHeader(frames[0].data(), frames[0].size());
  if (!r.ok() || r->op != Op::kReply) return;
  WithCore([&](ReplicaCore& c) { c.OnReply(NowMs(), member, *r); });
}

void Replica::SnapshotLoop() {
  // Its own thread: a snapshot of a large shard takes seconds, and the ticker must keep
  // renewing the lease and sending heartbeats meanwhile.
  MutexLock lock(&mu_);
  while (!stop_) {
    cv_.Wait(&mu_, [this]() REQUIRES(mu_) { return stop_ || !snapshot_todo_.empty(); });
    if (stop_) break;
    // Not a structured binding: C++17 lambdas cannot capture those (clang refuses).
    const size_t member = snapshot_todo_.front().first;
    const uint64_t token = snapshot_todo_.front().second;
    snapshot_todo_.pop_front();
    lock.Unlock();
    uint64_t at = 0;
    auto bytes = hooks_.snapshot(&at);
    WithCore([&](ReplicaCore& c) { c.OnSnapshot(NowMs(), member, token, bytes, at); });
    lock.Lock();
  }
}

}  // namespace onlineps::ps
