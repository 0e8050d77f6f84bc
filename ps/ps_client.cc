
#include "ps/ps_client.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include "common/mutex.h"
#include "common/partition.h"
#include "common/request_ids.h"
#include "common/rpc_calls.h"
#include "common/wire.h"

namespace onlineps::ps {

using Clock = std::chrono::steady_clock;

// t + d, saturating at the clock's end: "forever" (milliseconds::max()) must not wrap.
Clock::time_point After(Clock::time_point t, std::chrono::milliseconds d) {
  const auto room =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - t);
  return d >= room ? Clock::time_point::max() : t + d;
}

struct Ticket::State {
  Mutex mu;
  CondVar cv;
  int remaining GUARDED_BY(mu) = 0;
  bool done GUARDED_BY(mu) = false;
  std::atomic<bool> done_fast{false};  // set with done; lets Wait spin briefly
  Status status GUARDED_BY(mu);        // first error wins
  PsClient::Callback callback;

  // One part of the call finished with `st`.
  void Complete(const Status& st) {
    PsClient::Callback cb;
    Status result;  // status is final once done, but read it under mu all the same
    {
      MutexLock lock(&mu);
      if (!st.ok() && status.ok()) status = st;
      if (--remaining > 0) return;
      done = true;
      done_fast.store(true, std::memory_order_release);
      cb = std::move(callback);
      if (cb) result = status;
    }
    cv.SignalAll();
    if (cb) cb(result);
  }
};

Status Ticket::Wait() const {
  if (!state_) return Internal("Wait() on an empty Ticket");
  // A loopback round trip takes ~100 us; spinning briefly first saves the ~10-20 us a
  // futex wake-up costs, without burning a core when the answer is slow. At most half
  // the cores spin at once: more waiters than that sleep at once, or spinning callers
  // would take the cores the answers need (4 callers on 2 cores: p99 0.6-1.9 ms).
  static const int kMaxSpinners =
      std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / 2);
  static std::atomic<int> spinners{0};
  if (spinners.fetch_add(1, std::memory_order_relaxed) < kMaxSpinners) {
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    while (!state_->done_fast.load(std::memory_order_acquire) &&
           std::chrono::steady_clock::now() < spin_until) {
      std::this_thread::yield();
    }
  }
  spinners.fetch_sub(1, std::memory_order_relaxed);
  MutexLock lock(&state_->mu);
  state_->cv.Wait(&state_->mu, [this]() REQUIRES(state_->mu) { return state_->done; });
  return state_->status;
}

bool Ticket::Ready() const {
  if (!state_) return false;
  MutexLock lock(&state_->mu);
  return state_->done;
}

namespace {

// A per-shard part of a call, kept until its reply arrives or its deadline passes.
struct Pending {
  std::shared_ptr<Ticket::State> call;
  size_t shard = 0;
  size_t target = 0;  // transport endpoint of the attempt in flight (a replica of `shard`)
  Header header;
  Frames payload;
  std::function<Status(const Header&, const Frames&)> on_reply;
  std::chrono::milliseconds held_for{0};  // the shard may hold the answer this long (watch)
  Clock::time_point attempt_deadline, call_deadline;
  int attempts = 0;
};

struct TableMeta {
  TableSpec spec;
  std::unique_ptr<DenseLayout> layout;  // dense only
  std::vector<bool> contiguous;         // dense: shard's slices form one range
};

// A slice sharing `whole`'s owner: zero copy, and alive as long as any attempt needs it.
Frame Slice(const Frame& whole, size_t offset, size_t bytes) {
  return Frame(whole.holder(), whole.data() + offset, bytes);
}

// Where this client's push seqs start counting (the first push to a shard is this + 1):
// the wall clock in nanoseconds. A restarted process that reuses a fixed sender id then
// starts past every seq its predecessor used (it could not push once per nanosecond), so
// the shards apply its pushes instead of answering them as duplicates of the old ones.
uint64_t FirstSeq() {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  return ns > 0 ? static_cast<uint64_t>(ns) : 0;
}

// Most parts one pull is split into per shard (PsClientOptions::pull_part_bytes).
constexpr uint64_t kMaxPullParts = 16;

template <typename T>
Frame CopyOf(const T* p, size_t n) {
  return Frame::FromVector(std::vector<T>(p, p + n));
}

// How PsClientImpl::Broadcast sends: `timeout`, the call's when shorter than the client's;
// `one_attempt`, one attempt held for the whole call (an op answered only when done,
// which a resend would only ask for again).
struct BroadcastOptions {
  std::optional<std::chrono::milliseconds> timeout;
  bool one_attempt = false;
};

class PsClientImpl : public PsClient {
 public:
  explicit PsClientImpl(PsClientOptions o)
      : options_(std::move(o)),
        seq_(options_.shards.size()),
        primary_(options_.shards.size()),
        epoch_(options_.shards.size()) {
    if (options_.sender_id == 0) {
      std::random_device rd;
      options_.sender_id = ((uint64_t{rd()} << 32) ^ rd()) | 1;  // never 0
    }
    const uint64_t first = FirstSeq();
    for (auto& s : seq_) s.store(first);
  }
  ~PsClientImpl() override { Shutdown(); }

  Status Start();
  uint64_t sender_id() const override { return options_.sender_id; }
  size_t num_shards() const override { return options_.shards.size(); }

  Status CreateTable(const TableSpec& spec) override;
  StatusOr<TableSpec> OpenTable(const std::string& name) override;
  StatusOr<std::vector<std::map<std::string, std::string>>> TableInfo(
      const std::string& name) override;
  Status WaitForShards(std::chrono::milliseconds timeout) override;
  Status Checkpoint() override;
  Ticket PullDense(const std::string& table, float* out, VersionVector* versions, PullOptions opts,
                   Callback done) override;
  Ticket PushDense(const std::string& table, const float* values, const VersionVector& base,
                   PushReply* reply, PushOptions opts, Callback done) override;
  Ticket PushDense(const std::string& table, Frame values, const VersionVector& base,
                   PushReply* reply, PushOptions opts, Callback done) override;
  Ticket PullSparse(const std::string& table, const uint64_t* keys, size_t n, float* out,
                    VersionVector* versions, PullOptions opts, Callback done) override;
  Ticket PushSparse(const std::string& table, const uint64_t* keys, size_t n, const float* values,
                    const VersionVector& base, PushReply* reply, PushOptions opts,
                    Callback done) override;
  Ticket PushSparse(const std::string& table, Frame keys, Frame values, const VersionVector& base,
                    PushReply* reply, PushOptions opts, Callback done) override;
  Ticket PushDenseBatch(std::vector<DensePush> pushes, Callback done) override {
    return PushBatch(std::move(pushes), {}, std::move(done));
  }
  Ticket PushBatch(std::vector<DensePush> dense, std::vector<SparsePush> sparse,
                   Callback done) override;
  Ticket Watch(size_t shard, const std::map<std::string, uint64_t>& known,
               std::chrono::milliseconds wait, WatchReply* reply, Callback done) override;

 private:
  std::shared_ptr<Ticket::State> NewCall(int parts, Callback done);
  Header NewHeader(Op op, const std::string& table) const;
  // One shard's part of a call, with its header and the call deadline set.
  std::unique_ptr<Pending> NewPart(const std::shared_ptr<Ticket::State>& call, size_t shard, Op op,
                                   const std::string& table) const;
  // A push part: also its exactly-once seq, base version and flags.
  std::unique_ptr<Pending> NewPushPart(const std::shared_ptr<Ticket::State>& call, size_t shard,
                                       Op op, const std::string& table, const VersionVector& base,
                                       const PushOptions& opts);
  void Send(std::unique_ptr<Pending> p);
  // Replicated shards: moves `shard` to another replica when `from` (an endpoint
  // index) is not its primary; `hint` is the replica it named, if any.
  void Failover(size_t shard, size_t from, int64_t hint);
  void OnReply(size_t shard, Frames&& frames);
  void Expired(std::unique_ptr<Pending> p);
  void Retry(std::unique_ptr<Pending> p, Clock::time_point now, const Status& why);
  void Shutdown();
  StatusOr<std::shared_ptr<const TableMeta>> Meta(const std::string& table);
  void CacheMeta(const TableSpec& spec);
  // Sends `h` as `op` to every shard and waits for every reply; `each(shard, reply)`, when
  // given, sees each shard's reply header (on a client thread).
  Status Broadcast(Op op, const Header& h,
                   std::function<void(size_t, const Header&)> each = nullptr,
                   BroadcastOptions how = {});
  Ticket Failed(const Status& st, Callback done);
  void FillPushReply(PushReply* r, size_t shard, const Header& h);
  // Rows or elements per part of a pull of `units` of `unit_bytes` each: as many as
  // pull_part_bytes holds, but at most kMaxPullParts parts (all of them with 0).
  uint64_t UnitsPerPart(uint64_t units, uint64_t unit_bytes) const;
  // A part of a pull from shard `s` read at `version`: the shard's version in `versions`
  // is the oldest its parts read (`seen[s]`: one was recorded already).
  void NoteOldest(VersionVector* versions, std::vector<uint8_t>* seen, uint32_t s,
                  uint64_t version);
  // Sends one shard's part of a push; its reply fills `reply`, and `values` (when set)
  // takes the reply's frames of updated values.
  void SendPush(std::unique_ptr<Pending> p, PushReply* reply,
                std::function<Status(const Header&, const Frames&)> values = nullptr);

  PsClientOptions options_;
  std::unique_ptr<ClientTransport> transport_;
  std::vector<std::atomic<uint64_t>> seq_;  // per shard push sequence
  // Shard i's replicas are endpoints_[groups_[i][0..]]; primary_[i] indexes groups_[i].
  std::vector<std::string> endpoints_;
  std::vector<std::vector<size_t>> groups_;
  std::vector<std::atomic<size_t>> primary_;
  std::vector<std::atomic<uint64_t>> epoch_;  // highest replication epoch seen per shard

  // Attempts in flight and resends due later; its timer thread runs Expired and Send.
  RpcCalls<Pending> calls_{RequestIdPool::kMaxSlots,
                           [this](std::unique_ptr<Pending> p) { Expired(std::move(p)); },
                           [this](std::unique_ptr<Pending> p) { Send(std::move(p)); }};

  Mutex meta_mu_;
  std::map<std::string, std::shared_ptr<const TableMeta>> meta_ GUARDED_BY(meta_mu_);
  Mutex reply_mu_;  // serializes PushReply and pull version updates from different parts
};

Status PsClientImpl::Start() {
  if (options_.shards.empty()) return InvalidArgument("PsClient needs at least one shard endpoint");
  for (size_t s = 0; s < options_.shards.size(); ++s) {
    groups_.emplace_back();
    primary_[s].store(0);
    epoch_[s].store(0);
    const std::string& group = options_.shards[s];
    for (size_t b = 0; b <= group.size();) {
      size_t e = std::min(group.find('|', b), group.size());
      if (e == b)
        return InvalidArgument("shard " + std::to_string(s) + " '" + group +
                               "' has an empty replica endpoint (A|B|C expected)");
      groups_[s].push_back(endpoints_.size());
      endpoints_.push_back(group.substr(b, e - b));
      b = e + 1;
    }
  }
  transport_ = NewClientTransport(endpoints_, options_.transport);
  ONLINEPS_RETURN_IF_ERROR(transport_->Connect(
      endpoints_, [this](size_t target, Frames&& f) { OnReply(target, std::move(f)); }));
  calls_.Start();
  return Status::Ok();
}

void PsClientImpl::Shutdown() {
  std::vector<std::unique_ptr<Pending>> left = calls_.Stop();
  if (transport_) transport_->Close();
  for (auto& p : left) p->call->Complete(Cancelled("client shut down"));
}

std::shared_ptr<Ticket::State> PsClientImpl::NewCall(int parts, Callback done) {
  auto s = std::make_shared<Ticket::State>();
  MutexLock lock(&s->mu);  // not shared yet; for the analysis
  s->remaining = parts;
  s->callback = std::move(done);
  return s;
}

Ticket PsClientImpl::Failed(const Status& st, Callback done) {
  auto call = NewCall(1, std::move(done));
  call->Complete(st);
  return Ticket(call);
}

Header PsClientImpl::NewHeader(Op op, const std::string& table) const {
  Header h;
  h.op = op;
  h.sender = options_.sender_id;
  h.table = table;
  return h;
}

std::unique_ptr<Pending> PsClientImpl::NewPart(const std::shared_ptr<Ticket::State>& call,
                                               size_t shard, Op op,
                                               const std::string& table) const {
  auto p = std::make_unique<Pending>();
  p->call = call;
  p->shard = shard;
  p->header = NewHeader(op, table);
  p->call_deadline = After(Clock::now(), options_.timeout);
  return p;
}

uint32_t PushFlags(const PushOptions& opts) {
  return (opts.delta ? kFlagDelta : 0) | (opts.delta && opts.seed ? kFlagSeed : 0) |
         (opts.updated ? kFlagReturnValues : 0);
}

std::unique_ptr<Pending> PsClientImpl::NewPushPart(const std::shared_ptr<Ticket::State>& call,
                                                   size_t shard, Op op, const std::string& table,
                                                   const VersionVector& base,
                                                   const PushOptions& opts) {
  auto p = NewPart(call, shard, op, table);
  if (opts.sender != 0 && opts.seq != 0) {
    p->header.sender = opts.sender;
    p->header.seq = opts.seq;
  } else {
    p->header.seq = ++seq_[shard];
  }
  p->header.base_version = shard < base.size() ? base[shard] : 0;
  p->header.flags = PushFlags(opts);
  return p;
}

uint32_t PullFlags(const PullOptions& opts) {
  return (opts.averaged ? kFlagAveraged : 0) | (opts.record_backup ? 0 : kFlagNoBackup);
}

void PsClientImpl::Send(std::unique_ptr<Pending> p) {
  p->attempts++;
  p->attempt_deadline =
      std::min(After(After(Clock::now(), p->held_for), options_.attempt_timeout), p->call_deadline);
  const StatusOr<uint32_t> id = calls_.AddThen(
      &p, p->attempt_deadline,
      [this](uint32_t id, Pending& q) {
        q.header.request_id = id;
        q.target = groups_[q.shard][primary_[q.shard].load() % groups_[q.shard].size()];
        q.header.epoch = epoch_[q.shard].load();
        std::pair<size_t, Frames> out{q.target, {}};
        out.second.reserve(1 + q.payload.size());
        out.second.push_back(Frame::FromString(EncodeHeader(q.header)));
        for (const Frame& f : q.payload) out.second.push_back(f);
        return out;
      },
      [this](std::pair<size_t, Frames>&& out) {
        Status st = transport_->Send(out.first, std::move(out.second));
        if (!st.ok()) spdlog::debug("send to {} failed: {}", endpoints_[out.first], st.ToString());
      });
  if (!id.ok()) {
    // A resend may follow an attempt the shard applied: never report it as not sent.
    if (p->attempts > 1 && id.status().code() == StatusCode::kResourceExhausted) {
      return Retry(std::move(p), Clock::now(), Unavailable(id.status().message()));
    }
    p->call->Complete(id.status());
  }
}

void PsClientImpl::Failover(size_t shard, size_t from, int64_t hint) {
  const auto& group = groups_[shard];
  if (group.size() < 2) return;
  size_t cur = primary_[shard].load();
  if (group[cur % group.size()] != from) return;  // another reply moved it already
  size_t next = hint >= 0 && static_cast<size_t>(hint) < group.size() &&
                        group[static_cast<size_t>(hint)] != from
                    ? static_cast<size_t>(hint)
                    : (cur + 1) % group.size();
  if (primary_[shard].compare_exchange_strong(cur, next)) {
    spdlog::debug("shard {}: {} is not the primary; trying {}", shard, endpoints_[from],
                  endpoints_[group[next]]);
  }
}

void PsClientImpl::OnReply(size_t target, Frames&& frames) {
  if (frames.empty()) return;
  auto h = DecodeHeader(frames[0].data(), frames[0].size());
  if (!h.ok()) {
    spdlog::warn("undecodable reply from {}: {}", endpoints_[target], h.status().ToString());
    return;
  }
  // The id names the call; the target and the echoed table guard against a reply so late
  // that its id was issued again (ids come round after 65,536 x 65,535 calls).
  std::unique_ptr<Pending> p = calls_.Take(h->request_id, [&](const Pending& q) {
    return q.target == target && q.header.table == h->table;
  });
  if (!p) return;  // late or foreign
  const size_t shard = p->shard;
  Status st = ReplyStatus(*h);
  if (groups_[shard].size() > 1) {
    // Epoch fencing: never take an answer from a primary older than one already seen.
    uint64_t seen = epoch_[shard].load();
    while (h->epoch > seen && !epoch_[shard].compare_exchange_weak(seen, h->epoch)) {
    }
    if (h->epoch < seen && st.code() != StatusCode::kNotPrimary) {
      st = NotPrimary("answer from a deposed primary (epoch " + std::to_string(h->epoch) + " < " +
                      std::to_string(seen) + ")");
    }
  }
  if (st.code() == StatusCode::kNotPrimary) {
    // A deposed primary's answer names no primary; a real refusal may ("pri"). (Both arms
    // int64_t: with the uint32_t index as one, -1 became 4294967295, a "named primary",
    // and every election was a resend loop without a pause.)
    const int64_t hint = h->code == StatusCode::kNotPrimary && h->primary
                             ? static_cast<int64_t>(*h->primary)
                             : int64_t{-1};
    Failover(shard, target, hint);
    // Resend at once to a named primary; wait a little while an election runs.
    return Retry(std::move(p), Clock::now(),
                 hint >= 0 ? DeadlineExceeded(st.message()) : Unavailable(st.message()));
  }
  if (st.code() == StatusCode::kUnavailable) return Retry(std::move(p), Clock::now(), st);
  if (st.code() == StatusCode::kFailedPrecondition && p->attempts > 1 && p->header.seq != 0) {
    // A resend refused below the sender's dedup window (the window moved on past it): an
    // earlier attempt may have been applied and only its answer lost, so the outcome is
    // unknown, not "not applied" (a caller that took it for that and sent it again would
    // apply it twice).
    st = DeadlineExceeded("outcome unknown: a resend of this push was refused (" +
                          std::string(st.message()) +
                          ") and an earlier attempt may have been applied");
  }
  if (st.ok()) {
    try {
      st = p->on_reply(*h, frames);
    } catch (const std::exception& e) {
      st = Malformed(std::string("reply could not be read: ") + e.what());
    }
  }
  if (!st.ok())
    st = st.WithContext(std::string(OpName(p->header.op)) + " on shard " + std::to_string(shard));
  p->call->Complete(st);
}

void PsClientImpl::Retry(std::unique_ptr<Pending> p, Clock::time_point now, const Status& why) {
  if (now >= p->call_deadline) {
    p->call->Complete(DeadlineExceeded(
        std::string(OpName(p->header.op)) + " '" + p->header.table + "' on shard " +
        std::to_string(p->shard) + " (" + options_.shards[p->shard] + ") got no answer in " +
        std::to_string(options_.timeout.count()) + " ms after " + std::to_string(p->attempts) +
        " attempt(s); last: " + why.message()));
    return;
  }
  // A refused attempt (draining, in progress) waits a little; a lost one resends now.
  auto when = why.code() == StatusCode::kUnavailable ? now + std::chrono::milliseconds(20) : now;
  if (auto stopped = calls_.Later(when, std::move(p))) {
    stopped->call->Complete(Cancelled("client shut down"));
  }
}

// On the timer thread: an attempt got no answer in time.
void PsClientImpl::Expired(std::unique_ptr<Pending> p) {
  Failover(p->shard, p->target, -1);  // a silent replica may be a dead primary
  Retry(std::move(p), Clock::now(), DeadlineExceeded("attempt timed out"));
}

}  // namespace

namespace {

StatusOr<std::shared_ptr<const TableMeta>> PsClientImpl::Meta(const std::string& table) {
  {
    MutexLock lock(&meta_mu_);
    auto it = meta_.find(table);
    if (it != meta_.end()) return it->second;
  }
  auto spec = OpenTable(table);
  if (!spec.ok()) return spec.status();
  MutexLock lock(&meta_mu_);
  return meta_.at(table);
}

void PsClientImpl::CacheMeta(const TableSpec& spec) {
  auto m = std::make_shared<TableMeta>();
  m->spec = spec;
  if (spec.kind == TableKind::kDense) {
    const uint32_t n = static_cast<uint32_t>(num_shards());
    m->layout = std::make_unique<DenseLayout>(spec.name, spec.size(), n);
    for (uint32_t s = 0; s < n; ++s) {
      const auto& sl = m->layout->SlicesOf(s);
      bool contiguous = true;
      for (size_t i = 1; i < sl.size(); ++i) {
        contiguous &= sl[i].offset == sl[i - 1].offset + sl[i - 1].length;
      }
      m->contiguous.push_back(contiguous);
    }
  }
  MutexLock lock(&meta_mu_);
  meta_[spec.name] = std::move(m);
}

Status PsClientImpl::Broadcast(Op op, const Header& h,
                               std::function<void(size_t, const Header&)> each,
                               BroadcastOptions how) {
  auto call = NewCall(static_cast<int>(num_shards()), nullptr);
  for (size_t s = 0; s < num_shards(); ++s) {
    auto p = NewPart(call, s, op, h.table);
    if (how.timeout) {
      p->call_deadline = std::min(p->call_deadline, After(Clock::now(), *how.timeout));
    }
    if (how.one_attempt) p->held_for = options_.timeout;
    p->header = h;
    p->header.op = op;
    p->on_reply = [s, each](const Header& reply, const Frames&) {
      if (each) each(s, reply);
      return Status::Ok();
    };
    Send(std::move(p));
  }
  return Ticket(call).Wait();
}

Status PsClientImpl::CreateTable(const TableSpec& spec) {
  Header h = NewHeader(Op::kCreateTable, spec.name);
  h.spec = EncodeSpec(spec);
  auto decoded = DecodeSpec(h.spec);  // validate locally first: a clearer error, no traffic
  if (!decoded.ok()) return decoded.status();
  ONLINEPS_RETURN_IF_ERROR(Broadcast(Op::kCreateTable, h));
  CacheMeta(*decoded);
  return Status::Ok();
}

StatusOr<TableSpec> PsClientImpl::OpenTable(const std::string& name) {
  auto call = NewCall(1, nullptr);
  auto spec_map = std::make_shared<std::map<std::string, std::string>>();
  auto p = NewPart(call, 0, Op::kTableInfo, name);
  p->on_reply = [spec_map](const Header& h, const Frames&) {
    for (const auto& [k, v] : h.spec) {
      if (k.rfind("stat.", 0) != 0) (*spec_map)[k] = v;
    }
    return Status::Ok();
  };
  Send(std::move(p));
  ONLINEPS_RETURN_IF_ERROR(Ticket(call).Wait());
  auto spec = DecodeSpec(*spec_map);
  if (!spec.ok()) return spec.status();
  CacheMeta(*spec);
  return spec;
}

StatusOr<std::vector<std::map<std::string, std::string>>> PsClientImpl::TableInfo(
    const std::string& name) {
  using Info = std::vector<std::map<std::string, std::string>>;
  auto call = NewCall(static_cast<int>(num_shards()), nullptr);
  auto info = std::make_shared<Info>(num_shards());
  for (size_t s = 0; s < num_shards(); ++s) {
    auto p = NewPart(call, s, Op::kTableInfo, name);
    p->on_reply = [info, s](const Header& h, const Frames&) {
      (*info)[s] = h.spec;  // each part's reply runs once, on its own slot
      return Status::Ok();
    };
    Send(std::move(p));
  }
  ONLINEPS_RETURN_IF_ERROR(Ticket(call).Wait());
  return std::move(*info);
}

Status PsClientImpl::WaitForShards(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const size_t n = num_shards();
  Status last;
  while (Clock::now() < deadline) {
    // Each shard says which it is: a list in the wrong order or of the wrong length would
    // send dense slices (which carry no keys to check) to the wrong shards.
    auto wrong = std::make_shared<std::vector<std::string>>(n);
    auto counts = std::make_shared<std::vector<std::string>>(n);  // what each says it is of
    // Each round's pings end by the deadline: WaitForShards(1 s) takes 1 s, not the
    // 5 s call timeout (a probe thread waited it out at shutdown).
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    last = Broadcast(
        Op::kPing, NewHeader(Op::kPing, ""),
        [n, wrong, counts](size_t s, const Header& h) {
          auto shard = h.spec.find("shard");
          auto of = h.spec.find("num_shards");
          if (of != h.spec.end()) (*counts)[s] = of->second;
          if (shard != h.spec.end() && of != h.spec.end() &&
              (shard->second != std::to_string(s) || of->second != std::to_string(n))) {
            (*wrong)[s] = "position " + std::to_string(s) + " of the list is shard " +
                          shard->second + " of " + of->second;
          }
        },
        BroadcastOptions{std::max(left, std::chrono::milliseconds(1))});
    if (last.ok()) {
      std::string problems;
      for (size_t s = 0; s < n; ++s) {
        if (wrong->at(s).empty()) continue;
        problems += (problems.empty() ? "" : "; ") + wrong->at(s) + " (" + options_.shards[s] + ")";
      }
      if (problems.empty()) return last;
      // The count to name is the shards' own, when they agree on one (not the list's).
      std::string all = counts->at(0);
      for (const std::string& c : *counts) {
        if (c != all) all.clear();
      }
      return FailedPrecondition(
          "the shard list does not match the shards: " + problems + ". Name all " +
          (all.empty() ? std::string() : all + " ") +
          "shards, shard i at position i, as each was started (--shard-index, --num-shards)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return last.ok() ? DeadlineExceeded("shards did not answer") : last;
}

Status PsClientImpl::Checkpoint() {
  // A checkpoint's answer comes when the file is written, however long that takes: one
  // attempt for the whole call (a resend would only ask for another checkpoint). A ping
  // first finds each group's live primary (attempts time out and fail over), since the
  // checkpoint's one attempt cannot.
  ONLINEPS_RETURN_IF_ERROR(Broadcast(Op::kPing, NewHeader(Op::kPing, "")));
  BroadcastOptions once;
  once.one_attempt = true;
  return Broadcast(Op::kCheckpoint, NewHeader(Op::kCheckpoint, ""), nullptr, once);
}

void PsClientImpl::FillPushReply(PushReply* r, size_t shard, const Header& h) {
  if (r == nullptr) return;
  MutexLock lock(&reply_mu_);
  r->versions[shard] = h.version;
  r->taus[shard] = h.tau;
  r->max_tau = std::max(r->max_tau, h.tau);
  r->max_version = std::max(r->max_version, h.version);
  r->queued |= h.queued;
  r->duplicate |= h.message.rfind("duplicate", 0) == 0;
  ++r->shards_took;
}

void PsClientImpl::SendPush(std::unique_ptr<Pending> p, PushReply* reply,
                            std::function<Status(const Header&, const Frames&)> values) {
  const size_t shard = p->shard;
  p->on_reply = [this, reply, shard, values = std::move(values)](const Header& h, const Frames& f) {
    if (values) ONLINEPS_RETURN_IF_ERROR(values(h, f));
    FillPushReply(reply, shard, h);
    return Status::Ok();
  };
  Send(std::move(p));
}

namespace {

// Scatters a dense reply's frame 1, elements [first, first + count) of shard `s`'s (its
// slices concatenated in tensor order), into `out`. A reply of all the shard's elements
// (a shard that reads no ranges) serves any range.
Status ScatterDense(const TableMeta& m, uint32_t s, uint64_t first, uint64_t count, const Frames& f,
                    float* out) {
  const uint64_t all = m.layout->ElemsOf(s);
  const int64_t got = f.size() < 2 ? -1 : f[1].CountOf<float>();
  if (got != static_cast<int64_t>(count) && got != static_cast<int64_t>(all)) {
    return ShapeMismatch("expected " + std::to_string(count) + " floats in the reply");
  }
  const float* src = f[1].As<float>() + (got == static_cast<int64_t>(count) ? 0 : first);
  uint64_t at = 0;  // the shard's element where slice `sl` starts
  for (const DenseSlice& sl : m.layout->SlicesOf(s)) {
    const uint64_t lo = std::max(at, first), hi = std::min(at + sl.length, first + count);
    if (lo < hi)
      std::memcpy(out + sl.offset + (lo - at), src + (lo - first), (hi - lo) * sizeof(float));
    at += sl.length;
  }
  return Status::Ok();
}

// Scatters a sparse reply's frame 1 (n rows) into `out`: row i to row pos[i], or, with no
// `pos` (one shard: the call's keys in order), to row first + i.
Status ScatterRows(const uint32_t* pos, size_t first, size_t n, uint32_t d, const Frames& f,
                   float* out) {
  if (f.size() < 2 || f[1].CountOf<float>() != static_cast<int64_t>(n * d)) {
    return ShapeMismatch("expected " + std::to_string(n * d) + " floats in the reply");
  }
  const float* src = f[1].As<float>();
  if (pos == nullptr) {
    std::memcpy(out + first * d, src, n * d * sizeof(float));
    return Status::Ok();
  }
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(out + size_t{pos[i]} * d, src + i * d, d * sizeof(float));
  }
  return Status::Ok();
}

}  // namespace

uint64_t PsClientImpl::UnitsPerPart(uint64_t units, uint64_t unit_bytes) const {
  if (options_.pull_part_bytes == 0) return std::max<uint64_t>(units, 1);
  return std::max({uint64_t{1}, uint64_t{options_.pull_part_bytes / unit_bytes},
                   (units + kMaxPullParts - 1) / kMaxPullParts});
}

void PsClientImpl::NoteOldest(VersionVector* versions, std::vector<uint8_t>* seen, uint32_t s,
                              uint64_t version) {
  MutexLock lock(&reply_mu_);
  uint64_t& v = (*versions)[s];
  v = (*seen)[s] ? std::min(v, version) : version;
  (*seen)[s] = 1;
}

Ticket PsClientImpl::PullDense(const std::string& table, float* out, VersionVector* versions,
                               PullOptions opts, Callback done) {
  auto meta = Meta(table);
  if (!meta.ok()) return Failed(meta.status(), std::move(done));
  std::shared_ptr<const TableMeta> m = *meta;
  if (m->spec.kind != TableKind::kDense) {
    return Failed(InvalidArgument("table '" + table + "' is sparse"), std::move(done));
  }
  const uint32_t n = static_cast<uint32_t>(num_shards());
  if (versions) versions->assign(n, 0);
  // As a sparse pull: a shard's elements past pull_part_bytes go out as several ranges at
  // once. Not for DC-ASGD tables, whose pull records the copy it read as a whole.
  const bool whole = RecordsPullBackups(m->spec);
  auto per_part = [&](uint64_t elems) {
    return whole ? std::max<uint64_t>(elems, 1) : UnitsPerPart(elems, sizeof(float));
  };
  int count = 0;
  for (uint32_t s = 0; s < n; ++s) {
    const uint64_t elems = m->layout->ElemsOf(s);
    count +=
        static_cast<int>(std::max<uint64_t>(1, (elems + per_part(elems) - 1) / per_part(elems)));
  }
  auto call = NewCall(count, std::move(done));
  auto seen = std::make_shared<std::vector<uint8_t>>(n, 0);  // under reply_mu_, as for sparse
  for (uint32_t s = 0; s < n; ++s) {
    const uint64_t elems = m->layout->ElemsOf(s), per = per_part(elems);
    for (uint64_t first = 0; first == 0 || first < elems; first += per) {
      const uint64_t len = std::min(per, elems - first);
      auto p = NewPart(call, s, Op::kPullDense, table);
      p->header.flags = PullFlags(opts);
      if (len < elems) p->header.shape = {first, len};
      p->on_reply = [this, m, s, first, len, out, versions, seen](const Header& h,
                                                                  const Frames& f) -> Status {
        ONLINEPS_RETURN_IF_ERROR(ScatterDense(*m, s, first, len, f, out));
        if (versions) NoteOldest(versions, seen.get(), s, h.version);
        return Status::Ok();
      };
      Send(std::move(p));
    }
  }
  return Ticket(call);
}

Ticket PsClientImpl::PushDense(const std::string& table, const float* values,
                               const VersionVector& base, PushReply* reply, PushOptions opts,
                               Callback done) {
  auto meta = Meta(table);
  if (!meta.ok()) return Failed(meta.status(), std::move(done));
  Frame copy = CopyOf(values, (*meta)->spec.size());
  return PushDense(table, std::move(copy), base, reply, opts, std::move(done));
}

// The checks every dense push makes before anything is sent.
Status CheckDensePush(const TableMeta& m, const std::string& table, const Frame& values) {
  if (m.spec.kind != TableKind::kDense) {
    return InvalidArgument("table '" + table + "' is sparse");
  }
  if (values.size() != m.spec.size() * sizeof(float)) {
    return ShapeMismatch("table '" + table + "' has " + std::to_string(m.spec.size()) +
                         " elements, the push carries " +
                         std::to_string(values.size() / sizeof(float)));
  }
  return Status::Ok();
}

// Shard `s`'s slices of a dense tensor, in tensor order: a zero-copy slice of `values`
// when they form one range, else a gathered copy.
Frame ShardSlices(const TableMeta& m, uint32_t s, const Frame& values) {
  const auto& slices = m.layout->SlicesOf(s);
  if (slices.empty()) return Frame();
  if (m.contiguous[s]) {
    return Slice(values, slices[0].offset * sizeof(float), m.layout->ElemsOf(s) * sizeof(float));
  }
  const float* base_ptr = values.As<float>();
  std::vector<float> gathered;
  gathered.reserve(m.layout->ElemsOf(s));
  for (const DenseSlice& sl : slices) {
    gathered.insert(gathered.end(), base_ptr + sl.offset, base_ptr + sl.offset + sl.length);
  }
  return Frame::FromVector(std::move(gathered));
}

Ticket PsClientImpl::PushDense(const std::string& table, Frame values, const VersionVector& base,
                               PushReply* reply, PushOptions opts, Callback done) {
  auto meta = Meta(table);
  if (!meta.ok()) return Failed(meta.status(), std::move(done));
  const auto& m = **meta;
  if (Status st = CheckDensePush(m, table, values); !st.ok()) return Failed(st, std::move(done));
  const uint32_t n = static_cast<uint32_t>(num_shards());
  if (reply) *reply = PushReply{std::vector<uint64_t>(n), std::vector<uint64_t>(n)};
  auto call = NewCall(static_cast<int>(n), std::move(done));
  for (uint32_t s = 0; s < n; ++s) {
    auto p = NewPushPart(call, s, Op::kPushDense, table, base, opts);
    p->header.shape = {m.layout->ElemsOf(s)};
    p->payload.push_back(ShardSlices(m, s, values));
    std::function<Status(const Header&, const Frames&)> values;
    if (opts.updated) {
      values = [m = *meta, s, out = opts.updated](const Header&, const Frames& f) {
        return ScatterDense(*m, s, 0, m->layout->ElemsOf(s), f, out);
      };
    }
    SendPush(std::move(p), reply, std::move(values));
  }
  return Ticket(call);
}

// Keys of one call grouped by shard, remembering each key's position in the call.
struct ShardGroups {
  std::vector<std::vector<uint64_t>> keys;
  std::vector<std::vector<uint32_t>> pos;
};

ShardGroups GroupKeys(const uint64_t* keys, size_t n, uint32_t shards) {
  ShardGroups g;
  g.keys.resize(shards);
  g.pos.resize(shards);
  for (size_t i = 0; i < n; ++i) {
    const uint32_t s = ShardOfKey(keys[i], shards);
    g.keys[s].push_back(keys[i]);
    g.pos[s].push_back(static_cast<uint32_t>(i));
  }
  return g;
}

// Rows pos[0], pos[1], ... of `values` (rows of d floats), in that order.
std::vector<float> GatherRows(const float* values, const std::vector<uint32_t>& pos, uint32_t d) {
  std::vector<float> rows(pos.size() * d);
  for (size_t r = 0; r < pos.size(); ++r) {
    std::memcpy(rows.data() + r * d, values + size_t{pos[r]} * d, d * sizeof(float));
  }
  return rows;
}

Ticket PsClientImpl::PushBatch(std::vector<DensePush> dense, std::vector<SparsePush> sparse,
                               Callback done) {
  if (dense.empty() && sparse.empty()) return Failed(Status::Ok(), std::move(done));
  const uint32_t n = static_cast<uint32_t>(num_shards());
  // Every table checked before anything is sent; the meta of dense pushes, then sparse.
  auto metas = std::make_shared<std::vector<std::shared_ptr<const TableMeta>>>();
  auto check = [&](const std::string& table, const PushOptions& opts, PushReply* reply,
                   const std::function<Status(const TableMeta&)>& shape) -> Status {
    auto meta = Meta(table);
    if (!meta.ok()) return meta.status();
    Status st = shape(**meta);
    if (st.ok() && HoldsReplies((*meta)->spec)) {
      st = InvalidArgument("table '" + table + "' holds replies (block bound mode): push it alone");
    } else if (st.ok() && (opts.sender != 0 || opts.seq != 0)) {
      st = InvalidArgument("push to '" + table + "' with a fixed (sender, seq) goes alone");
    }
    if (!st.ok()) return st;
    metas->push_back(*std::move(meta));
    if (reply) *reply = PushReply{std::vector<uint64_t>(n), std::vector<uint64_t>(n)};
    return Status::Ok();
  };
  for (DensePush& p : dense) {
    Status st = check(p.table, p.opts, p.reply,
                      [&](const TableMeta& m) { return CheckDensePush(m, p.table, p.values); });
    if (!st.ok()) return Failed(st, std::move(done));
  }
  for (SparsePush& p : sparse) {
    Status st = check(p.table, p.opts, p.reply, [&](const TableMeta& m) -> Status {
      if (m.spec.kind != TableKind::kSparse) {
        return InvalidArgument("table '" + p.table + "' is dense");
      }
      if (p.values.size() != p.keys.size() * m.spec.dim) {
        return InvalidArgument("push to '" + p.table + "': " + std::to_string(p.keys.size()) +
                               " keys need " + std::to_string(p.keys.size() * m.spec.dim) +
                               " values (dim " + std::to_string(m.spec.dim) + "), not " +
                               std::to_string(p.values.size()));
      }
      return Status::Ok();
    });
    if (!st.ok()) return Failed(st, std::move(done));
  }
  // Sparse rows by shard, each row's position in its push kept for RETURN_VALUES.
  auto groups = std::make_shared<std::vector<ShardGroups>>();
  for (const SparsePush& p : sparse) groups->push_back(GroupKeys(p.keys.data(), p.keys.size(), n));
  auto batch_dense = std::make_shared<const std::vector<DensePush>>(std::move(dense));
  auto batch_sparse = std::make_shared<const std::vector<SparsePush>>(std::move(sparse));
  // What sub-push i has either way (pointing into the batches, which the replies keep).
  struct Common {
    const std::string* table;
    const PushOptions* opts;
    const VersionVector* base;
    PushReply* reply;
  };
  auto common = std::make_shared<std::vector<Common>>();
  for (const DensePush& p : *batch_dense) common->push_back({&p.table, &p.opts, &p.base, p.reply});
  for (const SparsePush& p : *batch_sparse)
    common->push_back({&p.table, &p.opts, &p.base, p.reply});
  // Sub-push i of shard s's message: dense table i (i < dense count), or sparse table
  // i - dense count; a shard gets the sparse tables it owns rows of.
  std::vector<std::vector<size_t>> subs(n);
  for (uint32_t s = 0; s < n; ++s) {
    for (size_t i = 0; i < batch_dense->size(); ++i) subs[s].push_back(i);
    for (size_t j = 0; j < batch_sparse->size(); ++j) {
      if (!(*groups)[j].keys[s].empty()) subs[s].push_back(batch_dense->size() + j);
    }
  }
  int parts = 0;
  for (const auto& sub : subs) parts += !sub.empty();
  if (parts == 0) return Failed(Status::Ok(), std::move(done));
  auto call = NewCall(parts, std::move(done));
  for (uint32_t s = 0; s < n; ++s) {
    if (subs[s].empty()) continue;
    auto part = NewPart(call, s, Op::kPushBatch, "");
    for (size_t i : subs[s]) {
      const bool is_dense = i < batch_dense->size();
      const Common& c = (*common)[i];
      Header sub = NewHeader(is_dense ? Op::kPushDense : Op::kPushSparse, *c.table);
      sub.seq = ++seq_[s];  // fixed now: a resend of the message carries the same seqs
      sub.base_version = s < c.base->size() ? (*c.base)[s] : 0;
      sub.flags = PushFlags(*c.opts);
      if (is_dense) {
        const TableMeta& m = *(*metas)[i];
        sub.shape = {m.layout->ElemsOf(s)};
        part->header.shape.push_back(2);
        part->payload.push_back(Frame::FromString(EncodeHeader(sub)));
        part->payload.push_back(ShardSlices(m, s, (*batch_dense)[i].values));
      } else {
        const size_t j = i - batch_dense->size();
        const SparsePush& p = (*batch_sparse)[j];
        const uint32_t d = (*metas)[i]->spec.dim;
        const std::vector<uint32_t>& pos = (*groups)[j].pos[s];
        std::vector<float> vals = GatherRows(p.values.data(), pos, d);
        sub.shape = {pos.size(), d};
        part->header.shape.push_back(3);
        part->payload.push_back(Frame::FromString(EncodeHeader(sub)));
        part->payload.push_back(CopyOf((*groups)[j].keys[s].data(), pos.size()));
        part->payload.push_back(Frame::FromVector(std::move(vals)));
      }
    }
    part->on_reply = [this, batch_dense, batch_sparse, common, metas, groups, s, which = subs[s]](
                         const Header& h, const Frames& f) -> Status {
      if (h.shape.size() != which.size()) {
        return Malformed("push_batch reply answers " + std::to_string(h.shape.size()) +
                         " sub-pushes, " + std::to_string(which.size()) + " were sent");
      }
      StatusOr<std::vector<Frames>> replies = SplitFrameGroups(h.shape, f);
      if (!replies.ok()) return replies.status().WithContext("push_batch reply");
      Status first;
      for (size_t k = 0; k < which.size(); ++k) {
        const size_t i = which[k];
        const bool is_dense = i < batch_dense->size();
        const Common& c = (*common)[i];
        float* updated = c.opts->updated;
        const Frames& sub = (*replies)[k];
        auto sh = DecodeHeader(sub[0].data(), sub[0].size());
        Status st = sh.ok() ? ReplyStatus(*sh) : sh.status();
        if (st.ok() && updated) {
          const TableMeta& m = *(*metas)[i];
          if (is_dense) {
            st = ScatterDense(m, s, 0, m.layout->ElemsOf(s), sub, updated);
          } else {
            const std::vector<uint32_t>& pos = (*groups)[i - batch_dense->size()].pos[s];
            st = ScatterRows(pos.data(), 0, pos.size(), m.spec.dim, sub, updated);
          }
        }
        if (st.ok()) {
          FillPushReply(c.reply, s, *sh);
        } else if (first.ok()) {
          first = st.WithContext(std::string(is_dense ? "push_dense '" : "push_sparse '") +
                                 *c.table + "'");
        }
      }
      return first;
    };
    Send(std::move(part));
  }
  return Ticket(call);
}

}  // namespace

namespace {

StatusOr<uint32_t> SparseDim(StatusOr<std::shared_ptr<const TableMeta>>& meta,
                             const std::string& table) {
  if (!meta.ok()) return meta.status();
  if ((*meta)->spec.kind != TableKind::kSparse) {
    return InvalidArgument("table '" + table + "' is dense");
  }
  return (*meta)->spec.dim;
}

Ticket PsClientImpl::PullSparse(const std::string& table, const uint64_t* keys, size_t n,
                                float* out, VersionVector* versions, PullOptions opts,
                                Callback done) {
  auto meta = Meta(table);
  auto dim = SparseDim(meta, table);
  if (!dim.ok()) return Failed(dim.status(), std::move(done));
  const uint32_t shards = static_cast<uint32_t>(num_shards());
  const uint32_t d = *dim;
  if (versions) versions->assign(shards, 0);
  if (n == 0) return Failed(Status::Ok(), std::move(done));
  // A large pull goes out in parts of at most pull_part_bytes of rows, all at once: the
  // shard reads part k + 1 while part k is on the wire and the client copies out part
  // k - 1. Each shard's version is the oldest its parts read.
  const size_t rows_per_part = UnitsPerPart(n, size_t{d} * sizeof(float));
  struct Parts {
    ShardGroups groups;         // empty with one shard: key i is row i
    std::vector<uint8_t> seen;  // per shard: a part's version was taken (under reply_mu_)
  };
  auto parts = std::make_shared<Parts>();
  if (shards > 1) parts->groups = GroupKeys(keys, n, shards);
  parts->seen.assign(shards, 0);
  auto rows_of = [&](uint32_t s) { return shards == 1 ? n : parts->groups.keys[s].size(); };
  int count = 0;
  for (uint32_t s = 0; s < shards; ++s) {
    count += static_cast<int>((rows_of(s) + rows_per_part - 1) / rows_per_part);
  }
  auto call = NewCall(count, std::move(done));
  for (uint32_t s = 0; s < shards; ++s) {
    const uint64_t* shard_keys = shards == 1 ? keys : parts->groups.keys[s].data();
    for (size_t first = 0; first < rows_of(s); first += rows_per_part) {
      const size_t rows = std::min(rows_per_part, rows_of(s) - first);
      auto p = NewPart(call, s, Op::kPullSparse, table);
      p->header.flags = PullFlags(opts);
      p->header.shape = {rows};
      p->payload.push_back(CopyOf(shard_keys + first, rows));
      p->on_reply = [this, parts, s, first, rows, d, out, versions](const Header& h,
                                                                    const Frames& f) -> Status {
        const uint32_t* pos =
            parts->groups.pos.empty() ? nullptr : parts->groups.pos[s].data() + first;
        ONLINEPS_RETURN_IF_ERROR(ScatterRows(pos, first, rows, d, f, out));
        if (versions) NoteOldest(versions, &parts->seen, s, h.version);
        return Status::Ok();
      };
      Send(std::move(p));
    }
  }
  return Ticket(call);
}

Ticket PsClientImpl::PushSparse(const std::string& table, const uint64_t* keys, size_t n,
                                const float* values, const VersionVector& base, PushReply* reply,
                                PushOptions opts, Callback done) {
  auto meta = Meta(table);
  auto dim = SparseDim(meta, table);
  if (!dim.ok()) return Failed(dim.status(), std::move(done));
  if (num_shards() == 1) {  // one shard: the caller's arrays are the whole message
    return PushSparse(table, CopyOf(keys, n), CopyOf(values, n * *dim), base, reply,
                      std::move(opts), std::move(done));
  }
  const uint32_t shards = static_cast<uint32_t>(num_shards());
  if (reply) *reply = PushReply{std::vector<uint64_t>(shards), std::vector<uint64_t>(shards)};
  ShardGroups groups = GroupKeys(keys, n, shards);
  int parts = 0;
  for (const auto& k : groups.keys) parts += !k.empty();
  if (parts == 0) return Failed(Status::Ok(), std::move(done));
  auto call = NewCall(parts, std::move(done));
  const uint32_t d = *dim;
  for (uint32_t s = 0; s < shards; ++s) {
    if (groups.keys[s].empty()) continue;
    auto p = NewPushPart(call, s, Op::kPushSparse, table, base, opts);
    p->header.shape = {groups.keys[s].size(), d};
    std::vector<float> vals = GatherRows(values, groups.pos[s], d);
    p->payload.push_back(Frame::FromVector(std::move(groups.keys[s])));
    p->payload.push_back(Frame::FromVector(std::move(vals)));
    std::function<Status(const Header&, const Frames&)> scatter;
    if (opts.updated) {
      scatter = [pos = std::move(groups.pos[s]), d, out = opts.updated](const Header&,
                                                                        const Frames& f) {
        return ScatterRows(pos.data(), 0, pos.size(), d, f, out);
      };
    }
    SendPush(std::move(p), reply, std::move(scatter));
  }
  return Ticket(call);
}

Ticket PsClientImpl::PushSparse(const std::string& table, Frame keys, Frame values,
                                const VersionVector& base, PushReply* reply, PushOptions opts,
                                Callback done) {
  auto meta = Meta(table);
  auto dim = SparseDim(meta, table);
  if (!dim.ok()) return Failed(dim.status(), std::move(done));
  const uint32_t d = *dim;
  const size_t n = keys.size() / sizeof(uint64_t);
  if (keys.size() % sizeof(uint64_t) != 0 || values.size() != n * d * sizeof(float)) {
    return Failed(InvalidArgument("push to '" + table + "': " + std::to_string(keys.size()) +
                                  " bytes of keys and " + std::to_string(values.size()) +
                                  " bytes of values do not make rows of dim " + std::to_string(d)),
                  std::move(done));
  }
  if (num_shards() > 1) {
    // Split by shard: copies either way. Aligned copies first if the frames are not.
    std::vector<uint64_t> k(n);
    std::vector<float> v(n * d);
    std::memcpy(k.data(), keys.data(), keys.size());
    std::memcpy(v.data(), values.data(), values.size());
    return PushSparse(table, k.data(), n, v.data(), base, reply, std::move(opts), std::move(done));
  }
  if (n == 0) return Failed(Status::Ok(), std::move(done));
  if (reply) *reply = PushReply{std::vector<uint64_t>(1), std::vector<uint64_t>(1)};
  auto call = NewCall(1, std::move(done));
  auto p = NewPushPart(call, 0, Op::kPushSparse, table, base, opts);
  p->header.shape = {n, d};
  p->payload.push_back(std::move(keys));
  p->payload.push_back(std::move(values));
  std::function<Status(const Header&, const Frames&)> scatter;
  if (opts.updated) {
    scatter = [n, d, out = opts.updated](const Header&, const Frames& f) {
      return ScatterRows(nullptr, 0, n, d, f, out);
    };
  }
  SendPush(std::move(p), reply, std::move(scatter));
  return Ticket(call);
}

}  // namespace

Ticket PsClientImpl::Watch(size_t shard, const std::map<std::string, uint64_t>& known,
                           std::chrono::milliseconds wait, WatchReply* reply, Callback done) {
  if (shard >= num_shards()) {
    return Failed(InvalidArgument("watch: no shard " + std::to_string(shard)), std::move(done));
  }
  auto call = NewCall(1, std::move(done));
  auto p = NewPart(call, shard, Op::kWatch, "");
  p->header.spec["wait_ms"] = std::to_string(wait.count());
  for (const auto& [table, version] : known) p->header.spec["t." + table] = std::to_string(version);
  p->held_for = wait;
  p->call_deadline = After(p->call_deadline, wait);
  p->on_reply = [reply](const Header& h, const Frames& f) -> Status {
    WatchReply r;
    for (const auto& [k, v] : h.spec) {
      if (k == "inc") r.incarnation = v;
      if (k.size() < 3 || k[1] != '.' || (k[0] != 't' && k[0] != 'k')) continue;
      const std::string table = k.substr(2);
      const std::optional<uint64_t> n = ParseSpecU64(v);
      if (k[0] == 't') {
        if (!n) return Malformed("watch reply: version of '" + table + "' is '" + v + "'");
        r.versions[table] = *n;
      } else if (v == "all") {
        r.all_keys.insert(table);
      } else {
        const uint64_t i = n.value_or(0);
        if (i == 0 || i >= f.size() || f[i].CountOf<uint64_t>() < 0) {
          return Malformed("watch reply: keys of '" + table + "' name no whole uint64 frame");
        }
        const uint64_t* keys = f[i].As<uint64_t>();
        r.keys[table].assign(keys, keys + f[i].CountOf<uint64_t>());
      }
    }
    if (reply) *reply = std::move(r);
    return Status::Ok();
  };
  Send(std::move(p));
  return Ticket(call);
}

StatusOr<std::unique_ptr<PsClient>> PsClient::Connect(PsClientOptions options) {
  auto client = std::make_unique<PsClientImpl>(std::move(options));
  ONLINEPS_RETURN_IF_ERROR(client->Start());
  return std::unique_ptr<PsClient>(std::move(client));
}

}  // namespace onlineps::ps
