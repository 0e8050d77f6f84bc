// Tests of shard checkpoints (ps/checkpoint.h): a round trip restores tables (weights,
// optimizer state, Polyak average, accumulation buffer, LRU order, version) and dedup
// windows so that the restored shard behaves exactly like the original; corrupt,
// truncated, foreign and missing files are refused with the documented codes; files of
// the previous format (1, FNV checksum) still load; writes
// are atomic; and a ShardServer checkpoints at Stop() and restores at Start().
#include "ps/checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <prometheus/registry.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ps/ps_client.h"
#include "ps/replica_sidecar.h"
#include "ps/shard_server.h"

namespace onlineps::ps {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Tables = std::map<std::string, std::shared_ptr<Table>>;

std::shared_ptr<Table> NewTable(const TableSpec& spec, ShardIdentity id) {
  auto t = Table::Create(spec, id.shard, id.num_shards);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::shared_ptr<Table>(std::move(t).value()) : nullptr;
}

std::vector<float> Pull(Table& t, const std::vector<uint64_t>& keys = {}, bool averaged = false) {
  PullRequest req;
  req.sender = 1;
  req.averaged = averaged;
  req.keys = keys.data();
  req.num_keys = keys.size();
  auto r = t.Pull(req);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r->values : std::vector<float>{};
}

PushResult Push(Table& t, const std::vector<float>& g, const std::vector<uint64_t>& keys = {},
                uint64_t base = 0) {
  PushRequest req;
  req.sender = 1;
  req.base_version = base;
  req.keys = keys.data();
  req.num_keys = keys.size();
  req.values = g.data();
  req.num_values = g.size();
  auto r = t.Push(req);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : PushResult{};
}

// Deterministic, distinct gradients.
std::vector<float> Grad(size_t n, int step) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i * 5 + step * 3) % 9) * 0.25f - 1.0f;
  return g;
}

void ExpectBitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TableSpec DenseSpec() {
  TableSpec s;
  s.name = "dense";
  s.shape = {3, 5};
  s.optimizer = "adam";
  s.optimizer_params = {{"lr", 0.05}};
  s.polyak = true;
  s.accumulate = 2;
  s.init = "uniform";
  s.init_value = 0.3;
  s.seed = 11;
  return s;
}

TableSpec SparseSpec() {
  TableSpec s;
  s.name = "sparse";
  s.kind = TableKind::kSparse;
  s.dim = 3;
  s.optimizer = "adagrad";
  s.optimizer_params = {{"lr", 0.1}};
  s.polyak = true;
  s.init = "normal";
  s.init_value = 0.1;
  return s;
}

std::vector<uint64_t> ManyKeys() {  // enough to spread over all 16 lock stripes
  std::vector<uint64_t> keys;
  for (uint64_t k = 0; k < 40; ++k) keys.push_back(k * 7919 + 1);
  return keys;
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "onlineps-ckpt-XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/shard.ckpt";
  }
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(dir_, ec);
  }

  // A shard (1 of 2) with a dense Adam table holding one queued accumulated push, a
  // sparse Adagrad table, and dedup windows of two senders.
  // A restored shard equals the live one: specs, versions, sizes, weights and averages.
  template <typename Tables>
  void ExpectSameAsLive(const Tables& restored) {
    ASSERT_EQ(restored.size(), 2u);
    auto& dense = *restored.at("dense");
    auto& sparse = *restored.at("sparse");
    EXPECT_TRUE(dense.spec() == DenseSpec());
    EXPECT_TRUE(sparse.spec() == SparseSpec());
    EXPECT_EQ(dense.version(), dense_->version());
    EXPECT_EQ(sparse.version(), sparse_->version());
    EXPECT_EQ(dense.local_elements(), dense_->local_elements());
    EXPECT_EQ(sparse.Stats().rows, sparse_->Stats().rows);
    const auto keys = ManyKeys();
    ExpectBitEqual(Pull(dense), Pull(*dense_));
    ExpectBitEqual(Pull(dense, {}, true), Pull(*dense_, {}, true));
    ExpectBitEqual(Pull(sparse, keys), Pull(*sparse_, keys));
    ExpectBitEqual(Pull(sparse, keys, true), Pull(*sparse_, keys, true));
  }

  // Writes `bytes` as the checkpoint and expects it refused as DATA_LOSS naming `what`.
  void ExpectDataLoss(const std::string& bytes, const std::string& what) {
    WriteFile(path_, bytes);
    Dedup d;
    auto r = ReadCheckpoint(path_, id_, &d);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_THAT(r.status().message(), HasSubstr(what));
    EXPECT_EQ(d.senders(), 0u);
  }

  void BuildShard() {
    dense_ = NewTable(DenseSpec(), id_);
    sparse_ = NewTable(SparseSpec(), id_);
    ASSERT_NE(dense_, nullptr);
    ASSERT_NE(sparse_, nullptr);
    const size_t n = dense_->local_elements();
    for (int step = 0; step < 5; ++step) Push(*dense_, Grad(n, step));  // 2 applied, 1 queued
    ASSERT_EQ(dense_->version(), 2u);
    const auto keys = ManyKeys();
    for (int step = 0; step < 3; ++step) Push(*sparse_, Grad(keys.size() * 3, step), keys);
    Push(*sparse_, Grad(6, 9), {keys[0], keys[1]});
    tables_ = {{"dense", dense_}, {"sparse", sparse_}};
    for (uint64_t seq : {1, 2, 4}) {
      ASSERT_EQ(dedup_.Begin(100, seq), Dedup::Verdict::kNew);
      dedup_.Commit(100, seq);
    }
    ASSERT_EQ(dedup_.Begin(200, 9), Dedup::Verdict::kNew);
    dedup_.Commit(200, 9);
  }

  std::string dir_, path_;
  const ShardIdentity id_{1, 2};
  std::shared_ptr<Table> dense_, sparse_;
  Tables tables_;
  Dedup dedup_;
};

TEST_F(CheckpointTest, RoundTripRestoresTablesAndDedup) {
  BuildShard();
  auto bytes = WriteCheckpoint(path_, id_, tables_, dedup_);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(*bytes, fs::file_size(path_));

  Dedup restored_dedup;
  auto restored = ReadCheckpoint(path_, id_, &restored_dedup);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  ExpectSameAsLive(*restored);
  auto& dense = *restored->at("dense");
  auto& sparse = *restored->at("sparse");
  const auto keys = ManyKeys();

  // Later pushes give identical results: Adam moments and step count, the queued half
  // of the accumulation window, Adagrad accumulators and row Polyak counts all survived.
  const size_t n = dense_->local_elements();
  for (int step = 10; step < 13; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    PushResult a = Push(*dense_, Grad(n, step), {}, 1), b = Push(dense, Grad(n, step), {}, 1);
    EXPECT_EQ(a.version, b.version);
    EXPECT_EQ(a.tau, b.tau);
    EXPECT_EQ(a.queued, b.queued);
    ExpectBitEqual(Pull(dense), Pull(*dense_));
    ExpectBitEqual(Pull(dense, {}, true), Pull(*dense_, {}, true));
    const std::vector<uint64_t> some = {keys[0], keys[5], 123456789};
    a = Push(*sparse_, Grad(9, step), some, 2);
    b = Push(sparse, Grad(9, step), some, 2);
    EXPECT_EQ(a.version, b.version);
    EXPECT_EQ(a.tau, b.tau);
    ExpectBitEqual(Pull(sparse, keys), Pull(*sparse_, keys));
    ExpectBitEqual(Pull(sparse, some, true), Pull(*sparse_, some, true));
  }

  EXPECT_EQ(restored_dedup.Begin(100, 1), Dedup::Verdict::kDuplicate);
  EXPECT_EQ(restored_dedup.Begin(100, 4), Dedup::Verdict::kDuplicate);
  EXPECT_EQ(restored_dedup.Begin(100, 3), Dedup::Verdict::kNew);
  EXPECT_EQ(restored_dedup.Begin(200, 9), Dedup::Verdict::kDuplicate);
  EXPECT_EQ(restored_dedup.Begin(300, 1), Dedup::Verdict::kNew);
}

// A snapshot's file holds the tables as they were at the cut, while another thread
// keeps updating them (existing rows, new rows, the dense table, the dedup window)
// during the write.
TEST_F(CheckpointTest, SnapshotHoldsStateAtCutWhileUpdatesGoOn) {
  const ShardIdentity id{0, 1};
  auto dense = NewTable(DenseSpec(), id);
  auto sparse = NewTable(SparseSpec(), id);
  ASSERT_NE(dense, nullptr);
  ASSERT_NE(sparse, nullptr);
  // Enough rows that the writer takes many chunks, so updates land on both sides of it.
  std::vector<uint64_t> keys(60000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 7 + 1;
  for (int step = 0; step < 2; ++step) {
    Push(*dense, Grad(15, step));
    Push(*sparse, Grad(keys.size() * 3, step), keys);
  }
  ASSERT_EQ(dedup_.Begin(5, 1), Dedup::Verdict::kNew);
  dedup_.Commit(5, 1);
  const std::vector<float> dense_at_cut = Pull(*dense), sparse_at_cut = Pull(*sparse, keys);
  const std::vector<float> sparse_avg_at_cut = Pull(*sparse, keys, /*averaged=*/true);
  const uint64_t sparse_version = sparse->version();
  ShardSnapshot snap = SnapshotShard(id, {{"dense", dense}, {"sparse", sparse}}, dedup_);
  std::atomic<bool> stop{false};
  std::thread updater([&] {
    for (int step = 2; !stop; ++step) {
      Push(*dense, Grad(15, step));
      // The last keys first, so rows the writer has not reached yet change too.
      std::vector<uint64_t> some(keys.rbegin(), keys.rbegin() + 5000);
      some.push_back(1000000 + step);  // and a new row
      Push(*sparse, Grad(some.size() * 3, step), some);
    }
  });
  auto bytes = WriteSnapshot(path_, &snap);
  stop = true;
  updater.join();
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(*bytes, fs::file_size(path_));
  ASSERT_GT(sparse->version(), sparse_version + 1) << "no update ran during the write";
  ASSERT_EQ(dedup_.Begin(5, 2), Dedup::Verdict::kNew);
  dedup_.Commit(5, 2);
  Dedup restored_dedup;
  auto restored = ReadCheckpoint(path_, id, &restored_dedup);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  ExpectBitEqual(Pull(*restored->at("dense")), dense_at_cut);
  ExpectBitEqual(Pull(*restored->at("sparse"), keys), sparse_at_cut);
  ExpectBitEqual(Pull(*restored->at("sparse"), keys, /*averaged=*/true), sparse_avg_at_cut);
  EXPECT_EQ(restored->at("sparse")->version(), sparse_version);
  EXPECT_EQ(restored->at("sparse")->Stats().rows, keys.size());
  EXPECT_EQ(restored_dedup.Begin(5, 1), Dedup::Verdict::kDuplicate);
  EXPECT_EQ(restored_dedup.Begin(5, 2), Dedup::Verdict::kNew);  // committed after the cut
  // The live table is unharmed by the snapshot: it holds the updates made meanwhile.
  EXPECT_EQ(sparse->Stats().rows, keys.size() + (sparse->version() - sparse_version));
}

// A table's snapshot writes exactly what Save wrote at the cut, byte for byte, while
// another thread pushes (changing rows, creating rows, and in a capped table evicting
// them) and pulls (moving rows in the LRU order) during the write.
TEST_F(CheckpointTest, TableSnapshotEqualsSaveAtCutUnderConcurrentUpdates) {
  for (const bool capped : {false, true}) {
    TableSpec spec = SparseSpec();  // adagrad with a Polyak average
    if (capped) spec.max_rows = 20000;
    auto t = NewTable(spec, {0, 1});
    ASSERT_NE(t, nullptr);
    std::vector<uint64_t> keys(20000);
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 13 + 5;
    Push(*t, Grad(keys.size() * 3, 1), keys);
    Pull(*t, std::vector<uint64_t>(keys.begin(), keys.begin() + 100));  // an LRU order
    ByteWriter at_cut;
    t->Save(&at_cut);
    auto snap = t->BeginSnapshot();
    std::atomic<bool> stop{false};
    std::thread updater([&] {
      for (uint64_t step = 0; !stop; ++step) {
        std::vector<uint64_t> some(keys.rbegin() + step % 50, keys.rbegin() + step % 50 + 200);
        Push(*t, Grad(some.size() * 3, static_cast<int>(step)), some);
        Pull(*t, std::vector<uint64_t>(keys.begin() + step % 300, keys.begin() + step % 300 + 50));
        Push(*t, Grad(3, 2), {1000000 + step});  // a new row (an eviction when capped)
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // updates before the write too
    ByteWriter written;
    snap->Write(&written);
    stop = true;
    updater.join();
    EXPECT_EQ(written.buffer().size(), at_cut.buffer().size()) << (capped ? "capped" : "uncapped");
    EXPECT_TRUE(written.buffer() == at_cut.buffer()) << (capped ? "capped" : "uncapped");
    snap.reset();
    if (capped) {
      EXPECT_GT(t->Stats().evicted_rows, 0u);
    }
  }
}

TEST_F(CheckpointTest, SnapshotToAMissingDirectoryIsUnavailableNamingIt) {
  const ShardIdentity id{0, 1};
  auto table = NewTable(SparseSpec(), id);  // outlives its snapshot
  ShardSnapshot snap = SnapshotShard(id, {{"sparse", table}}, dedup_);
  auto bytes = WriteSnapshot(dir_ + "/no/such/dir/shard.ckpt", &snap);
  ASSERT_FALSE(bytes.ok());
  EXPECT_EQ(bytes.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(bytes.status().message(), HasSubstr("no/such/dir/shard.ckpt.tmp"));
}

TEST_F(CheckpointTest, SparseLruOrderSurvivesRestore) {
  TableSpec spec = SparseSpec();
  spec.name = "capped";
  spec.dim = 1;
  spec.optimizer = "sgd";
  spec.optimizer_params = {{"lr", 1.0}};
  spec.init = "constant";
  spec.init_value = 0.5;
  spec.max_rows = 3;
  auto t = NewTable(spec, id_);
  ASSERT_NE(t, nullptr);
  Push(*t, {1}, {10});
  Push(*t, {1}, {20});
  Push(*t, {1}, {30});
  Pull(*t, {10});  // LRU order, oldest first: 20, 30, 10
  ASSERT_TRUE(WriteCheckpoint(path_, id_, {{"capped", t}}, dedup_).ok());
  auto restored = ReadCheckpoint(path_, id_, &dedup_);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  Table& r = *restored->at("capped");
  EXPECT_EQ(r.Stats().rows, 3u);
  Push(*t, {1}, {40});
  Push(r, {1}, {40});  // both evict 20
  for (Table* table : {t.get(), &r}) {
    EXPECT_EQ(Pull(*table, {10, 20, 30, 40}), (std::vector<float>{-0.5f, 0.5f, -0.5f, -0.5f}));
    EXPECT_EQ(table->Stats().rows, 3u);
  }
}

TEST_F(CheckpointTest, SparseAccumulationBufferSurvivesRestore) {
  TableSpec spec = SparseSpec();
  spec.optimizer = "sgd";
  spec.optimizer_params = {{"lr", 1.0}};
  spec.polyak = false;
  spec.init = "zeros";
  spec.accumulate = 3;
  spec.accumulate_mean = false;
  auto t = NewTable(spec, id_);
  ASSERT_NE(t, nullptr);
  const std::vector<uint64_t> key = {77};
  EXPECT_TRUE(Push(*t, {1, 2, 3}, key).queued);
  EXPECT_TRUE(Push(*t, {1, 2, 3}, key).queued);
  ASSERT_TRUE(WriteCheckpoint(path_, id_, {{"sparse", t}}, dedup_).ok());
  auto restored = ReadCheckpoint(path_, id_, &dedup_);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  Table& r = *restored->at("sparse");
  // The third push completes the window on both: sum of three gradients, lr 1.
  EXPECT_FALSE(Push(*t, {1, 2, 3}, key).queued);
  EXPECT_FALSE(Push(r, {1, 2, 3}, key).queued);
  EXPECT_EQ(Pull(*t, key), (std::vector<float>{-3, -6, -9}));
  EXPECT_EQ(Pull(r, key), (std::vector<float>{-3, -6, -9}));
}

TEST_F(CheckpointTest, FlippedByteAnywhereIsDataLoss) {
  // A small shard (every byte is tried): one dense and one sparse table, one sender.
  TableSpec dense = DenseSpec(), sparse = SparseSpec();
  dense.shape = {4};
  dense.polyak = false;
  auto d = NewTable(dense, id_), s = NewTable(sparse, id_);
  ASSERT_NE(d, nullptr);
  ASSERT_NE(s, nullptr);
  Push(*d, Grad(d->local_elements(), 1));
  Push(*s, Grad(6, 1), {3, 4});
  ASSERT_EQ(dedup_.Begin(100, 1), Dedup::Verdict::kNew);
  dedup_.Commit(100, 1);
  ASSERT_TRUE(WriteCheckpoint(path_, id_, {{"dense", d}, {"sparse", s}}, dedup_).ok());
  const std::string good = ReadFile(path_);
  ASSERT_GT(good.size(), 100u);
  const std::string bad_path = dir_ + "/bad.ckpt";
  Dedup target;  // must stay untouched by every failed read
  ASSERT_EQ(target.Begin(5, 1), Dedup::Verdict::kNew);
  target.Commit(5, 1);
  for (size_t off = 0; off < good.size(); ++off) {
    std::string bad = good;
    bad[off] = static_cast<char>(bad[off] ^ 0x01);
    WriteFile(bad_path, bad);
    auto r = ReadCheckpoint(bad_path, id_, &target);
    ASSERT_FALSE(r.ok()) << "flip at byte " << off << " of " << good.size() << " went unnoticed";
    ASSERT_EQ(r.status().code(), StatusCode::kDataLoss) << off << ": " << r.status().ToString();
    // The first 8 bytes are the magic, refused before the checksum is looked at.
    if (off >= 8) {
      ASSERT_THAT(r.status().message(), HasSubstr("checksum")) << "flip at byte " << off;
    } else {
      ASSERT_THAT(r.status().message(), HasSubstr("magic")) << "flip at byte " << off;
    }
  }
  EXPECT_EQ(target.Begin(5, 1), Dedup::Verdict::kDuplicate);
  EXPECT_EQ(target.Begin(100, 1), Dedup::Verdict::kNew);
  EXPECT_EQ(target.senders(), 2u);
  EXPECT_TRUE(ReadCheckpoint(path_, id_, &target).ok());  // the original is still good
}

// A checkpoint as the code before format 2 wrote it: the same body, format 1, and the
// four-lane FNV checksum in the trailer.
std::string AsFormat1(std::string bytes) {
  const uint32_t one = 1;
  std::memcpy(bytes.data() + 8, &one, sizeof(one));
  const uint64_t sum = LegacyChecksum64(bytes.data(), bytes.size() - 8);
  std::memcpy(bytes.data() + bytes.size() - 8, &sum, sizeof(sum));
  return bytes;
}

TEST(CheckpointChecksumTest, MatchTheirPublishedVectors) {
  EXPECT_EQ(Crc32("123456789", 9), 0xcbf43926u);  // the CRC-32/ISO-HDLC check value
  EXPECT_EQ(Crc32("", 0), 0u);
  // docs/protocol.md's vectors for format 1, computed by the code that wrote it.
  EXPECT_EQ(LegacyChecksum64("", 0), 0xda58e853c9647829ULL);
  EXPECT_EQ(LegacyChecksum64("abcde", 5), 0xf314757940c4d0c5ULL);
  EXPECT_EQ(LegacyChecksum64("onlineps", 8), 0x3edf5e083d3881e4ULL);
}

TEST_F(CheckpointTest, WrittenFileIsFormat2EndingInItsCrc32) {
  BuildShard();
  ASSERT_TRUE(WriteCheckpoint(path_, id_, tables_, dedup_).ok());
  const std::string bytes = ReadFile(path_);
  uint32_t format = 0;
  std::memcpy(&format, bytes.data() + 8, sizeof(format));
  EXPECT_EQ(format, 2u);
  uint64_t trailer = 0;
  std::memcpy(&trailer, bytes.data() + bytes.size() - 8, sizeof(trailer));
  EXPECT_EQ(trailer, Crc32(bytes.data(), bytes.size() - 8));
  // The replica sidecar records the same value to recognize this very file.
  EXPECT_EQ(CheckpointTrailer(path_), trailer);
}

TEST_F(CheckpointTest, Format1FileStillLoadsAndIsStillChecked) {
  BuildShard();
  ASSERT_TRUE(WriteCheckpoint(path_, id_, tables_, dedup_).ok());
  const std::string old = AsFormat1(ReadFile(path_));
  WriteFile(path_, old);
  EXPECT_EQ(CheckpointTrailer(path_), LegacyChecksum64(old.data(), old.size() - 8));
  Dedup restored_dedup;
  auto restored = ReadCheckpoint(path_, id_, &restored_dedup);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  ExpectSameAsLive(*restored);
  EXPECT_EQ(restored_dedup.Begin(100, 4), Dedup::Verdict::kDuplicate);
  EXPECT_EQ(restored_dedup.Begin(100, 3), Dedup::Verdict::kNew);

  // Its legacy checksum is still verified: a flipped body byte is refused.
  std::string bad = old;
  bad[old.size() / 2] ^= 0x01;
  ExpectDataLoss(bad, "checksum mismatch");
}

TEST_F(CheckpointTest, UnknownFormatIsDataLossNamingIt) {
  BuildShard();
  ASSERT_TRUE(WriteCheckpoint(path_, id_, tables_, dedup_).ok());
  std::string bytes = ReadFile(path_);
  const uint32_t three = 3;
  std::memcpy(bytes.data() + 8, &three, sizeof(three));
  ExpectDataLoss(bytes, "unknown format 3");
}

TEST_F(CheckpointTest, TruncatedFileIsDataLoss) {
  BuildShard();
  ASSERT_TRUE(WriteCheckpoint(path_, id_, tables_, dedup_).ok());
  const std::string good = ReadFile(path_);
  for (size_t len : {good.size() - 1, good.size() - 8, good.size() - 9, good.size() / 2, size_t{17},
                     size_t{16}, size_t{15}, size_t{8}, size_t{0}}) {
    WriteFile(path_, good.substr(0, len));
    Dedup d;
    auto r = ReadCheckpoint(path_, id_, &d);
    ASSERT_FALSE(r.ok()) << "length " << len;
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << len << ": " << r.status().ToString();
    EXPECT_EQ(d.senders(), 0u);
  }
}

TEST_F(CheckpointTest, FileOfAnotherShardIsFailedPreconditionNamingBoth) {
  BuildShard();
  ASSERT_TRUE(WriteCheckpoint(path_, id_, tables_, dedup_).ok());  // shard 1 of 2
  Dedup d;
  auto r = ReadCheckpoint(path_, {0, 2}, &d);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("shard 1 of 2"));
  EXPECT_THAT(r.status().message(), HasSubstr("shard 0 of 2"));
  r = ReadCheckpoint(path_, {1, 3}, &d);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(r.status().message(), HasSubstr("shard 1 of 2"));
  EXPECT_THAT(r.status().message(), HasSubstr("shard 1 of 3"));
  EXPECT_EQ(d.senders(), 0u);
}

TEST_F(CheckpointTest, MissingFileIsNotFound) {
  Dedup d;
  auto r = ReadCheckpoint(dir_ + "/absent.ckpt", id_, &d);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(r.status().message(), HasSubstr("absent.ckpt"));
}

TEST_F(CheckpointTest, WriteIsAtomicAndLeavesNoTmpFile) {
  BuildShard();
  ASSERT_TRUE(WriteCheckpoint(path_, id_, tables_, dedup_).ok());
  Push(*sparse_, Grad(3, 1), {5});  // change the state, then overwrite the checkpoint
  ASSERT_TRUE(WriteCheckpoint(path_, id_, tables_, dedup_).ok());
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir_)) names.push_back(e.path().filename());
  EXPECT_EQ(names, std::vector<std::string>{"shard.ckpt"});
  Dedup d;
  auto r = ReadCheckpoint(path_, id_, &d);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->at("sparse")->version(), sparse_->version());
  ExpectBitEqual(Pull(*r->at("sparse"), {5}), Pull(*sparse_, {5}));
}

TEST_F(CheckpointTest, WriteIntoMissingDirectoryFailsWithoutFiles) {
  BuildShard();
  auto r = WriteCheckpoint(dir_ + "/no/such/dir/shard.ckpt", id_, tables_, dedup_);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(fs::is_empty(dir_));
}

// ---------------------------------------------------------------- through a server

ShardServerOptions ServerOptions(const std::string& name, uint32_t shard, const std::string& dir) {
  ShardServerOptions o;
  o.shard = shard;
  o.num_shards = 2;
  o.listen = "mem://" + name + "-" + std::to_string(shard);
  o.checkpoint_dir = dir;
  return o;
}

std::vector<std::unique_ptr<ShardServer>> StartShards(const std::string& name,
                                                      const std::string& dir, bool restore,
                                                      std::vector<std::string>* endpoints) {
  std::vector<std::unique_ptr<ShardServer>> servers;
  endpoints->clear();
  for (uint32_t s = 0; s < 2; ++s) {
    ShardServerOptions o = ServerOptions(name, s, dir);
    o.restore = restore;
    servers.push_back(std::make_unique<ShardServer>(o, std::make_shared<prometheus::Registry>()));
    auto ep = servers.back()->Start();
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
    endpoints->push_back(ep.ok() ? *ep : "");
  }
  return servers;
}

std::unique_ptr<PsClient> ConnectClient(const std::vector<std::string>& endpoints) {
  PsClientOptions o;
  o.shards = endpoints;
  auto c = PsClient::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

TEST_F(CheckpointTest, ShardServerStopWritesCheckpointAndRestartRestores) {
  static std::atomic<int> counter{0};
  const std::string name = "ckpt-server-" + std::to_string(counter++);
  TableSpec dense;
  dense.name = "w";
  dense.shape = {9};
  dense.optimizer_params = {{"lr", 0.5}};
  TableSpec sparse;
  sparse.name = "e";
  sparse.kind = TableKind::kSparse;
  sparse.dim = 2;
  sparse.optimizer = "adagrad";
  const std::vector<uint64_t> keys = {1, 2, 3, 1000, 99999};
  std::vector<float> w_before(9), e_before(10);
  VersionVector wv_before, ev_before;
  {
    std::vector<std::string> endpoints;
    auto servers = StartShards(name, dir_, true, &endpoints);
    auto client = ConnectClient(endpoints);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->CreateTable(dense).ok());
    ASSERT_TRUE(client->CreateTable(sparse).ok());
    for (int step = 0; step < 3; ++step) {
      ASSERT_TRUE(client->PushDense("w", Grad(9, step).data(), {}, nullptr).Wait().ok());
      ASSERT_TRUE(
          client->PushSparse("e", keys.data(), keys.size(), Grad(10, step).data(), {}, nullptr)
              .Wait()
              .ok());
    }
    ASSERT_TRUE(client->PullDense("w", w_before.data(), &wv_before).Wait().ok());
    ASSERT_TRUE(
        client->PullSparse("e", keys.data(), keys.size(), e_before.data(), &ev_before).Wait().ok());
    client.reset();
    for (auto& s : servers) {
      s->Stop();
      EXPECT_TRUE(fs::exists(s->checkpoint_path())) << s->checkpoint_path();
    }
  }
  EXPECT_EQ(wv_before, (VersionVector{3, 3}));

  std::vector<std::string> endpoints;
  auto servers = StartShards(name, dir_, true, &endpoints);
  auto client = ConnectClient(endpoints);
  ASSERT_NE(client, nullptr);
  auto spec = client->OpenTable("w");
  ASSERT_TRUE(spec.ok()) << spec.status().ToString();
  EXPECT_TRUE(*spec == dense);
  std::vector<float> w(9), e(10);
  VersionVector wv, ev;
  ASSERT_TRUE(client->PullDense("w", w.data(), &wv).Wait().ok());
  ASSERT_TRUE(client->PullSparse("e", keys.data(), keys.size(), e.data(), &ev).Wait().ok());
  ExpectBitEqual(w, w_before);
  ExpectBitEqual(e, e_before);
  EXPECT_EQ(wv, wv_before);
  EXPECT_EQ(ev, ev_before);
  // Versions continue from the restored ones.
  PushReply reply;
  ASSERT_TRUE(client->PushDense("w", Grad(9, 7).data(), wv, &reply).Wait().ok());
  EXPECT_EQ(reply.versions, (std::vector<uint64_t>{4, 4}));
  EXPECT_EQ(reply.max_tau, 0u);
  client.reset();
  for (auto& s : servers) s->Stop();
}

TEST_F(CheckpointTest, ShardServerRefusesToStartFromCorruptCheckpoint) {
  static std::atomic<int> counter{0};
  const std::string name = "ckpt-corrupt-" + std::to_string(counter++);
  ShardServerOptions o = ServerOptions(name, 0, dir_);
  {
    ShardServer server(o, std::make_shared<prometheus::Registry>());
    ASSERT_TRUE(server.Start().ok());
    server.Stop();
  }
  const std::string path = dir_ + "/shard-0-of-2.ckpt";
  std::string bytes = ReadFile(path);
  ASSERT_GT(bytes.size(), 20u);
  bytes[12] = static_cast<char>(bytes[12] ^ 0x40);
  WriteFile(path, bytes);
  ShardServer server(o, std::make_shared<prometheus::Registry>());
  auto r = server.Start();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_FALSE(server.ready());
  EXPECT_EQ(ReadFile(path), bytes);  // the evidence is left alone
}

TEST_F(CheckpointTest, ShardServerWithRestoreOffStartsEmpty) {
  static std::atomic<int> counter{0};
  const std::string name = "ckpt-norestore-" + std::to_string(counter++);
  TableSpec dense;
  dense.name = "w";
  dense.shape = {4};
  {
    std::vector<std::string> endpoints;
    auto servers = StartShards(name, dir_, true, &endpoints);
    auto client = ConnectClient(endpoints);
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->CreateTable(dense).ok());
    client.reset();
    for (auto& s : servers) s->Stop();
  }
  std::vector<std::string> endpoints;
  auto servers = StartShards(name, dir_, /*restore=*/false, &endpoints);
  auto client = ConnectClient(endpoints);
  ASSERT_NE(client, nullptr);
  auto spec = client->OpenTable("w");
  EXPECT_EQ(spec.status().code(), StatusCode::kNotFound);
  client.reset();
  for (auto& s : servers) s->Stop();
}

}  // namespace
}  // namespace onlineps::ps
