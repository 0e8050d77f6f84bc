#include "worker/local_group.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>
#include <zmq.hpp>

#include "common/zmq_transport.h"

namespace onlineps::worker {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "payload frames are raw little-endian arrays: add byte swapping for this host");

// Every message is [header, payload]; the leader's ROUTER sees [identity, header, payload].
// Header, 32 bytes little-endian: magic u32, version u8, op u8, code u8, reserved u8,
// rank u32, size u32, seq u64, n u64. The payload is n raw elements, or the error text
// of a reply whose code is not OK.
constexpr uint32_t kMagic = 0x5247504F;  // "OPGR"
constexpr uint8_t kVersion = 1;
constexpr size_t kHeaderBytes = 32;
constexpr auto kLastCode = static_cast<uint8_t>(StatusCode::kNotPrimary);
// Calls a member may make before the leader makes them (it gave up waiting for a reply
// the leader has not sent yet); more than that and the member is answered with an error.
constexpr size_t kMaxEarlyCalls = 4;
// How long destroying a member may wait to deliver what it sent last (the leader's last
// replies): a process that exits right after its last call must not take them along.
constexpr int kLingerMs = 1000;

enum class GroupOp : uint8_t { kSumFloats = 1, kMinU64 = 2 };

size_t ElemSize(GroupOp op) { return op == GroupOp::kSumFloats ? sizeof(float) : sizeof(uint64_t); }
const char* OpName(GroupOp op) { return op == GroupOp::kSumFloats ? "SumFloats" : "MinU64"; }

std::string CallName(GroupOp op, uint64_t seq, uint64_t n) {
  return "group call #" + std::to_string(seq) + " " + OpName(op) + "(n=" + std::to_string(n) + ")";
}

struct Header {
  GroupOp op = GroupOp::kSumFloats;
  StatusCode code = StatusCode::kOk;
  uint32_t rank = 0;
  uint32_t size = 0;
  uint64_t seq = 0;
  uint64_t n = 0;
};

void PutLe(uint8_t* p, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t GetLe(const uint8_t* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

zmq::message_t EncodeHeader(const Header& h) {
  uint8_t b[kHeaderBytes] = {};
  PutLe(b, kMagic, 4);
  b[4] = kVersion;
  b[5] = static_cast<uint8_t>(h.op);
  b[6] = static_cast<uint8_t>(h.code);
  PutLe(b + 8, h.rank, 4);
  PutLe(b + 12, h.size, 4);
  PutLe(b + 16, h.seq, 8);
  PutLe(b + 24, h.n, 8);
  return zmq::message_t(b, kHeaderBytes);
}

Status DecodeHeader(const zmq::message_t& m, Header* h) {
  if (m.size() != kHeaderBytes) {
    return Malformed("group header of " + std::to_string(m.size()) + " bytes, expected 32");
  }
  const auto* b = m.data<uint8_t>();
  if (GetLe(b, 4) != kMagic) return Malformed("group header: bad magic");
  if (b[4] != kVersion) return Malformed("group header: version " + std::to_string(b[4]));
  if (b[5] != 1 && b[5] != 2) return Malformed("group header: op " + std::to_string(b[5]));
  if (b[6] > kLastCode) return Malformed("group header: code " + std::to_string(b[6]));
  h->op = static_cast<GroupOp>(b[5]);
  h->code = static_cast<StatusCode>(b[6]);
  h->rank = static_cast<uint32_t>(GetLe(b + 8, 4));
  h->size = static_cast<uint32_t>(GetLe(b + 12, 4));
  h->seq = GetLe(b + 16, 8);
  h->n = GetLe(b + 24, 8);
  return Status::Ok();
}

// inproc:// members must share a context: one per process, never destroyed (zmq_ctx_term
// would block exit on any open socket). A forked child makes its own: a context must not
// cross fork().
zmq::context_t& InprocContext() {
  static Mutex mu;
  static zmq::context_t* context = nullptr;
  static pid_t owner = 0;
  MutexLock lock(&mu);
  if (context == nullptr || owner != getpid()) {
    context = new zmq::context_t(1);
    owner = getpid();
  }
  return *context;
}

std::string Ms(milliseconds d) { return std::to_string(d.count()) + " ms"; }

class LocalGroupImpl final : public GroupReducer {
 public:
  LocalGroupImpl(const LocalGroupOptions& options, std::unique_ptr<zmq::context_t> context,
                 zmq::socket_t socket)
      : rank_(options.rank),
        size_(options.size),
        endpoint_(options.endpoint),
        timeout_(options.timeout),
        max_message_bytes_(options.max_message_bytes),
        context_(std::move(context)),
        socket_(std::move(socket)) {}

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  Status SumFloats(float* data, size_t n) override { return Run(GroupOp::kSumFloats, data, n); }
  Status MinU64(uint64_t* data, size_t n) override { return Run(GroupOp::kMinU64, data, n); }

 private:
  struct Incoming {
    zmq::message_t identity;
    Header header;
    zmq::message_t payload;
  };
  // The leader's view of one call: what each member sent (index = rank).
  struct Call {
    GroupOp op;
    uint64_t seq;
    uint64_t n;
    std::vector<std::optional<Incoming>> from;
    int missing;
  };

  Status Run(GroupOp op, void* data, size_t n);
  Status Follow(GroupOp op, uint64_t seq, void* data, size_t n);
  Status Lead(GroupOp op, uint64_t seq, void* data, size_t n);
  Status Accept(Call* call, Incoming in);
  Status Fail(Call* call, Status status);
  void Reduce(const Call& call, void* data) const;
  void Send(zmq::message_t* identity, const Header& h, const void* payload, size_t bytes);
  void Reject(Incoming* in, const Status& status);
  bool WaitReadable(Clock::time_point deadline);
  bool RecvAll(std::vector<zmq::message_t>* parts);

  // Immutable after construction.
  const int rank_;
  const int size_;
  const std::string endpoint_;
  const milliseconds timeout_;
  const uint64_t max_message_bytes_;
  // This member's own context (none for inproc://): its destructor, after socket_'s, waits
  // up to kLingerMs for unsent messages.
  std::unique_ptr<zmq::context_t> context_;
  zmq::socket_t socket_;  // ROUTER at the leader, DEALER at members; none if size == 1

  // Used only by the one thread that drives this member.
  uint64_t seq_ = 0;
  std::deque<Incoming> early_;  // leader: members' calls the leader has not made yet
  uint64_t failed_seq_ = 0;     // leader: the last failed call, answered to late members
  Status failed_status_;
};

Status LocalGroupImpl::Run(GroupOp op, void* data, size_t n) {
  if (n > 0 && data == nullptr) return InvalidArgument(std::string(OpName(op)) + ": null data");
  if (n > max_message_bytes_ / ElemSize(op)) {
    return InvalidArgument(std::string(OpName(op)) + ": " + std::to_string(n) +
                           " elements exceed max_message_bytes " +
                           std::to_string(max_message_bytes_));
  }
  if (size_ == 1) return Status::Ok();
  const uint64_t seq = ++seq_;
  try {
    return rank_ == 0 ? Lead(op, seq, data, n) : Follow(op, seq, data, n);
  } catch (const zmq::error_t& e) {
    return FromZmqError(CallName(op, seq, n), e);
  } catch (const std::exception& e) {  // e.g. bad_alloc
    return Internal(CallName(op, seq, n) + ": " + e.what());
  }
}

Status LocalGroupImpl::Follow(GroupOp op, uint64_t seq, void* data, size_t n) {
  const size_t bytes = n * ElemSize(op);
  const std::string call = CallName(op, seq, n);
  zmq::message_t header = EncodeHeader(
      {op, StatusCode::kOk, static_cast<uint32_t>(rank_), static_cast<uint32_t>(size_), seq, n});
  zmq::message_t payload(data, bytes);
  if (!socket_.send(header, zmq::send_flags::sndmore | zmq::send_flags::dontwait) ||
      !socket_.send(payload, zmq::send_flags::dontwait)) {
    return Unavailable(call + ": send queue to the leader at " + endpoint_ + " is full");
  }
  const Clock::time_point deadline = Clock::now() + timeout_;
  std::vector<zmq::message_t> parts;
  while (true) {
    if (!WaitReadable(deadline)) {
      return DeadlineExceeded(call + ": no reply from the leader (rank 0) at " + endpoint_ +
                              " within " + Ms(timeout_));
    }
    if (!RecvAll(&parts)) continue;
    if (parts.size() != 2) {
      return Malformed(call + ": leader reply of " + std::to_string(parts.size()) + " frames");
    }
    Header r;
    ONLINEPS_RETURN_IF_ERROR(DecodeHeader(parts[0], &r).WithContext(call));
    if (r.seq < seq) continue;  // the late reply to a call this member gave up on
    if (r.seq > seq) {
      return FailedPrecondition(call + ": the leader answered call #" + std::to_string(r.seq) +
                                ": members are out of step");
    }
    if (r.code != StatusCode::kOk) return Status(r.code, parts[1].to_string());
    if (r.op != op || r.n != n || parts[1].size() != bytes) {
      return Malformed(call + ": leader replied with " + OpName(r.op) + "(n=" +
                       std::to_string(r.n) + ") and " + std::to_string(parts[1].size()) + " bytes");
    }
    if (bytes > 0) std::memcpy(data, parts[1].data(), bytes);
    return Status::Ok();
  }
}

Status LocalGroupImpl::Lead(GroupOp op, uint64_t seq, void* data, size_t n) {
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
  std::vector<zmq::message_t> parts;
  while (call.missing > 0) {
    if (!WaitReadable(deadline)) {
      if (!failure.ok()) return Fail(&call, failure);
      std::string missing;
      for (int r = 1; r < size_; ++r) {
        if (!call.from[r]) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
      }
      return Fail(&call, DeadlineExceeded(CallName(op, seq, n) + ": no call from rank(s) " +
                                          missing + " within " + Ms(timeout_)));
    }
    if (!RecvAll(&parts) || parts.empty()) continue;
    Incoming in{std::move(parts[0]), Header(), zmq::message_t()};
    Status parsed = parts.size() == 3
                        ? DecodeHeader(parts[1], &in.header)
                        : Malformed("member message of " + std::to_string(parts.size() - 1) +
                                    " frames, expected 2");
    if (!parsed.ok()) {
      Reject(&in, parsed);
      continue;
    }
    in.payload = std::move(parts[2]);
    take(std::move(in));
  }
  if (!failure.ok()) return Fail(&call, failure);
  Reduce(call, data);
  const Header result{op, StatusCode::kOk, 0, static_cast<uint32_t>(size_), seq, n};
  for (int r = 1; r < size_; ++r) Send(&call.from[r]->identity, result, data, n * ElemSize(op));
  return Status::Ok();
}

// Takes one member message for the current call. Messages that only their sender got
// wrong are answered here; a non-OK return fails the whole call.
Status LocalGroupImpl::Accept(Call* call, Incoming in) {
  const Header& h = in.header;
  const std::string from = "rank " + std::to_string(h.rank);
  if (h.size != static_cast<uint32_t>(size_) || h.rank == 0 ||
      h.rank >= static_cast<uint32_t>(size_)) {
    Reject(&in, FailedPrecondition("a member claims rank " + std::to_string(h.rank) + " of " +
                                   std::to_string(h.size) + "; the leader's group has " +
                                   std::to_string(size_) + " members"));
    return Status::Ok();
  }
  if (h.seq < call->seq) {
    Reject(&in, h.seq == failed_seq_
                    ? failed_status_
                    : FailedPrecondition(CallName(h.op, h.seq, h.n) + " from " + from +
                                         " came after the leader finished it: members are "
                                         "out of step"));
    return Status::Ok();
  }
  if (h.seq > call->seq) {
    const auto ahead = std::count_if(early_.begin(), early_.end(),
                                     [&](const Incoming& e) { return e.header.rank == h.rank; });
    if (static_cast<size_t>(ahead) >= kMaxEarlyCalls) {
      Reject(&in, FailedPrecondition(from + " is too many calls ahead of the leader"));
    } else {
      early_.push_back(std::move(in));
    }
    return Status::Ok();
  }
  std::optional<Incoming>& slot = call->from[h.rank];
  if (slot) {
    Reject(&in, FailedPrecondition(from + " made " + CallName(h.op, h.seq, h.n) +
                                   " twice (two members with one rank?)"));
    return Status::Ok();
  }
  const bool same = h.op == call->op && h.n == call->n;
  const bool sized = same && in.payload.size() == h.n * ElemSize(h.op);
  slot = std::move(in);
  --call->missing;
  if (!same) {
    return FailedPrecondition(CallName(call->op, call->seq, call->n) + " at rank 0, but " + from +
                              " called " + OpName(h.op) + "(n=" + std::to_string(h.n) + ")");
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
  for (std::optional<Incoming>& in : call->from) {
    if (in) Reject(&*in, status);
  }
  failed_seq_ = call->seq;
  failed_status_ = status;
  return status;
}

// Folds in rank order, so every member gets bitwise the same result.
void LocalGroupImpl::Reduce(const Call& call, void* data) const {
  for (int r = 1; r < size_; ++r) {
    const char* in = call.from[r]->payload.data<char>();  // maybe unaligned: memcpy
    if (call.op == GroupOp::kSumFloats) {
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

// ROUTER sends never block: a member that is gone (or at its high-water mark) loses the
// reply and times out on its side.
void LocalGroupImpl::Send(zmq::message_t* identity, const Header& h, const void* payload,
                          size_t bytes) {
  zmq::message_t header = EncodeHeader(h);
  zmq::message_t body(payload, bytes);
  if (!socket_.send(*identity, zmq::send_flags::sndmore | zmq::send_flags::dontwait)) return;
  (void)socket_.send(header, zmq::send_flags::sndmore | zmq::send_flags::dontwait);
  (void)socket_.send(body, zmq::send_flags::dontwait);
}

void LocalGroupImpl::Reject(Incoming* in, const Status& status) {
  Header h = in->header;
  h.code = status.code();
  const std::string& text = status.message();
  Send(&in->identity, h, text.data(), text.size());
}

bool LocalGroupImpl::WaitReadable(Clock::time_point deadline) {
  while (true) {
    const auto left =
        std::max(milliseconds(0), std::chrono::ceil<milliseconds>(deadline - Clock::now()));
    zmq::pollitem_t item{socket_.handle(), 0, ZMQ_POLLIN, 0};
    try {
      if (zmq::poll(&item, 1, left) > 0) return true;
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
    }
    if (Clock::now() >= deadline) return false;
  }
}

// One whole multipart message, without blocking; false if none is waiting.
bool LocalGroupImpl::RecvAll(std::vector<zmq::message_t>* parts) {
  parts->clear();
  do {
    zmq::message_t part;
    if (!socket_.recv(part, zmq::recv_flags::dontwait)) return !parts->empty();
    parts->push_back(std::move(part));
  } while (parts->back().more());
  return true;
}

}  // namespace

StatusOr<std::unique_ptr<GroupReducer>> NewLocalGroup(const LocalGroupOptions& options) {
  if (options.size < 1) {
    return InvalidArgument("local group: size must be >= 1, got " + std::to_string(options.size));
  }
  if (options.rank < 0 || options.rank >= options.size) {
    return InvalidArgument("local group: rank " + std::to_string(options.rank) +
                           " out of range [0, " + std::to_string(options.size) + ")");
  }
  if (options.timeout.count() <= 0) return InvalidArgument("local group: timeout must be > 0");
  std::unique_ptr<GroupReducer> group;
  if (options.size == 1) {
    group = std::make_unique<LocalGroupImpl>(options, nullptr, zmq::socket_t());
    return group;
  }
  if (options.endpoint.empty()) return InvalidArgument("local group: empty endpoint");
  const bool leader = options.rank == 0;
  try {
    std::unique_ptr<zmq::context_t> own;
    if (options.endpoint.rfind("inproc://", 0) != 0) own = std::make_unique<zmq::context_t>(1);
    zmq::socket_t socket(own ? *own : InprocContext(),
                         leader ? zmq::socket_type::router : zmq::socket_type::dealer);
    socket.set(zmq::sockopt::linger, kLingerMs);
    const uint64_t max_frame = std::max<uint64_t>(options.max_message_bytes, 4096);
    socket.set(zmq::sockopt::maxmsgsize, max_frame > uint64_t{std::numeric_limits<int64_t>::max()}
                                             ? int64_t{-1}
                                             : static_cast<int64_t>(max_frame));
    if (leader) {
      socket.bind(options.endpoint);
    } else {
      socket.connect(options.endpoint);
    }
    group = std::make_unique<LocalGroupImpl>(options, std::move(own), std::move(socket));
    return group;
  } catch (const zmq::error_t& e) {
    return FromZmqError(
        std::string("local group: ") + (leader ? "bind " : "connect ") + options.endpoint, e);
  }
}

}  // namespace onlineps::worker
