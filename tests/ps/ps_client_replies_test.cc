// The PS client against shards whose answers are malformed, late, slow or missing: every
// call ends (never hangs), no late answer is taken as another call's, a slow checkpoint
// is waited for, "forever" timeouts do not wrap, and an applied push is never reported as
// not sent. The shards are real ZeroMQ sockets: a scripted fake, or a real ShardServer.
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/mutex.h"
#include "common/partition.h"
#include "common/transport.h"
#include "common/wire.h"
#include "ps/ps_client.h"
#include "ps/shard_server.h"
#include "ps/table_spec.h"

namespace onlineps::ps {
namespace {

using std::chrono::milliseconds;

// A fake shard: a real ZeroMQ ROUTER whose answers the test scripts.
class FakeShard {
 public:
  using Script = std::function<void(FakeShard&, const std::string& peer, const Header& req,
                                    const Frames& frames)>;
  explicit FakeShard(Script s) : script_(std::move(s)) {
    TransportOptions o;
    o.handler_threads = 1;
    o.inline_max_bytes = 0;
    transport_ = NewServerTransport("tcp://127.0.0.1:0", o);
    auto ep = transport_->Start("tcp://127.0.0.1:0", [this](Incoming&& in) {
      auto h = DecodeHeader(in.frames[0].data(), in.frames[0].size());
      if (!h.ok()) return;
      script_(*this, in.peer, *h, in.frames);
    });
    EXPECT_TRUE(ep.ok());
    endpoint = ep.ok() ? *ep : "";
  }
  ~FakeShard() { transport_->Stop(); }
  void Reply(const std::string& peer, const Header& h, Frames payload = {}) {
    Frames f{Frame::FromString(EncodeHeader(h))};
    for (auto& x : payload) f.push_back(std::move(x));
    (void)transport_->Send(peer, std::move(f));
  }
  std::string endpoint;

 private:
  Script script_;
  std::unique_ptr<ServerTransport> transport_;
};

TableSpec DenseSpec(const std::string& name, uint64_t n) {
  TableSpec s;
  s.name = name;
  s.kind = TableKind::kDense;
  s.shape = {n};
  s.optimizer_params = {{"lr", 1.0}};
  return s;
}

// A push_batch reply whose shape counts overflow uint64 passed SplitFrameGroups' sum
// check; the client then built a vector from a reversed range, the length_error escaped
// OnReply after the part had left the in-flight table, and the call never completed
// (Wait() blocked forever). Now: MALFORMED at once.
TEST(PsClientRepliesTest, AMalformedPushBatchReplyEndsTheCall) {
  FakeShard fake([](FakeShard& f, const std::string& peer, const Header& req, const Frames&) {
    Header r = MakeReply(req, Status::Ok());
    if (req.op == Op::kPushBatch) {
      // Two sub-pushes were sent; answer "two groups" of 2^64-1 and 2 frames (sum wraps
      // to 1) with one frame after the header.
      r.shape = {~uint64_t{0}, 2};
      f.Reply(peer, r, {Frame::FromString(EncodeHeader(MakeReply(req, Status::Ok())))});
      return;
    }
    f.Reply(peer, r);
  });
  PsClientOptions o;
  o.shards = {fake.endpoint};
  o.timeout = milliseconds(2000);
  auto client = PsClient::Connect(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTable(DenseSpec("a", 2)).ok());
  ASSERT_TRUE((*client)->CreateTable(DenseSpec("b", 2)).ok());
  std::vector<float> g(2, 1.0f);
  std::vector<DensePush> pushes(2);
  pushes[0].table = "a";
  pushes[0].values = Frame::FromVector(g);
  pushes[1].table = "b";
  pushes[1].values = Frame::FromVector(g);
  Ticket t = (*client)->PushDenseBatch(std::move(pushes));
  // The call's deadline is 2 s: give it 10.
  for (int i = 0; i < 1000 && !t.Ready(); ++i) std::this_thread::sleep_for(milliseconds(10));
  ASSERT_TRUE(t.Ready()) << "push_batch still not complete 10 s after its 2 s deadline";
  Status st = t.Wait();
  EXPECT_FALSE(st.ok());
  std::printf("push_batch with a malformed reply: %s\n", st.ToString().c_str());
}

// A push whose first attempt got no answer (applied, its answer lost) and whose resend a
// shard refuses below the sender's dedup window (4,096 newer pushes moved it on) was
// reported FAILED_PRECONDITION, which callers read as "not applied": a retry would apply
// it twice. It is DEADLINE_EXCEEDED (outcome unknown); a first attempt refused so stays
// FAILED_PRECONDITION (it reached no shard before).
TEST(PsClientRepliesTest, AResendRefusedBelowTheDedupWindowIsOutcomeUnknown) {
  std::atomic<int> push_attempts{0};
  FakeShard fake([&](FakeShard& f, const std::string& peer, const Header& req, const Frames&) {
    if (req.op != Op::kPushSparse) return f.Reply(peer, MakeReply(req, Status::Ok()));
    if (push_attempts++ == 0) return;  // applied; its answer lost
    f.Reply(peer, MakeReply(req, FailedPrecondition("push seq " + std::to_string(req.seq) +
                                                    " is below the dedup window; cannot tell "
                                                    "if it was applied")));
  });
  TableSpec sparse;
  sparse.name = "emb";
  sparse.kind = TableKind::kSparse;
  sparse.dim = 1;
  sparse.optimizer_params = {{"lr", 1.0}};
  PsClientOptions o;
  o.shards = {fake.endpoint};
  o.attempt_timeout = milliseconds(200);
  o.timeout = milliseconds(3000);
  auto client = PsClient::Connect(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTable(sparse).ok());
  const uint64_t key = 1;
  const float g = -1;
  Status resent = (*client)->PushSparse("emb", &key, 1, &g, {}, nullptr).Wait();
  EXPECT_EQ(resent.code(), StatusCode::kDeadlineExceeded) << resent.ToString();
  EXPECT_NE(resent.message().find("outcome unknown"), std::string::npos) << resent.ToString();
  EXPECT_EQ(push_attempts.load(), 2);
  // Refused at its first attempt: not applied, said as it is.
  Status first = (*client)->PushSparse("emb", &key, 1, &g, {}, nullptr).Wait();
  EXPECT_EQ(first.code(), StatusCode::kFailedPrecondition) << first.ToString();
}

// Request ids are (16-bit generation << 16 | slot). With slots reused last freed first, a
// caller making one call at a time reused one slot, and a reply late by 65,535 calls (two
// seconds here) carried the id of the call then in that slot and was taken as its answer:
// a pull of table "b" returned table "a"'s values, status OK.
TEST(PsClientRepliesTest, AReplyLateBy65535CallsIsNotAnotherCallsAnswer) {
  Mutex mu;
  std::string held_peer;
  Header held_req;
  bool holding = false, released = false;
  std::atomic<uint64_t> pulls{0};
  FakeShard fake([&](FakeShard& f, const std::string& peer, const Header& req, const Frames&) {
    Header r = MakeReply(req, Status::Ok());
    if (req.op != Op::kPullDense) return f.Reply(peer, r);
    pulls++;
    MutexLock lock(&mu);
    if (req.table == "a" && !holding) {  // hold the first pull of "a": a slow answer
      holding = true;
      held_peer = peer;
      held_req = req;
      return;
    }
    if (holding && !released && req.request_id == held_req.request_id) {
      // The late answer to the pull of "a" arrives now (its rid is live again).
      released = true;
      Header late = MakeReply(held_req, Status::Ok());
      late.version = 111;
      late.shape = {4};
      f.Reply(held_peer, late, {Frame::FromVector(std::vector<float>(4, 1.0f))});
      // (the reply to this very request would follow; it is simply late too)
      return;
    }
    r.version = 222;
    r.shape = {4};
    f.Reply(peer, r, {Frame::FromVector(std::vector<float>(4, 2.0f))});
  });
  PsClientOptions o;
  o.shards = {fake.endpoint};
  o.timeout = milliseconds(200);
  o.attempt_timeout = milliseconds(200);  // one attempt: the call fails, the slot is freed
  auto client = PsClient::Connect(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTable(DenseSpec("a", 4)).ok());
  ASSERT_TRUE((*client)->CreateTable(DenseSpec("b", 4)).ok());
  std::vector<float> out(4);
  EXPECT_FALSE((*client)->PullDense("a", out.data(), nullptr).Wait().ok());
  int wrong = 0, failed = 0;
  for (int i = 0; i < 70000; ++i) {
    std::fill(out.begin(), out.end(), -1.0f);
    VersionVector v;
    Status st = (*client)->PullDense("b", out.data(), &v).Wait();
    if (!st.ok()) {
      ++failed;
      continue;
    }
    if (out[0] != 2.0f) {
      ++wrong;
      std::printf("call %d: PullDense(\"b\") OK but got %.1f (table a's value), version %llu\n", i,
                  out[0], static_cast<unsigned long long>(v[0]));
    }
  }
  std::printf("%llu pulls served, %d failed, %d wrong\n",
              static_cast<unsigned long long>(pulls.load()), failed, wrong);
  EXPECT_EQ(wrong, 0) << "a late reply was taken as the answer to another call";
}

// Checkpoint(): a checkpoint that took longer than attempt_timeout was requested again
// each attempt, every answer came after its attempt was given up, and the call failed
// with DEADLINE_EXCEEDED although the shard wrote checkpoints back to back. Now one
// attempt spans the call.
TEST(PsClientRepliesTest, ACheckpointSlowerThanAnAttemptIsWaitedFor) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("rev-ckpt-" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  ShardServerOptions so;
  so.listen = "tcp://127.0.0.1:0";
  so.checkpoint_dir = dir.string();
  ShardServer server(so, std::make_shared<prometheus::Registry>());
  auto ep = server.Start();
  ASSERT_TRUE(ep.ok());
  {
    PsClientOptions o;
    o.shards = {*ep};
    auto setup = PsClient::Connect(o);
    ASSERT_TRUE(setup.ok());
    ASSERT_TRUE((*setup)->CreateTable(DenseSpec("big", uint64_t{16} << 20)).ok());  // 64 MiB
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto file = server.Checkpoint();
  const auto one = std::chrono::duration_cast<milliseconds>(std::chrono::steady_clock::now() - t0);
  ASSERT_TRUE(file.ok());
  // The defaults are attempt 1000 ms, call 5000 ms: the same ratios, scaled to this table
  // (a checkpoint of ~1.5x the attempt timeout, as a shard of a few GB has with defaults).
  PsClientOptions o;
  o.shards = {*ep};
  o.attempt_timeout = std::max(milliseconds(5), one * 2 / 3);
  o.timeout = o.attempt_timeout * 5;
  auto client = PsClient::Connect(o);
  ASSERT_TRUE(client.ok());
  std::printf("one checkpoint takes %lld ms; attempt timeout %lld ms, call timeout %lld ms\n",
              static_cast<long long>(one.count()),
              static_cast<long long>(o.attempt_timeout.count()),
              static_cast<long long>(o.timeout.count()));
  const auto t1 = std::chrono::steady_clock::now();
  Status st = (*client)->Checkpoint();
  std::printf("Checkpoint() after %.3f s: %s\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count(),
              st.ToString().c_str());
  EXPECT_TRUE(st.ok());
  client->reset();
  server.Stop();
  std::filesystem::remove_all(dir);
}

// Timeouts of "forever" (milliseconds::max()) made now + timeout wrap into the past: a
// resend storm, or a call failed at once.
TEST(PsClientRepliesTest, ForeverTimeoutsDoNotWrap) {
  ShardServerOptions so;
  so.listen = "tcp://127.0.0.1:0";
  ShardServer server(so, std::make_shared<prometheus::Registry>());
  auto ep = server.Start();
  ASSERT_TRUE(ep.ok());
  PsClientOptions o;
  o.shards = {*ep};
  o.attempt_timeout = milliseconds::max();
  o.timeout = milliseconds(2000);
  auto client = PsClient::Connect(o);
  ASSERT_TRUE(client.ok());
  Status st = (*client)->CreateTable(DenseSpec("w", 4));
  std::printf("CreateTable with attempt_timeout=max: %s\n", st.ToString().c_str());
  EXPECT_TRUE(st.ok());
  PsClientOptions o2 = o;
  o2.attempt_timeout = milliseconds(1000);
  o2.timeout = milliseconds::max();
  auto client2 = PsClient::Connect(o2);
  ASSERT_TRUE(client2.ok());
  st = (*client2)->CreateTable(DenseSpec("w2", 4));
  std::printf("CreateTable with timeout=max: %s\n", st.ToString().c_str());
  EXPECT_TRUE(st.ok());
  // Watch: "wait as long as the shard allows" (it caps the wait at 60 s). The table changes
  // after 6 s, past the 5 s call timeout: the watch must still be the one attempt, held
  // for its wait (it was resent every second and failed at 5 s).
  PsClientOptions o3 = o2;
  o3.timeout = milliseconds(5000);
  auto client3 = PsClient::Connect(o3);
  ASSERT_TRUE(client3.ok());
  std::thread change([&] {
    std::this_thread::sleep_for(milliseconds(6000));
    std::vector<float> g(4, 1.0f);
    EXPECT_TRUE((*client2)->PushDense("w2", g.data(), {}, nullptr).Wait().ok());
  });
  WatchReply wr;
  const auto t0 = std::chrono::steady_clock::now();
  st = (*client3)->Watch(0, {{"w2", 0}}, milliseconds::max(), &wr).Wait();
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  change.join();
  std::printf("Watch(wait=max) after %.3f s: %s\n", waited, st.ToString().c_str());
  EXPECT_TRUE(st.ok());
  EXPECT_GE(waited, 5.5);
  server.Stop();
}

// A resend that found every request id in use failed the call with RESOURCE_EXHAUSTED
// (documented: "back off, retry"), although an earlier attempt of the push may have been
// applied: the caller cannot resend with the same seq, so its retry applied the gradient
// twice. Now a resend waits for an id until the call's deadline.
TEST(PsClientRepliesTest, AResendWithoutAFreeIdIsRetriedNotReportedAsNotSent) {
  // Shard 0: a real shard. Shard 1: answers control ops, never data ops (a hung shard).
  ShardServerOptions so;
  so.listen = "tcp://127.0.0.1:0";
  so.shard = 0;
  so.num_shards = 2;
  ShardServer server(so, std::make_shared<prometheus::Registry>());
  auto ep = server.Start();
  ASSERT_TRUE(ep.ok());
  FakeShard hung([](FakeShard& f, const std::string& peer, const Header& req, const Frames&) {
    if (req.op == Op::kCreateTable || req.op == Op::kPing)
      f.Reply(peer, MakeReply(req, Status::Ok()));
  });
  TableSpec sparse;
  sparse.name = "emb";
  sparse.kind = TableKind::kSparse;
  sparse.dim = 1;
  sparse.optimizer_params = {{"lr", 1.0}};
  sparse.max_staleness = 0;  // SSP: a sender ahead of the slowest live one waits
  sparse.bound_mode = BoundMode::kBlock;
  sparse.block_timeout_ms = 3000;
  uint64_t k0 = 1, k1 = 1;
  while (ShardOfKey(k0, 2) != 0) ++k0;
  while (ShardOfKey(k1, 2) != 1) ++k1;

  PsClientOptions o;
  o.shards = {*ep, hung.endpoint};
  o.attempt_timeout = milliseconds(500);
  o.timeout = milliseconds(10000);
  auto reader = PsClient::Connect(o);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*reader)->CreateTable(sparse).ok());
  float v = -7;
  ASSERT_TRUE((*reader)->PullSparse("emb", &k0, 1, &v, nullptr).Wait().ok());  // live, clock 0

  auto client = PsClient::Connect(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTable(sparse).ok());
  const float minus_one = -1;
  // Applied at once; its reply held (this sender is ahead of the reader) for up to 3 s.
  Ticket push = (*client)->PushSparse("emb", &k0, 1, &minus_one, {}, nullptr);
  // Other threads of the same worker keep calling; shard 1's answers do not come.
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> refused{0};
  std::thread busy([&] {
    float out;
    while (!stop) {
      Ticket t = (*client)->PullSparse("emb", &k1, 1, &out, nullptr);
      if (t.Ready() && t.Wait().code() == StatusCode::kResourceExhausted) refused++;
    }
  });
  Status st = push.Wait();
  stop = true;
  busy.join();
  std::printf("push: %s (pulls refused at once meanwhile: %llu)\n", st.ToString().c_str(),
              static_cast<unsigned long long>(refused.load()));
  ASSERT_TRUE((*reader)->PullSparse("emb", &k0, 1, &v, nullptr).Wait().ok());
  std::printf("key %llu on shard 0: %.1f (1.0: the push was applied)\n",
              static_cast<unsigned long long>(k0), v);
  if (st.code() == StatusCode::kResourceExhausted) {
    EXPECT_NE(v, 1.0f) << "RESOURCE_EXHAUSTED (documented: back off, retry) for an applied push";
  }
  client->reset();
  server.Stop();
}

}  // namespace
}  // namespace onlineps::ps

namespace onlineps::ps {
namespace {

// Replicas that name no primary (an election in progress) or answer from a lower epoch
// than the client saw (a deposed primary) are retried after a pause, not at once: the
// "no primary named" hint was -1 converted to 4294967295, taken for a named primary, so
// the client resent the push back and forth between the replicas thousands of times a
// second (80,068 attempts in one 30 s call against a real group) for as long as the
// election lasted.
TEST(PsClientRepliesTest, ReplicasNamingNoPrimaryAreRetriedAfterAPause) {
  std::atomic<int> attempts{0};
  std::atomic<uint64_t> a_epoch{19};
  FakeShard a([&](FakeShard& f, const std::string& peer, const Header& req, const Frames&) {
    if (req.op == Op::kPushSparse) attempts++;
    Header r = MakeReply(req, Status::Ok());
    r.epoch = a_epoch.load();  // after the first call: an answer from a deposed primary
    f.Reply(peer, r);
  });
  FakeShard b([&](FakeShard& f, const std::string& peer, const Header& req, const Frames&) {
    if (req.op == Op::kPushSparse) attempts++;
    Header r = MakeReply(req, NotPrimary("not primary; no primary known (election in progress)"));
    r.epoch = 8;
    f.Reply(peer, r);
  });
  TableSpec sparse;
  sparse.name = "emb";
  sparse.kind = TableKind::kSparse;
  sparse.dim = 1;
  sparse.optimizer_params = {{"lr", 1.0}};
  PsClientOptions o;
  o.shards = {a.endpoint + "|" + b.endpoint};
  o.attempt_timeout = milliseconds(300);
  o.timeout = milliseconds(1000);
  auto client = PsClient::Connect(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->CreateTable(sparse).ok());  // the client sees epoch 19
  a_epoch = 8;
  const uint64_t key = 1;
  const float g = -1;
  Status st = (*client)->PushSparse("emb", &key, 1, &g, {}, nullptr).Wait();
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  // One attempt per 20 ms pause at most: about 50 in the second.
  EXPECT_LE(attempts.load(), 80) << "resent without a pause";
  EXPECT_GE(attempts.load(), 10);
}

}  // namespace
}  // namespace onlineps::ps
