// Real processes on loopback: 2 onlineps_ps shard processes and 2 onlineps_ps_cli client
// processes pushing concurrently; the final parameters must equal the exact expected sum.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "ps/ps_client.h"
#include "tests/subprocess.h"

namespace onlineps::ps {
namespace {

using std::chrono::milliseconds;
using testing::Subprocess;

constexpr int kWorkers = 2, kPushes = 60;
constexpr uint64_t kDense = 1000, kKeys = 64;
constexpr uint32_t kDim = 4;

// The gradient pattern of onlineps_ps_cli push-pattern, restated here independently.
float Pattern(int worker, int step, uint64_t i) {
  return static_cast<float>(static_cast<int>((worker * 7 + step * 3 + i) % 5) - 2);
}

std::unique_ptr<Subprocess> StartShard(int index, const std::string& ckpt_dir, std::string* ep) {
  auto p = std::make_unique<Subprocess>(std::vector<std::string>{
      ONLINEPS_BIN_DIR "/onlineps_ps", "--shard-index", std::to_string(index), "--num-shards", "2",
      "--listen", "tcp://127.0.0.1:0", "--admin-port", "-1", "--checkpoint-dir", ckpt_dir,
      "--log-level", "warn"});
  *ep = p->WaitForLine("LISTENING ", milliseconds(10000));
  return p;
}

class MultiProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("onlineps-mp-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    for (int i = 0; i < 2; ++i) {
      shards_.push_back(StartShard(i, dir_.string(), &endpoints_[i]));
      ASSERT_FALSE(endpoints_[i].empty()) << "shard " << i << " did not start";
    }
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // Pulls both tables and compares with the exact expected values.
  void ExpectExactParameters() {
    PsClientOptions o;
    o.shards = {endpoints_[0], endpoints_[1]};
    auto client = PsClient::Connect(o);
    ASSERT_TRUE(client.ok());
    ASSERT_TRUE((*client)->WaitForShards(milliseconds(5000)).ok());
    std::vector<float> dense(kDense);
    VersionVector v;
    ASSERT_TRUE((*client)->PullDense("pattern_dense", dense.data(), &v).Wait().ok());
    EXPECT_EQ(v[0] + v[1], 2u * kWorkers * kPushes) << "each push bumps both shards' version";
    for (uint64_t i = 0; i < kDense; ++i) {
      float expect = 0;
      for (int m = 0; m < kWorkers; ++m)
        for (int s = 0; s < kPushes; ++s) expect -= Pattern(m, s, i);
      ASSERT_EQ(dense[i], expect) << "dense element " << i;
    }
    std::vector<uint64_t> keys(kKeys);
    for (uint64_t k = 0; k < kKeys; ++k) keys[k] = k * 0x9e3779b97f4a7c15ULL;
    std::vector<float> rows(kKeys * kDim);
    ASSERT_TRUE(
        (*client)->PullSparse("pattern_sparse", keys.data(), kKeys, rows.data(), &v).Wait().ok());
    for (uint64_t k = 0; k < kKeys; ++k) {
      for (uint32_t j = 0; j < kDim; ++j) {
        float expect = 0;
        for (int m = 0; m < kWorkers; ++m)
          for (int s = 0; s < kPushes; ++s) expect -= Pattern(m, s, k + j);
        ASSERT_EQ(rows[k * kDim + j], expect) << "row " << k << " col " << j;
      }
    }
  }

  std::filesystem::path dir_;
  std::string endpoints_[2];
  std::vector<std::unique_ptr<Subprocess>> shards_;
};

TEST_F(MultiProcessTest, ConcurrentClientsGiveExactParametersAndSurviveRestart) {
  std::vector<std::unique_ptr<Subprocess>> clients;
  for (int m = 0; m < kWorkers; ++m) {
    clients.push_back(std::make_unique<Subprocess>(std::vector<std::string>{
        ONLINEPS_BIN_DIR "/onlineps_ps_cli", "--shards", endpoints_[0] + "," + endpoints_[1],
        "--log-level", "warn", "push-pattern", "--worker", std::to_string(m), "--pushes",
        std::to_string(kPushes), "--dense-size", std::to_string(kDense), "--sparse-keys",
        std::to_string(kKeys)}));
  }
  for (auto& c : clients) EXPECT_EQ(c->Wait(milliseconds(60000)), 0);
  ExpectExactParameters();

  // SIGTERM drains and checkpoints; restarted shards serve the same parameters.
  for (auto& s : shards_) EXPECT_EQ(s->Stop(SIGTERM, milliseconds(10000)), 0);
  EXPECT_TRUE(std::filesystem::exists(dir_ / "shard-0-of-2.ckpt"));
  EXPECT_TRUE(std::filesystem::exists(dir_ / "shard-1-of-2.ckpt"));
  shards_.clear();
  for (int i = 0; i < 2; ++i) {
    shards_.push_back(StartShard(i, dir_.string(), &endpoints_[i]));
    ASSERT_FALSE(endpoints_[i].empty());
  }
  ExpectExactParameters();
  for (auto& s : shards_) EXPECT_EQ(s->Stop(SIGTERM, milliseconds(10000)), 0);
}

// Incremental checkpoints through real processes: a full checkpoint, then a delta of the
// rows pushed since; shards killed with SIGKILL (no final checkpoint) restart from the
// full file and the delta after it, and serve what they held at the delta's cut.
TEST_F(MultiProcessTest, SigkilledShardsRestoreAFullCheckpointAndTheDeltaAfterIt) {
  PsClientOptions o;
  o.shards = {endpoints_[0], endpoints_[1]};
  auto client = PsClient::Connect(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->WaitForShards(milliseconds(5000)).ok());
  TableSpec spec;
  spec.name = "rows";
  spec.kind = TableKind::kSparse;
  spec.dim = 16;
  spec.optimizer = "adagrad";
  ASSERT_TRUE((*client)->CreateTable(spec).ok());
  std::vector<uint64_t> keys(20000);
  for (uint64_t k = 0; k < keys.size(); ++k) keys[k] = k * 0x9e3779b97f4a7c15ULL + 1;
  auto push = [&](size_t first, size_t n, int step) {
    std::vector<float> g(n * 16);
    for (size_t i = 0; i < g.size(); ++i) g[i] = Pattern(0, step, i);
    ASSERT_TRUE(
        (*client)->PushSparse("rows", keys.data() + first, n, g.data(), {}, nullptr).Wait().ok());
  };
  push(0, 18000, 1);
  ASSERT_TRUE((*client)->Checkpoint().ok());
  push(1000, 1500, 2);  // a few rows pushed again, 2,000 new ones
  push(18000, 2000, 3);
  ASSERT_TRUE((*client)->Checkpoint().ok());
  std::vector<float> before(keys.size() * 16);
  VersionVector v_before;
  ASSERT_TRUE((*client)
                  ->PullSparse("rows", keys.data(), keys.size(), before.data(), &v_before)
                  .Wait()
                  .ok());
  client->reset();
  for (int i = 0; i < 2; ++i) {
    const auto full = dir_ / ("shard-" + std::to_string(i) + "-of-2.ckpt");
    const auto delta = dir_ / ("shard-" + std::to_string(i) + "-of-2.ckpt.d1");
    ASSERT_TRUE(std::filesystem::exists(full));
    ASSERT_TRUE(std::filesystem::exists(delta)) << "the second checkpoint is a delta";
    EXPECT_LT(std::filesystem::file_size(delta) * 3, std::filesystem::file_size(full));
  }
  for (auto& s : shards_) s->Stop(SIGKILL, milliseconds(10000));
  shards_.clear();
  for (int i = 0; i < 2; ++i) {
    shards_.push_back(StartShard(i, dir_.string(), &endpoints_[i]));
    ASSERT_FALSE(endpoints_[i].empty());
  }
  o.shards = {endpoints_[0], endpoints_[1]};
  client = PsClient::Connect(o);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->WaitForShards(milliseconds(5000)).ok());
  ASSERT_TRUE((*client)->OpenTable("rows").ok());
  std::vector<float> after(keys.size() * 16);
  VersionVector v_after;
  ASSERT_TRUE(
      (*client)->PullSparse("rows", keys.data(), keys.size(), after.data(), &v_after).Wait().ok());
  EXPECT_EQ(v_after, v_before);
  EXPECT_EQ(std::memcmp(after.data(), before.data(), after.size() * sizeof(float)), 0);
  client->reset();
  for (auto& s : shards_) EXPECT_EQ(s->Stop(SIGTERM, milliseconds(10000)), 0);
}

// The demo's shard killed under it: every call fails, and the demo says so and exits 1
// (its monitor returned with the worker threads running: "terminate called", exit 134).
TEST(PsCliDemoTest, AShardKilledMidDemoIsAnErrorNotAnAbort) {
  std::string ep;
  auto shard = std::make_unique<Subprocess>(
      std::vector<std::string>{ONLINEPS_BIN_DIR "/onlineps_ps", "--listen", "tcp://127.0.0.1:0",
                               "--admin-port", "-1", "--log-level", "warn"});
  ep = shard->WaitForLine("LISTENING ", milliseconds(10000));
  ASSERT_FALSE(ep.empty());
  Subprocess demo({ONLINEPS_BIN_DIR "/onlineps_ps_cli", "--shards", ep, "--timeout-ms", "1000",
                   "--log-level", "off", "demo", "--steps", "100000000"},
                  /*with_stderr=*/true);
  ASSERT_FALSE(demo.WaitForLine("pushes applied", milliseconds(10000)).empty());
  shard->Stop(SIGKILL, milliseconds(5000));
  const std::string out = demo.ReadToEnd(milliseconds(30000));
  EXPECT_EQ(demo.Wait(milliseconds(30000)), 1) << out;
  EXPECT_EQ(out.find("terminate called"), std::string::npos) << out;
  EXPECT_NE(out.find("onlineps_ps_cli"), std::string::npos) << out;
}

}  // namespace
}  // namespace onlineps::ps
