// Pushes through a fault-injecting client transport (tests/common/fault_transport.h) to real
// shard servers on loopback ZeroMQ: with messages dropped, duplicated, delayed and
// reordered in both directions, every acknowledged push is applied exactly once.
#include <gtest/gtest.h>
#include <prometheus/registry.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "ps/ps_client.h"
#include "ps/shard_server.h"
#include "tests/common/fault_transport.h"

namespace onlineps::ps {
namespace {

using std::chrono::milliseconds;

constexpr int kShards = 2;
constexpr int kPushes = 400;  // one key each, so a lost or doubled push shows in its value

struct Cluster {
  std::vector<std::unique_ptr<ShardServer>> servers;
  std::vector<std::string> endpoints;
  Cluster() {
    for (uint32_t i = 0; i < kShards; ++i) {
      ShardServerOptions o;
      o.shard = i;
      o.num_shards = kShards;
      o.listen = "tcp://127.0.0.1:0";
      servers.push_back(std::make_unique<ShardServer>(o, std::make_shared<prometheus::Registry>()));
      auto ep = servers.back()->Start();
      EXPECT_TRUE(ep.ok()) << ep.status().ToString();
      endpoints.push_back(ep.ok() ? *ep : "");
    }
  }
  ~Cluster() {
    for (auto& s : servers) s->Stop();
  }
};

std::unique_ptr<PsClient> Connect(const Cluster& c, FaultOptions faults) {
  PsClientOptions o;
  o.shards = c.endpoints;
  o.attempt_timeout = milliseconds(60);
  o.timeout = milliseconds(20000);
  o.transport.decorate = FaultInjection(std::move(faults));
  auto client = PsClient::Connect(o);
  EXPECT_TRUE(client.ok()) << client.status().ToString();
  return client.ok() ? std::move(*client) : nullptr;
}

// Pushes kPushes sparse gradients of -1 on distinct keys and a dense gradient of -1
// kPushes times (SGD, lr 1) through `faults`, 32 in flight; then reads them back
// through a clean client: every key is 1 and the dense value is kPushes.
void PushExactlyOnce(FaultOptions faults) {
  Cluster cluster;
  auto counters = std::make_shared<FaultCounters>();
  faults.counters = counters;
  {
    auto setup = Connect(cluster, {});
    ASSERT_NE(setup, nullptr);
    TableSpec sparse;
    sparse.name = "emb";
    sparse.kind = TableKind::kSparse;
    sparse.dim = 1;
    sparse.optimizer_params = {{"lr", 1.0}};
    ASSERT_TRUE(setup->CreateTable(sparse).ok());
    TableSpec dense;
    dense.name = "w";
    dense.shape = {kShards};  // an element on each shard
    dense.optimizer_params = {{"lr", 1.0}};
    ASSERT_TRUE(setup->CreateTable(dense).ok());
  }
  auto client = Connect(cluster, faults);
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->WaitForShards(milliseconds(10000)).ok());
  const float minus_one = -1;
  const std::vector<float> dense_grad(kShards, -1.0f);
  std::vector<uint64_t> keys(kPushes);
  std::vector<PushReply> replies(2 * kPushes);
  std::vector<Ticket> tickets;
  int failed = 0;
  for (int i = 0; i < kPushes; ++i) {
    keys[i] = 1000003ull * static_cast<uint64_t>(i + 1);
    tickets.push_back(client->PushSparse("emb", &keys[i], 1, &minus_one, {}, &replies[2 * i]));
    tickets.push_back(client->PushDense("w", dense_grad.data(), {}, &replies[2 * i + 1]));
    if (tickets.size() >= 32) {
      for (Ticket& t : tickets) {
        Status st = t.Wait();
        if (!st.ok()) {
          ++failed;
          ADD_FAILURE() << st.ToString();
        }
      }
      tickets.clear();
    }
  }
  for (Ticket& t : tickets) {
    Status st = t.Wait();
    if (!st.ok()) {
      ++failed;
      ADD_FAILURE() << st.ToString();
    }
  }
  ASSERT_EQ(failed, 0);
  int duplicates_seen = 0;
  for (const PushReply& r : replies) duplicates_seen += r.duplicate ? 1 : 0;
  client.reset();

  auto reader = Connect(cluster, {});
  ASSERT_NE(reader, nullptr);
  std::vector<float> values(kPushes, -7);
  ASSERT_TRUE(reader->PullSparse("emb", keys.data(), kPushes, values.data(), nullptr).Wait().ok());
  int wrong = 0;
  for (int i = 0; i < kPushes; ++i) {
    if (values[i] != 1.0f) {
      if (++wrong <= 5) ADD_FAILURE() << "key " << keys[i] << " = " << values[i] << ", want 1";
    }
  }
  EXPECT_EQ(wrong, 0) << "pushes lost or applied twice";
  std::vector<float> w(kShards, -7);
  ASSERT_TRUE(reader->PullDense("w", w.data(), nullptr).Wait().ok());
  for (float x : w) EXPECT_EQ(x, static_cast<float>(kPushes));

  // The faults did happen, in the amounts asked for (loose bounds: a PRNG).
  const double sent = static_cast<double>(counters->passed + counters->dropped);
  std::printf(
      "fault_injection_test: %llu delivered, %llu dropped, %llu duplicated, "
      "%llu reordered; %d replies marked duplicate\n",
      static_cast<unsigned long long>(counters->passed.load()),
      static_cast<unsigned long long>(counters->dropped.load()),
      static_cast<unsigned long long>(counters->duplicated.load()),
      static_cast<unsigned long long>(counters->reordered.load()), duplicates_seen);
  EXPECT_GT(sent, 4.0 * kPushes);  // each push is a request and a reply, at least
  if (faults.drop > 0) {
    EXPECT_GT(counters->dropped / sent, faults.drop / 2);
  }
  if (faults.duplicate > 0) {
    EXPECT_GT(counters->duplicated / sent, faults.duplicate / 2);
  }
  if (faults.reorder > 0) {
    EXPECT_GT(counters->reordered / sent, faults.reorder / 2);
  }
  EXPECT_EQ(counters->overflowed, 0u);
}

TEST(FaultInjectionTest, TenPercentDropsAndDuplicatesApplyEveryPushExactlyOnce) {
  FaultOptions f;
  f.drop = 0.10;
  f.duplicate = 0.10;
  f.seed = 7;
  PushExactlyOnce(f);
}

TEST(FaultInjectionTest, DelayedAndReorderedMessagesApplyEveryPushExactlyOnce) {
  FaultOptions f;
  f.drop = 0.05;
  f.duplicate = 0.10;
  f.reorder = 0.20;
  f.delay = milliseconds(2);
  f.reorder_delay = milliseconds(30);  // past attempt_timeout: resends race the originals
  f.seed = 11;
  PushExactlyOnce(f);
}

TEST(FaultInjectionTest, EverythingDroppedTimesOutWithoutApplying) {
  Cluster cluster;
  FaultOptions f;
  f.drop = 1.0;
  PsClientOptions o;
  o.shards = cluster.endpoints;
  o.attempt_timeout = milliseconds(50);
  o.timeout = milliseconds(300);
  o.transport.decorate = FaultInjection(f);
  auto client = PsClient::Connect(o);
  ASSERT_TRUE(client.ok());
  TableSpec sparse;
  sparse.name = "emb";
  sparse.kind = TableKind::kSparse;
  sparse.dim = 1;
  Status st = (*client)->CreateTable(sparse);
  EXPECT_FALSE(st.ok());
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
}

}  // namespace
}  // namespace onlineps::ps
