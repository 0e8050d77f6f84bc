// ParamCache (worker/param_cache.h) against two real shard servers in this process:
// hits and pulls, the age and version bounds (including while another client pushes),
// single-flight pulls, sparse misses, LRU cap and base versions, the refresher, and
// errors from a dead shard followed by recovery.
#include "worker/param_cache.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <prometheus/registry.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/partition.h"
#include "ps/shard_server.h"

namespace onlineps::worker {
namespace {

using namespace std::chrono_literals;
constexpr uint64_t kDenseSize = 8;
constexpr uint32_t kDim = 2;

int64_t Now() { return static_cast<int64_t>(NowMs()); }

std::string UniqueMemName() {
  static std::atomic<int> counter{0};
  return "mem://param-cache-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

// A loopback TCP port with nothing listening on it (bound once, then released).
int FreeTcpPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

ps::TableSpec DenseSpec() {
  ps::TableSpec s;
  s.name = "w";
  s.shape = {kDenseSize};
  s.optimizer_params = {{"lr", 1.0}};
  return s;
}

ps::TableSpec SparseSpec() {
  ps::TableSpec s;
  s.name = "emb";
  s.kind = ps::TableKind::kSparse;
  s.dim = kDim;
  s.optimizer_params = {{"lr", 1.0}};
  return s;
}

// Two shard servers, a writer client that creates the tables and pushes (plain SGD,
// lr 1, zero init: a parameter is minus the sum of its pushed gradients), and a reader
// client with short timeouts for the cache.
class ParamCacheTest : public ::testing::Test {
 protected:
  void SetUp() override { StartAll({UniqueMemName(), UniqueMemName()}); }

  void StartAll(std::vector<std::string> listen) {
    listen_ = std::move(listen);
    endpoints_.resize(listen_.size());
    servers_.resize(listen_.size());
    for (uint32_t i = 0; i < listen_.size(); ++i) StartShard(i);
    writer_ = Connect(5000ms);
    ASSERT_NE(writer_, nullptr);
    ASSERT_TRUE(writer_->CreateTable(DenseSpec()).ok());
    ASSERT_TRUE(writer_->CreateTable(SparseSpec()).ok());
    reader_ = Connect(300ms);
    ASSERT_NE(reader_, nullptr);
  }

  void StartShard(uint32_t i) {
    ps::ShardServerOptions o;
    o.shard = i;
    o.num_shards = static_cast<uint32_t>(listen_.size());
    o.listen = listen_[i];
    o.checkpoint_dir = checkpoint_dir_;
    servers_[i] = std::make_unique<ps::ShardServer>(o, std::make_shared<prometheus::Registry>());
    auto ep = servers_[i]->Start();
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();
    endpoints_[i] = *ep;
  }

  std::unique_ptr<ps::PsClient> Connect(std::chrono::milliseconds timeout) {
    ps::PsClientOptions o;
    o.shards = endpoints_;
    o.timeout = timeout;
    o.attempt_timeout = std::min<std::chrono::milliseconds>(timeout, 100ms);
    auto c = ps::PsClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  void TearDown() override {
    reader_.reset();
    writer_.reset();
    for (auto& s : servers_)
      if (s) s->Stop();
  }

  std::unique_ptr<ParamCache> MakeCache(ParamCacheOptions o) {
    auto c = std::make_unique<ParamCache>(reader_.get(), o);
    c->AddDense("w", kDenseSize);
    c->AddSparse("emb", kDim);
    return c;
  }

  // Pushes gradient g to every element of the dense table; returns the reply versions.
  ps::VersionVector PushDense(float g) {
    std::vector<float> grad(kDenseSize, g);
    ps::PushReply r;
    EXPECT_TRUE(writer_->PushDense("w", grad.data(), {}, &r).Wait().ok());
    return r.versions;
  }

  ps::VersionVector PushRow(uint64_t key, std::vector<float> g) {
    ps::PushReply r;
    EXPECT_TRUE(writer_->PushSparse("emb", &key, 1, g.data(), {}, &r).Wait().ok());
    return r.versions;
  }

  std::vector<float> ReadDense(ParamCache& c) {
    auto s = c.Dense("w");
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? (*s)->values : std::vector<float>{};
  }

  // Keys 1, 2, ... whose shard (of 2) is `shard`.
  static std::vector<uint64_t> KeysOnShard(uint32_t shard, size_t n) {
    std::vector<uint64_t> keys;
    for (uint64_t k = 1; keys.size() < n; ++k)
      if (ShardOfKey(k, 2) == shard) keys.push_back(k);
    return keys;
  }

  std::vector<std::string> listen_, endpoints_;
  std::string checkpoint_dir_;  // none unless a test sets it before starting shards
  std::vector<std::unique_ptr<ps::ShardServer>> servers_;
  std::unique_ptr<ps::PsClient> writer_, reader_;
};

TEST_F(ParamCacheTest, FirstReadPullsAndSecondWithinBoundHits) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  auto a = cache->Dense("w");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)->values, std::vector<float>(kDenseSize, 0.0f));
  EXPECT_EQ((*a)->versions.size(), 2u);
  EXPECT_EQ((*a)->pull_id, 1u);
  auto b = cache->Dense("w");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(a->get(), b->get());  // the same shared snapshot
  auto s = cache->stats();
  EXPECT_EQ(s.dense_pulls, 1u);
  EXPECT_EQ(s.dense_hits, 1u);
}

// Two learns' pushes can reach the shards in different orders: the one answered last is
// then newer on one shard and older on the other. Installing it must keep, per shard, the
// slices of whichever copy is newer there, or a read goes back to a version the worker
// already returned (read-your-writes across concurrent learns).
TEST_F(ParamCacheTest, InstalledPushNewerOnOneShardOnlyKeepsTheOtherShardsNewerSlices) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  ASSERT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, 0.0f));
  const DenseLayout layout("w", kDenseSize, 2);
  // Push A answered at versions {3, 2} with values 1.0, push B at {2, 3} with values 2.0.
  cache->InstallDense("w", std::vector<float>(kDenseSize, 1.0f), {3, 2}, NowMs());
  cache->InstallDense("w", std::vector<float>(kDenseSize, 2.0f), {2, 3}, NowMs());
  auto snap = cache->Dense("w");
  ASSERT_TRUE(snap.ok()) << snap.status().ToString();
  EXPECT_EQ((*snap)->versions, (ps::VersionVector{3, 3}));
  for (uint32_t shard = 0; shard < 2; ++shard) {
    ASSERT_FALSE(layout.SlicesOf(shard).empty());
    for (const DenseSlice& sl : layout.SlicesOf(shard)) {
      for (uint64_t i = sl.offset; i < sl.offset + sl.length; ++i) {
        ASSERT_EQ((*snap)->values[i], shard == 0 ? 1.0f : 2.0f) << "element " << i;
      }
    }
  }
  // Older on every shard: ignored.
  cache->InstallDense("w", std::vector<float>(kDenseSize, 9.0f), {1, 1}, NowMs());
  EXPECT_EQ((*cache->Dense("w"))->versions, (ps::VersionVector{3, 3}));
}

TEST_F(ParamCacheTest, UnregisteredTableIsNotFound) {
  auto cache = MakeCache({});
  EXPECT_EQ(cache->Dense("nope").status().code(), StatusCode::kNotFound);
  uint64_t key = 1;
  float out[kDim];
  EXPECT_EQ(cache->Sparse("nope", &key, 1, out, nullptr).code(), StatusCode::kNotFound);
}

TEST_F(ParamCacheTest, TableRegisteredWithWrongSizeIsRefusedNotOverflowed) {
  ParamCache cache(reader_.get(), {});
  cache.AddDense("w", kDenseSize - 3);
  cache.AddSparse("emb", kDim + 1);
  EXPECT_EQ(cache.Dense("w").status().code(), StatusCode::kShapeMismatch);
  uint64_t key = 1;
  std::vector<float> out(kDim + 1);
  EXPECT_EQ(cache.Sparse("emb", &key, 1, out.data(), nullptr).code(), StatusCode::kShapeMismatch);
}

TEST_F(ParamCacheTest, ReadAfterAgeBoundSeesAnotherClientsPush) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 300;
  auto cache = MakeCache(o);
  const int64_t t0 = Now();
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, 0.0f));
  PushDense(1.0f);
  std::vector<float> cached = ReadDense(*cache);
  if (Now() - t0 < 300) {  // still within the bound: served from the copy
    EXPECT_EQ(cached, std::vector<float>(kDenseSize, 0.0f));
    EXPECT_EQ(cache->stats().dense_hits, 1u);
  }
  std::this_thread::sleep_for(350ms);
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, -1.0f));
  EXPECT_GE(cache->stats().dense_pulls, 2u);
}

TEST_F(ParamCacheTest, EveryReadIsWithinTheAgeBoundWhileAnotherClientPushes) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 30;
  o.refresh_interval_ms = 5;
  o.notices = false;  // the age bound's refresher
  auto cache = MakeCache(o);
  cache->Start();
  std::mutex mu;
  std::vector<int64_t> done_ms;  // completion time of each acknowledged push, ascending
  std::atomic<bool> stop{false};
  std::thread pusher([&] {
    while (!stop.load()) {
      PushDense(1.0f);
      std::lock_guard<std::mutex> lock(mu);
      done_ms.push_back(Now());
    }
  });
  int reads = 0;
  bool failed = false;  // no ASSERT here: the pusher thread must be joined
  for (const int64_t end = Now() + 700; Now() < end && !failed; ++reads) {
    const int64_t t0 = Now();
    auto s = cache->Dense("w");
    if (!s.ok()) {
      ADD_FAILURE() << s.status().ToString();
      break;
    }
    EXPECT_GE((*s)->fetched_ms, t0 - o.dense.max_age_ms) << "read " << reads;
    failed |= (*s)->fetched_ms < t0 - o.dense.max_age_ms;
    // A push acknowledged before the pull was sent must be in the values.
    size_t acked;
    {
      std::lock_guard<std::mutex> lock(mu);
      acked = std::lower_bound(done_ms.begin(), done_ms.end(), (*s)->fetched_ms) - done_ms.begin();
    }
    for (float v : (*s)->values) {
      EXPECT_GE(-v, static_cast<float>(acked)) << "read " << reads;
      failed |= -v < static_cast<float>(acked);
    }
    std::this_thread::sleep_for(2ms);
  }
  stop = true;
  pusher.join();
  EXPECT_GT(reads, 50);
  EXPECT_GT(done_ms.size(), 10u);
  auto st = cache->stats();
  EXPECT_GT(st.dense_pulls + st.refresher_pulls, 10u);
}

TEST_F(ParamCacheTest, NewerObservedVersionForcesRepullWhileAgeIsFresh) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 60'000;
  o.dense.max_versions_behind = 1;
  auto cache = MakeCache(o);
  ReadDense(*cache);
  cache->ObserveVersions("w", PushDense(1.0f));  // one version behind: allowed
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, 0.0f));
  EXPECT_EQ(cache->stats().dense_pulls, 1u);
  PushDense(1.0f);
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, 0.0f));  // not yet observed
  cache->ObserveVersions("w", PushDense(1.0f));                        // now three behind
  auto s = cache->Dense("w");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->values, std::vector<float>(kDenseSize, -3.0f));
  EXPECT_EQ(cache->stats().dense_pulls, 2u);
  EXPECT_EQ((*s)->pull_id, 2u);
}

TEST_F(ParamCacheTest, NoBoundsMeansNeverRepull) {
  ParamCacheOptions o;
  o.dense.max_age_ms = -1;
  o.dense.max_versions_behind = -1;
  auto cache = MakeCache(o);
  ReadDense(*cache);
  cache->ObserveVersions("w", PushDense(1.0f));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, 0.0f));
  auto s = cache->stats();
  EXPECT_EQ(s.dense_pulls, 1u);
  EXPECT_EQ(s.dense_hits, 1u);
}

TEST_F(ParamCacheTest, PerTableBoundOverridesTheDefault) {
  ParamCacheOptions o;
  o.dense.max_age_ms = -1;                // default: never re-pull
  o.tables["w"] = FreshnessBound{-1, 0};  // this table: the newest version seen
  auto cache = MakeCache(o);
  ReadDense(*cache);
  cache->ObserveVersions("w", PushDense(1.0f));
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, -1.0f));
  EXPECT_EQ(cache->stats().dense_pulls, 2u);
}

TEST_F(ParamCacheTest, DenseAllPullsOnlyStaleTablesAndSharesSnapshots) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  EXPECT_EQ(cache->DenseAll({"w", "nope"}).status().code(), StatusCode::kNotFound);
  auto a = cache->DenseAll({"w"});
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ((*a)[0]->values, std::vector<float>(kDenseSize, 0.0f));
  PushDense(1.0f);
  auto b = cache->DenseAll({"w"});  // within the bound: the same snapshot
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*a)[0].get(), (*b)[0].get());
  cache->Invalidate("w");
  auto c = cache->DenseAll({"w"});
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)[0]->values, std::vector<float>(kDenseSize, -1.0f));
  EXPECT_EQ(cache->Dense("w")->get(), (*c)[0].get());
  auto s = cache->stats();
  EXPECT_EQ(s.dense_pulls, 2u);
  EXPECT_EQ(s.dense_hits, 2u);
}

TEST_F(ParamCacheTest, InvalidateRowsDropsOnlyThoseRows) {
  ParamCacheOptions o;
  o.sparse.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  const uint64_t keys[2] = {5, 6};
  float out[2 * kDim];
  ASSERT_TRUE(cache->Sparse("emb", keys, 2, out, nullptr).ok());
  PushRow(5, {1, 1});
  PushRow(6, {1, 1});
  cache->InvalidateRows("emb", keys, 1);  // only key 5
  ASSERT_TRUE(cache->Sparse("emb", keys, 2, out, nullptr).ok());
  EXPECT_EQ(out[0], -1.0f);    // re-pulled
  EXPECT_EQ(out[kDim], 0.0f);  // still the cached copy
  EXPECT_EQ(cache->stats().sparse_misses, 3u);
}

TEST_F(ParamCacheTest, InvalidateDropsTheCopies) {
  ParamCacheOptions o;
  o.dense.max_age_ms = o.sparse.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  ReadDense(*cache);
  uint64_t key = 5;
  float out[kDim];
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, out, nullptr).ok());
  PushDense(2.0f);
  PushRow(key, {1, 1});
  cache->Invalidate("w");
  cache->Invalidate("emb");
  EXPECT_EQ(cache->stats().sparse_rows, 0u);
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, -2.0f));
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, out, nullptr).ok());
  EXPECT_EQ(out[0], -1.0f);
  auto s = cache->stats();
  EXPECT_EQ(s.dense_pulls, 2u);
  EXPECT_EQ(s.sparse_pulls, 2u);
}

void ConcurrentReads(ParamCache* cache, int n, std::vector<const DenseSnapshot*>* got) {
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  got->assign(n, nullptr);
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      ready.fetch_add(1);
      while (ready.load() < n) std::this_thread::yield();
      auto s = cache->Dense("w");
      if (s.ok()) (*got)[i] = s->get();
    });
  }
  for (auto& t : threads) t.join();
}

TEST_F(ParamCacheTest, ConcurrentMissesOnAColdTableShareOnePull) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  std::vector<const DenseSnapshot*> got;
  ConcurrentReads(cache.get(), 16, &got);
  for (auto* p : got) EXPECT_EQ(p, got[0]);
  ASSERT_NE(got[0], nullptr);
  auto s = cache->stats();
  EXPECT_EQ(s.dense_pulls, 1u);
  EXPECT_EQ(s.dense_hits, 15u);
}

TEST_F(ParamCacheTest, ConcurrentReadersOfAStaleTableShareOnePull) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 300;
  auto cache = MakeCache(o);
  ReadDense(*cache);
  PushDense(1.0f);
  std::this_thread::sleep_for(350ms);
  std::vector<const DenseSnapshot*> got;
  ConcurrentReads(cache.get(), 16, &got);
  ASSERT_NE(got[0], nullptr);
  for (auto* p : got) EXPECT_EQ(p, got[0]);
  EXPECT_EQ(got[0]->values, std::vector<float>(kDenseSize, -1.0f));
  EXPECT_EQ(cache->stats().dense_pulls, 2u);
}

TEST_F(ParamCacheTest, SparsePullsOnlyMissingKeys) {
  ParamCacheOptions o;
  o.sparse.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  for (uint64_t k = 1; k <= 5; ++k) PushRow(k, {float(k), float(10 * k)});
  std::vector<uint64_t> keys = {1, 2, 3};
  std::vector<float> out(5 * kDim);
  ASSERT_TRUE(cache->Sparse("emb", keys.data(), 3, out.data(), nullptr).ok());
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 6),
            (std::vector<float>{-1, -10, -2, -20, -3, -30}));
  PushRow(1, {100, 100});  // the cached copy of 1 is within the bound: not re-pulled
  keys = {1, 4, 2, 5, 3};
  ASSERT_TRUE(cache->Sparse("emb", keys.data(), 5, out.data(), nullptr).ok());
  EXPECT_EQ(out, (std::vector<float>{-1, -10, -4, -40, -2, -20, -5, -50, -3, -30}));
  auto s = cache->stats();
  EXPECT_EQ(s.sparse_pulls, 2u);
  EXPECT_EQ(s.sparse_misses, 5u);
  EXPECT_EQ(s.sparse_hits, 3u);
  EXPECT_EQ(s.sparse_rows, 5u);
}

TEST_F(ParamCacheTest, SparseRowOlderThanAgeBoundIsRepulled) {
  ParamCacheOptions o;
  o.sparse.max_age_ms = 100;
  auto cache = MakeCache(o);
  uint64_t key = 9;
  float out[kDim];
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, out, nullptr).ok());
  PushRow(key, {3, 4});
  std::this_thread::sleep_for(150ms);
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, out, nullptr).ok());
  EXPECT_EQ(out[0], -3.0f);
  EXPECT_EQ(out[1], -4.0f);
  EXPECT_EQ(cache->stats().sparse_pulls, 2u);
}

TEST_F(ParamCacheTest, SparseLruCapEvictsLeastRecentRows) {
  ParamCacheOptions o;
  o.sparse.max_age_ms = 60'000;
  o.max_sparse_rows = 4;
  auto cache = MakeCache(o);
  for (uint64_t k = 1; k <= 6; ++k) PushRow(k, {float(k), 0});
  std::vector<uint64_t> keys = {1, 2, 3, 4, 5, 6};
  std::vector<float> out(6 * kDim);
  ASSERT_TRUE(cache->Sparse("emb", keys.data(), 6, out.data(), nullptr).ok());
  for (size_t i = 0; i < 6; ++i) EXPECT_EQ(out[i * kDim], -float(i + 1));  // all returned
  auto s = cache->stats();
  EXPECT_EQ(s.sparse_rows, 4u);
  EXPECT_EQ(s.sparse_evictions, 2u);
  uint64_t six = 6, one = 1;
  ASSERT_TRUE(cache->Sparse("emb", &six, 1, out.data(), nullptr).ok());
  EXPECT_EQ(cache->stats().sparse_pulls, 1u);  // 6 was kept
  ASSERT_TRUE(cache->Sparse("emb", &one, 1, out.data(), nullptr).ok());
  EXPECT_EQ(out[0], -1.0f);
  s = cache->stats();
  EXPECT_EQ(s.sparse_pulls, 2u);  // 1 was evicted
  EXPECT_EQ(s.sparse_rows, 4u);
  EXPECT_EQ(s.sparse_evictions, 3u);
}

TEST_F(ParamCacheTest, BaseIsPerShardMinimumOfTheRowsVersions) {
  ParamCacheOptions o;
  o.sparse.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  const auto s0 = KeysOnShard(0, 2), s1 = KeysOnShard(1, 1);
  const uint64_t v_a0 = PushRow(s0[0], {1, 1})[0];
  ps::VersionVector base;
  float out[3 * kDim];
  ASSERT_TRUE(cache->Sparse("emb", &s0[0], 1, out, &base).ok());
  EXPECT_EQ(base, (ps::VersionVector{v_a0, 0}));
  const uint64_t v_a1 = PushRow(s0[1], {1, 1})[0];
  PushRow(s1[0], {1, 1});
  const uint64_t v_b = PushRow(s1[0], {1, 1})[1];
  ASSERT_LT(v_a0, v_a1);
  std::vector<uint64_t> keys = {s0[0], s0[1], s1[0]};
  ASSERT_TRUE(cache->Sparse("emb", keys.data(), 3, out, &base).ok());
  EXPECT_EQ(base, (ps::VersionVector{v_a0, v_b}));  // cached s0[0] is older than s0[1]
  EXPECT_EQ(out[0], -1.0f);
  EXPECT_EQ(out[2], -1.0f);
  EXPECT_EQ(out[4], -2.0f);
  // Two cached rows of shard 0 read at different versions: the older one counts.
  keys = {s0[1], s0[0]};
  ASSERT_TRUE(cache->Sparse("emb", keys.data(), 2, out, &base).ok());
  EXPECT_EQ(base[0], v_a0);
  // Only shard 1 rows: shard 0 carries the newest version seen there.
  ASSERT_TRUE(cache->Sparse("emb", &s1[0], 1, out, &base).ok());
  EXPECT_EQ(base, (ps::VersionVector{v_a1, v_b}));
}

TEST_F(ParamCacheTest, DuplicateKeysInOneCallArePulledOnce) {
  ParamCacheOptions o;
  o.sparse.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  PushRow(7, {1, 2});
  PushRow(8, {3, 4});
  std::vector<uint64_t> keys = {7, 7, 8, 7};
  std::vector<float> out(4 * kDim, 99);
  ASSERT_TRUE(cache->Sparse("emb", keys.data(), 4, out.data(), nullptr).ok());
  EXPECT_EQ(out, (std::vector<float>{-1, -2, -1, -2, -3, -4, -1, -2}));
  auto s = cache->stats();
  EXPECT_EQ(s.sparse_pulls, 1u);
  EXPECT_EQ(s.sparse_rows, 2u);
  keys = {8, 8};
  ASSERT_TRUE(cache->Sparse("emb", keys.data(), 2, out.data(), nullptr).ok());
  EXPECT_EQ(std::vector<float>(out.begin(), out.begin() + 4), (std::vector<float>{-3, -4, -3, -4}));
  EXPECT_EQ(cache->stats().sparse_pulls, 1u);
}

TEST_F(ParamCacheTest, RefresherKeepsHotTableFreshWithoutReadsPulling) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 200;
  o.refresh_interval_ms = 10;
  o.notices = false;  // the age bound's refresher
  auto cache = MakeCache(o);
  cache->Start();
  ReadDense(*cache);
  PushDense(1.0f);
  bool saw_push = false;
  for (const int64_t end = Now() + 800; Now() < end;) {
    saw_push |= ReadDense(*cache) == std::vector<float>(kDenseSize, -1.0f);
    std::this_thread::sleep_for(20ms);
  }
  cache->Stop();
  auto s = cache->stats();
  EXPECT_TRUE(saw_push);
  EXPECT_EQ(s.dense_pulls, 1u);
  EXPECT_GE(s.refresher_pulls, 3u);
}

TEST_F(ParamCacheTest, RefresherLeavesTablesNotReadRecently) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 40;
  o.refresh_interval_ms = 5;
  o.notices = false;  // the age bound's refresher
  o.hot_window_ms = 150;
  auto cache = MakeCache(o);
  cache->Start();
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(cache->stats().refresher_pulls, 0u);  // never read: not hot
  ReadDense(*cache);
  std::this_thread::sleep_for(500ms);
  const uint64_t after_window = cache->stats().refresher_pulls;
  EXPECT_GT(after_window, 0u);
  std::this_thread::sleep_for(200ms);
  EXPECT_EQ(cache->stats().refresher_pulls, after_window);
  cache->Stop();
  cache->Stop();  // idempotent
}

// ---------------------------------------------------------------- notices

// Polls `pred` every 2 ms for up to `ms`; the time it took, or -1.
template <typename Pred>
int64_t MsUntil(int64_t ms, Pred pred) {
  const int64_t t0 = Now();
  while (Now() - t0 <= ms) {
    if (pred()) return Now() - t0;
    std::this_thread::sleep_for(2ms);
  }
  return -1;
}

TEST_F(ParamCacheTest, NoticeShowsAnotherClientsDensePushLongBeforeTheAgeBound) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  cache->Start();
  ASSERT_GE(MsUntil(3000, [&] { return cache->stats().shards_noticing == 2; }), 0)
      << "the shards' notices never started flowing";
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, 0.0f));
  const uint64_t reads_pulls = cache->stats().dense_pulls;
  PushDense(1.0f);
  const int64_t ms =
      MsUntil(1000, [&] { return ReadDense(*cache) == std::vector<float>(kDenseSize, -1.0f); });
  ASSERT_GE(ms, 0) << "another client's push not seen in 1 s with a 60 s age bound";
  EXPECT_LE(ms, 500);  // the 60 s age bound would take 60 s; slack for a loaded machine
  auto s = cache->stats();
  EXPECT_GE(s.notices, 1u);
  // The refresher pulled the hot table on notice; reads found it done or shared its pull.
  EXPECT_GE(s.refresher_pulls + s.dense_pulls - reads_pulls, 1u);
  cache->Stop();
}

TEST_F(ParamCacheTest, TheNoticeOfAnOwnPushInFlightIsLeftToItsReply) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  cache->Start();
  ASSERT_GE(MsUntil(3000, [&] { return cache->stats().shards_noticing == 2; }), 0);
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, 0.0f));  // hot now
  auto pulls = [&] {
    auto s = cache->stats();
    return s.refresher_pulls + s.dense_pulls;
  };
  const uint64_t before = pulls();
  // A push of "ours" whose reply brings its values: its notice may come first.
  cache->BeginOwnPush("w");
  const ps::VersionVector ours = PushDense(1.0f);
  ASSERT_GE(MsUntil(1000, [&] { return cache->stats().notices >= 1; }), 0);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(pulls(), before) << "the refresher pulled back what the push's reply brings";
  cache->InstallDense("w", std::vector<float>(kDenseSize, -1.0f), ours, Now());
  cache->EndOwnPush("w");
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, -1.0f));
  EXPECT_EQ(pulls(), before) << "the installed reply covers the notice";
  // A push that ends without installing (failed, or another worker's push announced
  // meanwhile): the refresher looks again at the end.
  const uint64_t notices = cache->stats().notices;
  const uint64_t refreshed = cache->stats().refresher_pulls;
  cache->BeginOwnPush("w");
  PushDense(1.0f);
  ASSERT_GE(MsUntil(1000, [&] { return cache->stats().notices > notices; }), 0);
  cache->EndOwnPush("w");
  EXPECT_GE(MsUntil(1000, [&] { return cache->stats().refresher_pulls > refreshed; }), 0)
      << "a notice left to a push that brought nothing was never pulled";
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, -2.0f));
  cache->Stop();
}

TEST_F(ParamCacheTest, WithoutNoticesACopyIsKeptForTheWholeAgeBound) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 60'000;
  o.notices = false;
  auto cache = MakeCache(o);
  cache->Start();
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, 0.0f));
  PushDense(1.0f);
  std::this_thread::sleep_for(300ms);
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, 0.0f));
  EXPECT_EQ(cache->stats().shards_noticing, 0u);
  cache->Stop();
}

TEST_F(ParamCacheTest, NoticeDropsExactlyTheSparseRowsAnotherClientPushed) {
  ParamCacheOptions o;
  o.sparse.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  cache->Start();
  ASSERT_GE(MsUntil(3000, [&] { return cache->stats().shards_noticing == 2; }), 0);
  // Rows on both shards; the pushed one and an untouched one share shard 0.
  const std::vector<uint64_t> s0 = KeysOnShard(0, 2), s1 = KeysOnShard(1, 1);
  std::vector<uint64_t> keys = {s0[0], s0[1], s1[0]};
  std::vector<float> out(keys.size() * kDim);
  ASSERT_TRUE(cache->Sparse("emb", keys.data(), keys.size(), out.data(), nullptr).ok());
  EXPECT_EQ(out, std::vector<float>(keys.size() * kDim, 0.0f));
  PushRow(s0[0], {1, 2});
  const int64_t ms = MsUntil(1000, [&] {
    float row[kDim];
    return cache->Sparse("emb", &s0[0], 1, row, nullptr).ok() && row[0] == -1 && row[1] == -2;
  });
  ASSERT_GE(ms, 0) << "the pushed row was not seen in 1 s with a 60 s age bound";
  EXPECT_LE(ms, 500);  // the 60 s age bound would take 60 s; slack for a loaded machine
  const uint64_t pulls = cache->stats().sparse_pulls;
  // The other rows, on the pushed shard too, are still served from the cache.
  std::vector<uint64_t> others = {s0[1], s1[0]};
  ASSERT_TRUE(cache->Sparse("emb", others.data(), 2, out.data(), nullptr).ok());
  auto s = cache->stats();
  EXPECT_EQ(s.sparse_pulls, pulls);
  EXPECT_EQ(s.rows_noticed, 1u);
  cache->Stop();
}

TEST_F(ParamCacheTest, ACachedRowNobodyPushesCountsAsCurrentNotAsOldAsItsPull) {
  ParamCacheOptions o;
  o.sparse.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  cache->Start();
  ASSERT_GE(MsUntil(3000, [&] { return cache->stats().shards_noticing == 2; }), 0);
  const std::vector<uint64_t> s0 = KeysOnShard(0, 2);
  float row[kDim];
  ps::VersionVector base;
  ASSERT_TRUE(cache->Sparse("emb", &s0[0], 1, row, &base).ok());
  // Other rows of the same shard move on; this one is not pushed.
  ps::VersionVector pushed;
  for (int i = 0; i < 5; ++i) pushed = PushRow(s0[1], {1, 1});
  ASSERT_GE(MsUntil(1000,
                    [&] {
                      ps::VersionVector b;
                      return cache->Sparse("emb", &s0[0], 1, row, &b).ok() && b[0] == pushed[0];
                    }),
            0)
      << "the unchanged row's base stayed at the version it was pulled at (" << base[0]
      << "), so a gradient on it would be measured " << pushed[0] - base[0] << " versions stale";
  EXPECT_EQ(cache->stats().sparse_pulls, 1u) << "the row itself was not pulled again";
  cache->Stop();
}

TEST_F(ParamCacheTest, OwnPushValuesOlderThanANoticeAlreadyHandledAreNotInstalled) {
  ParamCacheOptions o;
  o.sparse.max_age_ms = 60'000;
  auto cache = MakeCache(o);
  cache->Start();
  ASSERT_GE(MsUntil(3000, [&] { return cache->stats().shards_noticing == 2; }), 0);
  const uint64_t key = KeysOnShard(0, 1)[0];
  float row[kDim];
  auto noticed = [&](uint64_t n) {
    return MsUntil(1000, [&] { return cache->stats().rows_noticed >= n; }) >= 0;
  };
  // "Our" push made a version on shard 0; another client's later push to the same row is
  // announced to us (and handled) before our push's reply arrives.
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, row, nullptr).ok());  // cached
  const ps::VersionVector ours = PushRow(key, {1, 1});
  ASSERT_TRUE(noticed(1));
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, row, nullptr).ok());  // cached again
  const ps::VersionVector theirs = PushRow(key, {2, 2});
  ASSERT_GT(theirs[0], ours[0]);
  ASSERT_TRUE(noticed(2)) << "the later push was never announced";
  const std::vector<float> stale = {-1, -1};  // the row after our push only
  cache->InstallRows("emb", &key, 1, stale.data(), ours, Now());
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, row, nullptr).ok());
  EXPECT_EQ(std::vector<float>(row, row + kDim), (std::vector<float>{-3, -3}))
      << "values older than a push already announced were installed and served";
  // Values at least as new as every announced version are installed and served.
  const ps::VersionVector later = PushRow(key, {1, 1});
  ASSERT_GE(MsUntil(1000,
                    [&] {
                      float r[kDim];
                      return cache->Sparse("emb", &key, 1, r, nullptr).ok() && r[0] == -4;
                    }),
            0);
  const uint64_t pulls = cache->stats().sparse_pulls;
  const std::vector<float> current = {-4, -4};
  cache->InstallRows("emb", &key, 1, current.data(), later, Now());
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, row, nullptr).ok());
  EXPECT_EQ(row[0], -4);
  EXPECT_EQ(cache->stats().sparse_pulls, pulls) << "an installed row is served without a pull";
  cache->Stop();
}

TEST_F(ParamCacheTest, RowsOfATableTheShardsEvictStayUnderTheAgeBound) {
  // A TTL (or max_rows) eviction changes a row without a push: no notice tells of it.
  ps::TableSpec ttl = SparseSpec();
  ttl.name = "emb_ttl";
  ttl.ttl_ms = 3'600'000;
  ASSERT_TRUE(writer_->CreateTable(ttl).ok());
  ParamCacheOptions o;
  o.sparse.max_age_ms = 100;
  ParamCache cache(reader_.get(), o);
  cache.AddSparse("emb", kDim);
  cache.AddSparse("emb_ttl", kDim);
  cache.Start();
  ASSERT_GE(MsUntil(3000, [&] { return cache.stats().shards_noticing == 2; }), 0);
  const uint64_t key = 1;
  float row[kDim];
  ASSERT_TRUE(cache.Sparse("emb", &key, 1, row, nullptr).ok());
  ASSERT_TRUE(cache.Sparse("emb_ttl", &key, 1, row, nullptr).ok());
  const uint64_t pulls = cache.stats().sparse_pulls;
  std::this_thread::sleep_for(200ms);  // past the 100 ms age bound
  ASSERT_TRUE(cache.Sparse("emb", &key, 1, row, nullptr).ok());
  EXPECT_EQ(cache.stats().sparse_pulls, pulls) << "notices flow: no age bound for 'emb'";
  ASSERT_TRUE(cache.Sparse("emb_ttl", &key, 1, row, nullptr).ok());
  EXPECT_EQ(cache.stats().sparse_pulls, pulls + 1) << "'emb_ttl' rows must be re-pulled by age";
  cache.Stop();
}

TEST_F(ParamCacheTest, RowsEvictedForMaxRowsAreNamedInNoticesAndReadFresh) {
  // A max_rows eviction happens in the push that makes room, and that push's notice names
  // the evicted rows: the cache trusts such a table under notices (no age bound) and
  // still drops a row the moment the shards evict it.
  ps::TableSpec capped = SparseSpec();
  capped.name = "emb_cap";
  capped.max_rows = 2;  // per shard: one stripe of 2 rows
  ASSERT_TRUE(writer_->CreateTable(capped).ok());
  ParamCacheOptions o;
  o.sparse.max_age_ms = 100;
  ParamCache cache(reader_.get(), o);
  cache.AddSparse("emb_cap", kDim);
  cache.Start();
  ASSERT_GE(MsUntil(3000, [&] { return cache.stats().shards_noticing == 2; }), 0);
  const uint64_t key = 1;
  const std::vector<float> g(kDim, 1.0f);
  ps::PushReply r;
  ASSERT_TRUE(writer_->PushSparse("emb_cap", &key, 1, g.data(), {}, &r).Wait().ok());
  float row[kDim];
  ASSERT_GE(MsUntil(3000,
                    [&] {
                      return cache.Sparse("emb_cap", &key, 1, row, nullptr).ok() && row[0] == -1.0f;
                    }),
            0);
  const uint64_t pulls = cache.stats().sparse_pulls;
  std::this_thread::sleep_for(200ms);  // past the 100 ms age bound
  ASSERT_TRUE(cache.Sparse("emb_cap", &key, 1, row, nullptr).ok());
  EXPECT_EQ(cache.stats().sparse_pulls, pulls) << "notices flow: no age bound for 'emb_cap'";
  // Twenty other rows, about ten a shard: key 1 is the least recently used and goes.
  std::vector<uint64_t> others;
  for (uint64_t k = 100; k < 120; ++k) others.push_back(k);
  const std::vector<float> zeros(others.size() * kDim, 0.0f);
  ASSERT_TRUE(writer_->PushSparse("emb_cap", others.data(), others.size(), zeros.data(), {}, &r)
                  .Wait()
                  .ok());
  EXPECT_GE(MsUntil(3000,
                    [&] {
                      return cache.Sparse("emb_cap", &key, 1, row, nullptr).ok() && row[0] == 0.0f;
                    }),
            0)
      << "the evicted row still reads " << row[0] << " from the cache";
  cache.Stop();
}

TEST_F(ParamCacheTest, AnIdleClusterCostsHeartbeatsNotPulls) {
  ParamCacheOptions o;
  o.notice_wait_ms = 200;
  auto cache = MakeCache(o);
  cache->Start();
  ASSERT_GE(MsUntil(3000, [&] { return cache->stats().shards_noticing == 2; }), 0);
  ReadDense(*cache);
  uint64_t key = 1;
  float row[kDim];
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, row, nullptr).ok());
  const auto before = cache->stats();
  // Several heartbeats; with the default 500 ms age bound the copies would be re-pulled.
  std::this_thread::sleep_for(1200ms);
  ReadDense(*cache);
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, row, nullptr).ok());
  const auto after = cache->stats();
  EXPECT_EQ(after.dense_pulls + after.refresher_pulls, before.dense_pulls + before.refresher_pulls);
  EXPECT_EQ(after.sparse_pulls, before.sparse_pulls);
  EXPECT_EQ(after.shards_noticing, 2u) << "heartbeats keep the notices live";
  cache->Stop();
}

// A shard that restarts from an older checkpoint goes back to a version below what this
// worker saw of it through its own push replies (which its watch does not name): the
// worker notices at the next heartbeat and drops what it holds of that shard, instead of
// serving rows the shard no longer has until the age bound, or forever while notices flow.
TEST_F(ParamCacheTest, AShardThatWentBackIsNoticedAndWhatItHeldIsDropped) {
  char tmpl[] = "/tmp/onlineps-cache-back-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  reader_.reset();
  writer_.reset();
  for (auto& srv : servers_) srv->Stop();
  checkpoint_dir_ = dir;
  StartAll({UniqueMemName(), UniqueMemName()});
  ParamCacheOptions o;
  o.sparse.max_age_ms = 60'000;
  o.dense.max_age_ms = 60'000;
  o.notice_wait_ms = 200;
  auto cache = MakeCache(o);
  cache->Start();
  ASSERT_GE(MsUntil(3000, [&] { return cache->stats().shards_noticing == 2; }), 0);
  const uint64_t key = KeysOnShard(0, 1)[0];
  const std::string ckpt = servers_[0]->checkpoint_path();
  auto written = servers_[0]->Checkpoint();
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  ASSERT_EQ(*written, ckpt);
  const std::string older = dir + "/older.ckpt";
  std::filesystem::copy_file(ckpt, older);
  // This worker's own pushes (through the cache's client), installed from their replies.
  std::vector<float> dense_grad(kDenseSize, 1.0f);
  ps::PushReply dense_reply;
  ASSERT_TRUE(reader_->PushDense("w", dense_grad.data(), {}, &dense_reply).Wait().ok());
  ASSERT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, -1.0f));
  const std::vector<float> grad = {1, 2}, values = {-1, -2};
  ps::PushReply reply;
  ASSERT_TRUE(reader_->PushSparse("emb", &key, 1, grad.data(), {}, &reply).Wait().ok());
  cache->InstallRows("emb", &key, 1, values.data(), reply.versions, Now());
  float row[kDim];
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, row, nullptr).ok());
  ASSERT_EQ(std::vector<float>(row, row + kDim), values);
  // Shard 0 stops and comes back from the checkpoint before those pushes.
  servers_[0]->Stop();
  servers_[0].reset();
  for (const auto& f : std::filesystem::directory_iterator(dir)) {
    if (f.path().filename().string().rfind("shard-0-", 0) == 0) std::filesystem::remove(f.path());
  }
  std::filesystem::rename(older, ckpt);
  StartShard(0);
  const int64_t ms = MsUntil(5000, [&] {
    float r[kDim];
    return cache->Sparse("emb", &key, 1, r, nullptr).ok() && r[0] == 0 && r[1] == 0;
  });
  EXPECT_GE(ms, 0) << "the row the shard lost is still served";
  // Dense: shard 0's slice is back to its initial values too.
  EXPECT_GE(MsUntil(5000,
                    [&] {
                      auto d = cache->Dense("w");
                      return d.ok() && (*d)->values != std::vector<float>(kDenseSize, -1.0f);
                    }),
            0)
      << "the dense slice the shard lost is still served";
  cache->Stop();
  reader_.reset();
  writer_.reset();
  for (auto& srv : servers_) srv->Stop();
  std::filesystem::remove_all(dir);
}

TEST_F(ParamCacheTest, AShardBackAtTheVersionThisWorkerHeldWithOtherRowsIsNoticed) {
  char tmpl[] = "/tmp/onlineps-cache-aba-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  reader_.reset();
  writer_.reset();
  for (auto& srv : servers_) srv->Stop();
  checkpoint_dir_ = dir;
  StartAll({UniqueMemName(), UniqueMemName()});
  const std::vector<uint64_t> keys = KeysOnShard(0, 2);
  const uint64_t key = keys[0], other = keys[1];
  const std::string ckpt = servers_[0]->checkpoint_path();
  auto restart_from = [&](const std::string& copy) {
    servers_[0]->Stop();
    servers_[0].reset();
    for (const auto& f : std::filesystem::directory_iterator(dir)) {
      if (f.path().filename().string().rfind("shard-0-", 0) == 0) std::filesystem::remove(f.path());
    }
    std::filesystem::copy_file(copy, ckpt);
    StartShard(0);
  };
  // Two histories of shard 0 from version v: "b" pushed `other` to v + 1.
  ASSERT_TRUE(servers_[0]->Checkpoint().ok());
  const std::string base = dir + "/base.ckpt", b = dir + "/b.ckpt";
  std::filesystem::copy_file(ckpt, base);
  PushRow(other, {5, 5});
  ASSERT_TRUE(servers_[0]->Checkpoint().ok());
  std::filesystem::copy_file(ckpt, b);
  restart_from(base);
  ParamCacheOptions o;
  o.sparse.max_age_ms = 60'000;
  o.notice_wait_ms = 200;
  auto cache = MakeCache(o);
  cache->Start();
  ASSERT_GE(MsUntil(3000, [&] { return cache->stats().shards_noticing == 2; }), 0);
  // The other history pushes `key` to v + 1; the worker holds that row, noticed at v + 1.
  PushRow(key, {1, 2});
  float row[kDim];
  std::this_thread::sleep_for(600ms);  // the notice of v + 1 came
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, row, nullptr).ok());
  ASSERT_EQ(row[0], -1);
  // Shard 0 comes back from "b": at v + 1 too, where `key` was never pushed.
  restart_from(b);
  std::this_thread::sleep_for(1500ms);
  ASSERT_EQ(cache->stats().shards_noticing, 2u);
  ASSERT_TRUE(cache->Sparse("emb", &key, 1, row, nullptr).ok());
  EXPECT_EQ(std::vector<float>(row, row + kDim), std::vector<float>(kDim, 0.0f))
      << "the row of the history the shard lost is still served";
  cache->Stop();
  reader_.reset();
  writer_.reset();
  for (auto& srv : servers_) srv->Stop();
  std::filesystem::remove_all(dir);
}

class ParamCacheDeadShardTest : public ParamCacheTest {
 protected:
  void SetUp() override {
    const int p0 = FreeTcpPort(), p1 = FreeTcpPort();
    ASSERT_GT(p0, 0);
    ASSERT_GT(p1, 0);
    StartAll({"tcp://127.0.0.1:" + std::to_string(p0), "tcp://127.0.0.1:" + std::to_string(p1)});
  }
};

TEST_F(ParamCacheDeadShardTest, PullFromDeadShardFailsAndRecoversAfterRestart) {
  ParamCacheOptions o;
  o.dense.max_age_ms = 20;
  o.sparse.max_age_ms = 20;
  auto cache = MakeCache(o);
  ASSERT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, 0.0f));
  servers_[1]->Stop();
  servers_[1].reset();
  std::this_thread::sleep_for(50ms);
  auto dead = cache->Dense("w");
  ASSERT_FALSE(dead.ok());
  EXPECT_EQ(dead.status().code(), StatusCode::kDeadlineExceeded) << dead.status().ToString();
  const auto k0 = KeysOnShard(0, 1), k1 = KeysOnShard(1, 1);
  float out[kDim];
  EXPECT_FALSE(cache->Sparse("emb", &k1[0], 1, out, nullptr).ok());
  EXPECT_TRUE(cache->Sparse("emb", &k0[0], 1, out, nullptr).ok());  // shard 0 is up

  // Concurrent readers share one failed pull instead of timing out one after another.
  std::atomic<int> errors{0};
  std::vector<std::thread> readers;
  const int64_t t0 = Now();
  for (int i = 0; i < 8; ++i) {
    readers.emplace_back([&] { errors += !cache->Dense("w").ok(); });
  }
  for (auto& t : readers) t.join();
  EXPECT_EQ(errors.load(), 8);
  EXPECT_LT(Now() - t0, 4 * 300) << "8 readers, 300 ms timeout";

  StartShard(1);
  ASSERT_TRUE(writer_->CreateTable(DenseSpec()).ok());  // the new shard 1 starts empty
  ASSERT_TRUE(writer_->CreateTable(SparseSpec()).ok());
  PushDense(1.0f);
  EXPECT_EQ(ReadDense(*cache), std::vector<float>(kDenseSize, -1.0f));
  EXPECT_TRUE(cache->Sparse("emb", &k1[0], 1, out, nullptr).ok());
  EXPECT_EQ(cache->stats().dense_pulls, 2u);
}

}  // namespace
}  // namespace onlineps::worker
