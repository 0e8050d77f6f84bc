// End-to-end through a real shard server and the client library, in one process.
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "ps/ps_client.h"
#include "ps/shard_server.h"

namespace onlineps::ps {
namespace {

class PsSmokeTest : public ::testing::TestWithParam<std::string> {};

// Shards 0..n-1 of n, started on the test's transport (mem:// names start with
// `mem_prefix`), and a client of all of them; stopped when it goes.
struct Cluster {
  std::vector<std::unique_ptr<ShardServer>> servers;
  std::vector<std::string> endpoints;
  std::unique_ptr<PsClient> client;
  ~Cluster() {
    client.reset();
    for (auto& s : servers) s->Stop();
  }
};

std::unique_ptr<Cluster> StartCluster(const std::string& scheme, uint32_t n,
                                      const std::string& mem_prefix) {
  auto c = std::make_unique<Cluster>();
  PsClientOptions co;
  for (uint32_t i = 0; i < n; ++i) {
    ShardServerOptions o;
    o.shard = i;
    o.num_shards = n;
    o.listen = scheme == "mem" ? "mem://" + mem_prefix + std::to_string(i) : "tcp://127.0.0.1:0";
    c->servers.push_back(
        std::make_unique<ShardServer>(o, std::make_shared<prometheus::Registry>()));
    auto ep = c->servers.back()->Start();
    if (!ep.ok()) {
      ADD_FAILURE() << ep.status().ToString();
      return nullptr;
    }
    co.shards.push_back(*ep);
  }
  c->endpoints = co.shards;
  auto client = PsClient::Connect(co);
  if (!client.ok()) {
    ADD_FAILURE() << client.status().ToString();
    return nullptr;
  }
  c->client = std::move(client).value();
  return c;
}

// A sparse table "emb" of dim 2, plain SGD with lr 1: a push of g leaves -g.
TableSpec EmbSpec() {
  TableSpec sparse;
  sparse.name = "emb";
  sparse.kind = TableKind::kSparse;
  sparse.dim = 2;
  sparse.optimizer_params = {{"lr", 1.0}};
  return sparse;
}

TEST_P(PsSmokeTest, DenseAndSparsePushThenPull) {
  auto cluster = StartCluster(GetParam(), 2, "smoke-");
  ASSERT_NE(cluster, nullptr);
  PsClient& c = *cluster->client;
  TableSpec dense;
  dense.name = "w";
  dense.shape = {5};
  dense.optimizer_params = {{"lr", 0.5}};
  ASSERT_TRUE(c.CreateTable(dense).ok());
  std::vector<float> g = {1, 2, 3, 4, 5}, w(5, -1);
  VersionVector v;
  ASSERT_TRUE(c.PullDense("w", w.data(), &v).Wait().ok());
  EXPECT_EQ(w, std::vector<float>(5, 0.0f));
  PushReply r;
  ASSERT_TRUE(c.PushDense("w", g.data(), v, &r).Wait().ok());
  EXPECT_EQ(r.max_tau, 0u);
  ASSERT_TRUE(c.PullDense("w", w.data(), &v).Wait().ok());
  EXPECT_EQ(w, (std::vector<float>{-0.5f, -1.0f, -1.5f, -2.0f, -2.5f}));

  ASSERT_TRUE(c.CreateTable(EmbSpec()).ok());
  std::vector<uint64_t> keys = {7, UINT64_MAX, 0, 12345};
  std::vector<float> sg = {1, 1, 2, 2, 3, 3, 4, 4}, out(8, 9);
  ASSERT_TRUE(c.PushSparse("emb", keys.data(), 4, sg.data(), {}, &r).Wait().ok());
  ASSERT_TRUE(c.PullSparse("emb", keys.data(), 4, out.data(), &v).Wait().ok());
  EXPECT_EQ(out, (std::vector<float>{-1, -1, -2, -2, -3, -3, -4, -4}));
}

TEST_P(PsSmokeTest, ClipNormTravelsInTheSpecAndBoundsEachPush) {
  const std::string scheme = GetParam();
  ShardServerOptions o;
  o.listen = scheme == "mem" ? "mem://smoke-clip" : "tcp://127.0.0.1:0";
  ShardServer server(o, std::make_shared<prometheus::Registry>());
  auto ep = server.Start();
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  PsClientOptions co;
  co.shards = {*ep};
  auto client = PsClient::Connect(co);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  TableSpec spec;
  spec.name = "clipped";
  spec.shape = {2};
  spec.optimizer_params = {{"lr", 1.0}};
  spec.clip_norm = 5.0;
  ASSERT_TRUE((*client)->CreateTable(spec).ok());
  auto opened = (*client)->OpenTable("clipped");
  ASSERT_TRUE(opened.ok()) << opened.status().ToString();
  EXPECT_EQ(opened->clip_norm, 5.0);
  const std::vector<float> bad = {3e4f, 4e4f};  // norm 5e4: applied as {3, 4}
  PushReply r;
  ASSERT_TRUE((*client)->PushDense("clipped", bad.data(), {}, &r).Wait().ok());
  std::vector<float> w(2);
  ASSERT_TRUE((*client)->PullDense("clipped", w.data(), nullptr).Wait().ok());
  EXPECT_NEAR(w[0], -3.0f, 1e-5);
  EXPECT_NEAR(w[1], -4.0f, 1e-5);
  server.Stop();
}

// The zero-copy sparse push (frames shared, not copied) with one shard and with two
// (split by shard), and its refusal of frames that do not make whole rows.
TEST_P(PsSmokeTest, SparsePushOfFramesAppliesAsTheArrayPush) {
  for (uint32_t shards : {1u, 2u}) {
    auto cluster = StartCluster(GetParam(), shards, "frames-" + std::to_string(shards) + "-");
    ASSERT_NE(cluster, nullptr);
    PsClient& c = *cluster->client;
    ASSERT_TRUE(c.CreateTable(EmbSpec()).ok());
    const std::vector<uint64_t> keys = {7, UINT64_MAX, 0, 12345};
    PushReply r;
    Status st = c.PushSparse("emb", Frame::FromVector(keys),
                             Frame::FromVector(std::vector<float>{1, 1, 2, 2, 3, 3, 4, 4}), {}, &r)
                    .Wait();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(r.versions.size(), shards);
    std::vector<float> out(8, 9);
    VersionVector v;
    ASSERT_TRUE(c.PullSparse("emb", keys.data(), 4, out.data(), &v).Wait().ok());
    EXPECT_EQ(out, (std::vector<float>{-1, -1, -2, -2, -3, -3, -4, -4})) << shards << " shards";
    st = c.PushSparse("emb", Frame::FromVector(keys), Frame::FromVector(std::vector<float>(7)), {},
                      nullptr)
             .Wait();
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
    EXPECT_NE(st.message().find("dim 2"), std::string::npos) << st.message();
  }
}

// A client given the shards in the wrong order, or only some of them, is told so when it
// waits for them: dense slices carry no keys a shard could check, so they would be read
// and written at the wrong shards.
TEST_P(PsSmokeTest, AShardListInTheWrongOrderOrOfTheWrongLengthIsRefused) {
  static std::atomic<int> runs{0};
  auto c = StartCluster(GetParam(), 2, "smoke-order-" + std::to_string(runs++) + "-");
  ASSERT_NE(c, nullptr);
  const std::vector<std::string> eps = c->endpoints;
  auto wait = [](std::vector<std::string> shards) {
    PsClientOptions o;
    o.shards = std::move(shards);
    auto client = PsClient::Connect(o);
    EXPECT_TRUE(client.ok()) << client.status().ToString();
    return client.ok() ? (*client)->WaitForShards(std::chrono::milliseconds(3000))
                       : client.status();
  };
  EXPECT_TRUE(wait(eps).ok());
  const Status reversed = wait({eps[1], eps[0]});
  EXPECT_EQ(reversed.code(), StatusCode::kFailedPrecondition) << reversed.ToString();
  EXPECT_NE(reversed.message().find("position 0 of the list is shard 1 of 2"), std::string::npos)
      << reversed.ToString();
  const Status partial = wait({eps[0]});
  EXPECT_EQ(partial.code(), StatusCode::kFailedPrecondition) << partial.ToString();
  EXPECT_NE(partial.message().find("shard 0 of 2"), std::string::npos) << partial.ToString();
}

std::unique_ptr<PsClient> ConnectAs(const std::vector<std::string>& shards, uint64_t sender) {
  PsClientOptions o;
  o.shards = shards;
  o.sender_id = sender;
  auto client = PsClient::Connect(o);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(client).value() : nullptr;
}

// A worker restarted with a fixed --sender-id is a new client with the old id: its seqs
// used to start at 1 again, and each shard answered its pushes as duplicates of the old
// client's ("applied", not applied). Each generation's push must move the rows.
TEST_P(PsSmokeTest, ARestartedClientWithAFixedSenderIdHasItsPushesApplied) {
  static std::atomic<int> runs{0};
  auto c = StartCluster(GetParam(), 2, "smoke-reuse-" + std::to_string(runs++) + "-");
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->client->CreateTable(EmbSpec()).ok());
  const std::vector<uint64_t> keys = {7, UINT64_MAX, 0, 12345};  // on both shards
  const std::vector<float> g(8, 1.0f);
  for (int generation = 1; generation <= 3; ++generation) {
    auto client = ConnectAs(c->endpoints, 42);
    ASSERT_NE(client, nullptr);
    for (int i = 0; i < 2; ++i) {
      PushReply r;
      const Status st = client->PushSparse("emb", keys.data(), 4, g.data(), {}, &r).Wait();
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_FALSE(r.duplicate) << "generation " << generation << " push " << i;
    }
    std::vector<float> out(8);
    ASSERT_TRUE(client->PullSparse("emb", keys.data(), 4, out.data(), nullptr).Wait().ok());
    EXPECT_EQ(out, std::vector<float>(8, -2.0f * generation)) << "generation " << generation;
  }
}

// Two clients sharing one id at the same time are not supported; the older one is told
// (its seqs fall below the window the newer one's moved up), not silently dropped.
TEST_P(PsSmokeTest, TwoLiveClientsSharingASenderIdAreRefusedVisibly) {
  static std::atomic<int> runs{0};
  auto c = StartCluster(GetParam(), 1, "smoke-twins-" + std::to_string(runs++) + "-");
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(c->client->CreateTable(EmbSpec()).ok());
  const uint64_t key = 7;
  const std::vector<float> g(2, 1.0f);
  auto older = ConnectAs(c->endpoints, 43);
  ASSERT_NE(older, nullptr);
  ASSERT_TRUE(older->PushSparse("emb", &key, 1, g.data(), {}, nullptr).Wait().ok());
  std::this_thread::sleep_for(std::chrono::milliseconds(2));
  auto newer = ConnectAs(c->endpoints, 43);
  ASSERT_NE(newer, nullptr);
  ASSERT_TRUE(newer->PushSparse("emb", &key, 1, g.data(), {}, nullptr).Wait().ok());
  const Status st = older->PushSparse("emb", &key, 1, g.data(), {}, nullptr).Wait();
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition) << st.ToString();
  EXPECT_NE(st.message().find("two clients"), std::string::npos) << st.ToString();
  std::vector<float> out(2);
  ASSERT_TRUE(newer->PullSparse("emb", &key, 1, out.data(), nullptr).Wait().ok());
  EXPECT_EQ(out, std::vector<float>(2, -2.0f));  // the two pushes answered OK, no more
}

INSTANTIATE_TEST_SUITE_P(Transports, PsSmokeTest, ::testing::Values("mem", "tcp"));

}  // namespace
}  // namespace onlineps::ps
