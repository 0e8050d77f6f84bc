// SIGTERM under load, one case per binary, through the real processes on loopback: the
// process stops taking new work, answers what it has already read, exits 0 well inside
// a pod's grace period, and every update it acknowledged is in the model afterwards.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <atomic>
#include <filesystem>
#include <mutex>
#include <thread>

#include "ps/ps_client.h"
#include "tests/bridge/bridge_cluster.h"
#include "worker/worker_client.h"

namespace onlineps::testing {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kGrace{15000};  // well under the manifests' 30 s grace period
constexpr int kThreads = 4;

// When each call started and ended, and whether it got a complete successful answer.
struct CallLog {
  std::mutex mu;
  std::vector<std::tuple<Clock::time_point, Clock::time_point, bool>> calls;
  void Add(Clock::time_point start, bool ok) {
    std::lock_guard<std::mutex> lock(mu);
    calls.emplace_back(start, Clock::now(), ok);
  }
  // Calls that were in flight when the signal was sent and still succeeded after it.
  int CompletedAcross(Clock::time_point signal) {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const auto& [start, end, ok] : calls) n += ok && start < signal && end > signal;
    return n;
  }
  // Calls started well before the signal (the process had surely read them) that failed.
  int FailedBefore(Clock::time_point signal, milliseconds margin) {
    std::lock_guard<std::mutex> lock(mu);
    int n = 0;
    for (const auto& [start, end, ok] : calls) n += !ok && start + margin < signal;
    return n;
  }
};

std::string TempDir() {
  std::string dir = (std::filesystem::temp_directory_path() / "onlineps-drain.XXXXXX").string();
  return mkdtemp(dir.data()) ? dir : "";
}

std::unique_ptr<Subprocess> StartShard(const std::string& dir, std::string* endpoint) {
  auto p = std::make_unique<Subprocess>(std::vector<std::string>{
      ONLINEPS_BIN_DIR "/onlineps_ps", "--shard-index", "0", "--num-shards", "1", "--listen",
      "tcp://127.0.0.1:0", "--admin-port", "-1", "--checkpoint-dir", dir, "--log-level", "warn"});
  *endpoint = p->WaitForLine("LISTENING ", kProcessStart);
  return p;
}

std::unique_ptr<ps::PsClient> ConnectPs(const std::string& endpoint, milliseconds timeout) {
  ps::PsClientOptions o;
  o.shards = {endpoint};
  o.timeout = timeout;
  auto c = ps::PsClient::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// Pushes applied to the text model's embedding table (each learn pushes it once).
uint64_t EmbedVersion(const std::string& shard) {
  auto client = ConnectPs(shard, milliseconds(5000));
  if (!client || !client->OpenTable("text/embed").ok()) return 0;
  uint64_t key = 1;
  std::vector<float> row(64);
  ps::VersionVector v;
  if (!client->PullSparse("text/embed", &key, 1, row.data(), &v).Wait().ok()) return 0;
  return v.empty() ? 0 : v[0];
}

json TextExamples(int n, int salt) {
  json examples = json::array();
  for (int i = 0; i < n; ++i) {
    const bool pos = (i + salt) % 2 == 0;
    examples.push_back({{"text", (pos ? "lovely warm film number " : "dull cold mess number ") +
                                     std::to_string(i * 7 + salt)},
                        {"label", pos ? "positive" : "negative"}});
  }
  return examples;
}

// A shard under 4 pushing threads: SIGTERM, exit 0, then the checkpoint it wrote on the
// way out holds every acknowledged push (and none that was never sent).
TEST(DrainTest, ShardUnderLoadKeepsEveryAcknowledgedPush) {
  const std::string dir = TempDir();
  ASSERT_FALSE(dir.empty());
  std::string ep;
  auto shard = StartShard(dir, &ep);
  ASSERT_FALSE(ep.empty());
  auto client = ConnectPs(ep, milliseconds(1000));
  ASSERT_TRUE(client);
  ps::TableSpec spec;
  spec.name = "drain";
  spec.shape = {256};
  spec.optimizer_params = {{"lr", 1.0}};
  ASSERT_TRUE(client->CreateTable(spec).ok());

  std::atomic<uint64_t> sent{0}, acked{0};
  CallLog log;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      const std::vector<float> ones(256, 1.0f);
      for (;;) {
        sent++;
        const auto start = Clock::now();
        const bool ok = client->PushDense("drain", ones.data(), {}, nullptr).Wait().ok();
        log.Add(start, ok);
        if (!ok) return;
        acked++;
      }
    });
  }
  while (acked.load() < 2000) std::this_thread::sleep_for(milliseconds(1));
  const auto signal = Clock::now();
  const auto t0 = Clock::now();
  EXPECT_EQ(shard->Stop(SIGTERM, kGrace), 0);
  const double stop_s = std::chrono::duration<double>(Clock::now() - t0).count();
  for (auto& t : threads) t.join();
  client.reset();
  EXPECT_GE(log.CompletedAcross(signal), 1) << "no push in flight at SIGTERM was answered";

  auto restarted = StartShard(dir, &ep);
  ASSERT_FALSE(ep.empty());
  auto reader = ConnectPs(ep, milliseconds(5000));
  ASSERT_TRUE(reader);
  ASSERT_TRUE(reader->OpenTable("drain").ok());
  std::vector<float> w(256);
  ps::VersionVector v;
  ASSERT_TRUE(reader->PullDense("drain", w.data(), &v).Wait().ok());
  ASSERT_EQ(v.size(), 1u);
  EXPECT_GE(v[0], acked.load()) << "an acknowledged push is missing after the restart";
  EXPECT_LE(v[0], sent.load());
  // Plain SGD with lr 1 on a gradient of ones, from zeros: w = -pushes applied.
  EXPECT_FLOAT_EQ(w[0], -static_cast<float>(v[0]));
  EXPECT_FLOAT_EQ(w[255], -static_cast<float>(v[0]));
  std::printf(
      "shard: %llu pushes sent, %llu acknowledged, %llu in the checkpoint; stop took %.2f s\n",
      static_cast<unsigned long long>(sent.load()), static_cast<unsigned long long>(acked.load()),
      static_cast<unsigned long long>(v[0]), stop_s);
  EXPECT_EQ(restarted->Stop(SIGTERM, kGrace), 0);
  std::filesystem::remove_all(dir);
}

// A worker under 4 learning clients: SIGTERM, exit 0; learns it had read are answered,
// and every learn it acknowledged as applied is in the shard.
TEST(DrainTest, WorkerUnderLoadAnswersWhatItReadAndLosesNoAcknowledgedLearn) {
  BridgeCluster cluster;
  ASSERT_TRUE(cluster.StartShard());
  Subprocess worker({ONLINEPS_BIN_DIR "/onlineps_worker", "--ps", cluster.shard_endpoint(),
                     "--listen", "tcp://127.0.0.1:0", "--model", "text", "--labels",
                     "negative,positive", "--lr", "0.5", "--admin-port", "-1", "--log-level",
                     "warn"});
  const std::string ep = worker.WaitForLine("LISTENING ", kProcessStart);
  ASSERT_FALSE(ep.empty());

  std::atomic<uint64_t> sent{0}, acked{0};
  CallLog log;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      worker::WorkerClientOptions o;
      o.endpoint = ep;
      o.timeout = milliseconds(3000);
      auto c = worker::WorkerClient::Connect(o);
      if (!c.ok()) return;
      for (int k = 0;; ++k) {
        sent++;
        const auto start = Clock::now();
        auto r = (*c)->Call(Op::kLearn, {{"examples", TextExamples(32, t * 1000 + k)}});
        const bool ok = r.ok() && r->value("outcome", "") == "applied";
        log.Add(start, ok);
        if (!r.ok()) return;
        if (ok) acked++;
      }
    });
  }
  while (acked.load() < 60) std::this_thread::sleep_for(milliseconds(1));
  const auto signal = Clock::now();
  EXPECT_EQ(worker.Stop(SIGTERM, kGrace), 0);
  for (auto& t : threads) t.join();
  EXPECT_GE(log.CompletedAcross(signal), 1) << "no learn in flight at SIGTERM was answered";
  EXPECT_EQ(log.FailedBefore(signal, milliseconds(100)), 0)
      << "a learn sent well before SIGTERM got no answer";
  const uint64_t applied = EmbedVersion(cluster.shard_endpoint());
  EXPECT_GE(applied, acked.load()) << "an acknowledged learn is missing";
  EXPECT_LE(applied, sent.load());
  std::printf("worker: %llu learns sent, %llu acknowledged, %llu applied\n",
              static_cast<unsigned long long>(sent.load()),
              static_cast<unsigned long long>(acked.load()),
              static_cast<unsigned long long>(applied));
}

// The bridge under 4 MCP clients (a new connection per call): SIGTERM, exit 0; calls it
// had accepted finish with a full answer, and every acknowledged learn is in the shard.
TEST(DrainTest, BridgeUnderLoadFinishesAcceptedCallsAndLosesNoAcknowledgedLearn) {
  BridgeCluster cluster;
  ASSERT_TRUE(cluster.StartShard());
  const std::string w = cluster.StartWorker();
  ASSERT_FALSE(w.empty());
  const int port = cluster.StartBridge({w}, {"--learn-chunk", "8"});
  ASSERT_GT(port, 0);

  std::atomic<uint64_t> sent{0}, acked{0};
  std::atomic<int> ready{0};
  CallLog log;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      McpHttp c(port);
      if (c.Initialize().empty()) return;
      ready++;
      c.set_keep_alive(false);
      for (int k = 0;; ++k) {
        sent++;
        const auto start = Clock::now();
        int status = 0;
        // 32 examples in chunks of 8: four worker round trips per call.
        json r = c.Call("learn", {{"examples", TextExamples(32, t * 1000 + k)}}, &status);
        const bool ok = status == 200 && !r.value("isError", true) &&
                        r["structuredContent"]["outcome"] == "applied";
        log.Add(start, ok);
        if (status != 200) return;
        if (ok) acked++;
      }
    });
  }
  while (acked.load() < 40) std::this_thread::sleep_for(milliseconds(1));
  EXPECT_EQ(ready.load(), kThreads);
  const auto signal = Clock::now();
  EXPECT_EQ(cluster.StopBridge(), 0);
  for (auto& t : threads) t.join();
  EXPECT_GE(log.CompletedAcross(signal), 1) << "no call in flight at SIGTERM was answered";
  EXPECT_EQ(log.FailedBefore(signal, milliseconds(100)), 0)
      << "a call sent well before SIGTERM got no full answer";
  // A learn of 4 chunks pushes the embedding 4 times.
  const uint64_t applied = EmbedVersion(cluster.shard_endpoint());
  EXPECT_GE(applied, 4 * acked.load()) << "an acknowledged learn is missing";
  EXPECT_LE(applied, 4 * sent.load());
  std::printf("bridge: %llu learns sent, %llu acknowledged, %llu chunk pushes applied\n",
              static_cast<unsigned long long>(sent.load()),
              static_cast<unsigned long long>(acked.load()),
              static_cast<unsigned long long>(applied));
}

}  // namespace
}  // namespace onlineps::testing
