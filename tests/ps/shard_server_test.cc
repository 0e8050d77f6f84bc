// Tests of a real ShardServer (ps/shard_server.h) over every transport (mem:// and
// tcp://): every bad input is answered with the right error code and a message naming
// the problem while the shard keeps serving; pushes are applied exactly once under
// retries; block-mode replies are held; the PsClient survives a late server and times
// out on an absent one; concurrent clients sum exactly; and /metrics counts what
// happened. Raw requests go through a ClientTransport with hand-built frames.
#include "ps/shard_server.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <ctime>
#include <deque>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/partition.h"
#include "common/transport.h"
#include "common/wire.h"
#include "ps/checkpoint.h"
#include "ps/dedup.h"
#include "ps/dense_table.h"
#include "ps/ps_client.h"
#include "ps/sparse_table.h"

namespace onlineps::ps {

// Holds a table's locks from a test, as a long apply on a handler thread would.
class TableTestPeer {
 public:
  static std::unique_ptr<bool[]> AllStripes(const SparseTable& s) {
    auto all = std::make_unique<bool[]>(s.stripes_.size());
    std::fill_n(all.get(), s.stripes_.size(), true);
    return all;
  }
  static void Lock(Table* t) NO_THREAD_SAFETY_ANALYSIS {
    if (auto* d = dynamic_cast<DenseTable*>(t)) d->mu_.Lock();
    if (auto* s = dynamic_cast<SparseTable*>(t)) {
      const auto all = AllStripes(*s);
      while (!s->TryLockStripes(all.get())) std::this_thread::yield();
    }
  }
  static void Unlock(Table* t) NO_THREAD_SAFETY_ANALYSIS {
    if (auto* d = dynamic_cast<DenseTable*>(t)) d->mu_.Unlock();
    if (auto* s = dynamic_cast<SparseTable*>(t)) {
      s->UnlockStripes(AllStripes(*s).get());
    }
  }
};

// What a replica does when it re-syncs from its primary (replication hooks.load).
class ShardServerTestPeer {
 public:
  static Status LoadSnapshot(ShardServer* s, const std::string& bytes) {
    return s->LoadSnapshot(bytes);
  }
  // What a primary does for a re-syncing backup (replication hooks.snapshot).
  static StatusOr<std::string> Snapshot(ShardServer* s) {
    uint64_t lsn = 0;
    return s->Snapshot(&lsn);
  }
  // A backup applying an entry of its primary's log (replication hooks.apply).
  static Status ApplyReplicated(ShardServer* s, const Frames& frames) {
    auto h = DecodeHeader(frames[0].data(), frames[0].size());
    if (!h.ok()) return h.status();
    return s->ApplyReplicated(*h, frames);
  }
  // A push_batch handled on the caller's thread, as a handler thread handles it.
  static Status DispatchBatch(ShardServer* s, const Frames& frames, Header* reply, Frames* out) {
    auto h = DecodeHeader(frames[0].data(), frames[0].size());
    if (!h.ok()) return h.status();
    uint64_t lsn = 0;
    return s->DispatchBatch(*h, frames, reply, out, "test-peer", &lsn);
  }
};

namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string UniqueMemName(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return "mem://" + prefix + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

// A loopback TCP port with nothing listening on it (bound once, then released).
int FreeTcpPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  int port = -1;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

std::string ListenEndpoint(const std::string& scheme, const std::string& prefix) {
  return scheme == "mem" ? UniqueMemName(prefix) : "tcp://127.0.0.1:0";
}

// Value of the first sample of `name` whose line contains every one of `labels`
// (e.g. code="OK"), or -1 when there is none.
double MetricValue(prometheus::Registry& registry, const std::string& name,
                   const std::vector<std::string>& labels = {}) {
  std::istringstream in(prometheus::TextSerializer().Serialize(registry.Collect()));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0 || line.size() <= name.size()) continue;
    if (line[name.size()] != ' ' && line[name.size()] != '{') continue;
    bool all = true;
    for (const auto& l : labels) all &= line.find(l) != std::string::npos;
    if (all) return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

Frame HeaderFrame(const Header& h) { return Frame::FromString(EncodeHeader(h)); }
Frame Bytes(const std::string& s) { return Frame::FromString(s); }
Frame Floats(std::vector<float> v) { return Frame::FromVector(std::move(v)); }
Frame Keys(std::vector<uint64_t> v) { return Frame::FromVector(std::move(v)); }

// A client that sends hand-built frames to one server and collects the replies.
class RawClient {
 public:
  explicit RawClient(const std::string& endpoint) : transport_(NewClientTransport({endpoint})) {
    Status st = transport_->Connect({endpoint}, [this](size_t, Frames&& f) {
      std::lock_guard<std::mutex> lock(mu_);
      replies_.push_back(std::move(f));
      cv_.notify_all();
    });
    EXPECT_TRUE(st.ok()) << st.ToString();
  }
  ~RawClient() { transport_->Close(); }

  void Send(Frames frames) {
    Status st = transport_->Send(0, std::move(frames));
    EXPECT_TRUE(st.ok()) << st.ToString();
  }

  // The next reply, decoded; nullopt when none arrives within `timeout`.
  std::optional<std::pair<Header, Frames>> Receive(std::chrono::milliseconds timeout = 5000ms) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [this] { return !replies_.empty(); })) return std::nullopt;
    Frames f = std::move(replies_.front());
    replies_.pop_front();
    lock.unlock();
    if (f.empty()) {
      ADD_FAILURE() << "reply without frames";
      return std::nullopt;
    }
    auto h = DecodeHeader(f[0].data(), f[0].size());
    if (!h.ok()) {
      ADD_FAILURE() << "undecodable reply: " << h.status().ToString();
      return std::nullopt;
    }
    EXPECT_EQ(h->op, Op::kReply);
    return std::make_pair(*h, std::move(f));
  }

  std::optional<std::pair<Header, Frames>> Call(Frames frames) {
    Send(std::move(frames));
    return Receive();
  }

 private:
  std::unique_ptr<ClientTransport> transport_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Frames> replies_;  // guarded by mu_
};

Header Request(Op op, const std::string& table, uint32_t rid = 0) {
  Header h;
  h.op = op;
  h.table = table;
  h.request_id = rid;
  h.sender = 1;
  return h;
}

Header PushHeader(Op op, const std::string& table, uint64_t sender, uint64_t seq) {
  Header h = Request(op, table);
  h.sender = sender;
  h.seq = seq;
  return h;
}

TableSpec DenseSpec() {
  TableSpec s;
  s.name = "d";
  s.shape = {6};
  s.optimizer_params = {{"lr", 1.0}};
  return s;
}

TableSpec SparseSpec() {
  TableSpec s;
  s.name = "s";
  s.kind = TableKind::kSparse;
  s.dim = 2;
  s.optimizer_params = {{"lr", 1.0}};
  return s;
}

std::unique_ptr<ShardServer> StartServer(ShardServerOptions o,
                                         std::shared_ptr<prometheus::Registry> registry,
                                         std::string* endpoint) {
  auto server = std::make_unique<ShardServer>(std::move(o), std::move(registry));
  auto ep = server->Start();
  EXPECT_TRUE(ep.ok()) << ep.status().ToString();
  *endpoint = ep.ok() ? *ep : "";
  return ep.ok() ? std::move(server) : nullptr;
}

std::unique_ptr<PsClient> ConnectClient(std::vector<std::string> shards,
                                        std::chrono::milliseconds timeout = 5000ms,
                                        std::chrono::milliseconds attempt = 1000ms) {
  PsClientOptions o;
  o.shards = std::move(shards);
  o.timeout = timeout;
  o.attempt_timeout = attempt;
  auto c = PsClient::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

// ------------------------------------------------------ one shard, raw requests

const std::vector<float> kDenseG0 = {1, 2, 3, 4, 5, 6};
const std::vector<uint64_t> kSparseKeys = {7, 8};
const std::vector<float> kSparseG0 = {1, 2, 3, 4};
constexpr size_t kMaxMessageBytes = 64 * 1024;

class ShardServerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    registry_ = std::make_shared<prometheus::Registry>();
    ShardServerOptions o;
    o.listen = ListenEndpoint(GetParam(), "shard-server-test");
    o.max_message_bytes = kMaxMessageBytes;
    server_ = StartServer(o, registry_, &endpoint_);
    ASSERT_NE(server_, nullptr);
    raw_ = std::make_unique<RawClient>(endpoint_);
    for (const TableSpec& spec : {DenseSpec(), SparseSpec()}) {
      Header h = Request(Op::kCreateTable, spec.name);
      h.spec = EncodeSpec(spec);
      auto r = raw_->Call({HeaderFrame(h)});
      ASSERT_TRUE(r.has_value());
      ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
      EXPECT_EQ(r->first.message, "created");
    }
    // Earlier pushes that every later check expects to find.
    auto r = raw_->Call({HeaderFrame(PushHeader(Op::kPushDense, "d", 1, 1)), Floats(kDenseG0)});
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
    r = raw_->Call({HeaderFrame(PushHeader(Op::kPushSparse, "s", 1, 2)), Keys(kSparseKeys),
                    Floats(kSparseG0)});
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  }

  void TearDown() override {
    raw_.reset();
    if (server_) server_->Stop();
  }

  // Sends `frames` and expects an error reply with `code` and `substr` in its message.
  Header ExpectError(Frames frames, StatusCode code, const std::string& substr) {
    auto r = raw_->Call(std::move(frames));
    EXPECT_TRUE(r.has_value()) << "no reply";
    if (!r) return {};
    EXPECT_EQ(r->first.code, code) << StatusCodeName(r->first.code) << ": " << r->first.message;
    EXPECT_THAT(r->first.message, HasSubstr(substr));
    EXPECT_EQ(r->second.size(), 1u) << "an error reply carries no payload";
    return r->first;
  }

  // A normal pull still works and returns what the earlier pushes left (lr 1, zeros).
  void ExpectStillServing(uint64_t dense_version = 1) {
    auto r = raw_->Call({HeaderFrame(Request(Op::kPullDense, "d", 4242))});
    ASSERT_TRUE(r.has_value()) << "shard stopped answering";
    ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
    EXPECT_EQ(r->first.request_id, 4242u);
    EXPECT_EQ(r->first.version, dense_version);
    ASSERT_EQ(r->second.size(), 2u);
    ASSERT_EQ(r->second[1].CountOf<float>(), 6);
    const float* w = r->second[1].As<float>();
    if (dense_version == 1) {
      for (size_t i = 0; i < 6; ++i) EXPECT_EQ(w[i], -kDenseG0[i]) << i;
    }
    r = raw_->Call({HeaderFrame(Request(Op::kPullSparse, "s")), Keys(kSparseKeys)});
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
    ASSERT_EQ(r->second.size(), 2u);
    ASSERT_EQ(r->second[1].CountOf<float>(), 4);
    for (size_t i = 0; i < 4; ++i) EXPECT_EQ(r->second[1].As<float>()[i], -kSparseG0[i]) << i;
  }

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ShardServer> server_;
  std::string endpoint_;
  std::unique_ptr<RawClient> raw_;
};

TEST_P(ShardServerTest, GarbageHeaderIsMalformed) {
  ExpectError({Bytes("\xc1\xc1 this is not msgpack")}, StatusCode::kMalformed, "msgpack");
  ExpectError({Bytes("hello")}, StatusCode::kMalformed, "msgpack");  // a fixint, not a map
  ExpectStillServing();
}

TEST_P(ShardServerTest, EmptyHeaderFrameIsMalformed) {
  // Transports refuse a message of zero frames, so the emptiest request is one empty frame.
  ExpectError({Frame()}, StatusCode::kMalformed, "msgpack");
  ExpectStillServing();
}

TEST_P(ShardServerTest, HeaderWithoutVersionIsMalformed) {
  // {"op": 2, "tbl": "d"} by hand: fixmap(2), fixstr keys.
  ExpectError({Bytes("\x82\xa2op\x02\xa3tbl\xa1"
                     "d")},
              StatusCode::kMalformed, "'v'");
  ExpectStillServing();
}

TEST_P(ShardServerTest, WrongProtocolVersionIsUnsupported) {
  Header h = Request(Op::kPullDense, "d");
  h.protocol = 7;
  ExpectError({HeaderFrame(h)}, StatusCode::kUnsupportedVersion, "7");
  ExpectStillServing();
}

TEST_P(ShardServerTest, UnknownOpNumberIsUnknownOp) {
  // {"v": 1, "op": 42}
  ExpectError({Bytes("\x82\xa1v\x01\xa2op\x2a")}, StatusCode::kUnknownOp, "42");
  // A reply sent to a shard is known as an op but not served.
  ExpectError({HeaderFrame(Request(Op::kReply, "d"))}, StatusCode::kUnknownOp, "repl");
  // A worker op sent to a shard by mistake says where it belongs.
  ExpectError({HeaderFrame(Request(Op::kLearn, ""))}, StatusCode::kUnknownOp, "worker op");
  // So does a local-group op (a member pointed at a shard), whatever table it names.
  for (Op op : {Op::kGroupSumFloats, Op::kGroupMinU64}) {
    for (const char* table : {"", "d"}) {
      ExpectError({HeaderFrame(Request(op, table)), Floats({1})}, StatusCode::kUnknownOp,
                  "local group");
    }
  }
  ExpectStillServing();
}

TEST_P(ShardServerTest, UnknownTableIsNotFound) {
  Header reply = ExpectError({HeaderFrame(Request(Op::kPullDense, "nope", 77))},
                             StatusCode::kNotFound, "'nope'");
  EXPECT_EQ(reply.request_id, 77u);
  ExpectError({HeaderFrame(PushHeader(Op::kPushSparse, "nope", 3, 1)), Keys({1}), Floats({1, 2})},
              StatusCode::kNotFound, "'nope'");
  Header info = Request(Op::kTableInfo, "nope");
  ExpectError({HeaderFrame(info)}, StatusCode::kNotFound, "'nope'");
  ExpectStillServing();
}

TEST_P(ShardServerTest, ValueFrameNotWholeFloatsIsMalformed) {
  ExpectError({HeaderFrame(PushHeader(Op::kPushDense, "d", 3, 1)), Bytes("1234567")},
              StatusCode::kMalformed, "7 bytes");
  ExpectError({HeaderFrame(PushHeader(Op::kPushSparse, "s", 3, 2)), Keys({1}), Bytes("123456")},
              StatusCode::kMalformed, "6 bytes");
  ExpectError({HeaderFrame(PushHeader(Op::kPushSparse, "s", 3, 3)), Bytes("1234"), Floats({1, 2})},
              StatusCode::kMalformed, "4 bytes");  // keys: not whole uint64s
  ExpectError({HeaderFrame(PushHeader(Op::kPushDense, "d", 3, 4))}, StatusCode::kMalformed,
              "missing");
  ExpectError({HeaderFrame(Request(Op::kPullSparse, "s"))}, StatusCode::kMalformed, "missing");
  ExpectStillServing();
}

TEST_P(ShardServerTest, DensePushWithWrongElementCountIsShapeMismatch) {
  Header reply =
      ExpectError({HeaderFrame(PushHeader(Op::kPushDense, "d", 3, 1)), Floats({1, 2, 3, 4, 5})},
                  StatusCode::kShapeMismatch, "6");
  EXPECT_THAT(reply.message, HasSubstr("5"));
  ExpectStillServing();
  EXPECT_EQ(MetricValue(*registry_, "onlineps_ps_requests_total",
                        {"code=\"SHAPE_MISMATCH\"", "op=\"push_dense\""}),
            1);
  EXPECT_EQ(
      MetricValue(*registry_, "onlineps_ps_requests_total", {"code=\"OK\"", "op=\"push_dense\""}),
      1);
}

TEST_P(ShardServerTest, SparsePushWithKeysValuesMismatchIsShapeMismatch) {
  Header reply = ExpectError(
      {HeaderFrame(PushHeader(Op::kPushSparse, "s", 3, 1)), Keys({1, 2}), Floats({1, 2, 3})},
      StatusCode::kShapeMismatch, "4");  // 2 keys * dim 2
  EXPECT_THAT(reply.message, HasSubstr("3"));
  ExpectStillServing();
}

TEST_P(ShardServerTest, NanGradientIsNonFiniteAndNotApplied) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ExpectError({HeaderFrame(PushHeader(Op::kPushDense, "d", 3, 1)), Floats({1, 1, nan, 1, 1, 1})},
              StatusCode::kNonFinite, "NaN");
  ExpectError({HeaderFrame(PushHeader(Op::kPushSparse, "s", 3, 2)), Keys(kSparseKeys),
               Floats({1, std::numeric_limits<float>::infinity(), 1, 1})},
              StatusCode::kNonFinite, "'s'");
  ExpectStillServing(/*dense_version=*/1);
}

TEST_P(ShardServerTest, RefusedPushCanBeRetriedWithSameSeq) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  ExpectError({HeaderFrame(PushHeader(Op::kPushDense, "d", 3, 1)), Floats({nan, 0, 0, 0, 0, 0})},
              StatusCode::kNonFinite, "NaN");
  // The refused push was not recorded as applied: the corrected retry goes through.
  auto r = raw_->Call({HeaderFrame(PushHeader(Op::kPushDense, "d", 3, 1)), Floats(kDenseG0)});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  EXPECT_EQ(r->first.version, 2u);
  EXPECT_THAT(r->first.message, ::testing::Not(HasSubstr("duplicate")));
}

TEST_P(ShardServerTest, MessageOverLimitIsTooLarge) {
  const size_t floats = kMaxMessageBytes / 4 + 1000;  // over the soft limit, under 2x
  Header reply = ExpectError(
      {HeaderFrame(PushHeader(Op::kPushDense, "d", 3, 1)), Floats(std::vector<float>(floats))},
      StatusCode::kTooLarge, std::to_string(kMaxMessageBytes));
  ExpectStillServing();
}

TEST_P(ShardServerTest, CreateTableWithBadSpecIsInvalidArgument) {
  Header h = Request(Op::kCreateTable, "bad");
  TableSpec spec = DenseSpec();
  spec.name = "bad";
  h.spec = EncodeSpec(spec);
  h.spec["optimizer"] = "sgdx";
  ExpectError({HeaderFrame(h)}, StatusCode::kInvalidArgument, "'sgdx'");
  h.spec = EncodeSpec(spec);
  h.spec["shape"] = "0x3";
  ExpectError({HeaderFrame(h)}, StatusCode::kInvalidArgument, "shape");
  h.spec = EncodeSpec(spec);
  h.spec["opt.lr"] = "-1";
  ExpectError({HeaderFrame(h)}, StatusCode::kInvalidArgument, "lr");
  h.spec = {{"name", "bad"}};
  ExpectError({HeaderFrame(h)}, StatusCode::kInvalidArgument, "kind");
  // None of them was created.
  ExpectError({HeaderFrame(Request(Op::kPullDense, "bad"))}, StatusCode::kNotFound, "'bad'");
  ExpectStillServing();
}

TEST_P(ShardServerTest, CreateTableWithDifferentSpecIsAlreadyExists) {
  TableSpec spec = DenseSpec();
  Header h = Request(Op::kCreateTable, "d");
  h.spec = EncodeSpec(spec);
  auto same = raw_->Call({HeaderFrame(h)});  // an equal spec is idempotent
  ASSERT_TRUE(same.has_value());
  EXPECT_EQ(same->first.code, StatusCode::kOk);
  EXPECT_EQ(same->first.message, "exists");
  EXPECT_EQ(same->first.version, 1u);
  spec.optimizer_params = {{"lr", 0.5}};
  h.spec = EncodeSpec(spec);
  ExpectError({HeaderFrame(h)}, StatusCode::kAlreadyExists, "'d'");
  ExpectStillServing();  // the table, its weights and its lr are unchanged
  auto r = raw_->Call({HeaderFrame(PushHeader(Op::kPushDense, "d", 3, 1)), Floats(kDenseG0)});
  ASSERT_TRUE(r.has_value());
  r = raw_->Call({HeaderFrame(Request(Op::kPullDense, "d"))});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->second.size(), 2u);
  EXPECT_EQ(r->second[1].As<float>()[5], -12.0f);  // lr still 1
}

// A worker started with other table flags than the one that created the table (a changed
// ONLINEPS_LR in a rollout) is refused; the refusal names each field that differs, with
// the table's value and the asked one, so the operator knows which flag to revert.
TEST_P(ShardServerTest, CreateTableWithDifferentSpecNamesWhatDiffers) {
  TableSpec spec = DenseSpec();
  Header h = Request(Op::kCreateTable, "d");
  spec.optimizer_params = {{"lr", 0.5}};
  spec.staleness = "lr_over_tau";
  h.spec = EncodeSpec(spec);
  ExpectError({HeaderFrame(h)}, StatusCode::kAlreadyExists,
              "table 'd' exists with a different spec: opt.lr=1 (asked 0.5), staleness=none "
              "(asked lr_over_tau)");
  spec = DenseSpec();
  spec.clip_norm = 2.0;  // a field the table does not hold at all
  h.spec = EncodeSpec(spec);
  ExpectError({HeaderFrame(h)}, StatusCode::kAlreadyExists, "clip_norm=(none) (asked 2)");
  ExpectStillServing();
}

// The caps of a sparse table are fixed at creation: a create_table that differs only in
// them joins the table (so workers with other cap flags can share it) and says which
// caps the table kept.
TEST_P(ShardServerTest, CreateTableWithOtherCapsKeepsTheTablesCaps) {
  TableSpec spec = SparseSpec();
  spec.max_rows = 5000;
  spec.ttl_ms = 100;
  spec.admit_after = 3;
  Header h = Request(Op::kCreateTable, "s");
  h.spec = EncodeSpec(spec);
  auto r = raw_->Call({HeaderFrame(h)});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  EXPECT_EQ(r->first.message,
            "exists with other caps, kept: max_rows=0 ttl_ms=0 admit_after=0 (asked max_rows=5000 "
            "ttl_ms=100 admit_after=3)");
  r = raw_->Call({HeaderFrame(Request(Op::kTableInfo, "s"))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.spec["max_rows"], "0");
  EXPECT_EQ(r->first.spec["ttl_ms"], "0");
  EXPECT_EQ(r->first.spec["admit_after"], "0");
  spec.dim = 3;  // a different row size is another table
  h.spec = EncodeSpec(spec);
  ExpectError({HeaderFrame(h)}, StatusCode::kAlreadyExists, "'s'");
  ExpectStillServing();
}

// Issue 21: the I/O thread never waits on a table lock. A small request runs on the I/O
// thread when its peer's lane is idle; while another thread holds the table's locks it
// goes to its lane's handler thread instead, so other peers are still served at once.
TEST_P(ShardServerTest, IoThreadServesOthersWhileATableIsLocked) {
  if (GetParam() != "tcp") GTEST_SKIP() << "mem:// has no I/O thread";
  ShardServerOptions o;
  o.listen = ListenEndpoint("tcp", "");
  o.handler_threads = 16;  // six pingers all on the blocked peer's lane: p = 16^-6
  std::string endpoint;
  auto server = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(server, nullptr);
  RawClient pusher(endpoint);
  for (const TableSpec& spec : {DenseSpec(), SparseSpec()}) {
    Header h = Request(Op::kCreateTable, spec.name);
    h.spec = EncodeSpec(spec);
    auto r = pusher.Call({HeaderFrame(h)});
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  }
  std::vector<std::unique_ptr<RawClient>> pingers;
  for (int i = 0; i < 6; ++i) pingers.push_back(std::make_unique<RawClient>(endpoint));
  for (auto& p : pingers) ASSERT_TRUE(p->Call({HeaderFrame(Request(Op::kPing, ""))}).has_value());

  // A push that asks for the values it wrote, then its retry (a duplicate: nothing to
  // apply, but its values are still read).
  Header with_values = PushHeader(Op::kPushDense, "d", 5, 3);
  with_values.flags |= kFlagReturnValues;
  const std::vector<std::pair<Frames, std::string>> blocked = {
      {{HeaderFrame(PushHeader(Op::kPushSparse, "s", 5, 1)), Keys(kSparseKeys), Floats(kSparseG0)},
       "s"},
      {{HeaderFrame(Request(Op::kPullDense, "d"))}, "d"},
      {{HeaderFrame(PushHeader(Op::kPushDense, "d", 5, 2)), Floats(kDenseG0)}, "d"},
      {{HeaderFrame(with_values), Floats(kDenseG0)}, "d"},
      {{HeaderFrame(with_values), Floats(kDenseG0)}, "d"}};
  for (const auto& [request, table] : blocked) {
    SCOPED_TRACE(table);
    std::shared_ptr<Table> t = server->FindTable(table);
    ASSERT_NE(t, nullptr);
    const uint64_t version = t->version();
    TableTestPeer::Lock(t.get());
    pusher.Send(request);
    std::this_thread::sleep_for(50ms);  // the request reached the shard and was handed on
    for (auto& p : pingers) p->Send({HeaderFrame(Request(Op::kPing, ""))});
    std::vector<bool> got;
    for (auto& p : pingers) got.push_back(p->Receive(1000ms).has_value());
    const size_t answered = static_cast<size_t>(std::count(got.begin(), got.end(), true));
    const bool waiting = !pusher.Receive(100ms).has_value();
    TableTestPeer::Unlock(t.get());
    EXPECT_GE(answered, 1u) << "no peer was answered while the table was locked";
    EXPECT_TRUE(waiting) << "the request was answered while its table was locked";
    auto r = pusher.Receive(5000ms);
    ASSERT_TRUE(r.has_value()) << "the handed-on request was never answered";
    EXPECT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
    const bool push = r->first.version != version;
    EXPECT_EQ(t->version(), version + (push ? 1 : 0)) << "applied exactly once";
    if (DecodeHeader(request[0].data(), request[0].size())->flags & kFlagReturnValues) {
      ASSERT_EQ(r->second.size(), 2u) << "no values in the reply";
      EXPECT_EQ(r->second[1].size(), kDenseG0.size() * sizeof(float));
    }
    for (size_t i = 0; i < pingers.size(); ++i) {  // those queued behind it come through
      if (!got[i]) {
        EXPECT_TRUE(pingers[i]->Receive(5000ms).has_value()) << "pinger " << i;
      }
    }
  }
  // The sparse push was applied once: rows 7 and 8 moved by -lr * g.
  auto pulled = pusher.Call({HeaderFrame(Request(Op::kPullSparse, "s")), Keys(kSparseKeys)});
  ASSERT_TRUE(pulled.has_value());
  ASSERT_EQ(pulled->second.size(), 2u);
  EXPECT_EQ(pulled->second[1].As<float>()[0], -kSparseG0[0]);
  EXPECT_EQ(pulled->second[1].As<float>()[3], -kSparseG0[3]);
  server->Stop();
}

TEST_P(ShardServerTest, WrongOpForTableKindIsInvalidArgument) {
  ExpectError({HeaderFrame(PushHeader(Op::kPushDense, "s", 3, 1)), Floats({1, 2})},
              StatusCode::kInvalidArgument, "push_sparse");
  ExpectError({HeaderFrame(PushHeader(Op::kPushSparse, "d", 3, 2)), Keys({1}), Floats({1, 2})},
              StatusCode::kInvalidArgument, "push_dense");
  ExpectError({HeaderFrame(Request(Op::kPullDense, "s"))}, StatusCode::kInvalidArgument,
              "pull_sparse");
  ExpectError({HeaderFrame(Request(Op::kPullSparse, "d")), Keys({1})}, StatusCode::kInvalidArgument,
              "pull_dense");
  ExpectStillServing();
}

// A dense pull of a range {first, count} of the shard's elements reads just those; a range
// past the end, an empty one or a shape of another length is refused, naming the problem.
TEST_P(ShardServerTest, DensePullOfARangeReadsItAndBadRangesAreRefused) {
  Header h = Request(Op::kPullDense, "d");
  h.shape = {2, 3};
  auto r = raw_->Call({HeaderFrame(h)});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  EXPECT_EQ(r->first.version, 1u);
  ASSERT_EQ(r->second.size(), 2u);
  ASSERT_EQ(r->second[1].CountOf<float>(), 3);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(r->second[1].As<float>()[i], -kDenseG0[2 + i]) << i;
  h.shape = {4, 3};
  ExpectError({HeaderFrame(h)}, StatusCode::kInvalidArgument, "this shard holds 6");
  h.shape = {~uint64_t{0}, 2};
  ExpectError({HeaderFrame(h)}, StatusCode::kInvalidArgument, "this shard holds 6");
  h.shape = {1, 0};
  ExpectError({HeaderFrame(h)}, StatusCode::kInvalidArgument, "empty range");
  h.shape = {1};
  ExpectError({HeaderFrame(h)}, StatusCode::kInvalidArgument, "{first, count}");
  // A DC-ASGD table's pull records the copy read as the sender's backup: whole only,
  // unless it records none.
  TableSpec dc = DenseSpec();
  dc.name = "dc";
  dc.staleness = "dc_constant";
  Header c = Request(Op::kCreateTable, "dc");
  c.spec = EncodeSpec(dc);
  ASSERT_EQ(raw_->Call({HeaderFrame(c)})->first.code, StatusCode::kOk);
  Header p = Request(Op::kPullDense, "dc");
  p.shape = {0, 2};
  ExpectError({HeaderFrame(p)}, StatusCode::kInvalidArgument, "DC-ASGD");
  p.flags = kFlagNoBackup;
  auto ok = raw_->Call({HeaderFrame(p)});
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->first.code, StatusCode::kOk) << ok->first.message;
  ExpectStillServing();
}

TEST_P(ShardServerTest, SamePushSentThreeTimesIsAppliedOnce) {
  const std::vector<float> g = {10, 20, 30, 40, 50, 60};
  for (int i = 0; i < 3; ++i) {
    Header h = PushHeader(Op::kPushDense, "d", /*sender=*/55, /*seq=*/1);
    h.request_id = 100 + i;
    raw_->Send({HeaderFrame(h), Floats(g)});
  }
  for (int i = 0; i < 3; ++i) {
    auto r = raw_->Receive();
    ASSERT_TRUE(r.has_value()) << "reply " << i;
    EXPECT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
    EXPECT_EQ(r->first.request_id, static_cast<uint32_t>(100 + i));
    EXPECT_EQ(r->first.version, 2u);
    if (i == 0) {
      EXPECT_EQ(r->first.message, "");
    } else {
      EXPECT_THAT(r->first.message, StartsWith("duplicate"));
    }
  }
  auto r = raw_->Call({HeaderFrame(Request(Op::kPullDense, "d"))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.version, 2u);
  ASSERT_EQ(r->second.size(), 2u);
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(r->second[1].As<float>()[i], -kDenseG0[i] - g[i]);
  EXPECT_EQ(MetricValue(*registry_, "onlineps_ps_duplicate_pushes_total"), 2);
  // The next seq of that sender is new.
  r = raw_->Call({HeaderFrame(PushHeader(Op::kPushDense, "d", 55, 2)), Floats(g)});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.message, "");
  EXPECT_EQ(r->first.version, 3u);
}

// A duplicate's values are read as a pull reads them, for the keys it names, whatever
// its values frame holds: the reply size a pull refuses (TOO_LARGE), a duplicate must too,
// or a retry naming many keys of a wide table makes the shard allocate far past its limit.
TEST_P(ShardServerTest, ADuplicateAskingForValuesIsBoundedLikeAPull) {
  TableSpec wide = SparseSpec();
  wide.name = "wide";
  wide.dim = 1024;
  Header create = Request(Op::kCreateTable, wide.name);
  create.spec = EncodeSpec(wide);
  auto r = raw_->Call({HeaderFrame(create)});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  r = raw_->Call({HeaderFrame(PushHeader(Op::kPushSparse, "wide", 77, 1)), Keys({7}),
                  Floats(std::vector<float>(1024, 1.0f))});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  // The same (sender, seq) again, naming 7,000 keys (56 KB, under the message limit):
  // their rows are 28 MB, which a pull of them is refused.
  std::vector<uint64_t> keys(7000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  ExpectError({HeaderFrame(Request(Op::kPullSparse, "wide")), Keys(keys)}, StatusCode::kTooLarge,
              "split it");
  Header dup = PushHeader(Op::kPushSparse, "wide", 77, 1);
  dup.flags = kFlagReturnValues;
  ExpectError({HeaderFrame(dup), Keys(keys), Floats({})}, StatusCode::kTooLarge, "split it");
  ExpectStillServing();
}

TEST_P(ShardServerTest, PushReplyReportsStalenessAndMetricsCountIt) {
  // Baseline: two pushes at base 0 (tau 0 each: one per table). A push at base 0 to a
  // table at version 1 has tau 1.
  Header h = PushHeader(Op::kPushDense, "d", 3, 1);
  auto r = raw_->Call({HeaderFrame(h), Floats(kDenseG0)});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.tau, 1u);
  h.seq = 2;
  h.base_version = 2;
  r = raw_->Call({HeaderFrame(h), Floats(kDenseG0)});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.tau, 0u);
  EXPECT_EQ(r->first.version, 3u);
  // By table: d had three pushes (tau 0, 1, 0), s one (tau 0).
  EXPECT_EQ(MetricValue(*registry_, "onlineps_ps_push_staleness_count", {"table=\"d\""}), 3);
  EXPECT_EQ(MetricValue(*registry_, "onlineps_ps_push_staleness_sum", {"table=\"d\""}), 1);
  EXPECT_EQ(MetricValue(*registry_, "onlineps_ps_push_staleness_count", {"table=\"s\""}), 1);
  EXPECT_EQ(MetricValue(*registry_, "onlineps_ps_push_staleness_sum", {"table=\"s\""}), 0);
  EXPECT_EQ(
      MetricValue(*registry_, "onlineps_ps_push_staleness_bucket", {"table=\"d\"", "le=\"0\""}), 2);
}

TEST_P(ShardServerTest, PingAndTableInfoDescribeTheShard) {
  auto r = raw_->Call({HeaderFrame(Request(Op::kPing, "", 9))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.code, StatusCode::kOk);
  EXPECT_EQ(r->first.request_id, 9u);
  EXPECT_EQ(r->first.spec["shard"], "0");
  EXPECT_EQ(r->first.spec["num_shards"], "1");
  EXPECT_EQ(r->first.spec["ready"], "true");
  r = raw_->Call({HeaderFrame(Request(Op::kTableInfo, "s"))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  EXPECT_EQ(r->first.version, 1u);
  EXPECT_EQ(r->first.spec["stat.rows"], "2");
  EXPECT_EQ(r->first.spec["stat.elements"], "4");
  EXPECT_EQ(r->first.spec["dim"], "2");
  r = raw_->Call({HeaderFrame(Request(Op::kTableInfo, ""))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.spec,
            (std::map<std::string, std::string>{{"table.d", "1"}, {"table.s", "1"}}));
}

TEST_P(ShardServerTest, CheckpointWithoutDirectoryIsFailedPrecondition) {
  ExpectError({HeaderFrame(Request(Op::kCheckpoint, ""))}, StatusCode::kFailedPrecondition,
              "checkpoint directory");
  ExpectStillServing();
}

TEST_P(ShardServerTest, StartRefusesShardIndexOutOfRangeAndTakenEndpoint) {
  ShardServerOptions o;
  o.shard = 2;
  o.num_shards = 2;
  o.listen = ListenEndpoint(GetParam(), "bad-index");
  ShardServer bad_index(o, std::make_shared<prometheus::Registry>());
  auto r = bad_index.Start();
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("2"));
  o.shard = 0;
  o.listen = endpoint_;  // already served by this fixture's shard
  ShardServer taken(o, std::make_shared<prometheus::Registry>());
  r = taken.Start();
  EXPECT_FALSE(r.ok());
  EXPECT_FALSE(taken.ready());
  ExpectStillServing();
}

Header WatchHeader(uint32_t rid, std::map<std::string, std::string> spec) {
  Header h = Request(Op::kWatch, "", rid);
  h.spec = std::move(spec);
  return h;
}

TEST_P(ShardServerTest, WatchIsHeldUntilANamedTableChangesAndNamesTheKeysPushed) {
  // The fixture left both tables at version 1. Another client pushes.
  RawClient other(endpoint_);
  raw_->Send({HeaderFrame(WatchHeader(71, {{"wait_ms", "10000"}, {"t.d", "1"}, {"t.s", "1"}}))});
  EXPECT_FALSE(raw_->Receive(200ms).has_value()) << "nothing changed: the watch must be held";
  auto pushed = other.Call(
      {HeaderFrame(PushHeader(Op::kPushSparse, "s", 2, 1)), Keys({42, 7}), Floats({1, 1, 1, 1})});
  ASSERT_TRUE(pushed.has_value());
  EXPECT_EQ(pushed->first.code, StatusCode::kOk) << pushed->first.message;
  auto watch = raw_->Receive();
  ASSERT_TRUE(watch.has_value());
  EXPECT_EQ(watch->first.request_id, 71u);
  EXPECT_EQ(watch->first.code, StatusCode::kOk) << watch->first.message;
  EXPECT_EQ(watch->first.spec["t.s"], "2");
  EXPECT_EQ(watch->first.spec["t.d"], "1");
  EXPECT_EQ(watch->first.spec.count("k.d"), 0u) << "dense tables carry no keys";
  ASSERT_EQ(watch->first.spec["k.s"], "1");
  ASSERT_EQ(watch->second.size(), 2u);
  const uint64_t* k = watch->second[1].As<uint64_t>();
  EXPECT_EQ(std::vector<uint64_t>(k, k + watch->second[1].CountOf<uint64_t>()),
            (std::vector<uint64_t>{7, 42}));
  // Watching from the new version: only what came after it.
  raw_->Send({HeaderFrame(WatchHeader(72, {{"wait_ms", "10000"}, {"t.s", "2"}}))});
  EXPECT_FALSE(raw_->Receive(100ms).has_value());
  // The watcher's own push does not answer its watch (the push reply says it all)...
  auto own =
      raw_->Call({HeaderFrame(PushHeader(Op::kPushSparse, "s", 1, 3)), Keys({9}), Floats({1, 1})});
  ASSERT_TRUE(own.has_value());
  EXPECT_EQ(own->first.request_id, 0u) << "the held watch was answered by its own push";
  EXPECT_FALSE(raw_->Receive(100ms).has_value());
  // ...and the next notice names its keys with the other client's.
  ASSERT_TRUE(
      other.Call({HeaderFrame(PushHeader(Op::kPushSparse, "s", 2, 2)), Keys({8}), Floats({1, 1})})
          .has_value());
  auto next = raw_->Receive();
  ASSERT_TRUE(next.has_value());
  EXPECT_EQ(next->first.request_id, 72u);
  EXPECT_EQ(next->first.spec["t.s"], "4");
  ASSERT_EQ(next->second.size(), 2u);
  k = next->second[1].As<uint64_t>();
  EXPECT_EQ(std::vector<uint64_t>(k, k + next->second[1].CountOf<uint64_t>()),
            (std::vector<uint64_t>{8, 9}));
}

TEST_P(ShardServerTest, APushThatEvictsRowsAnswersThePushersOwnWatchWithThem) {
  // A push's reply names only the rows it pushed; rows it evicted (max_rows) are news to
  // the pusher too, so its own held watch is answered with them.
  TableSpec capped = SparseSpec();
  capped.name = "c";
  capped.max_rows = 2;
  Header create = Request(Op::kCreateTable, "c");
  create.spec = EncodeSpec(capped);
  ASSERT_TRUE(raw_->Call({HeaderFrame(create)}).has_value());
  auto first =
      raw_->Call({HeaderFrame(PushHeader(Op::kPushSparse, "c", 1, 10)), Keys({5}), Floats({1, 1})});
  ASSERT_TRUE(first.has_value());
  ASSERT_EQ(first->first.code, StatusCode::kOk) << first->first.message;
  raw_->Send({HeaderFrame(WatchHeader(81, {{"wait_ms", "10000"}, {"t.c", "1"}}))});
  EXPECT_FALSE(raw_->Receive(100ms).has_value());
  // Without evictions the pusher's own watch stays held (see above); these two rows make
  // the stripe evict key 5.
  raw_->Send(
      {HeaderFrame(PushHeader(Op::kPushSparse, "c", 1, 11)), Keys({6, 7}), Floats({1, 1, 1, 1})});
  std::map<uint32_t, std::pair<Header, Frames>> replies;
  for (int i = 0; i < 2; ++i) {
    auto r = raw_->Receive(2000ms);
    ASSERT_TRUE(r.has_value()) << "reply " << i << " missing";
    replies[r->first.request_id] = std::move(*r);
  }
  ASSERT_EQ(replies.count(81), 1u) << "the pusher's own watch was not answered";
  const auto& watch = replies[81];
  EXPECT_EQ(watch.first.spec.at("t.c"), "2");
  ASSERT_EQ(watch.second.size(), 2u);
  const uint64_t* k = watch.second[1].As<uint64_t>();
  const std::vector<uint64_t> keys(k, k + watch.second[1].CountOf<uint64_t>());
  EXPECT_THAT(keys, ::testing::Contains(5u)) << "the evicted row is not named";
}

TEST_P(ShardServerTest, AWatchNamesTheKeysOfPushesQueuedBeforeItStarted) {
  // accumulate = 2: the first push is queued (version 0), the second applies both.
  TableSpec acc = SparseSpec();
  acc.name = "q";
  acc.accumulate = 2;
  Header create = Request(Op::kCreateTable, "q");
  create.spec = EncodeSpec(acc);
  ASSERT_TRUE(raw_->Call({HeaderFrame(create)}).has_value());
  RawClient other(endpoint_);
  auto queued =
      other.Call({HeaderFrame(PushHeader(Op::kPushSparse, "q", 2, 1)), Keys({42}), Floats({1, 1})});
  ASSERT_TRUE(queued.has_value());
  ASSERT_EQ(queued->first.code, StatusCode::kOk) << queued->first.message;
  EXPECT_EQ(queued->first.version, 0u);
  // The first watch of the table starts the shard remembering keys, after key 42 came.
  raw_->Send({HeaderFrame(WatchHeader(91, {{"wait_ms", "10000"}, {"t.q", "0"}}))});
  EXPECT_FALSE(raw_->Receive(100ms).has_value());
  ASSERT_TRUE(
      other.Call({HeaderFrame(PushHeader(Op::kPushSparse, "q", 2, 2)), Keys({7}), Floats({1, 1})})
          .has_value());
  auto watch = raw_->Receive();
  ASSERT_TRUE(watch.has_value());
  EXPECT_EQ(watch->first.spec["t.q"], "1");
  // Version 1 changed key 42 too: the answer names it, or says "all".
  if (watch->first.spec["k.q"] == "all") return;
  ASSERT_EQ(watch->first.spec["k.q"], "1");
  ASSERT_EQ(watch->second.size(), 2u);
  const uint64_t* k = watch->second[1].As<uint64_t>();
  EXPECT_THAT(std::vector<uint64_t>(k, k + watch->second[1].CountOf<uint64_t>()),
              ::testing::Contains(42u))
      << "the queued push's key is not named: a watcher keeps its old row for good";
}

TEST_P(ShardServerTest, APushThatAppliesOthersQueuedPushesAnswersThePushersOwnWatch) {
  // accumulate = 2: a push that completes the window applies another sender's queued
  // push too; its reply names only its own rows, so its pusher's watch is answered.
  TableSpec acc = SparseSpec();
  acc.name = "q";
  acc.accumulate = 2;
  Header create = Request(Op::kCreateTable, "q");
  create.spec = EncodeSpec(acc);
  ASSERT_TRUE(raw_->Call({HeaderFrame(create)}).has_value());
  RawClient other(endpoint_);
  auto watch = raw_->Call({HeaderFrame(WatchHeader(90, {{"wait_ms", "10000"}, {"t.q", "1"}}))});
  ASSERT_TRUE(watch.has_value());
  ASSERT_EQ(watch->first.spec["t.q"], "0");
  raw_->Send({HeaderFrame(WatchHeader(91, {{"wait_ms", "10000"}, {"t.q", "0"}}))});
  EXPECT_FALSE(raw_->Receive(100ms).has_value());
  auto queued =
      other.Call({HeaderFrame(PushHeader(Op::kPushSparse, "q", 2, 1)), Keys({42}), Floats({1, 1})});
  ASSERT_TRUE(queued.has_value());
  ASSERT_TRUE(queued->first.queued);
  raw_->Send({HeaderFrame(PushHeader(Op::kPushSparse, "q", 1, 10)), Keys({7}), Floats({1, 1})});
  std::map<uint32_t, std::pair<Header, Frames>> replies;
  for (int i = 0; i < 2; ++i) {
    auto r = raw_->Receive(2000ms);
    ASSERT_TRUE(r.has_value()) << "reply " << i << " missing";
    replies[r->first.request_id] = std::move(*r);
  }
  ASSERT_EQ(replies.count(91), 1u) << "the pusher's own watch was not answered";
  const auto& notice = replies[91];
  EXPECT_EQ(notice.first.spec.at("t.q"), "1");
  if (notice.first.spec.at("k.q") == "all") return;
  ASSERT_EQ(notice.second.size(), 2u);
  const uint64_t* k = notice.second[1].As<uint64_t>();
  EXPECT_THAT(std::vector<uint64_t>(k, k + notice.second[1].CountOf<uint64_t>()),
              ::testing::Contains(42u));
}

TEST_P(ShardServerTest, WatchFromAnOlderVersionIsAnsweredAtOnceWithAllRows) {
  // The keys pushed before the first watch are not known: "all".
  auto r = raw_->Call({HeaderFrame(WatchHeader(5, {{"t.d", "0"}, {"t.s", "0"}}))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  EXPECT_EQ(r->first.spec["t.d"], "1");
  EXPECT_EQ(r->first.spec["t.s"], "1");
  EXPECT_EQ(r->first.spec["k.s"], "all");
  // A version ahead of the shard's (it restarted from an older checkpoint): "all" too.
  r = raw_->Call({HeaderFrame(WatchHeader(6, {{"t.s", "9"}}))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.spec["t.s"], "1");
  EXPECT_EQ(r->first.spec["k.s"], "all");
}

TEST_P(ShardServerTest, QuietWatchIsAnsweredWhenItsWaitEnds) {
  const auto t0 = Clock::now();
  auto r = raw_->Call({HeaderFrame(WatchHeader(9, {{"wait_ms", "150"}, {"t.d", "1"}}))});
  const auto elapsed = Clock::now() - t0;
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  EXPECT_EQ(r->first.spec["t.d"], "1");
  EXPECT_GE(elapsed, 140ms);
  EXPECT_LE(elapsed, 1000ms);
}

TEST_P(ShardServerTest, BadWatchIsInvalidArgumentAndTheShardKeepsServing) {
  ExpectError({HeaderFrame(WatchHeader(1, {{"wait_ms", "10"}}))}, StatusCode::kInvalidArgument,
              "names no table");
  ExpectError({HeaderFrame(WatchHeader(1, {{"t.d", "one"}}))}, StatusCode::kInvalidArgument,
              "not an unsigned integer");
  ExpectError({HeaderFrame(WatchHeader(1, {{"t.d", "1"}, {"bogus", "1"}}))},
              StatusCode::kInvalidArgument, "bogus");
  ExpectError({HeaderFrame(WatchHeader(1, {{"t.d", "1"}, {"wait_ms", "99999999999999999999999"}}))},
              StatusCode::kInvalidArgument, "wait_ms");
  // A name no table can have (over 128 characters): a held watch keeps its names.
  ExpectError({HeaderFrame(WatchHeader(1, {{"t." + std::string(129, 'x'), "1"}}))},
              StatusCode::kInvalidArgument, "128");
  ExpectStillServing();
}

// A push_batch request of `subs`, each sub-push's frames in turn.
Frames BatchOf(std::vector<Frames> subs, uint64_t sender = 1) {
  Header h = Request(Op::kPushBatch, "");
  h.sender = sender;
  Frames f{Frame()};
  for (Frames& sub : subs) {
    h.shape.push_back(sub.size());
    for (Frame& x : sub) f.push_back(std::move(x));
  }
  f[0] = HeaderFrame(h);
  return f;
}

// A push_batch reply split into its sub-replies (decoded header, frames).
std::vector<std::pair<Header, Frames>> SubReplies(const Header& h, const Frames& f) {
  std::vector<std::pair<Header, Frames>> out;
  size_t at = 1;
  for (uint64_t k : h.shape) {
    if (k == 0 || at + k > f.size()) {
      ADD_FAILURE() << "reply shape does not count its frames";
      return out;
    }
    auto sh = DecodeHeader(f[at].data(), f[at].size());
    if (!sh.ok()) {
      ADD_FAILURE() << "undecodable sub-reply: " << sh.status().ToString();
      return out;
    }
    out.emplace_back(*sh, Frames(f.begin() + static_cast<ptrdiff_t>(at),
                                 f.begin() + static_cast<ptrdiff_t>(at + k)));
    at += k;
  }
  EXPECT_EQ(at, f.size()) << "frames beyond the reply's shape";
  return out;
}

// A push_batch run on the I/O thread whose later sub-push finds its table locked goes,
// whole, to a handler thread and runs again there. Sub-pushes applied before are answered
// as duplicates only when they carry a seq: one sent with seq 0 (no dedup) was applied a
// second time although the client sent it once. Such a batch now goes before anything is
// applied.
TEST_P(ShardServerTest, ABatchHandedOffAfterAPartialApplyAppliesASeqZeroSubPushOnce) {
  if (GetParam() != "tcp") GTEST_SKIP() << "mem:// has no I/O thread";
  ShardServerOptions o;
  o.listen = ListenEndpoint("tcp", "");
  std::string endpoint;
  auto server = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(server, nullptr);
  RawClient client(endpoint);
  for (const TableSpec& spec : {DenseSpec(), SparseSpec()}) {
    Header h = Request(Op::kCreateTable, spec.name);
    h.spec = EncodeSpec(spec);
    auto r = client.Call({HeaderFrame(h)});
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  }
  std::shared_ptr<Table> dense = server->FindTable("d");
  std::shared_ptr<Table> sparse = server->FindTable("s");
  ASSERT_EQ(dense->version(), 0u);
  // Sub-push 1: dense, seq 0. Sub-push 2: sparse, whose stripes a test thread holds.
  Frames batch = BatchOf(
      {{HeaderFrame(PushHeader(Op::kPushDense, "d", 5, 0)), Floats(kDenseG0)},
       {HeaderFrame(PushHeader(Op::kPushSparse, "s", 5, 0)), Keys(kSparseKeys), Floats(kSparseG0)}},
      5);
  TableTestPeer::Lock(sparse.get());
  client.Send(std::move(batch));
  std::this_thread::sleep_for(100ms);  // reached the I/O thread, handed on
  TableTestPeer::Unlock(sparse.get());
  auto r = client.Receive(5000ms);
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  EXPECT_EQ(sparse->version(), 1u);
  EXPECT_EQ(dense->version(), 1u) << "the dense sub-push, sent once, was applied "
                                  << dense->version() << " times";
  auto pulled = client.Call({HeaderFrame(Request(Op::kPullDense, "d"))});
  ASSERT_TRUE(pulled.has_value());
  EXPECT_EQ(pulled->second[1].As<float>()[0], -kDenseG0[0]);
  server->Stop();
}

// A sub-push whose (sid, seq) is being applied by another request is UNAVAILABLE, and
// the whole message used to be refused so that the client resends it: a sub-push before
// it sent with seq 0 (no dedup) was then applied once more than it was sent. Once such
// a sub-push is applied, the refusal is that sub-push's own reply.
TEST_P(ShardServerTest, ABatchRefusedForRetryAfterASeqZeroSubPushDoesNotAskForAResend) {
  if (GetParam() != "tcp") GTEST_SKIP() << "one run is enough: the batch is handled here";
  std::shared_ptr<Table> dense = server_->FindTable("d");
  std::shared_ptr<Table> sparse = server_->FindTable("s");
  const uint64_t dense_before = dense->version();
  // (5, 9) is being applied: its handler thread waits for the sparse table's locks.
  TableTestPeer::Lock(sparse.get());
  raw_->Send({HeaderFrame(PushHeader(Op::kPushSparse, "s", 5, 9)), Keys({7}), Floats({1, 1})});
  std::this_thread::sleep_for(200ms);
  const Frames batch =
      BatchOf({{HeaderFrame(PushHeader(Op::kPushDense, "d", 5, 0)), Floats(kDenseG0)},
               {HeaderFrame(PushHeader(Op::kPushSparse, "s", 5, 9)), Keys({7}), Floats({1, 1})}},
              5);
  Header reply;
  Frames out{Frame()};
  const Status st = ShardServerTestPeer::DispatchBatch(server_.get(), batch, &reply, &out);
  TableTestPeer::Unlock(sparse.get());
  auto pushed = raw_->Receive(5000ms);
  ASSERT_TRUE(pushed.has_value());
  EXPECT_EQ(pushed->first.code, StatusCode::kOk) << pushed->first.message;
  ASSERT_TRUE(st.ok()) << "the whole batch is to be resent, its seq-0 sub-push applied again: "
                       << st.ToString();
  auto subs = SubReplies(reply, out);
  ASSERT_EQ(subs.size(), 2u);
  EXPECT_EQ(subs[0].first.code, StatusCode::kOk) << subs[0].first.message;
  EXPECT_EQ(subs[1].first.code, StatusCode::kUnavailable) << subs[1].first.message;
  EXPECT_EQ(dense->version(), dense_before + 1);
  // What was refused is resent on its own: (5, 9) was applied by the first request.
  auto again = raw_->Call(BatchOf(
      {{HeaderFrame(PushHeader(Op::kPushSparse, "s", 5, 9)), Keys({7}), Floats({1, 1})}}, 5));
  ASSERT_TRUE(again.has_value());
  subs = SubReplies(again->first, again->second);
  ASSERT_EQ(subs.size(), 1u);
  EXPECT_THAT(subs[0].first.message, StartsWith("duplicate"));
  EXPECT_EQ(dense->version(), dense_before + 1);
}

TEST_P(ShardServerTest, PushBatchAppliesEachSubPushOnceAndAnswersEachOnItsOwn) {
  const std::vector<float> g = {1, 1, 1, 1, 1, 1};
  auto batch = [&]() {
    return BatchOf(
        {{HeaderFrame(PushHeader(Op::kPushDense, "d", 9, 1)), Floats(g)},
         {HeaderFrame(PushHeader(Op::kPushSparse, "s", 9, 2)), Keys({7}), Floats({5, 6})},
         {HeaderFrame(PushHeader(Op::kPushDense, "nope", 9, 3)), Floats(g)},
         {HeaderFrame(PushHeader(Op::kPushDense, "d", 9, 4)),
          Floats({1, 2, std::numeric_limits<float>::quiet_NaN(), 4, 5, 6})}},
        9);
  };
  for (int round = 0; round < 2; ++round) {  // the second is a resend: duplicates
    auto r = raw_->Call(batch());
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
    auto subs = SubReplies(r->first, r->second);
    ASSERT_EQ(subs.size(), 4u);
    EXPECT_EQ(subs[0].first.code, StatusCode::kOk) << subs[0].first.message;
    EXPECT_EQ(subs[0].first.version, 2u);
    EXPECT_EQ(subs[1].first.code, StatusCode::kOk) << subs[1].first.message;
    EXPECT_EQ(subs[1].first.version, 2u);
    if (round == 0) {
      EXPECT_EQ(subs[0].first.message, "");
    } else {
      EXPECT_THAT(subs[0].first.message, StartsWith("duplicate"));
      EXPECT_THAT(subs[1].first.message, StartsWith("duplicate"));
    }
    EXPECT_EQ(subs[2].first.code, StatusCode::kNotFound);
    EXPECT_THAT(subs[2].first.message, HasSubstr("nope"));
    EXPECT_EQ(subs[3].first.code, StatusCode::kNonFinite);
  }
  auto r = raw_->Call({HeaderFrame(Request(Op::kPullDense, "d"))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.version, 2u) << "the dense sub-push once, the NaN one never";
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(r->second[1].As<float>()[i], -kDenseG0[i] - 1) << i;
  r = raw_->Call({HeaderFrame(Request(Op::kPullSparse, "s")), Keys({7})});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->second[1].As<float>()[0], -1.0f - 5.0f);
  EXPECT_EQ(MetricValue(*registry_, "onlineps_ps_requests_total",
                        {"op=\"push_dense\"", "code=\"NON_FINITE\""}),
            2);
  // The NaN push was refused, not applied: its seq may be sent again with good values.
  r = raw_->Call(BatchOf({{HeaderFrame(PushHeader(Op::kPushDense, "d", 9, 4)), Floats(g)}}, 9));
  ASSERT_TRUE(r.has_value());
  auto subs = SubReplies(r->first, r->second);
  ASSERT_EQ(subs.size(), 1u);
  EXPECT_EQ(subs[0].first.code, StatusCode::kOk) << subs[0].first.message;
  EXPECT_EQ(subs[0].first.version, 3u);
}

// Duplicates asking for values read the table whatever values they carry: many of them in
// one push_batch must not add up to a reply past the message limit (1,024 sub-pushes of a
// table's whole part each, from one message of headers).
TEST_P(ShardServerTest, DuplicatesInABatchAskingForValuesAreBoundedByTheMessageLimit) {
  TableSpec big = DenseSpec();
  big.name = "big";
  big.shape = {10000};  // 40 KB: one push of it fits in the 64 KiB limit, two replies do not
  Header create = Request(Op::kCreateTable, big.name);
  create.spec = EncodeSpec(big);
  auto r = raw_->Call({HeaderFrame(create)});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  r = raw_->Call({HeaderFrame(PushHeader(Op::kPushDense, "big", 88, 1)),
                  Floats(std::vector<float>(10000, 1.0f))});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  Header dup = PushHeader(Op::kPushDense, "big", 88, 1);
  dup.flags = kFlagReturnValues;
  std::vector<Frames> subs;
  for (int i = 0; i < 3; ++i) subs.push_back({HeaderFrame(dup), Floats({})});
  ExpectError(BatchOf(std::move(subs), 88), StatusCode::kTooLarge, "limit");
  ExpectStillServing();
}

TEST_P(ShardServerTest, BadPushBatchIsRefusedAndTheShardKeepsServing) {
  Header h = Request(Op::kPushBatch, "");
  ExpectError({HeaderFrame(h)}, StatusCode::kMalformed, "1 to 1024 sub-pushes");
  h.shape = {2, 2};
  ExpectError(
      {HeaderFrame(h), HeaderFrame(PushHeader(Op::kPushDense, "d", 9, 1)), Floats(kDenseG0)},
      StatusCode::kMalformed, "shape counts 4 frames after the header, the message has 2");
  h.shape = {0};
  ExpectError({HeaderFrame(h)}, StatusCode::kMalformed, "1 to 3 frames");
  // Sub-pushes that are not pushes, or whose header is garbage, fail on their own.
  auto r = raw_->Call(BatchOf({{HeaderFrame(Request(Op::kPing, ""))},
                               {Bytes("not msgpack")},
                               {HeaderFrame(PushHeader(Op::kPushDense, "d", 9, 1)), Floats({1})}}));
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  auto subs = SubReplies(r->first, r->second);
  ASSERT_EQ(subs.size(), 3u);
  EXPECT_EQ(subs[0].first.code, StatusCode::kInvalidArgument);
  EXPECT_THAT(subs[0].first.message, HasSubstr("not ping"));
  EXPECT_EQ(subs[1].first.code, StatusCode::kMalformed);
  EXPECT_EQ(subs[2].first.code, StatusCode::kShapeMismatch);
  // A table whose replies may be held cannot be in a batch.
  TableSpec block = DenseSpec();
  block.name = "blk";
  block.max_staleness = 1;
  block.bound_mode = BoundMode::kBlock;
  Header c = Request(Op::kCreateTable, "blk");
  c.spec = EncodeSpec(block);
  ASSERT_EQ(raw_->Call({HeaderFrame(c)})->first.code, StatusCode::kOk);
  r = raw_->Call(
      BatchOf({{HeaderFrame(PushHeader(Op::kPushDense, "blk", 9, 2)), Floats(kDenseG0)}}));
  ASSERT_TRUE(r.has_value());
  subs = SubReplies(r->first, r->second);
  ASSERT_EQ(subs.size(), 1u);
  EXPECT_EQ(subs[0].first.code, StatusCode::kInvalidArgument);
  EXPECT_THAT(subs[0].first.message, HasSubstr("block bound mode"));
  // Refused sub-pushes count under their own op like any refused push.
  EXPECT_EQ(MetricValue(*registry_, "onlineps_ps_requests_total",
                        {"op=\"push_dense\"", "code=\"INVALID_ARGUMENT\""}),
            1);
  EXPECT_EQ(MetricValue(*registry_, "onlineps_ps_requests_total",
                        {"op=\"push_dense\"", "code=\"SHAPE_MISMATCH\""}),
            1);
  ExpectStillServing();
}

INSTANTIATE_TEST_SUITE_P(Transports, ShardServerTest, ::testing::Values("mem", "tcp"),
                         [](const auto& info) { return info.param; });

// ------------------------------------------------------ through the PsClient

class ShardServerClientTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ShardServerClientTest, CallToAbsentServerIsDeadlineExceededNamingEndpoint) {
  const std::string endpoint = GetParam() == "mem"
                                   ? UniqueMemName("nobody-listens")
                                   : "tcp://127.0.0.1:" + std::to_string(FreeTcpPort());
  auto client = ConnectClient({endpoint}, /*timeout=*/300ms);
  ASSERT_NE(client, nullptr);
  const auto t0 = Clock::now();
  std::vector<float> out(4);
  Status st = client->PullDense("w", out.data(), nullptr).Wait();
  const auto elapsed = Clock::now() - t0;
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr(endpoint));
  EXPECT_GE(elapsed, 295ms);
  EXPECT_LE(elapsed, 1000ms);
  // A push (after the table is known elsewhere) fails the same way, on its own deadline.
  const auto t1 = Clock::now();
  st = client->CreateTable(DenseSpec());
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr(endpoint));
  EXPECT_LE(Clock::now() - t1, 1000ms);
}

TEST_P(ShardServerClientTest, BlockModeReplyIsHeldUntilSlowSenderPushes) {
  std::string endpoint;
  ShardServerOptions o;
  o.listen = ListenEndpoint(GetParam(), "block");
  auto server = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(server, nullptr);
  auto a = ConnectClient({endpoint}), b = ConnectClient({endpoint});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  TableSpec spec = DenseSpec();
  spec.max_staleness = 0;
  spec.bound_mode = BoundMode::kBlock;
  ASSERT_TRUE(a->CreateTable(spec).ok());
  std::vector<float> w(6);
  VersionVector va, vb;
  ASSERT_TRUE(a->PullDense("d", w.data(), &va).Wait().ok());
  ASSERT_TRUE(b->PullDense("d", w.data(), &vb).Wait().ok());
  const std::vector<float> g = {1, 1, 1, 1, 1, 1};
  PushReply ra, rb;
  Ticket ta = a->PushDense("d", g.data(), va, &ra);
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(ta.Ready()) << "A is a push ahead of B with s=0: its reply must be held";
  ASSERT_TRUE(b->PushDense("d", g.data(), vb, &rb).Wait().ok());
  ASSERT_TRUE(ta.Wait().ok());
  EXPECT_EQ(ra.versions, VersionVector{1});
  EXPECT_EQ(rb.versions, VersionVector{2});
  EXPECT_EQ(rb.max_tau, 1u);
  ASSERT_TRUE(a->PullDense("d", w.data(), nullptr).Wait().ok());
  EXPECT_EQ(w, std::vector<float>(6, -2.0f));
  server->Stop();
}

// block_timeout_ms takes any uint64 (docs/protocol.md): a hold of 2^64-1 ms is as good as
// "wait for the slow sender". Its deadline was now + block_timeout_ms, which wrapped to
// the past, so a held reply went out at once and the bound held no one.
TEST_P(ShardServerClientTest, AHugeBlockTimeoutStillHoldsTheReply) {
  std::string endpoint;
  ShardServerOptions o;
  o.listen = ListenEndpoint(GetParam(), "block-huge");
  auto server = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(server, nullptr);
  auto a = ConnectClient({endpoint}), b = ConnectClient({endpoint});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  TableSpec spec = DenseSpec();
  spec.max_staleness = 0;
  spec.bound_mode = BoundMode::kBlock;
  spec.block_timeout_ms = std::numeric_limits<uint64_t>::max();
  ASSERT_TRUE(a->CreateTable(spec).ok());
  std::vector<float> w(6);
  VersionVector va, vb;
  ASSERT_TRUE(a->PullDense("d", w.data(), &va).Wait().ok());
  ASSERT_TRUE(b->PullDense("d", w.data(), &vb).Wait().ok());
  const std::vector<float> g(6, 1.0f);
  Ticket ta = a->PushDense("d", g.data(), va, nullptr);
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(ta.Ready()) << "A is a push ahead of B with s=0: its reply must be held";
  ASSERT_TRUE(b->PushDense("d", g.data(), vb, nullptr).Wait().ok());
  EXPECT_TRUE(ta.Wait().ok());
  server->Stop();
}

// Regression: a client that only pulls a block-mode table (a reader) stayed live at the
// clock of its first pull: every push reply past s was held until block_timeout_ms, for
// as long as the reader went on pulling. A reader is waited for during its first lease.
TEST_P(ShardServerClientTest, BlockModeDoesNotHoldPushersForAClientThatOnlyPulls) {
  std::string endpoint;
  ShardServerOptions o;
  o.listen = ListenEndpoint(GetParam(), "block-reader");
  auto server = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(server, nullptr);
  auto reader = ConnectClient({endpoint}), pusher = ConnectClient({endpoint});
  ASSERT_NE(reader, nullptr);
  ASSERT_NE(pusher, nullptr);
  TableSpec spec = DenseSpec();
  spec.max_staleness = 0;
  spec.bound_mode = BoundMode::kBlock;
  spec.block_timeout_ms = 300;
  ASSERT_TRUE(pusher->CreateTable(spec).ok());
  std::atomic<bool> stop{false};
  std::thread reading([&] {
    std::vector<float> w(6);
    while (!stop) {
      EXPECT_TRUE(reader->PullDense("d", w.data(), nullptr).Wait().ok());
      std::this_thread::sleep_for(50ms);
    }
  });
  std::this_thread::sleep_for(400ms);  // past the reader's first lease
  std::vector<float> w(6);
  VersionVector v;
  ASSERT_TRUE(pusher->PullDense("d", w.data(), &v).Wait().ok());
  const std::vector<float> g(6, 1.0f);
  const auto t0 = Clock::now();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pusher->PushDense("d", g.data(), v, nullptr).Wait().ok());
  const auto took = Clock::now() - t0;
  stop = true;
  reading.join();
  EXPECT_LT(took, 250ms) << "the pushes were held for a client that never pushes ("
                         << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                         << " ms for 3)";
  server->Stop();
}

TEST_P(ShardServerClientTest, HeldPushReplyIsNotReleasedByClientRetry) {
  std::string endpoint;
  ShardServerOptions o;
  o.listen = ListenEndpoint(GetParam(), "block-retry");
  auto server = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(server, nullptr);
  auto a = ConnectClient({endpoint}, 5000ms, /*attempt=*/150ms);
  auto b = ConnectClient({endpoint});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  TableSpec spec = DenseSpec();
  spec.max_staleness = 0;
  spec.bound_mode = BoundMode::kBlock;
  ASSERT_TRUE(a->CreateTable(spec).ok());
  std::vector<float> w(6);
  VersionVector va, vb;
  ASSERT_TRUE(a->PullDense("d", w.data(), &va).Wait().ok());
  ASSERT_TRUE(b->PullDense("d", w.data(), &vb).Wait().ok());
  const std::vector<float> g = {1, 1, 1, 1, 1, 1};
  PushReply ra;
  Ticket ta = a->PushDense("d", g.data(), va, &ra);
  std::this_thread::sleep_for(600ms);  // several attempt timeouts, far below the 10 s hold
  EXPECT_FALSE(ta.Ready()) << "A's held push completed (duplicate=" << ra.duplicate
                           << ") before the slow sender pushed";
  ASSERT_TRUE(b->PushDense("d", g.data(), vb, nullptr).Wait().ok());
  EXPECT_TRUE(ta.Wait().ok());
  server->Stop();
}

TEST_P(ShardServerClientTest, StopReleasesHeldReplies) {
  std::string endpoint;
  ShardServerOptions o;
  o.listen = ListenEndpoint(GetParam(), "block-stop");
  auto server = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(server, nullptr);
  auto a = ConnectClient({endpoint}), b = ConnectClient({endpoint});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  TableSpec spec = DenseSpec();
  spec.max_staleness = 0;
  spec.bound_mode = BoundMode::kBlock;
  ASSERT_TRUE(a->CreateTable(spec).ok());
  std::vector<float> w(6);
  VersionVector va;
  ASSERT_TRUE(a->PullDense("d", w.data(), &va).Wait().ok());
  ASSERT_TRUE(b->PullDense("d", w.data(), nullptr).Wait().ok());
  const std::vector<float> g(6, 1.0f);
  Ticket ta = a->PushDense("d", g.data(), va, nullptr);
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(ta.Ready());
  const auto t0 = Clock::now();
  server->Stop();
  EXPECT_TRUE(ta.Wait().ok());
  EXPECT_LE(Clock::now() - t0, 900ms);  // released by Stop, not by a client retry
}

TEST_P(ShardServerClientTest, ConcurrentClientsSumExactlyAndMetricsCountPushes) {
  constexpr int kThreads = 4, kPushes = 200, kKeys = 16;
  constexpr uint32_t kShards = 2;
  std::vector<std::shared_ptr<prometheus::Registry>> registries;
  std::vector<std::unique_ptr<ShardServer>> servers;
  std::vector<std::string> endpoints;
  for (uint32_t s = 0; s < kShards; ++s) {
    ShardServerOptions o;
    o.shard = s;
    o.num_shards = kShards;
    o.listen = ListenEndpoint(GetParam(), "concurrent");
    registries.push_back(std::make_shared<prometheus::Registry>());
    std::string ep;
    servers.push_back(StartServer(o, registries.back(), &ep));
    ASSERT_NE(servers.back(), nullptr);
    endpoints.push_back(ep);
  }
  TableSpec spec = SparseSpec();
  spec.name = "c";
  {
    auto setup = ConnectClient(endpoints);
    ASSERT_NE(setup, nullptr);
    ASSERT_TRUE(setup->CreateTable(spec).ok());
  }
  auto keys_of = [](int t, int i) {
    std::vector<uint64_t> keys;
    for (int j = 0; j < 3; ++j) keys.push_back(1000 + (t * 7 + i * 3 + j * 5) % kKeys);
    return keys;
  };
  auto grad_of = [](int t, int i) {
    std::vector<float> g;
    for (int j = 0; j < 3; ++j) {
      for (int c = 0; c < 2; ++c) g.push_back(static_cast<float>((t + i * 3 + j + c) % 5 - 2));
    }
    return g;
  };
  std::vector<std::vector<uint64_t>> taus(kThreads);
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      auto client = ConnectClient(endpoints, 10000ms);
      if (client == nullptr) return void(failures++);
      std::vector<float> scratch(6);
      for (int i = 0; i < kPushes; ++i) {
        const auto keys = keys_of(t, i);
        const auto g = grad_of(t, i);
        VersionVector base;
        PushReply reply;
        if (!client->PullSparse("c", keys.data(), 3, scratch.data(), &base).Wait().ok() ||
            !client->PushSparse("c", keys.data(), 3, g.data(), base, &reply).Wait().ok()) {
          failures++;
          return;
        }
        for (uint32_t s = 0; s < kShards; ++s) {
          if (reply.versions[s] != 0) taus[t].push_back(reply.taus[s]);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_EQ(failures.load(), 0);

  // Expected: the exact negative sum of every gradient (integers are exact in float).
  std::map<uint64_t, std::array<int64_t, 2>> want;
  std::vector<int64_t> pushes_per_shard(kShards, 0);
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < kPushes; ++i) {
      const auto keys = keys_of(t, i);
      const auto g = grad_of(t, i);
      std::set<uint32_t> touched;
      for (int j = 0; j < 3; ++j) {
        for (int c = 0; c < 2; ++c) want[keys[j]][c] -= static_cast<int64_t>(g[j * 2 + c]);
        touched.insert(ShardOfKey(keys[j], kShards));
      }
      for (uint32_t s : touched) pushes_per_shard[s]++;
    }
  }
  auto reader = ConnectClient(endpoints);
  ASSERT_NE(reader, nullptr);
  std::vector<uint64_t> all;
  for (const auto& [k, v] : want) all.push_back(k);
  std::vector<float> got(all.size() * 2);
  ASSERT_TRUE(reader->PullSparse("c", all.data(), all.size(), got.data(), nullptr).Wait().ok());
  for (size_t i = 0; i < all.size(); ++i) {
    for (int c = 0; c < 2; ++c) {
      EXPECT_EQ(got[i * 2 + c], static_cast<float>(want[all[i]][c])) << "key " << all[i];
    }
  }

  // Staleness: never beyond the number of pushes, and concurrency makes some push stale.
  uint64_t max_tau = 0, replies = 0;
  for (const auto& ts : taus) {
    for (uint64_t tau : ts) {
      EXPECT_LE(tau, static_cast<uint64_t>(kThreads * kPushes));
      max_tau = std::max(max_tau, tau);
      ++replies;
    }
  }
  EXPECT_EQ(replies, static_cast<uint64_t>(pushes_per_shard[0] + pushes_per_shard[1]));
  EXPECT_GT(max_tau, 0u);
  for (uint32_t s = 0; s < kShards; ++s) {
    EXPECT_EQ(MetricValue(*registries[s], "onlineps_ps_push_staleness_count"),
              static_cast<double>(pushes_per_shard[s]))
        << "shard " << s;
  }
  for (auto& server : servers) server->Stop();
}

// Sparse table "big" (dim 32) of kBigBatches x kBigBatch = 1M rows, each 0.5 (sender 3,
// seqs 1..kBigBatches): about 150 MB serialized, a snapshot or checkpoint of a second or
// more here.
constexpr size_t kBigBatch = 1 << 16;
constexpr uint64_t kBigBatches = 16;
void FillBigTable(RawClient* client) {
  TableSpec spec = SparseSpec();
  spec.name = "big";
  spec.dim = 32;
  Header create = Request(Op::kCreateTable, spec.name);
  create.spec = EncodeSpec(spec);
  auto created = client->Call({HeaderFrame(create)});
  ASSERT_TRUE(created.has_value());
  ASSERT_EQ(created->first.code, StatusCode::kOk) << created->first.message;
  for (uint64_t b = 0; b < kBigBatches; ++b) {
    std::vector<uint64_t> keys(kBigBatch);
    for (size_t i = 0; i < kBigBatch; ++i) keys[i] = b * kBigBatch + i + 1;
    auto r =
        client->Call({HeaderFrame(PushHeader(Op::kPushSparse, "big", 3, b + 1)),
                      Keys(std::move(keys)), Floats(std::vector<float>(kBigBatch * 32, 0.5f))});
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  }
}

// A primary's snapshot for a re-syncing backup held every update of the shard while it
// serialized the whole shard (seconds on a large one: every client's pushes waited). It
// is now cut in O(stripes) and serialized while pushes go on, and still holds exactly
// the state at its cut: rows the pushes change after the cut are written as they were.
TEST(ShardServerSnapshotTest, AReplicaSnapshotIsSerializedWhilePushesGoOn) {
  ShardServerOptions o;
  o.listen = ListenEndpoint("mem", "snapshot-while-pushing");
  o.checkpoint_interval_s = 0;
  std::string endpoint;
  auto server = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(server, nullptr);
  RawClient client(endpoint);
  // A serialization long enough to push during it.
  ASSERT_NO_FATAL_FAILURE(FillBigTable(&client));
  constexpr size_t kBatch = kBigBatch;
  constexpr uint64_t kBatches = kBigBatches;
  // Every push adds 1 (lr 1, gradient -1) to 256 rows spread over the whole table, so
  // the writer meets rows changed both before and after the cut.
  std::vector<uint64_t> hot(256);
  for (size_t i = 0; i < hot.size(); ++i) hot[i] = 1 + i * (kBatch * kBatches / hot.size()) + 7;
  std::atomic<bool> snapshot_running{false}, snapshot_done{false};
  std::atomic<int> pushes_during{0};
  std::thread pusher([&] {
    for (uint64_t seq = 1; !snapshot_done; ++seq) {
      const bool running_before = snapshot_running;
      auto r = client.Call({HeaderFrame(PushHeader(Op::kPushSparse, "big", 4, seq)), Keys(hot),
                            Floats(std::vector<float>(hot.size() * 32, -1.0f))});
      ASSERT_TRUE(r.has_value());
      ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
      if (running_before && !snapshot_done) ++pushes_during;
    }
  });
  std::this_thread::sleep_for(20ms);  // the pusher is under way
  snapshot_running = true;
  const auto t0 = Clock::now();
  StatusOr<std::string> bytes = ShardServerTestPeer::Snapshot(server.get());
  const double snapshot_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  snapshot_done = true;
  pusher.join();
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  std::printf("snapshot %.1f ms, %d pushes completed during it\n", snapshot_ms,
              pushes_during.load());
  // Before, no push started after the snapshot began could complete until it ended.
  EXPECT_GE(pushes_during.load(), 10)
      << "pushes waited for the whole snapshot (" << snapshot_ms << " ms)";

  // The snapshot is the state at one instant: every hot row moved by the same count of
  // pushes, the table's version counts exactly those, and the other rows are as pushed.
  Dedup dedup;
  auto loaded = ParseShard(*bytes, "snapshot", {0, 1}, &dedup);
  ASSERT_TRUE(loaded.ok()) << loaded.status().ToString();
  std::shared_ptr<Table> big = loaded->at("big");
  const uint64_t version = big->Stats().version;
  ASSERT_GE(version, kBatches);
  const float expected_hot = -0.5f + static_cast<float>(version - kBatches);
  for (uint64_t k : {hot[0], hot[100], hot[255], uint64_t{2}, kBatch * kBatches}) {
    PullRequest pull;
    pull.keys = &k;
    pull.num_keys = 1;
    auto got = big->Pull(pull);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->values.size(), 32u);
    const bool is_hot = std::find(hot.begin(), hot.end(), k) != hot.end();
    EXPECT_FLOAT_EQ(got->values[0], is_hot ? expected_hot : -0.5f) << "key " << k;
    EXPECT_FLOAT_EQ(got->values[31], is_hot ? expected_hot : -0.5f) << "key " << k;
  }
  server->Stop();
}

// A shard on an in-process endpoint named `name` that checkpoints (on request only) to
// a temporary directory, removed with it.
struct CheckpointingServer {
  explicit CheckpointingServer(const std::string& name)
      : dir((std::filesystem::temp_directory_path() / "onlineps-ckpt-XXXXXX").string()) {
    if (::mkdtemp(dir.data()) == nullptr) return;
    ShardServerOptions o;
    o.listen = ListenEndpoint("mem", name);
    o.checkpoint_dir = dir;
    o.checkpoint_interval_s = 0;
    server = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  }
  ~CheckpointingServer() {
    if (server != nullptr) server->Stop();
    std::filesystem::remove_all(dir);
  }
  std::string dir;
  std::string endpoint;
  std::unique_ptr<ShardServer> server;  // null if the directory or the start failed
};

// A replica's snapshot must leave the checkpoint chain whole: the rows changed before it
// belong in the next delta checkpoint (a snapshot that started a new change set, as a
// checkpoint's does, would leave them out of every file).
TEST(ShardServerSnapshotTest, AReplicaSnapshotLeavesTheNextDeltaCheckpointWhole) {
  CheckpointingServer s("snapshot-then-delta");
  ASSERT_NE(s.server, nullptr);
  ShardServer* server = s.server.get();
  RawClient client(s.endpoint);
  TableSpec spec = SparseSpec();
  Header create = Request(Op::kCreateTable, spec.name);
  create.spec = EncodeSpec(spec);
  auto created = client.Call({HeaderFrame(create)});
  ASSERT_TRUE(created.has_value());
  uint64_t seq = 0;
  auto push = [&](uint64_t first, size_t n) {
    std::vector<uint64_t> keys(n);
    for (size_t i = 0; i < n; ++i) keys[i] = first + i;
    auto r = client.Call({HeaderFrame(PushHeader(Op::kPushSparse, spec.name, 5, ++seq)),
                          Keys(std::move(keys)), Floats(std::vector<float>(n * 2, -1.0f))});
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  };
  push(1, 1000);
  auto full = server->Checkpoint();
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  push(5000, 10);  // before the replica's snapshot
  ASSERT_TRUE(ShardServerTestPeer::Snapshot(server).ok());
  push(6000, 10);  // after it
  auto delta = server->Checkpoint();
  ASSERT_TRUE(delta.ok()) << delta.status().ToString();
  EXPECT_NE(*delta, *full) << "expected a delta checkpoint (20 of 1020 rows changed)";
  server->Stop();
  Dedup dedup;
  auto restored = RestoreCheckpoint(*full, {0, 1}, &dedup);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  std::shared_ptr<Table> t = restored->tables.at(spec.name);
  EXPECT_EQ(t->Stats().rows, 1020u) << "rows pushed before the replica's snapshot were lost";
  for (uint64_t k : {uint64_t{5000}, uint64_t{5009}, uint64_t{6000}}) {
    PullRequest pull;
    pull.keys = &k;
    pull.num_keys = 1;
    auto got = t->Pull(pull);
    ASSERT_TRUE(got.ok());
    EXPECT_FLOAT_EQ(got->values[0], 1.0f) << "key " << k;
  }
}

// A replica that re-syncs from its primary (loads its snapshot) while it writes a
// checkpoint replaces the tables the writer is reading: they were destroyed under it
// (a crash, use after free). The snapshot being written keeps its tables alive.
TEST(ShardServerSnapshotTest, ASnapshotLoadedDuringACheckpointWriteLeavesTheWriterItsTables) {
  CheckpointingServer s("load-during-ckpt");
  ASSERT_NE(s.server, nullptr);
  ShardServer* server = s.server.get();
  RawClient client(s.endpoint);
  // A checkpoint write long enough to load a snapshot while it runs.
  ASSERT_NO_FATAL_FAILURE(FillBigTable(&client));
  std::weak_ptr<Table> old = server->FindTable("big");
  std::atomic<bool> writing{true};
  std::thread ckpt([&] {
    auto st = server->Checkpoint();
    EXPECT_TRUE(st.ok()) << st.status().ToString();
    writing = false;
  });
  const std::string tmp = s.dir + "/shard-0-of-1.ckpt.tmp";
  while (!std::filesystem::exists(tmp) && writing) std::this_thread::yield();
  // The primary's snapshot: no tables at all.
  ASSERT_TRUE(ShardServerTestPeer::LoadSnapshot(server, SerializeShard({0, 1}, {}, Dedup())).ok());
  const bool still_writing = writing.load();
  EXPECT_EQ(server->FindTable("big"), nullptr);
  if (still_writing) {
    EXPECT_FALSE(old.expired()) << "the table being written was destroyed";
  }
  ckpt.join();
  EXPECT_TRUE(old.expired()) << "the written snapshot still holds the replaced table";
  if (!still_writing) std::printf("the write ended before the load: the race was not hit\n");
}

TEST(ShardServerLateStartTest, PushQueuedBeforeServerStartsIsAppliedOnce) {
  const int port = FreeTcpPort();
  ASSERT_GT(port, 0);
  std::string dir = (std::filesystem::temp_directory_path() / "onlineps-late-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  ShardServerOptions o;
  o.listen = "tcp://127.0.0.1:" + std::to_string(port);
  o.checkpoint_dir = dir;  // carries the table over to the server started later
  std::string endpoint;
  auto first = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(first, nullptr);
  // Short attempts: the push is resent several times while no server is there.
  auto client = ConnectClient({o.listen}, 10000ms, 100ms);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateTable(SparseSpec()).ok());
  first->Stop();
  first.reset();

  const std::vector<uint64_t> keys = {5, 6};
  const std::vector<float> g = {1, 2, 3, 4};
  PushReply reply;
  Ticket push = client->PushSparse("s", keys.data(), 2, g.data(), {}, &reply);
  std::this_thread::sleep_for(400ms);
  EXPECT_FALSE(push.Ready());
  auto second = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(second, nullptr);
  Status st = push.Wait();
  EXPECT_TRUE(st.ok()) << st.ToString();
  std::vector<float> out(4);
  ASSERT_TRUE(client->PullSparse("s", keys.data(), 2, out.data(), nullptr).Wait().ok());
  EXPECT_EQ(out, (std::vector<float>{-1, -2, -3, -4}));  // applied once, lr 1
  client.reset();
  second->Stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

TEST(ShardServerLateStartTest, TimedOutPushIsNotSentLaterFromReusedBuffer) {
  const int port = FreeTcpPort();
  ASSERT_GT(port, 0);
  std::string dir = (std::filesystem::temp_directory_path() / "onlineps-late-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  ShardServerOptions o;
  o.listen = "tcp://127.0.0.1:" + std::to_string(port);
  o.checkpoint_dir = dir;
  std::string endpoint;
  auto first = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(first, nullptr);
  auto client = ConnectClient({o.listen}, /*timeout=*/300ms, /*attempt=*/100ms);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateTable(SparseSpec()).ok());
  first->Stop();
  first.reset();

  std::vector<uint64_t> keys = {5, 6};
  std::vector<float> g = {1, 2, 3, 4};
  Status st = client->PushSparse("s", keys.data(), 2, g.data(), {}, nullptr).Wait();
  ASSERT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  // The call is over: the caller may reuse its buffers (REQUIRES ends at completion).
  g = {100, 200, 300, 400};
  auto second = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(second, nullptr);
  std::this_thread::sleep_for(500ms);  // let any queued attempt reach the new server
  std::vector<float> out(4);
  ASSERT_TRUE(client->PullSparse("s", keys.data(), 2, out.data(), nullptr).Wait().ok());
  // Not applied (0), or applied with the values of the call (-g): never the reused buffer.
  EXPECT_TRUE(out == std::vector<float>(4, 0.0f) || out == std::vector<float>({-1, -2, -3, -4}))
      << "applied " << out[0] << ", " << out[1] << ", " << out[2] << ", " << out[3];
  client.reset();
  second->Stop();
  std::error_code ec;
  std::filesystem::remove_all(dir, ec);
}

// Two shards of one table set and a client of both; the shards stop when it goes.
struct TwoShards {
  std::unique_ptr<ShardServer> s0, s1;
  std::unique_ptr<PsClient> client;  // null when a shard did not start
  std::vector<std::string> endpoints;
  TwoShards() = default;
  TwoShards(TwoShards&&) = default;
  ~TwoShards() {
    client.reset();
    if (s0) s0->Stop();
    if (s1) s1->Stop();
  }
};

TwoShards StartTwoShards(const std::string& scheme, const std::string& prefix) {
  TwoShards two;
  std::string e0, e1;
  ShardServerOptions o;
  o.num_shards = 2;
  o.listen = ListenEndpoint(scheme, prefix + "0");
  two.s0 = StartServer(o, std::make_shared<prometheus::Registry>(), &e0);
  o.shard = 1;
  o.listen = ListenEndpoint(scheme, prefix + "1");
  two.s1 = StartServer(o, std::make_shared<prometheus::Registry>(), &e1);
  two.endpoints = {e0, e1};
  if (two.s0 != nullptr && two.s1 != nullptr) two.client = ConnectClient({e0, e1});
  return two;
}

TEST_P(ShardServerClientTest, PushRepliesCarryTheValuesTheyWroteWhenAsked) {
  TwoShards two = StartTwoShards(GetParam(), "retvals");
  ASSERT_NE(two.client, nullptr);
  PsClient* a = two.client.get();
  TableSpec dense = DenseSpec();
  dense.shape = {1000};  // spread over both shards in several slices
  ASSERT_TRUE(a->CreateTable(dense).ok());
  ASSERT_TRUE(a->CreateTable(SparseSpec()).ok());
  std::vector<float> g(1000);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 7);
  ASSERT_TRUE(a->PushDense("d", g.data(), {}, nullptr).Wait().ok());
  std::vector<float> updated(1000, 99.0f), pulled(1000);
  PushOptions opts;
  opts.updated = updated.data();
  PushReply reply;
  ASSERT_TRUE(a->PushDense("d", g.data(), {}, &reply, opts).Wait().ok());
  VersionVector versions;
  ASSERT_TRUE(a->PullDense("d", pulled.data(), &versions).Wait().ok());
  EXPECT_EQ(updated, pulled);
  EXPECT_EQ(reply.versions, versions);
  EXPECT_EQ(updated[13], -2.0f * (13 % 7));
  // Sparse: rows in the caller's key order, a repeated key included, across shards.
  const std::vector<uint64_t> keys = {5, 1, 2, 5};
  const std::vector<float> rows = {1, 1, 2, 2, 3, 3, 4, 4};
  std::vector<float> got(8, 99.0f), want(8);
  opts.updated = got.data();
  ASSERT_TRUE(a->PushSparse("s", keys.data(), 4, rows.data(), {}, nullptr, opts).Wait().ok());
  ASSERT_TRUE(a->PullSparse("s", keys.data(), 4, want.data(), nullptr).Wait().ok());
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], -5.0f) << "key 5 pushed twice: 1 + 4";
}

// A large pull goes out in parts (PsClientOptions::pull_part_bytes): every row lands where
// one whole pull puts it, on one shard and across two, repeated and unknown keys included.
TEST_P(ShardServerClientTest, PullInPartsReadsWhatOneWholePullReads) {
  TwoShards two = StartTwoShards(GetParam(), "parts");
  ASSERT_NE(two.client, nullptr);
  std::string e0, e1;
  ShardServerOptions o;
  o.listen = ListenEndpoint(GetParam(), "parts-one");
  auto one = StartServer(o, std::make_shared<prometheus::Registry>(), &e0);
  ASSERT_NE(one, nullptr);
  auto one_client = ConnectClient({e0});
  ASSERT_NE(one_client, nullptr);
  for (PsClient* c : {two.client.get(), one_client.get()}) {
    ASSERT_TRUE(c->CreateTable(SparseSpec()).ok());
    std::vector<uint64_t> keys;
    for (uint64_t k = 0; k < 500; ++k) keys.push_back(k * 7919 % 1000);  // repeats
    std::vector<float> g(keys.size() * 2);
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 13);
    ASSERT_TRUE(c->PushSparse("s", keys.data(), 300, g.data(), {}, nullptr).Wait().ok());
    ASSERT_TRUE(c->PushSparse("s", keys.data() + 100, 300, g.data(), {}, nullptr).Wait().ok());
    keys.push_back(123456789);  // never pushed: its initializer
    std::vector<float> whole(keys.size() * 2), parted(keys.size() * 2, 99.0f);
    VersionVector vw, vp;
    ASSERT_TRUE(c->PullSparse("s", keys.data(), keys.size(), whole.data(), &vw).Wait().ok());
    for (size_t part_bytes : {size_t{8}, size_t{100}, size_t{1000}}) {
      PsClientOptions po;
      po.shards = c == one_client.get() ? std::vector<std::string>{e0} : two.endpoints;
      po.pull_part_bytes = part_bytes;
      auto parts = PsClient::Connect(po);
      ASSERT_TRUE(parts.ok()) << parts.status().ToString();
      ASSERT_TRUE(
          (*parts)->PullSparse("s", keys.data(), keys.size(), parted.data(), &vp).Wait().ok());
      EXPECT_EQ(parted, whole) << part_bytes << " bytes a part, " << c->num_shards() << " shards";
      EXPECT_EQ(vp, vw) << part_bytes << " bytes a part, " << c->num_shards() << " shards";
    }
    EXPECT_NE(whole[2 * 100], 0.0f) << "a pushed row reads as pushed";
  }
  // Dense: 1.1 M floats, five slices of 220,000 (256 Ki at most), so a shard of two holds
  // two or three; pulled in 16 ranges a shard (the most), which cut across the slices.
  for (PsClient* c : {two.client.get(), one_client.get()}) {
    TableSpec dense = DenseSpec();
    dense.shape = {1100000};
    ASSERT_TRUE(c->CreateTable(dense).ok());
    std::vector<float> g(1100000);
    for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>(i % 17);
    ASSERT_TRUE(c->PushDense("d", g.data(), {}, nullptr).Wait().ok());
    ASSERT_TRUE(c->PushDense("d", g.data(), {}, nullptr).Wait().ok());
    std::vector<float> parted(g.size(), 99.0f);
    VersionVector vp;
    PsClientOptions po;
    po.shards = c == one_client.get() ? std::vector<std::string>{e0} : two.endpoints;
    po.pull_part_bytes = 1000;  // 250 floats a part, but at most 16 parts a shard
    auto parts = PsClient::Connect(po);
    ASSERT_TRUE(parts.ok()) << parts.status().ToString();
    ASSERT_TRUE((*parts)->PullDense("d", parted.data(), &vp).Wait().ok());
    for (size_t i = 0; i < g.size(); ++i) {
      ASSERT_EQ(parted[i], -2.0f * g[i]) << i << ", " << c->num_shards() << " shards";
    }
    EXPECT_EQ(vp, VersionVector(c->num_shards(), 2));
  }
}

TEST_P(ShardServerClientTest, PushDenseBatchMatchesOnePushPerTableAcrossShards) {
  TwoShards two = StartTwoShards(GetParam(), "batch");
  ASSERT_NE(two.client, nullptr);
  PsClient* a = two.client.get();
  // Three tables: spread over both shards in slices, one range each, and one too small
  // to reach the second shard. Each pushed twice in batches ("b/") and one by one ("p/").
  const std::vector<std::pair<std::string, uint64_t>> shapes = {
      {"big", 1000}, {"mid", 64}, {"tiny", 1}};
  for (const char* prefix : {"b/", "p/"}) {
    for (const auto& [name, n] : shapes) {
      TableSpec spec = DenseSpec();
      spec.name = prefix + name;
      spec.shape = {n};
      ASSERT_TRUE(a->CreateTable(spec).ok());
    }
  }
  auto grad = [](uint64_t n, int round) {
    std::vector<float> g(n);
    for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i * 3 + round) % 11);
    return g;
  };
  for (int round = 0; round < 2; ++round) {
    std::vector<DensePush> batch;
    std::vector<PushReply> replies(shapes.size());
    std::vector<std::vector<float>> updated;
    for (const auto& [name, n] : shapes) updated.emplace_back(n, 99.0f);
    for (size_t t = 0; t < shapes.size(); ++t) {
      DensePush p;
      p.table = "b/" + shapes[t].first;
      p.values = Frame::FromVector(grad(shapes[t].second, round));
      p.reply = &replies[t];
      p.opts.updated = updated[t].data();
      batch.push_back(std::move(p));
      const auto g = grad(shapes[t].second, round);
      ASSERT_TRUE(a->PushDense("p/" + shapes[t].first, g.data(), {}, nullptr).Wait().ok());
    }
    Status st = a->PushDenseBatch(std::move(batch)).Wait();
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (size_t t = 0; t < shapes.size(); ++t) {
      const uint64_t n = shapes[t].second;
      std::vector<float> b(n), p(n);
      VersionVector vb, vp;
      ASSERT_TRUE(a->PullDense("b/" + shapes[t].first, b.data(), &vb).Wait().ok());
      ASSERT_TRUE(a->PullDense("p/" + shapes[t].first, p.data(), &vp).Wait().ok());
      EXPECT_EQ(b, p) << shapes[t].first;
      EXPECT_EQ(vb, vp) << shapes[t].first;
      EXPECT_EQ(replies[t].versions, vb) << shapes[t].first;
      EXPECT_EQ(updated[t], b) << shapes[t].first << ": the reply's values are the pull's";
      EXPECT_EQ(replies[t].max_version, static_cast<uint64_t>(round + 1));
    }
  }
  // A bad table fails the call before anything is sent, naming it.
  std::vector<DensePush> bad(2);
  bad[0].table = "b/big";
  bad[0].values = Frame::FromVector(grad(1000, 0));
  bad[1].table = "b/mid";
  bad[1].values = Frame::FromVector(grad(63, 0));
  Status st = a->PushDenseBatch(std::move(bad)).Wait();
  EXPECT_EQ(st.code(), StatusCode::kShapeMismatch) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("b/mid"));
  std::vector<float> w(1000);
  VersionVector v;
  ASSERT_TRUE(a->PullDense("b/big", w.data(), &v).Wait().ok());
  EXPECT_EQ(v, (VersionVector{2, 2})) << "nothing of the refused batch was applied";
}

// Sparse tables in a batch: each shard gets one push_batch with the dense slices and the
// rows it owns; every table ends as one push per table leaves it, with the same versions,
// and the values the replies carry are what a pull reads.
TEST_P(ShardServerClientTest, PushBatchWithSparseTablesMatchesOnePushPerTable) {
  TwoShards two = StartTwoShards(GetParam(), "sbatch");
  ASSERT_NE(two.client, nullptr);
  PsClient* a = two.client.get();
  for (const char* prefix : {"b/", "p/"}) {
    TableSpec d = DenseSpec();
    d.name = std::string(prefix) + "d";
    d.shape = {1000};
    ASSERT_TRUE(a->CreateTable(d).ok());
    for (const char* name : {"s", "one"}) {
      TableSpec sp = SparseSpec();
      sp.name = std::string(prefix) + name;
      ASSERT_TRUE(a->CreateTable(sp).ok());
    }
  }
  // "one" gets a single key: its rows live on one shard only.
  const std::vector<uint64_t> keys = {5, 1, 2, 5, 77, 1000003}, one = {42};
  for (int round = 0; round < 2; ++round) {
    std::vector<float> dg(1000), sg(keys.size() * 2), og = {1.5f, -2.0f};
    for (size_t i = 0; i < dg.size(); ++i) dg[i] = static_cast<float>((i + round) % 7);
    for (size_t i = 0; i < sg.size(); ++i) sg[i] = static_cast<float>((i * 3 + round) % 5);
    std::vector<PushReply> replies(3);
    std::vector<float> dense_after(1000, 99.0f), sparse_after(sg.size(), 99.0f);
    std::vector<DensePush> dense(1);
    dense[0].table = "b/d";
    dense[0].values = Frame::FromVector(dg);
    dense[0].reply = &replies[0];
    dense[0].opts.updated = dense_after.data();
    std::vector<SparsePush> sparse(2);
    sparse[0].table = "b/s";
    sparse[0].keys = keys;
    sparse[0].values = sg;
    sparse[0].reply = &replies[1];
    sparse[0].opts.updated = sparse_after.data();
    sparse[1].table = "b/one";
    sparse[1].keys = one;
    sparse[1].values = og;
    sparse[1].reply = &replies[2];
    Status st = a->PushBatch(std::move(dense), std::move(sparse)).Wait();
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(a->PushDense("p/d", dg.data(), {}, nullptr).Wait().ok());
    ASSERT_TRUE(a->PushSparse("p/s", keys.data(), keys.size(), sg.data(), {}, nullptr).Wait().ok());
    ASSERT_TRUE(a->PushSparse("p/one", one.data(), 1, og.data(), {}, nullptr).Wait().ok());
    std::vector<float> b(1000), p(1000);
    VersionVector vb, vp;
    ASSERT_TRUE(a->PullDense("b/d", b.data(), &vb).Wait().ok());
    ASSERT_TRUE(a->PullDense("p/d", p.data(), &vp).Wait().ok());
    EXPECT_EQ(b, p);
    EXPECT_EQ(vb, vp);
    EXPECT_EQ(replies[0].versions, vb);
    EXPECT_EQ(dense_after, b) << "the reply's values are the pull's";
    std::vector<float> bs(sg.size()), ps_(sg.size()), bo(2), po(2);
    ASSERT_TRUE(a->PullSparse("b/s", keys.data(), keys.size(), bs.data(), &vb).Wait().ok());
    ASSERT_TRUE(a->PullSparse("p/s", keys.data(), keys.size(), ps_.data(), &vp).Wait().ok());
    EXPECT_EQ(bs, ps_);
    EXPECT_EQ(vb, vp);
    EXPECT_EQ(replies[1].versions, vb);
    EXPECT_EQ(sparse_after, bs);
    EXPECT_EQ(replies[1].max_version, static_cast<uint64_t>(round + 1));
    ASSERT_TRUE(a->PullSparse("b/one", one.data(), 1, bo.data(), &vb).Wait().ok());
    ASSERT_TRUE(a->PullSparse("p/one", one.data(), 1, po.data(), &vp).Wait().ok());
    EXPECT_EQ(bo, po);
    EXPECT_EQ(vb, vp) << "the shard that owns no row of 'one' got no push of it";
    EXPECT_EQ(replies[2].max_version, static_cast<uint64_t>(round + 1));
  }
  // A sparse push whose values do not make rows fails the call before anything is sent.
  std::vector<SparsePush> bad(1);
  bad[0].table = "b/s";
  bad[0].keys = {1, 2};
  bad[0].values = {1, 2, 3};
  std::vector<DensePush> d(1);
  d[0].table = "b/d";
  d[0].values = Frame::FromVector(std::vector<float>(1000, 1.0f));
  Status st = a->PushBatch(std::move(d), std::move(bad)).Wait();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("b/s"));
  std::vector<float> w(1000);
  VersionVector v;
  ASSERT_TRUE(a->PullDense("b/d", w.data(), &v).Wait().ok());
  EXPECT_EQ(v, (VersionVector{2, 2})) << "nothing of the refused batch was applied";
}

TEST_P(ShardServerClientTest, WatchThroughTheClientReportsVersionsAndKeys) {
  std::string endpoint;
  ShardServerOptions o;
  o.listen = ListenEndpoint(GetParam(), "watch");
  auto server = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(server, nullptr);
  auto a = ConnectClient({endpoint}), b = ConnectClient({endpoint});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(a->CreateTable(DenseSpec()).ok());
  ASSERT_TRUE(a->CreateTable(SparseSpec()).ok());
  WatchReply first;
  ASSERT_TRUE(b->Watch(0, {{"d", 0}, {"s", 0}}, 200ms, &first).Wait().ok());  // quiet
  EXPECT_EQ(first.versions, (std::map<std::string, uint64_t>{{"d", 0}, {"s", 0}}));
  WatchReply next;
  Ticket t = b->Watch(0, first.versions, 5000ms, &next);
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(t.Ready());
  const std::vector<uint64_t> keys = {3, 5};
  const std::vector<float> g = {1, 1, 1, 1};
  ASSERT_TRUE(a->PushSparse("s", keys.data(), 2, g.data(), {}, nullptr).Wait().ok());
  ASSERT_TRUE(t.Wait().ok());
  EXPECT_EQ(next.versions["s"], 1u);
  EXPECT_EQ(next.keys["s"], keys);
  EXPECT_TRUE(next.all_keys.empty());
  // A watch waits longer than the client's attempt timeout without being resent.
  auto c = ConnectClient({endpoint}, 5000ms, /*attempt=*/100ms);
  ASSERT_NE(c, nullptr);
  const auto t0 = Clock::now();
  WatchReply quiet;
  ASSERT_TRUE(c->Watch(0, next.versions, 400ms, &quiet).Wait().ok());
  EXPECT_GE(Clock::now() - t0, 390ms);
  EXPECT_EQ(quiet.versions, next.versions);
  server->Stop();
}

// Regression: a watch named at most 1,024 tables, and a worker names every table it
// holds of the shard in one watch: past 1,024 tables its watch was refused
// INVALID_ARGUMENT, and no notice came for any table (copies fresh by age bounds only).
// A watch may now name every table the shard holds; what held watches name in all stays
// bounded as before (max_watches x 1,024).
TEST_P(ShardServerClientTest, AWatchOfMoreThan1024TablesGetsNoticesOfEach) {
  std::string endpoint;
  ShardServerOptions o;
  o.listen = ListenEndpoint(GetParam(), "watch-many");
  o.max_watches = 2;  // held watches name at most 2 x 1,024 tables in all
  auto server = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(server, nullptr);
  auto a = ConnectClient({endpoint}), b = ConnectClient({endpoint});
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  constexpr int kTables = 1100;
  std::map<std::string, uint64_t> known;
  for (int i = 0; i < kTables; ++i) {
    TableSpec spec = SparseSpec();
    spec.name = "s" + std::to_string(i);
    ASSERT_TRUE(a->CreateTable(spec).ok()) << spec.name;
    known[spec.name] = 0;
  }
  WatchReply got;
  Ticket t = b->Watch(0, known, 5000ms, &got);
  std::this_thread::sleep_for(100ms);
  ASSERT_FALSE(t.Ready()) << "the watch was answered at once: " << t.Wait().ToString();
  // A second watch of them all would take held names past 2 x 1,024.
  WatchReply refused;
  Status st = a->Watch(0, known, 5000ms, &refused).Wait();
  EXPECT_EQ(st.code(), StatusCode::kResourceExhausted) << st.ToString();
  EXPECT_THAT(st.message(), HasSubstr("tables"));
  const std::vector<uint64_t> keys = {3, 5};
  const std::vector<float> g = {1, 1, 1, 1};
  ASSERT_TRUE(a->PushSparse("s1050", keys.data(), 2, g.data(), {}, nullptr).Wait().ok());
  ASSERT_TRUE(t.Wait().ok()) << t.Wait().ToString();
  EXPECT_EQ(got.versions.size(), static_cast<size_t>(kTables));
  EXPECT_EQ(got.versions["s1050"], 1u);
  EXPECT_EQ(got.keys["s1050"], keys);
  // Answered: its names no longer count, and a new watch of them all is held again.
  Ticket again = a->Watch(0, got.versions, 200ms, &refused);
  EXPECT_TRUE(again.Wait().ok()) << again.Wait().ToString();
  server->Stop();
}

INSTANTIATE_TEST_SUITE_P(Transports, ShardServerClientTest, ::testing::Values("mem", "tcp"),
                         [](const auto& info) { return info.param; });

// What an operator alerts on: checkpoint age (a timestamp and the interval), checkpoint
// failures (a series at 0 from the start), and clipped pushes as a counter by table.
TEST(ShardServerMetricsTest, CheckpointAgeFailuresAndClippedPushes) {
  std::string dir = (std::filesystem::temp_directory_path() / "onlineps-ckmetrics-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  auto registry = std::make_shared<prometheus::Registry>();
  ShardServerOptions o;
  o.listen = "mem://shard-metrics-test";
  o.checkpoint_dir = dir;
  o.checkpoint_interval_s = 3600;
  o.maintenance_interval_ms = 20;
  std::string endpoint;
  const double started = static_cast<double>(std::time(nullptr));
  auto server = StartServer(o, registry, &endpoint);
  ASSERT_NE(server, nullptr);
  auto gauge = [&](const char* name) { return MetricValue(*registry, name); };
  EXPECT_EQ(gauge("onlineps_ps_checkpoint_interval_seconds"), 3600);
  EXPECT_NEAR(gauge("onlineps_ps_last_checkpoint_success_timestamp_seconds"), started, 2);
  EXPECT_EQ(MetricValue(*registry, "onlineps_ps_checkpoints_total", {"result=\"error\""}), 0);
  EXPECT_EQ(MetricValue(*registry, "onlineps_ps_checkpoints_total", {"result=\"ok\""}), 0);

  auto client = ConnectClient({endpoint}, 5000ms, 1000ms);
  ASSERT_NE(client, nullptr);
  TableSpec clipped = DenseSpec();
  clipped.name = "c";
  clipped.clip_norm = 0.5;
  ASSERT_TRUE(client->CreateTable(clipped).ok());
  const std::vector<float> big = {10, 0, 0, 0, 0, 0}, small = {0.1f, 0, 0, 0, 0, 0};
  for (const auto* g : {&big, &small, &big}) {
    ASSERT_TRUE(client->PushDense("c", g->data(), {}, nullptr).Wait().ok());
  }
  // Copied by the maintenance thread about once a second.
  for (int i = 0;
       i < 300 && MetricValue(*registry, "onlineps_ps_clipped_pushes_total", {"table=\"c\""}) != 2;
       ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(MetricValue(*registry, "onlineps_ps_clipped_pushes_total", {"table=\"c\""}), 2);

  std::this_thread::sleep_for(1100ms);  // the timestamp has a resolution of a second or better
  StatusOr<std::string> ok = server->Checkpoint();
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_EQ(MetricValue(*registry, "onlineps_ps_checkpoints_total", {"result=\"ok\""}), 1);
  EXPECT_GE(gauge("onlineps_ps_last_checkpoint_success_timestamp_seconds"), started + 1);
  const double last_ok = gauge("onlineps_ps_last_checkpoint_success_timestamp_seconds");

  // The directory replaced by a file: the next checkpoint fails and is counted; the
  // timestamp keeps the last success.
  std::filesystem::remove_all(dir);
  { std::ofstream(dir) << "not a directory"; }
  EXPECT_FALSE(server->Checkpoint().ok());
  EXPECT_EQ(MetricValue(*registry, "onlineps_ps_checkpoints_total", {"result=\"error\""}), 1);
  EXPECT_EQ(gauge("onlineps_ps_last_checkpoint_success_timestamp_seconds"), last_ok);
  client.reset();
  std::filesystem::remove(dir);
  server->Stop();  // its final checkpoint fails too (logged)
}

// ------------------------------------------------------ memory budget

// A shard with a budget of 1 MiB of table state (--max-memory-mb).
class ShardServerMemoryBudgetTest : public ::testing::TestWithParam<std::string> {
 protected:
  static constexpr uint64_t kBudget = 1 << 20;

  void SetUp() override {
    registry_ = std::make_shared<prometheus::Registry>();
    ShardServerOptions o;
    o.listen = ListenEndpoint(GetParam(), "memory-budget-test");
    o.max_memory_bytes = kBudget;
    server_ = StartServer(o, registry_, &endpoint_);
    ASSERT_NE(server_, nullptr);
    raw_ = std::make_unique<RawClient>(endpoint_);
  }
  void TearDown() override {
    raw_.reset();
    if (server_) server_->Stop();
  }

  Header Create(const TableSpec& spec) {
    Header h = Request(Op::kCreateTable, spec.name);
    h.spec = EncodeSpec(spec);
    auto r = raw_->Call({HeaderFrame(h)});
    EXPECT_TRUE(r.has_value());
    return r ? r->first : Header{};
  }
  static TableSpec Sparse(const std::string& name, uint64_t max_rows = 0) {
    TableSpec s;
    s.name = name;
    s.kind = TableKind::kSparse;
    s.dim = 64;
    s.max_rows = max_rows;
    s.optimizer_params = {{"lr", 1.0}};
    return s;
  }
  // Keys [first, first + n), each pushed with gradient `g` everywhere.
  Header Push(const std::string& table, uint64_t first, size_t n, float g) {
    std::vector<uint64_t> keys(n);
    for (size_t i = 0; i < n; ++i) keys[i] = first + i;
    auto r = raw_->Call({HeaderFrame(PushHeader(Op::kPushSparse, table, 1, ++seq_)),
                         Keys(std::move(keys)), Floats(std::vector<float>(n * 64, g))});
    EXPECT_TRUE(r.has_value());
    return r ? r->first : Header{};
  }
  std::vector<float> Pull(const std::string& table, uint64_t first, size_t n) {
    std::vector<uint64_t> keys(n);
    for (size_t i = 0; i < n; ++i) keys[i] = first + i;
    auto r = raw_->Call({HeaderFrame(Request(Op::kPullSparse, table)), Keys(std::move(keys))});
    EXPECT_TRUE(r.has_value());
    if (!r || r->first.code != StatusCode::kOk || r->second.size() != 2) return {};
    const float* v = r->second[1].As<float>();
    return std::vector<float>(v, v + n * 64);
  }
  std::map<std::string, std::string> Info(const std::string& table) {
    auto r = raw_->Call({HeaderFrame(Request(Op::kTableInfo, table))});
    EXPECT_TRUE(r.has_value());
    return r ? r->first.spec : std::map<std::string, std::string>{};
  }

  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<ShardServer> server_;
  std::string endpoint_;
  std::unique_ptr<RawClient> raw_;
  uint64_t seq_ = 0;
};

TEST_P(ShardServerMemoryBudgetTest, APushCreatingRowsPastTheBudgetIsRefusedWhole) {
  ASSERT_EQ(Create(Sparse("grow")).code, StatusCode::kOk);
  ASSERT_EQ(Create(Sparse("capped", /*max_rows=*/8)).code, StatusCode::kOk);
  ASSERT_EQ(Push("capped", 1u << 30, 8, 1.0f).code, StatusCode::kOk);  // full: evicts from now
  // Always-new keys, 256 rows (~70 KB) a push: refused once the budget is reached.
  uint64_t next = 0;
  Header refused;
  for (int i = 0; i < 100 && refused.code == StatusCode::kOk; ++i, next += 256) {
    refused = Push("grow", next, 256, 1.0f);
  }
  ASSERT_EQ(refused.code, StatusCode::kResourceExhausted)
      << "no push refused after " << next << " new rows (" << Info("grow")["stat.memory_bytes"]
      << " bytes): the shard has no memory budget";
  EXPECT_THAT(refused.message, HasSubstr("table 'grow'"));
  EXPECT_THAT(refused.message, HasSubstr("memory budget of 1048576 bytes (--max-memory-mb)"));
  EXPECT_THAT(refused.message, HasSubstr("nothing of it was applied"));
  EXPECT_THAT(refused.message, HasSubstr("max_rows"));
  // Then one row a push, up to the last that fits.
  next -= 256;
  refused = {};
  for (int i = 0; i < 1000 && refused.code == StatusCode::kOk; ++i)
    refused = Push("grow", next++, 1, 1.0f);
  ASSERT_EQ(refused.code, StatusCode::kResourceExhausted) << refused.message;
  const uint64_t held = next - 1;  // the rows of the pushes accepted
  std::map<std::string, std::string> before = Info("grow");
  EXPECT_EQ(before["stat.rows"], std::to_string(held));
  EXPECT_LE(std::stoull(before["stat.memory_bytes"]), kBudget + 2 * 256 * 300)
      << "the pushes accepted stay about within the budget";

  // A push of existing rows and one new key is refused whole: the existing rows it
  // names are not changed either.
  const std::vector<float> old_rows = Pull("grow", 0, 4);
  ASSERT_EQ(old_rows.size(), 4u * 64);
  EXPECT_EQ(old_rows[0], -1.0f);
  std::vector<uint64_t> mixed = {0, 1, 2, 3, next + 1000};
  auto r = raw_->Call({HeaderFrame(PushHeader(Op::kPushSparse, "grow", 1, ++seq_)), Keys(mixed),
                       Floats(std::vector<float>(5 * 64, 5.0f))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.code, StatusCode::kResourceExhausted) << r->first.message;
  EXPECT_EQ(Pull("grow", 0, 4), old_rows);
  std::map<std::string, std::string> after = Info("grow");
  EXPECT_EQ(after["stat.rows"], before["stat.rows"]);
  EXPECT_EQ(after["stat.version"], before["stat.version"]);

  // Existing rows only: applied. Pulls go on. A capped table that is full evicts for
  // each new row and grows no more: its new rows go on too.
  Header ok = Push("grow", 0, 4, 1.0f);
  EXPECT_EQ(ok.code, StatusCode::kOk) << ok.message;
  EXPECT_EQ(Pull("grow", 0, 1)[0], -2.0f);
  ok = Push("capped", 1u << 31, 8, 1.0f);
  EXPECT_EQ(ok.code, StatusCode::kOk) << ok.message;
  EXPECT_EQ(Info("grow")["stat.rows"], std::to_string(held));

  EXPECT_GE(
      MetricValue(*registry_, "onlineps_ps_memory_budget_refusals_total", {"op=\"push_sparse\""}),
      2);
  EXPECT_EQ(MetricValue(*registry_, "onlineps_ps_memory_budget_bytes"), kBudget);
}

// Regression: the budget was checked, then the rows created, with nothing counted in
// between: pushes applied at once each saw the count without the others' rows and all
// passed, together past the budget. Each push now reserves its rows' bytes before it
// applies them.
TEST_P(ShardServerMemoryBudgetTest, ConcurrentPushesOfNewRowsDoNotTogetherPassTheBudget) {
  ShardServerOptions o;
  o.listen = ListenEndpoint(GetParam(), "memory-budget-race");
  o.max_memory_bytes = kBudget;
  o.handler_threads = 16;  // the pushes below wait in the apply at once, on their own threads
  std::string endpoint;
  auto server = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(server, nullptr);
  RawClient admin(endpoint);
  Header h = Request(Op::kCreateTable, "grow");
  h.spec = EncodeSpec(Sparse("grow"));
  auto created = admin.Call({HeaderFrame(h)});
  ASSERT_TRUE(created.has_value());
  ASSERT_EQ(created->first.code, StatusCode::kOk) << created->first.message;
  std::shared_ptr<Table> t = server->FindTable("grow");
  ASSERT_NE(t, nullptr);
  // Eight pushes of 1000 new rows (~280 KB each): three fit in 1 MiB, four do not. On 16
  // handler threads at least four of them wait at once (each thread takes a peer's).
  constexpr size_t kRows = 1000, kPushes = 8;
  ASSERT_LE(3 * kRows * t->BytesPerNewRow(), kBudget);
  ASSERT_GT(4 * kRows * t->BytesPerNewRow(), kBudget);
  std::vector<std::unique_ptr<RawClient>> pushers;
  TableTestPeer::Lock(t.get());  // every push waits to apply, as behind a long apply
  for (uint64_t p = 0; p < kPushes; ++p) {
    pushers.push_back(std::make_unique<RawClient>(endpoint));
    std::vector<uint64_t> keys(kRows);
    for (size_t i = 0; i < kRows; ++i) keys[i] = p * kRows + i;
    pushers.back()->Send({HeaderFrame(PushHeader(Op::kPushSparse, "grow", 100 + p, 1)),
                          Keys(std::move(keys)), Floats(std::vector<float>(kRows * 64, 1.0f))});
  }
  std::this_thread::sleep_for(300ms);  // every push reached its handler thread
  TableTestPeer::Unlock(t.get());
  int accepted = 0;
  for (auto& p : pushers) {
    auto r = p->Receive(10000ms);
    ASSERT_TRUE(r.has_value()) << "a push was never answered";
    if (r->first.code == StatusCode::kOk) {
      ++accepted;
    } else {
      EXPECT_EQ(r->first.code, StatusCode::kResourceExhausted) << r->first.message;
      EXPECT_THAT(r->first.message, HasSubstr("nothing of it was applied"));
    }
  }
  EXPECT_LE(accepted, 3) << accepted << " pushes of " << kRows
                         << " new rows were accepted, together past the budget";
  EXPECT_GE(accepted, 1);
  EXPECT_EQ(t->Stats().rows, uint64_t(accepted) * kRows) << "a refused push applied rows";
  server->Stop();
}

// Regression: with admit_after, a key pushed fewer times than that is an admission
// candidate (a touch count, not a row yet). Candidates were counted neither in
// stat.memory_bytes nor against the budget: up to 2^20 per table (~90 MB) went unseen,
// and always-new keys were never refused.
TEST_P(ShardServerMemoryBudgetTest, AdmissionCandidatesAreCountedAndBoundedByTheBudget) {
  TableSpec spec = Sparse("admit");
  spec.admit_after = 3;
  ASSERT_EQ(Create(spec).code, StatusCode::kOk);
  const uint64_t empty = std::stoull(Info("admit")["stat.memory_bytes"]);
  ASSERT_EQ(Push("admit", 0, 2000, 1.0f).code, StatusCode::kOk);
  std::map<std::string, std::string> info = Info("admit");
  EXPECT_EQ(info["stat.rows"], "0") << "a key pushed once is not a row yet";
  EXPECT_GE(std::stoull(info["stat.memory_bytes"]), empty + 2000 * 64)
      << "2000 admission candidates are not in stat.memory_bytes";
  // Always-new keys, each pushed once: candidates only, yet refused at the budget.
  uint64_t next = 2000;
  Header refused;
  for (int i = 0; i < 100 && refused.code == StatusCode::kOk; ++i, next += 2000) {
    refused = Push("admit", next, 2000, 1.0f);
  }
  ASSERT_EQ(refused.code, StatusCode::kResourceExhausted)
      << "no push refused after " << next << " candidates";
  EXPECT_THAT(refused.message, HasSubstr("nothing of it was applied"));
  info = Info("admit");
  EXPECT_EQ(info["stat.rows"], "0");
  EXPECT_LE(std::stoull(info["stat.memory_bytes"]), kBudget) << "candidates past the budget";
}

TEST_P(ShardServerMemoryBudgetTest, ATableTooLargeForTheBudgetIsNotCreated) {
  TableSpec big = DenseSpec();
  big.name = "big";
  big.shape = {1 << 20};  // 4 MiB of weights
  Header h = Create(big);
  ASSERT_EQ(h.code, StatusCode::kResourceExhausted) << h.message;
  EXPECT_THAT(h.message, HasSubstr("table 'big' would hold 4194304 bytes"));
  EXPECT_THAT(h.message, HasSubstr("memory budget of 1048576 bytes (--max-memory-mb)"));
  auto r = raw_->Call({HeaderFrame(Request(Op::kTableInfo, "big"))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.code, StatusCode::kNotFound);
  // At the 2^36-element cap: refused from its size, nothing allocated.
  big.name = "huge";
  big.shape = {uint64_t{1} << 36};
  big.optimizer = "adam";
  h = Create(big);
  EXPECT_EQ(h.code, StatusCode::kResourceExhausted) << h.message;
  EXPECT_THAT(h.message, HasSubstr("table 'huge' would hold 824633720832 bytes"));
  // One that fits is created and served; then the budget counts it.
  big.name = "small";
  big.shape = {163840};  // 640 KiB
  big.optimizer = "sgd";
  h = Create(big);
  ASSERT_EQ(h.code, StatusCode::kOk) << h.message;
  big.name = "small2";
  h = Create(big);
  EXPECT_EQ(h.code, StatusCode::kResourceExhausted) << h.message;
  EXPECT_THAT(h.message, HasSubstr("of which 655360 are in use"));
  r = raw_->Call({HeaderFrame(Request(Op::kPullDense, "small"))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  EXPECT_EQ(
      MetricValue(*registry_, "onlineps_ps_memory_budget_refusals_total", {"op=\"create_table\""}),
      3);
}

TEST_P(ShardServerMemoryBudgetTest, ABackupAppliesWhatItsPrimaryAcceptedPastTheBudget) {
  // The budget is enforced at the primary: a backup replaying its log (whose count may
  // differ a little) must not refuse an update the primary acknowledged.
  TableSpec big = DenseSpec();
  big.name = "big";
  big.shape = {1 << 20};
  Header h = Request(Op::kCreateTable, "big");
  h.spec = EncodeSpec(big);
  Status st = ShardServerTestPeer::ApplyReplicated(server_.get(), {HeaderFrame(h)});
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(Create(Sparse("grow")).code, StatusCode::kOk);
  std::vector<uint64_t> keys(4096);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
  st = ShardServerTestPeer::ApplyReplicated(
      server_.get(), {HeaderFrame(PushHeader(Op::kPushSparse, "grow", 2, 1)), Keys(keys),
                      Floats(std::vector<float>(keys.size() * 64, 1.0f))});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Info("grow")["stat.rows"], "4096");
  // A client's push of a new row is refused here (this shard is not a backup).
  EXPECT_EQ(Push("grow", 100000, 1, 1.0f).code, StatusCode::kResourceExhausted);
}

// A shard restored over its budget starts (its state is intact, and pulls and pushes to
// existing rows can be served) and says so: a warning naming the figures and the
// largest table, and the gauges the alert OnlinepsShardOverMemoryBudget compares.
TEST(ShardServerMemoryBudgetRestoreTest, ARestoreOverTheBudgetStartsWarnsAndRefusesNewRows) {
  const int port = FreeTcpPort();
  ASSERT_GT(port, 0);
  std::string dir = (std::filesystem::temp_directory_path() / "onlineps-over-XXXXXX").string();
  ASSERT_NE(::mkdtemp(dir.data()), nullptr);
  ShardServerOptions o;
  o.listen = "tcp://127.0.0.1:" + std::to_string(port);
  o.checkpoint_dir = dir;
  std::string endpoint;
  auto first = StartServer(o, std::make_shared<prometheus::Registry>(), &endpoint);
  ASSERT_NE(first, nullptr);
  {
    RawClient raw(endpoint);
    TableSpec spec = SparseSpec();
    spec.name = "big";
    spec.dim = 64;
    Header h = Request(Op::kCreateTable, "big");
    h.spec = EncodeSpec(spec);
    auto r = raw.Call({HeaderFrame(h)});
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->first.code, StatusCode::kOk);
    std::vector<uint64_t> keys(8000);  // ~2.2 MB of rows
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = i;
    r = raw.Call({HeaderFrame(PushHeader(Op::kPushSparse, "big", 1, 1)), Keys(keys),
                  Floats(std::vector<float>(keys.size() * 64, 1.0f))});
    ASSERT_TRUE(r.has_value());
    ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  }
  first->Stop();  // its final checkpoint holds the rows
  first.reset();

  std::ostringstream log;
  auto sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(log);
  spdlog::default_logger()->sinks().push_back(sink);
  o.max_memory_bytes = 1 << 20;
  auto registry = std::make_shared<prometheus::Registry>();
  auto second = StartServer(o, registry, &endpoint);
  ASSERT_NE(second, nullptr) << "a shard restored over its budget must still start";
  const uint64_t held = second->FindTable("big")->Stats().memory_bytes;
  EXPECT_THAT(log.str(), HasSubstr("the restored tables hold " + std::to_string(held) + " bytes"));
  EXPECT_THAT(log.str(), HasSubstr("over the memory budget of 1048576 bytes (1 MiB"));
  EXPECT_THAT(log.str(), HasSubstr("by " + std::to_string(held - (1 << 20)) + " bytes"));
  EXPECT_THAT(log.str(), HasSubstr("the largest is 'big'"));
  EXPECT_GT(MetricValue(*registry, "onlineps_ps_memory_used_bytes"),
            MetricValue(*registry, "onlineps_ps_memory_budget_bytes"));
  RawClient raw(endpoint);
  auto r = raw.Call({HeaderFrame(PushHeader(Op::kPushSparse, "big", 2, 1)), Keys({100000}),
                     Floats(std::vector<float>(64, 1.0f))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.code, StatusCode::kResourceExhausted) << r->first.message;
  r = raw.Call({HeaderFrame(PushHeader(Op::kPushSparse, "big", 2, 2)), Keys({7}),
                Floats(std::vector<float>(64, 1.0f))});
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  r = raw.Call({HeaderFrame(Request(Op::kPullSparse, "big")), Keys({7})});
  ASSERT_TRUE(r.has_value());
  ASSERT_EQ(r->first.code, StatusCode::kOk) << r->first.message;
  EXPECT_EQ(r->second[1].As<float>()[0], -2.0f);
  second->Stop();
  auto& sinks = spdlog::default_logger()->sinks();
  sinks.erase(std::remove(sinks.begin(), sinks.end(), sink), sinks.end());
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Transports, ShardServerMemoryBudgetTest, ::testing::Values("mem", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace onlineps::ps
