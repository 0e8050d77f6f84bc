#include "worker/local_group.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <exception>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/transport.h"
#include "common/wire.h"

namespace onlineps::worker {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "payload frames are raw little-endian arrays: add byte swapping for this host");

// A call is a wire message (common/wire.h, docs/protocol.md "Local group"):
// [header, payload]. Header: op kGroupSumFloats / kGroupMinU64, sid = the member's rank,
// seq = the call's sequence number, shape = {n}, spec {"group_size": N}; the payload is
// n raw elements. The leader's reply: op kReply with the same seq and shape and the
// result as payload, or a code and message and no payload.
constexpr const char* kSizeKey = "group_size";
// Calls a member may make before the leader makes them (it gave up waiting for a reply
// the leader has not sent yet); more than that and the member is answered with an error.
constexpr size_t kMaxEarlyCalls = 4;
// How long closing a member may keep flushing what it sent last (ZMQ_LINGER), and how
// long destroying the leader waits for the members to confirm its last replies.
constexpr milliseconds kLinger{1000};

size_t ElemSize(Op op) { return op == Op::kGroupSumFloats ? sizeof(float) : sizeof(uint64_t); }
const char* OpLabel(Op op) { return op == Op::kGroupSumFloats ? "SumFloats" : "MinU64"; }

std::string CallName(Op op, uint64_t seq, uint64_t n) {
  return "group call #" + std::to_string(seq) + " " + OpLabel(op) + "(n=" + std::to_string(n) + ")";
}

std::string Ms(milliseconds d) { return std::to_string(d.count()) + " ms"; }

// One message as the transport delivered it, decoded on the thread that drives the group.
struct Received {
  std::string peer;  // leader: the member's transport identity
  Frames frames;
};

// A call decoded at the leader.
struct Incoming {
  std::string peer;
  Header header;
  uint32_t size = 0;  // the group size the member believes in
  Frame payload;
  uint64_t n() const { return header.shape.empty() ? 0 : header.shape[0]; }
};

// Messages handed from the transport's threads to the member's own thread. Bounded: a
// flood beyond `capacity` is dropped (the leader answers each dropped call with an error).
class Inbox {
 public:
  explicit Inbox(size_t capacity) : capacity_(capacity) {}

  bool Put(Received r) {
    MutexLock lock(&mu_);
    if (queue_.size() >= capacity_) return false;
    queue_.push_back(std::move(r));
    cv_.Signal();
    return true;
  }
  std::optional<Received> Take(Clock::time_point deadline) {
    MutexLock lock(&mu_);
    if (!cv_.WaitUntil(&mu_, deadline, [&]() REQUIRES(mu_) { return !queue_.empty(); })) {
      return std::nullopt;
    }
    Received r = std::move(queue_.front());
    queue_.pop_front();
    return r;
  }

 private:
  const size_t capacity_;
  Mutex mu_;
  CondVar cv_;
  std::deque<Received> queue_ GUARDED_BY(mu_);
};

Frames Message(const Header& h, Frame payload) {
  Frames frames{Frame::FromString(EncodeHeader(h))};
  frames.push_back(std::move(payload));
  return frames;
}

class LocalGroupImpl final : public GroupReducer {
 public:
  explicit LocalGroupImpl(const LocalGroupOptions& options)
      : rank_(options.rank),
        size_(options.size),
        endpoint_(options.endpoint),
        timeout_(options.timeout),
        max_message_bytes_(options.max_message_bytes),
        inbox_(static_cast<size_t>(options.size) * (kMaxEarlyCalls + 2)) {}
  ~LocalGroupImpl() override {
    if (server_) {
      AwaitAcks();
      server_->Stop();  // the transports' threads use inbox_
    }
    if (client_) client_->Close();
  }

  Status Start(const LocalGroupOptions& options);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status SumFloats(float* data, size_t n) override { return Run(Op::kGroupSumFloats, data, n); }
  Status MinU64(uint64_t* data, size_t n) override { return Run(Op::kGroupMinU64, data, n); }
  bool MayHaveCompleted() const override { return unsettled_; }

 private:
  // The leader's view of one call: what each member sent (index = rank).
  struct Call {
    Op op;
    uint64_t seq;
    uint64_t n;
    std::vector<std::optional<Incoming>> from;
    int missing;
  };

  Status Run(Op op, void* data, size_t n);
  Status Follow(Op op, uint64_t seq, void* data, size_t n);
  Status Lead(Op op, uint64_t seq, void* data, size_t n);
  StatusOr<Incoming> Decode(Received r) const;
  Status Accept(Call* call, Incoming in);
  Status Fail(Call* call, Status status);
  void Reduce(const Call& call, void* data) const;
  void Reply(const Incoming& in, const Status& status, Frame payload);
  Header CallHeader(Op op, uint64_t seq, size_t n) const;
  void Ack(Op op, uint64_t seq, size_t n);
  bool TakeAck(const Incoming& in);
  void AwaitAcks();

  // Immutable after construction.
  const int rank_;
  const int size_;
  const std::string endpoint_;
  const milliseconds timeout_;
  const uint64_t max_message_bytes_;

  Inbox inbox_;
  std::unique_ptr<ServerTransport> server_;  // the leader's; null at members
  std::unique_ptr<ClientTransport> client_;  // a member's; null at the leader

  // Used only by the one thread that drives this member.
  uint64_t seq_ = 0;
  // A member's last call was sent and the leader's answer to it did not come back.
  bool unsettled_ = false;
  std::deque<Incoming> early_;  // leader: members' calls the leader has not made yet
  uint64_t failed_seq_ = 0;     // leader: the last failed call, answered to late members
  Status failed_status_;
  // Leader: per rank, the last call whose reply the member confirmed, and the ranks the
  // leader answered for its last call (destroying the leader waits for their acks).
  std::vector<uint64_t> acked_ = std::vector<uint64_t>(static_cast<size_t>(size_), 0);
  std::vector<int> answered_;
};

Status LocalGroupImpl::Start(const LocalGroupOptions& options) {
  TransportOptions t;
  t.handler_threads = 1;
  t.max_message_bytes = std::max<uint64_t>(options.max_message_bytes, 4096) + 4096;
  t.linger = kLinger;
  t.curve = options.curve;
  if (rank_ == 0) {
    server_ = NewServerTransport(endpoint_, t);
    auto bound = server_->Start(endpoint_, [this](onlineps::Incoming&& in) {
      Received r{std::move(in.peer), std::move(in.frames)};
      const std::string peer = r.peer;
      if (!inbox_.Put(std::move(r))) {
        Header h = MakeReply(Header(), ResourceExhausted("the group leader's inbox is full"));
        (void)server_->Send(peer, {Frame::FromString(EncodeHeader(h))});
      }
    });
    return bound.status().WithContext("local group");
  }
  client_ = NewClientTransport({endpoint_}, t);
  return client_
      ->Connect({endpoint_},
                [this](size_t, Frames&& frames) {
                  (void)inbox_.Put({"", std::move(frames)});
                })
      .WithContext("local group");
}

Status LocalGroupImpl::Run(Op op, void* data, size_t n) {
  unsettled_ = false;
  if (n > 0 && data == nullptr) return InvalidArgument(std::string(OpLabel(op)) + ": null data");
  if (n > max_message_bytes_ / ElemSize(op)) {
    return InvalidArgument(std::string(OpLabel(op)) + ": " + std::to_string(n) +
                           " elements exceed max_message_bytes " +
                           std::to_string(max_message_bytes_));
  }
  if (size_ == 1) return Status::Ok();
  const uint64_t seq = ++seq_;
  try {
    return rank_ == 0 ? Lead(op, seq, data, n) : Follow(op, seq, data, n);
  } catch (const std::exception& e) {  // e.g. bad_alloc
    return Internal(CallName(op, seq, n) + ": " + e.what());
  }
}

Status LocalGroupImpl::Follow(Op op, uint64_t seq, void* data, size_t n) {
  const size_t bytes = n * ElemSize(op);
  const std::string call = CallName(op, seq, n);
  if (Status sent = client_->Send(0, Message(CallHeader(op, seq, n), Frame::Copy(data, bytes)));
      !sent.ok()) {
    return Unavailable(call + ": send to the leader at " + endpoint_ +
                       " failed: " + sent.message());
  }
  unsettled_ = true;  // until the leader's answer to this call is in
  const Clock::time_point deadline = Clock::now() + timeout_;
  while (true) {
    std::optional<Received> in = inbox_.Take(deadline);
    if (!in) {
      return DeadlineExceeded(call + ": no reply from the leader (rank 0) at " + endpoint_ +
                              " within " + Ms(timeout_));
    }
    const Frames& parts = in->frames;
    if (parts.empty() || parts.size() > 2) {
      return Malformed(call + ": leader reply of " + std::to_string(parts.size()) + " frames");
    }
    StatusOr<Header> decoded = DecodeHeader(parts[0].data(), parts[0].size());
    if (!decoded.ok()) return decoded.status().WithContext(call);
    const Header& r = *decoded;
    if (r.op != Op::kReply)
      return Malformed(call + ": the leader sent " + std::string(OpName(r.op)));
    if (r.seq != 0 && r.seq < seq) continue;  // the late reply to a call this member gave up on
    if (r.seq > seq) {
      return FailedPrecondition(call + ": the leader answered call #" + std::to_string(r.seq) +
                                ": members are out of step");
    }
    if (r.seq == seq) Ack(op, seq, n);
    if (r.code != StatusCode::kOk) {
      unsettled_ = r.seq != seq;  // the leader failed this very call: it completed nowhere
      return ReplyStatus(r);
    }
    const size_t got = parts.size() == 2 ? parts[1].size() : 0;
    const uint64_t rn = r.shape.empty() ? 0 : r.shape[0];
    if (r.seq != seq || rn != n || got != bytes) {
      return Malformed(call + ": leader replied to call #" + std::to_string(r.seq) +
                       " (n=" + std::to_string(rn) + ") with " + std::to_string(got) + " bytes");
    }
    if (bytes > 0) std::memcpy(data, parts[1].data(), bytes);
    return Status::Ok();
  }
}

Status LocalGroupImpl::Lead(Op op, uint64_t seq, void* data, size_t n) {
  Call call{op, seq, n, std::vector<std::optional<Incoming>>(size_), size_ - 1};
  // A bad call is answered only once every member made it (or time is up), so that all
  // members see the same error rather than some of them a timeout.
  Status failure;
  auto take = [&](Incoming in) {
    Status s = Accept(&call, std::move(in));
    if (!s.ok() && failure.ok()) failure = std::move(s);
  };
  std::deque<Incoming> early;
  early.swap(early_);
  for (Incoming& in : early) take(std::move(in));
  const Clock::time_point deadline = Clock::now() + timeout_;
  while (call.missing > 0) {
    std::optional<Received> r = inbox_.Take(deadline);
    if (!r) {
      if (!failure.ok()) return Fail(&call, failure);
      std::string missing;
      for (int m = 1; m < size_; ++m) {
        if (!call.from[m]) missing += (missing.empty() ? "" : ", ") + std::to_string(m);
      }
      return Fail(&call, DeadlineExceeded(CallName(op, seq, n) + ": no call from rank(s) " +
                                          missing + " within " + Ms(timeout_)));
    }
    Incoming rejected{r->peer, Header(), 0, Frame()};
    StatusOr<Incoming> in = Decode(std::move(*r));
    if (!in.ok()) {
      Reply(rejected, in.status(), Frame());
      continue;
    }
    if (!TakeAck(*in)) take(std::move(in).value());
  }
  if (!failure.ok()) return Fail(&call, failure);
  Reduce(call, data);
  const Frame result = Frame::Copy(data, n * ElemSize(op));
  answered_.clear();
  for (int m = 1; m < size_; ++m) {
    Reply(*call.from[m], Status::Ok(), result);
    answered_.push_back(m);
  }
  return Status::Ok();
}

StatusOr<Incoming> LocalGroupImpl::Decode(Received r) const {
  if (r.frames.size() != 2) {
    return Malformed("member message of " + std::to_string(r.frames.size()) +
                     " frames, expected 2");
  }
  ONLINEPS_ASSIGN_OR_RETURN(Header h, DecodeHeader(r.frames[0].data(), r.frames[0].size()));
  if (h.op != Op::kGroupSumFloats && h.op != Op::kGroupMinU64) {
    return UnknownOp(std::string(OpName(h.op)) + " sent to a local group leader");
  }
  const auto size = h.spec.find(kSizeKey);
  char* end = nullptr;
  const unsigned long long claimed =
      size == h.spec.end() ? 0 : std::strtoull(size->second.c_str(), &end, 10);
  if (h.shape.size() != 1 || size == h.spec.end() || end == size->second.c_str() || *end != 0 ||
      claimed > UINT32_MAX) {
    return Malformed("group call without shape {n} and a numeric group_size");
  }
  return Incoming{std::move(r.peer), std::move(h), static_cast<uint32_t>(claimed),
                  std::move(r.frames[1])};
}

// Takes one member message for the current call. Messages that only their sender got
// wrong are answered here; a non-OK return fails the whole call.
Status LocalGroupImpl::Accept(Call* call, Incoming in) {
  const Header& h = in.header;
  const std::string from = "rank " + std::to_string(h.sender);
  if (in.size != static_cast<uint32_t>(size_) || h.sender == 0 ||
      h.sender >= static_cast<uint64_t>(size_)) {
    Reply(in,
          FailedPrecondition("a member claims rank " + std::to_string(h.sender) + " of " +
                             std::to_string(in.size) + "; the leader's group has " +
                             std::to_string(size_) + " members"),
          Frame());
    return Status::Ok();
  }
  if (h.seq < call->seq) {
    Reply(in,
          h.seq == failed_seq_
              ? failed_status_
              : FailedPrecondition(CallName(h.op, h.seq, in.n()) + " from " + from +
                                   " came after the leader finished it: members are "
                                   "out of step"),
          Frame());
    return Status::Ok();
  }
  if (h.seq > call->seq) {
    const auto ahead = std::count_if(early_.begin(), early_.end(), [&](const Incoming& e) {
      return e.header.sender == h.sender;
    });
    if (static_cast<size_t>(ahead) >= kMaxEarlyCalls) {
      Reply(in, FailedPrecondition(from + " is too many calls ahead of the leader"), Frame());
    } else {
      early_.push_back(std::move(in));
    }
    return Status::Ok();
  }
  std::optional<Incoming>& slot = call->from[h.sender];
  if (slot) {
    Reply(in,
          FailedPrecondition(from + " made " + CallName(h.op, h.seq, in.n()) +
                             " twice (two members with one rank?)"),
          Frame());
    return Status::Ok();
  }
  const bool same = h.op == call->op && in.n() == call->n;
  const bool sized = same && in.payload.size() == in.n() * ElemSize(h.op);
  const Op op = h.op;
  const uint64_t n = in.n();
  slot = std::move(in);
  --call->missing;
  if (!same) {
    return FailedPrecondition(CallName(call->op, call->seq, call->n) + " at rank 0, but " + from +
                              " called " + OpLabel(op) + "(n=" + std::to_string(n) + ")");
  }
  if (!sized) {
    return Malformed(CallName(call->op, call->seq, call->n) + ": " + from + " sent " +
                     std::to_string(slot->payload.size()) + " bytes");
  }
  return Status::Ok();
}

// Answers every member that already called with `status`, and remembers it for the
// members that call later.
Status LocalGroupImpl::Fail(Call* call, Status status) {
  answered_.clear();
  for (std::optional<Incoming>& in : call->from) {
    if (!in) continue;
    Reply(*in, status, Frame());
    answered_.push_back(static_cast<int>(in->header.sender));
  }
  failed_seq_ = call->seq;
  failed_status_ = status;
  return status;
}

// Folds in rank order, so every member gets bitwise the same result.
void LocalGroupImpl::Reduce(const Call& call, void* data) const {
  for (int r = 1; r < size_; ++r) {
    const char* in = call.from[r]->payload.data();  // maybe unaligned: memcpy
    if (call.op == Op::kGroupSumFloats) {
      auto* out = static_cast<float*>(data);
      for (uint64_t i = 0; i < call.n; ++i) {
        float v;
        std::memcpy(&v, in + i * sizeof(v), sizeof(v));
        out[i] += v;
      }
    } else {
      auto* out = static_cast<uint64_t*>(data);
      for (uint64_t i = 0; i < call.n; ++i) {
        uint64_t v;
        std::memcpy(&v, in + i * sizeof(v), sizeof(v));
        out[i] = std::min(out[i], v);
      }
    }
  }
}

// Sends never block: a member that is gone (or at its high-water mark) loses the reply
// and times out on its side.
void LocalGroupImpl::Reply(const Incoming& in, const Status& status, Frame payload) {
  Header h = MakeReply(in.header, status);
  h.seq = in.header.seq;
  h.shape = in.header.shape;
  Frames frames{Frame::FromString(EncodeHeader(h))};
  if (status.ok()) frames.push_back(std::move(payload));
  (void)server_->Send(in.peer, std::move(frames));
}

// A member confirms the leader's reply to call `seq` (kFlagGroupAck; no reply), so a
// leader that is being destroyed knows its last replies were delivered.
void LocalGroupImpl::Ack(Op op, uint64_t seq, size_t n) {
  Header h = CallHeader(op, seq, n);
  h.flags = kFlagGroupAck;
  (void)client_->Send(0, Message(h, Frame()));
}

// A member's header for call `seq` (docs/protocol.md, "Local group").
Header LocalGroupImpl::CallHeader(Op op, uint64_t seq, size_t n) const {
  Header h;
  h.op = op;
  h.sender = static_cast<uint64_t>(rank_);
  h.seq = seq;
  h.shape = {n};
  h.spec = {{kSizeKey, std::to_string(size_)}};
  return h;
}

// True (and recorded) if `in` is a member's ack rather than a call.
bool LocalGroupImpl::TakeAck(const Incoming& in) {
  if ((in.header.flags & kFlagGroupAck) == 0) return false;
  if (in.header.sender < acked_.size()) {
    acked_[in.header.sender] = std::max(acked_[in.header.sender], in.header.seq);
  }
  return true;
}

// Until every member the leader answered last confirmed it, for at most kLinger: a
// process that exits right after its last call must not take those replies along.
void LocalGroupImpl::AwaitAcks() {
  const Clock::time_point deadline = Clock::now() + kLinger;
  auto pending = [&] {
    return std::any_of(answered_.begin(), answered_.end(),
                       [&](int m) { return acked_[static_cast<size_t>(m)] < seq_; });
  };
  while (pending()) {
    std::optional<Received> r = inbox_.Take(deadline);
    if (!r) return;
    StatusOr<Incoming> in = Decode(std::move(*r));
    if (in.ok()) (void)TakeAck(*in);
  }
}

}  // namespace

Status CheckLocalGroupOptions(const LocalGroupOptions& options) {
  if (options.size < 1) {
    return InvalidArgument("local group: size must be >= 1, got " + std::to_string(options.size));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return InvalidArgument("local group: rank " + std::to_string(options.rank) +
                           " out of range [0, " + std::to_string(options.size) + ")");
  }
  if (options.timeout.count() <= 0) return InvalidArgument("local group: timeout must be > 0");
  if (options.size > 1 && options.endpoint.empty()) {
    return InvalidArgument("local group: empty endpoint");
  }
  return Status::Ok();
}

StatusOr<std::unique_ptr<GroupReducer>> NewLocalGroup(const LocalGroupOptions& options) {
  ONLINEPS_RETURN_IF_ERROR(CheckLocalGroupOptions(options));
  auto group = std::make_unique<LocalGroupImpl>(options);
  if (options.size > 1) ONLINEPS_RETURN_IF_ERROR(group->Start(options));
  return std::unique_ptr<GroupReducer>(std::move(group));
}

}  // namespace onlineps::worker
