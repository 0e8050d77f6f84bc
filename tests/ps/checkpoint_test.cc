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
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "ps/ps_client.h"
#include "ps/replica_sidecar.h"
#include "ps/shard_server.h"
#include "tests/ps/sim_etcd.h"

// Fails fsync of a directory while set, as a disk error would: the test binary's own
// fsync stands in for libc's for every caller in the process.
std::atomic<bool> g_fail_directory_fsync{false};

extern "C" int fsync(int fd) {
  struct stat st;
  if (g_fail_directory_fsync.load() && ::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
    errno = EIO;
    return -1;
  }
  return static_cast<int>(::syscall(SYS_fsync, fd));
}

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

// Writes `snap` while another thread calls update(0), update(1), ... (from 20 ms before
// the write until it ends); returns what was written.
std::string WriteWhileUpdating(TableSnapshot* snap, const std::function<void(uint64_t)>& update) {
  std::atomic<bool> stop{false};
  std::thread updater([&] {
    for (uint64_t step = 0; !stop; ++step) update(step);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // updates before the write too
  ByteWriter written;
  snap->Write(&written);
  stop = true;
  updater.join();
  return written.buffer();
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
  std::atomic<int> pushed{0};
  std::thread updater([&] {
    for (int step = 2; !stop; ++step) {
      Push(*dense, Grad(15, step));
      // The last keys first, so rows the writer has not reached yet change too.
      std::vector<uint64_t> some(keys.rbegin(), keys.rbegin() + 5000);
      some.push_back(1000000 + step);  // and a new row
      Push(*sparse, Grad(some.size() * 3, step), some);
      pushed++;
    }
  });
  // Updates after the cut before the write starts too (the writer copies what they
  // change first): on a loaded machine the write could end before the updater's first.
  for (int i = 0; i < 2000 && pushed.load() < 2; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
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

// The keys of the snapshot-under-updates tests, and a table (shard 0 of 1) with one push
// of a dim-3 gradient to each.
std::vector<uint64_t> SnapshotKeys() {
  std::vector<uint64_t> keys(20000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 13 + 5;
  return keys;
}
std::shared_ptr<Table> PushedTable(const TableSpec& spec, const std::vector<uint64_t>& keys) {
  auto t = NewTable(spec, {0, 1});
  if (t != nullptr) Push(*t, Grad(keys.size() * 3, 1), keys);
  return t;
}

// A table's snapshot writes exactly what Save wrote at the cut, byte for byte, while
// another thread pushes (changing rows, creating rows, and in a capped table evicting
// them) and pulls (moving rows in the LRU order) during the write.
TEST_F(CheckpointTest, TableSnapshotEqualsSaveAtCutUnderConcurrentUpdates) {
  for (const bool capped : {false, true}) {
    TableSpec spec = SparseSpec();  // adagrad with a Polyak average
    if (capped) spec.max_rows = 20000;
    const std::vector<uint64_t> keys = SnapshotKeys();
    auto t = PushedTable(spec, keys);
    ASSERT_NE(t, nullptr);
    Pull(*t, std::vector<uint64_t>(keys.begin(), keys.begin() + 100));  // an LRU order
    ByteWriter at_cut;
    t->Save(&at_cut);
    auto snap = t->BeginSnapshot();
    const std::string written = WriteWhileUpdating(snap.get(), [&](uint64_t step) {
      std::vector<uint64_t> some(keys.rbegin() + step % 50, keys.rbegin() + step % 50 + 200);
      Push(*t, Grad(some.size() * 3, static_cast<int>(step)), some);
      Pull(*t, std::vector<uint64_t>(keys.begin() + step % 300, keys.begin() + step % 300 + 50));
      Push(*t, Grad(3, 2), {1000000 + step});  // a new row (an eviction when capped)
    });
    EXPECT_EQ(written.size(), at_cut.buffer().size()) << (capped ? "capped" : "uncapped");
    EXPECT_TRUE(written == at_cut.buffer()) << (capped ? "capped" : "uncapped");
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
  const uint32_t four = 4;  // 3 is a delta's (an incremental checkpoint)
  std::memcpy(bytes.data() + 8, &four, sizeof(four));
  ExpectDataLoss(bytes, "unknown format 4");
}

// Damage that a valid checksum does not reveal (a writer bug, or a hand-edited file
// resealed): refused as DATA_LOSS naming the file, never loaded with a row or a table
// silently gone or replaced.
TEST_F(CheckpointTest, DamageBehindAValidChecksumIsDataLossNamingTheFile) {
  const ShardIdentity one{0, 1};
  constexpr size_t kHeader = 8 + 4 + 4 + 4;  // magic, format, shard, shard count
  auto reseal = [](std::string bytes) {
    const uint64_t crc = Crc32(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &crc, sizeof(crc));
    return bytes;
  };
  auto file_of = [&](const Tables& tables) {
    EXPECT_TRUE(WriteCheckpoint(path_, one, tables, Dedup()).ok());
    return ReadFile(path_);
  };
  auto refused = [&](const std::string& bytes, const std::string& what) {
    WriteFile(path_, bytes);
    Dedup d;
    auto r = ReadCheckpoint(path_, one, &d);
    ASSERT_FALSE(r.ok()) << what << ": loaded";
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
    EXPECT_THAT(r.status().message(), HasSubstr(what));
    EXPECT_THAT(r.status().message(), HasSubstr(path_));
  };
  const uint64_t key = 0x1234567890abcdefULL;
  auto sparse = NewTable(SparseSpec(), one);
  const std::string empty_table = file_of({{"sparse", sparse}});
  Push(*sparse, Grad(3, 1), {key});
  const std::string one_row = file_of({{"sparse", sparse}});
  const std::string no_tables = file_of({});

  // Bytes after the last section.
  std::string extra = one_row;
  extra.insert(extra.size() - 8, std::string(16, '\0'));
  refused(reseal(extra), "16 unexpected bytes");

  // One table written twice.
  const size_t tail = no_tables.size() - kHeader - 8;  // the dedup section and trailer
  const std::string table = one_row.substr(kHeader + 8, one_row.size() - kHeader - 8 - tail);
  std::string twice = one_row.substr(0, kHeader);
  const uint64_t two = 2;
  twice.append(reinterpret_cast<const char*>(&two), 8);
  twice += table + table + one_row.substr(one_row.size() - tail);
  refused(reseal(twice), "table 'sparse' appears twice");

  // One row written twice in its stripe (its row count raised to match).
  const size_t row_bytes = one_row.size() - empty_table.size();
  const size_t at = one_row.find(std::string(reinterpret_cast<const char*>(&key), 8));
  ASSERT_NE(at, std::string::npos);
  ASSERT_EQ(one_row.find(std::string(reinterpret_cast<const char*>(&key), 8), at + 1),
            std::string::npos);
  uint64_t rows = 0;
  std::memcpy(&rows, one_row.data() + at - 8, 8);
  ASSERT_EQ(rows, 1u);
  std::string dup = one_row;
  std::memcpy(dup.data() + at - 8, &two, 8);
  dup.insert(at + row_bytes, one_row.substr(at, row_bytes));
  refused(reseal(dup), "appears twice");

  // More dedup senders than the file holds: the byte reader's own message, with the path.
  std::string more = no_tables;
  std::memcpy(more.data() + kHeader + 8, &two, 8);
  refused(reseal(more), "truncated");

  // And the untouched files load.
  WriteFile(path_, one_row);
  Dedup d;
  auto good = ReadCheckpoint(path_, one, &d);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->at("sparse")->Stats().rows, 1u);
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
  // The model's parameters are not for every user of the host.
  EXPECT_EQ(static_cast<unsigned>(fs::status(path_).permissions() & fs::perms::all), 0640u);
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

ShardServerOptions ServerOptions(const std::string& name, uint32_t shard, const std::string& dir,
                                 uint32_t num_shards = 2) {
  ShardServerOptions o;
  o.shard = shard;
  o.num_shards = num_shards;
  o.listen = "mem://" + name + "-" + std::to_string(shard);
  o.checkpoint_dir = dir;
  return o;
}

// The sparse table "e" of the server tests.
TableSpec SparseE(uint32_t dim, const std::string& optimizer = "sgd") {
  TableSpec s;
  s.name = "e";
  s.kind = TableKind::kSparse;
  s.dim = dim;
  s.optimizer = optimizer;
  return s;
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
  const TableSpec sparse = SparseE(2, "adagrad");
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

// etcd for an in-process replicated shard: the simulation's model, answered at once.
class LocalKv final : public KvStore {
 public:
  void Grant(int64_t ttl_s, Callback done) override {
    ps::KvCall c;
    c.kind = ps::KvCall::Kind::kGrant;
    c.ttl_s = ttl_s;
    Do(std::move(c), std::move(done));
  }
  void KeepAlive(uint64_t lease, Callback done) override {
    ps::KvCall c;
    c.kind = ps::KvCall::Kind::kKeepAlive;
    c.lease = lease;
    Do(std::move(c), std::move(done));
  }
  void Revoke(uint64_t lease, Callback done) override {
    ps::KvCall c;
    c.kind = ps::KvCall::Kind::kRevoke;
    c.lease = lease;
    Do(std::move(c), std::move(done));
  }
  void Range(const std::string& prefix, Callback done) override {
    ps::KvCall c;
    c.kind = ps::KvCall::Kind::kRange;
    c.prefix = prefix;
    Do(std::move(c), std::move(done));
  }
  void Txn(KvTxn txn, Callback done) override {
    ps::KvCall c;
    c.kind = ps::KvCall::Kind::kTxn;
    c.txn = std::move(txn);
    Do(std::move(c), std::move(done));
  }

 private:
  void Do(ps::KvCall call, Callback done) {
    KvResult r;
    {
      std::lock_guard<std::mutex> lock(mu_);
      r = etcd_.Do(NowMs(), call);
    }
    done(std::move(r));
  }
  std::mutex mu_;
  sim::SimEtcd etcd_;
};

// A periodic checkpoint of a replicated shard names in its sidecar the log position it
// holds, which ranks the replica when every in-sync replica restarted (the most recent
// state is elected; the others reload from it). The position was read after the file was
// written, while pushes went on: the sidecar claimed pushes the checkpoint does not hold,
// so a restarted replica outranked one that held them, and they were lost when that one
// reloaded. The position is now read at the cut.
TEST_F(CheckpointTest, ReplicaSidecarNamesNoPushTheCheckpointLacks) {
  static std::atomic<int> counter{0};
  const std::string name = "ckpt-replica-" + std::to_string(counter++);
  ShardServerOptions o = ServerOptions(name, 0, dir_, 1);
  o.replication.members = {o.listen, "mem://" + name + "-peer"};  // the peer never starts
  o.replication.index = 0;
  o.replication.lease_ms = 1000;
  o.replication.kv = std::make_shared<LocalKv>();
  ShardServer server(o, std::make_shared<prometheus::Registry>());
  auto ep = server.Start();
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  // Alone, it forms the group after the bootstrap wait (3 s) and acknowledges alone.
  for (int i = 0; i < 200 && !server.replica()->primary(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_TRUE(server.replica()->primary());
  auto client = ConnectClient({*ep});
  ASSERT_NE(client, nullptr);
  TableSpec big;  // makes the checkpoint take a while
  big.name = "big";
  big.shape = {uint64_t{16} << 20};
  TableSpec w;
  w.name = "w";
  w.shape = {1};
  ASSERT_TRUE(client->CreateTable(big).ok());
  ASSERT_TRUE(client->CreateTable(w).ok());
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> acked{0};
  std::thread pusher([&] {
    const float g = 1.0f;
    while (!stop) {
      if (client->PushDense("w", &g, {}, nullptr).Wait().ok()) ++acked;
    }
  });
  while (acked < 100) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto file = server.Checkpoint();
  const uint64_t acked_after = acked;
  stop = true;
  pusher.join();
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto side = ReadReplicaSidecar(server.checkpoint_path() + ".replica");
  ASSERT_TRUE(side.ok()) << side.status().ToString();
  Dedup dedup;
  auto restored = RestoreCheckpoint(server.checkpoint_path(), {0, 1}, &dedup);
  ASSERT_TRUE(restored.ok()) << restored.status().ToString();
  // Two table creations, then one logged update per push.
  const uint64_t held = 2 + restored->tables.at("w")->version();
  EXPECT_LT(held - 2, acked_after) << "no push ran while the checkpoint was written";
  EXPECT_LE(side->lsn, held) << "the sidecar names lsn " << side->lsn
                             << " but the checkpoint holds updates up to lsn " << held;
  client.reset();
  server.Stop();
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

// A checkpoint path that is a link to nothing (its volume not mounted, say) is refused
// at start, naming both: starting empty would serve none of the shard's state and replace
// the link with a new file at the first checkpoint.
TEST_F(CheckpointTest, ADanglingCheckpointLinkIsRefusedNotTakenForNoCheckpoint) {
  static std::atomic<int> counter{0};
  const std::string name = "ckpt-link-" + std::to_string(counter++);
  const std::string path = dir_ + "/shard-0-of-2.ckpt";
  const std::string target = dir_ + "/unmounted/shard-0-of-2.ckpt";
  fs::create_symlink(target, path);
  ShardServer server(ServerOptions(name, 0, dir_), std::make_shared<prometheus::Registry>());
  auto r = server.Start();
  ASSERT_FALSE(r.ok()) << "started empty";
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition) << r.status().ToString();
  EXPECT_NE(r.status().message().find(target), std::string::npos) << r.status().ToString();
  EXPECT_TRUE(fs::is_symlink(path));  // left alone
}

// Two shard processes on one checkpoint file would each overwrite the other's
// checkpoints (an empty shard's replaced a full one): the second is refused at start,
// naming the directory; once the first stops, the file is free again.
TEST_F(CheckpointTest, ASecondShardOnTheSameCheckpointFileIsRefused) {
  static std::atomic<int> counter{0};
  const std::string name = "ckpt-lock-" + std::to_string(counter++);
  ShardServerOptions o = ServerOptions(name, 0, dir_);
  ShardServer first(o, std::make_shared<prometheus::Registry>());
  ASSERT_TRUE(first.Start().ok());
  ShardServerOptions o2 = ServerOptions(name + "-b", 0, dir_);
  ShardServer second(o2, std::make_shared<prometheus::Registry>());
  auto r = second.Start();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("another process is using the checkpoint directory " + dir_),
            std::string::npos)
      << r.status().ToString();
  // Another shard index in the same directory is another file: allowed.
  ShardServer other(ServerOptions(name + "-c", 1, dir_), std::make_shared<prometheus::Registry>());
  EXPECT_TRUE(other.Start().ok());
  other.Stop();
  first.Stop();
  ShardServer third(ServerOptions(name + "-d", 0, dir_), std::make_shared<prometheus::Registry>());
  EXPECT_TRUE(third.Start().ok());
  third.Stop();
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

// ---------------------------------------------------------------- incremental checkpoints

// Tables of every kind a delta handles: an uncapped sparse table (Adagrad, Polyak), a
// capped one that evicts rows (an LRU list, dropped keys), and a dense one.
TableSpec CappedSpec() {
  TableSpec s;
  s.name = "capped";
  s.kind = TableKind::kSparse;
  s.dim = 4;
  s.max_rows = 2048;  // 2 stripes of 1024 rows
  s.optimizer_params = {{"lr", 0.5}};
  return s;
}

std::vector<uint64_t> KeyRange(uint64_t first, uint64_t n) {
  std::vector<uint64_t> keys(n);
  for (uint64_t i = 0; i < n; ++i) keys[i] = (first + i) * 7919 + 3;
  return keys;
}

// Every table of `restored` holds what `live` holds: versions, row counts, and the values
// (and averages) of every key in `keys` (a key not held reads as its initializer in both).
void ExpectSameTables(const Tables& restored, const Tables& live,
                      const std::vector<uint64_t>& keys) {
  ASSERT_EQ(restored.size(), live.size());
  for (const auto& [name, t] : live) {
    SCOPED_TRACE(name);
    ASSERT_EQ(restored.count(name), 1u);
    Table& r = *restored.at(name);
    EXPECT_TRUE(r.spec() == t->spec());
    EXPECT_EQ(r.version(), t->version());
    EXPECT_EQ(r.Stats().rows, t->Stats().rows);
    if (t->spec().kind == TableKind::kDense) {
      ExpectBitEqual(Pull(r), Pull(*t));
      continue;
    }
    ExpectBitEqual(Pull(r, keys), Pull(*t, keys));
    if (t->spec().polyak) ExpectBitEqual(Pull(r, keys, true), Pull(*t, keys, true));
  }
}

TEST_F(CheckpointTest, DeltaChainRestoresWhatTheTablesHeldAtTheLastCut) {
  const ShardIdentity id{0, 1};
  auto sparse = NewTable(SparseSpec(), id);
  auto capped = NewTable(CappedSpec(), id);
  TableSpec dspec = DenseSpec();
  dspec.accumulate = 1;
  auto dense = NewTable(dspec, id);
  Tables tables = {{"sparse", sparse}, {"capped", capped}, {"dense", dense}};
  const auto all = KeyRange(0, 6000);
  const std::vector<uint64_t> first(all.begin(), all.begin() + 4000);
  Push(*sparse, Grad(first.size() * 3, 1), first);
  Push(*capped, Grad(2000 * 4, 1), std::vector<uint64_t>(all.begin(), all.begin() + 2000));
  Push(*dense, Grad(dense->local_elements(), 1));
  for (uint64_t seq : {1, 2}) {
    ASSERT_EQ(dedup_.Begin(100, seq), Dedup::Verdict::kNew);
    dedup_.Commit(100, seq);
  }
  uint64_t trailer = 0;
  ShardSnapshot full = SnapshotShard(id, tables, dedup_, SnapshotKind::kFull);
  auto full_bytes = WriteSnapshot(path_, &full, &trailer);
  ASSERT_TRUE(full_bytes.ok()) << full_bytes.status().ToString();
  full = {};

  // Delta 1: a tenth of the rows pushed again, new rows, rows evicted by the cap.
  const std::vector<uint64_t> some(all.begin() + 100, all.begin() + 500);
  Push(*sparse, Grad(some.size() * 3, 2), some);
  const std::vector<uint64_t> fresh(all.begin() + 4000, all.begin() + 4100);
  Push(*sparse, Grad(fresh.size() * 3, 3), fresh);
  Push(*capped, Grad(300 * 4, 2), std::vector<uint64_t>(all.begin() + 2000, all.begin() + 2300));
  ASSERT_GT(capped->Stats().evicted_rows, 0u);
  Push(*dense, Grad(dense->local_elements(), 2));
  ASSERT_EQ(dedup_.Begin(100, 3), Dedup::Verdict::kNew);
  dedup_.Commit(100, 3);
  ChangeStats c = sparse->Changes();
  EXPECT_EQ(c.changed_rows, some.size() + fresh.size());
  EXPECT_EQ(c.rows, first.size() + fresh.size());
  EXPECT_EQ(capped->Changes().dropped_rows, capped->Stats().evicted_rows);
  ShardSnapshot d1 = SnapshotShard(id, tables, dedup_, SnapshotKind::kDelta);
  d1.seq = 1;
  d1.prev_trailer = trailer;
  auto d1_bytes = WriteSnapshot(DeltaPath(path_, 1), &d1, &trailer);
  ASSERT_TRUE(d1_bytes.ok()) << d1_bytes.status().ToString();
  d1 = {};
  EXPECT_LT(*d1_bytes * 4, *full_bytes) << "a delta of a tenth of the rows";
  EXPECT_EQ(sparse->Changes().changed_rows, 0u) << "the cut starts a new change set";

  // Delta 2: a table created after the full checkpoint, and rows of both kinds again.
  TableSpec late_spec = SparseSpec();
  late_spec.name = "late";
  auto late = NewTable(late_spec, id);
  tables["late"] = late;
  Push(*late, Grad(50 * 3, 4), std::vector<uint64_t>(all.begin(), all.begin() + 50));
  Push(*sparse, Grad(some.size() * 3, 5), some);
  Push(*capped, Grad(500 * 4, 3), std::vector<uint64_t>(all.begin() + 5000, all.end() - 500));
  ASSERT_EQ(dedup_.Begin(200, 7), Dedup::Verdict::kNew);
  dedup_.Commit(200, 7);
  ShardSnapshot d2 = SnapshotShard(id, tables, dedup_, SnapshotKind::kDelta);
  d2.seq = 2;
  d2.prev_trailer = trailer;
  ASSERT_TRUE(WriteSnapshot(DeltaPath(path_, 2), &d2, &trailer).ok());
  d2 = {};

  Dedup restored_dedup;
  auto r = RestoreCheckpoint(path_, id, &restored_dedup);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->deltas, 2u);
  EXPECT_EQ(r->tip, DeltaPath(path_, 2));
  EXPECT_EQ(r->tip_trailer, trailer);
  EXPECT_TRUE(r->stale.empty());
  ExpectSameTables(r->tables, tables, all);
  EXPECT_EQ(restored_dedup.Begin(100, 3), Dedup::Verdict::kDuplicate);
  EXPECT_EQ(restored_dedup.Begin(200, 7), Dedup::Verdict::kDuplicate);
  EXPECT_EQ(restored_dedup.Begin(200, 8), Dedup::Verdict::kNew);

  // The full checkpoint alone still reads as the state at its own cut.
  Dedup base_dedup;
  auto base = ReadCheckpoint(path_, id, &base_dedup);
  ASSERT_TRUE(base.ok()) << base.status().ToString();
  EXPECT_EQ(base->at("sparse")->version(), 1u);
  EXPECT_EQ(base->count("late"), 0u);
  // A delta alone is no checkpoint.
  auto alone = ReadCheckpoint(DeltaPath(path_, 1), id, &base_dedup);
  ASSERT_FALSE(alone.ok());
  EXPECT_EQ(alone.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(alone.status().message(), HasSubstr("is a delta"));
}

TEST_F(CheckpointTest, DeltaSnapshotHoldsTheCutUnderConcurrentUpdates) {
  for (const bool capped : {false, true}) {
    SCOPED_TRACE(capped ? "capped" : "uncapped");
    TableSpec spec = SparseSpec();  // adagrad with a Polyak average
    if (capped) spec.max_rows = 20000;
    const std::vector<uint64_t> keys = SnapshotKeys();
    auto t = PushedTable(spec, keys);
    ASSERT_NE(t, nullptr);
    ByteWriter base;
    t->BeginSnapshot(SnapshotKind::kFull)->Write(&base);
    // Changes before the cut: rows pushed again, new rows (evictions when capped).
    std::vector<uint64_t> changed(keys.begin() + 3000, keys.begin() + 5000);
    for (uint64_t k = 0; k < 500; ++k) changed.push_back(2000000 + k);
    Push(*t, Grad(changed.size() * 3, 2), changed);
    ByteWriter at_cut;
    t->Save(&at_cut);
    auto snap = t->BeginSnapshot(SnapshotKind::kDelta);
    const std::string delta = WriteWhileUpdating(snap.get(), [&](uint64_t step) {
      std::vector<uint64_t> some(keys.begin() + 2900 + step % 400,
                                 keys.begin() + 3100 + step % 400);
      Push(*t, Grad(some.size() * 3, static_cast<int>(step)), some);
      Push(*t, Grad(3, 2), {1000000 + step});  // a new row (an eviction when capped)
    });
    snap.reset();
    EXPECT_LT(delta.size(), at_cut.buffer().size() / 4);

    auto restored = NewTable(spec, {0, 1});
    auto expected = NewTable(spec, {0, 1});
    ByteReader rb(base.buffer().data(), base.buffer().size());
    ASSERT_TRUE(restored->Load(&rb).ok());
    ByteReader rd(delta.data(), delta.size());
    ASSERT_TRUE(restored->LoadDelta(&rd).ok());
    EXPECT_EQ(rd.Remaining(), 0u);
    ByteReader re(at_cut.buffer().data(), at_cut.buffer().size());
    ASSERT_TRUE(expected->Load(&re).ok());
    std::vector<uint64_t> read = keys;
    read.insert(read.end(), changed.end() - 500, changed.end());
    ExpectSameTables({{"t", restored}}, {{"t", expected}}, read);
    if (!capped) {  // rows in the same slots: the same bytes
      ByteWriter again;
      restored->Save(&again);
      EXPECT_TRUE(again.buffer() == at_cut.buffer());
    }
  }
}

// BuildShard's tables written as a full checkpoint at path_, then `deltas` deltas, each
// after a push to two rows.
void WriteChain(const Tables& tables, Table& sparse, const Dedup& dedup, const ShardIdentity& id,
                const std::string& path, uint64_t deltas) {
  uint64_t trailer = 0;
  ShardSnapshot full = SnapshotShard(id, tables, dedup, SnapshotKind::kFull);
  ASSERT_TRUE(WriteSnapshot(path, &full, &trailer).ok());
  full = {};
  for (uint64_t seq = 1; seq <= deltas; ++seq) {
    Push(sparse, Grad(6, static_cast<int>(seq)), {ManyKeys()[seq], ManyKeys()[seq + 5]});
    ShardSnapshot d = SnapshotShard(id, tables, dedup, SnapshotKind::kDelta);
    d.seq = seq;
    d.prev_trailer = trailer;
    ASSERT_TRUE(WriteSnapshot(DeltaPath(path, seq), &d, &trailer).ok());
  }
}

TEST_F(CheckpointTest, DeltasOfAnOlderChainAreStaleAndACorruptDeltaIsDataLoss) {
  BuildShard();
  const ShardIdentity id = id_;
  uint64_t trailer = 0;
  WriteChain(tables_, *sparse_, dedup_, id, path_, 2);
  ASSERT_EQ(DeltaFiles(path_).size(), 2u);
  EXPECT_EQ(DeltaFiles(path_)[0].path, DeltaPath(path_, 1));  // by N ascending
  EXPECT_EQ(DeltaFiles(path_)[1].seq, 2u);
  const std::string d1 = ReadFile(DeltaPath(path_, 1));

  // A corrupt delta in the chain: the state after it is unknown.
  std::string bad = d1;
  bad[bad.size() / 2] ^= 0x10;
  WriteFile(DeltaPath(path_, 1), bad);
  Dedup d;
  auto r = RestoreCheckpoint(path_, id, &d);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr(DeltaPath(path_, 1)));
  WriteFile(DeltaPath(path_, 1), d1);

  // A new full checkpoint whose old deltas were not removed (a crash in between): they
  // name another file, so the chain is the full checkpoint alone.
  Push(*sparse_, Grad(6, 9), {ManyKeys()[0], ManyKeys()[1]});
  ShardSnapshot again = SnapshotShard(id, tables_, dedup_, SnapshotKind::kFull);
  ASSERT_TRUE(WriteSnapshot(path_, &again, &trailer).ok());
  again = {};
  r = RestoreCheckpoint(path_, id, &d);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->deltas, 0u);
  EXPECT_EQ(r->tip, path_);
  EXPECT_EQ(r->stale.size(), 2u);
  ExpectSameAsLive(r->tables);
}

// Start removes the stale deltas a restore lists, in its order: a crash (kill -9) after
// the first removal must leave files that still restore, not a gap refused as damage.
TEST_F(CheckpointTest, ACrashWhileStaleDeltasAreRemovedLeavesARestorableChain) {
  BuildShard();
  const ShardIdentity id = id_;
  uint64_t trailer = 0;
  WriteChain(tables_, *sparse_, dedup_, id, path_, 3);
  Push(*sparse_, Grad(6, 9), {ManyKeys()[0], ManyKeys()[1]});
  ShardSnapshot again = SnapshotShard(id, tables_, dedup_, SnapshotKind::kFull);
  ASSERT_TRUE(WriteSnapshot(path_, &again, &trailer).ok());
  again = {};
  Dedup d;
  auto r = RestoreCheckpoint(path_, id, &d);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->stale.size(), 3u);
  std::filesystem::remove(r->stale.front());  // then the crash
  r = RestoreCheckpoint(path_, id, &d);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->deltas, 0u);
  EXPECT_EQ(r->stale.size(), 2u);
  ExpectSameAsLive(r->tables);
}

TEST_F(CheckpointTest, ShardServerWritesDeltasBetweenFullCheckpointsAndRestoresTheChain) {
  static std::atomic<int> counter{0};
  const std::string name = "ckpt-delta-" + std::to_string(counter++);
  ShardServerOptions o = ServerOptions(name, 0, dir_, 1);
  o.checkpoint_full_every = 3;  // the full checkpoint and two deltas
  auto server = std::make_unique<ShardServer>(o, std::make_shared<prometheus::Registry>());
  auto ep = server->Start();
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  auto client = ConnectClient({*ep});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->CreateTable(SparseE(8, "adagrad")).ok());
  const auto keys = KeyRange(0, 5000);
  auto push = [&](uint64_t first, uint64_t n, int step) {
    const std::vector<uint64_t> k(keys.begin() + first, keys.begin() + first + n);
    ASSERT_TRUE(client->PushSparse("e", k.data(), k.size(), Grad(n * 8, step).data(), {}, nullptr)
                    .Wait()
                    .ok());
  };
  auto pull = [&] {
    std::vector<float> v(keys.size() * 8);
    EXPECT_TRUE(client->PullSparse("e", keys.data(), keys.size(), v.data(), nullptr).Wait().ok());
    return v;
  };
  const std::string path = server->checkpoint_path();
  push(0, 4000, 1);
  auto file = server->Checkpoint();
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(*file, path) << "the first checkpoint is full";
  push(10, 200, 2);
  file = server->Checkpoint();
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(*file, DeltaPath(path, 1));
  EXPECT_LT(fs::file_size(*file) * 10, fs::file_size(path));
  push(3900, 300, 3);  // 200 new rows
  file = server->Checkpoint();
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(*file, DeltaPath(path, 2));
  const std::vector<float> at_d2 = pull();
  // A copy of the files as a crash right now would leave them.
  const std::string copy = dir_ + "/copy";
  fs::create_directories(copy);
  for (const std::string& f : {path, DeltaPath(path, 1), DeltaPath(path, 2)})
    fs::copy_file(f, copy + "/" + fs::path(f).filename().string());
  push(0, 10, 4);
  file = server->Checkpoint();
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(*file, path) << "the chain was full: the next checkpoint is full";
  EXPECT_TRUE(DeltaFiles(path).empty());
  push(2000, 3000, 5);  // more than half the rows changed: full again
  file = server->Checkpoint();
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(*file, path);
  client.reset();
  server->Stop();

  ShardServerOptions restart = o;
  restart.listen = "mem://" + name + "-restart";
  restart.checkpoint_dir = copy;
  auto restarted = std::make_unique<ShardServer>(restart, std::make_shared<prometheus::Registry>());
  ep = restarted->Start();
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  client = ConnectClient({*ep});
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->OpenTable("e").ok());
  ExpectBitEqual(pull(), at_d2);
  // The chain goes on from its last delta: the next checkpoint is full (3 files).
  push(0, 10, 6);
  file = restarted->Checkpoint();
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(*file, restarted->checkpoint_path());
  client.reset();
  restarted->Stop();
}

TEST_F(CheckpointTest, DcAdaptiveCompensationOfAQueuedPushIsInTheDelta) {
  TableSpec spec = SparseSpec();
  spec.polyak = false;
  spec.staleness = "dc_adaptive";  // compensation updates a policy slot of the row
  spec.accumulate = 2;
  auto t = NewTable(spec, {0, 1});
  ASSERT_NE(t, nullptr);
  // One row: the accumulator (saved in its hash map's order) then saves the same bytes.
  const auto keys = KeyRange(0, 1);
  for (int step = 0; step < 2; ++step) Push(*t, Grad(3, step), keys);  // applied
  ByteWriter base;
  t->BeginSnapshot(SnapshotKind::kFull)->Write(&base);
  Pull(*t, keys);              // sender 1's backup
  Push(*t, Grad(3, 5), keys);  // queued: compensated against the backup
  ByteWriter at_cut, delta;
  t->Save(&at_cut);
  t->BeginSnapshot(SnapshotKind::kDelta)->Write(&delta);
  auto restored = NewTable(spec, {0, 1});
  ByteReader rb(base.buffer().data(), base.buffer().size());
  ASSERT_TRUE(restored->Load(&rb).ok());
  ByteReader rd(delta.buffer().data(), delta.buffer().size());
  ASSERT_TRUE(restored->LoadDelta(&rd).ok());
  ByteWriter again;
  restored->Save(&again);
  EXPECT_TRUE(again.buffer() == at_cut.buffer()) << "the row's policy state, as at the cut";
}

TEST_F(CheckpointTest, MoreDropsThanADeltaKeepsAskForAFullCheckpoint) {
  auto t = NewTable(CappedSpec(), {0, 1});  // 2 stripes of 1024 rows
  ASSERT_NE(t, nullptr);
  Push(*t, Grad(2000 * 4, 1), KeyRange(0, 2000));
  t->BeginSnapshot(SnapshotKind::kFull);
  EXPECT_FALSE(t->Changes().overflow);
  Push(*t, Grad(4000 * 4, 2), KeyRange(2000, 4000));  // ~2,000 drops per stripe: kept
  EXPECT_FALSE(t->Changes().overflow);
  EXPECT_EQ(t->Changes().dropped_rows, t->Stats().evicted_rows);
  Push(*t, Grad(8000 * 4, 3), KeyRange(6000, 8000));  // past 4,096 in a stripe
  EXPECT_TRUE(t->Changes().overflow);
  t->BeginSnapshot(SnapshotKind::kFull);  // a cut starts a new change set
  EXPECT_FALSE(t->Changes().overflow);
  EXPECT_EQ(t->Changes().dropped_rows, 0u);
}

TEST_F(CheckpointTest, ADeltaAfterAMissingOneIsDataLossNamingBoth) {
  BuildShard();
  WriteChain(tables_, *sparse_, dedup_, id_, path_, 3);
  fs::remove(DeltaPath(path_, 2));
  Dedup d;
  auto r = RestoreCheckpoint(path_, id_, &d);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
  EXPECT_THAT(r.status().message(), HasSubstr(DeltaPath(path_, 3)));
  EXPECT_THAT(r.status().message(), HasSubstr("missing delta (" + DeltaPath(path_, 2)));
  EXPECT_TRUE(fs::exists(DeltaPath(path_, 3))) << "the evidence is left alone";
}

// Starts `server`, connects a client and creates the sparse table "e" (dim 4) on it; null
// (with the test failed) when any step fails.
std::unique_ptr<PsClient> StartWithTableE(ShardServer* server) {
  auto ep = server->Start();
  if (!ep.ok()) {
    ADD_FAILURE() << ep.status().ToString();
    return nullptr;
  }
  auto client = ConnectClient({*ep});
  if (client == nullptr) return nullptr;
  if (Status st = client->CreateTable(SparseE(4)); !st.ok()) {
    ADD_FAILURE() << st.ToString();
    return nullptr;
  }
  return client;
}

// Deltas without the full checkpoint they continue cannot be restored; starting empty
// would silently drop the shard and then delete them at its first checkpoint.
TEST_F(CheckpointTest, ShardServerRefusesDeltasWhoseCheckpointIsMissing) {
  static std::atomic<int> counter{0};
  const std::string name = "ckpt-orphans-" + std::to_string(counter++);
  ShardServerOptions o = ServerOptions(name, 0, dir_, /*num_shards=*/1);
  {
    ShardServer server(o, std::make_shared<prometheus::Registry>());
    auto client = StartWithTableE(&server);
    ASSERT_NE(client, nullptr);
    const auto keys = KeyRange(0, 1000);
    ASSERT_TRUE(
        client->PushSparse("e", keys.data(), 1000, Grad(4000, 1).data(), {}, nullptr).Wait().ok());
    ASSERT_EQ(*server.Checkpoint(), server.checkpoint_path());  // full
    ASSERT_TRUE(
        client->PushSparse("e", keys.data(), 10, Grad(40, 2).data(), {}, nullptr).Wait().ok());
    auto delta = server.Checkpoint();
    ASSERT_TRUE(delta.ok()) << delta.status().ToString();
    EXPECT_EQ(*delta, DeltaPath(server.checkpoint_path(), 1));
    client.reset();
    server.Stop();
  }
  const std::string path = dir_ + "/shard-0-of-1.ckpt";
  ASSERT_TRUE(fs::remove(path));
  ASSERT_TRUE(fs::exists(DeltaPath(path, 1)));
  {
    ShardServer server(o, std::make_shared<prometheus::Registry>());
    auto r = server.Start();
    ASSERT_FALSE(r.ok()) << "started from deltas without their checkpoint";
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss);
    EXPECT_THAT(r.status().message(), HasSubstr(path + " is missing"));
    EXPECT_TRUE(fs::exists(DeltaPath(path, 1))) << "the evidence is left alone";
  }
  // --no-restore still starts empty, on purpose.
  o.restore = false;
  ShardServer fresh(o, std::make_shared<prometheus::Registry>());
  EXPECT_TRUE(fresh.Start().ok());
  fresh.Stop();
}

TEST_F(CheckpointTest, ShardServerWritesAFullCheckpointAfterAFailedOne) {
  static std::atomic<int> counter{0};
  const ShardServerOptions o =
      ServerOptions("ckpt-failed-" + std::to_string(counter++), 0, dir_ + "/ck", 1);
  ShardServer server(o, std::make_shared<prometheus::Registry>());
  auto client = StartWithTableE(&server);
  ASSERT_NE(client, nullptr);
  const auto keys = KeyRange(0, 1000);
  auto push = [&](size_t n, int step) {
    ASSERT_TRUE(
        client->PushSparse("e", keys.data(), n, Grad(n * 4, step).data(), {}, nullptr).Wait().ok());
  };
  push(1000, 1);
  ASSERT_EQ(*server.Checkpoint(), server.checkpoint_path());
  push(10, 2);
  // The volume goes away: the delta cannot be written, and its cut took the changes.
  fs::rename(o.checkpoint_dir, dir_ + "/moved");
  WriteFile(o.checkpoint_dir, "not a directory");
  EXPECT_FALSE(server.Checkpoint().ok());
  fs::remove(o.checkpoint_dir);
  fs::rename(dir_ + "/moved", o.checkpoint_dir);
  push(10, 3);
  auto file = server.Checkpoint();
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(*file, server.checkpoint_path()) << "not a delta: the failed one's rows are in none";
  client.reset();
  server.Stop();
}

// The directory of a renamed checkpoint could not be synced (a disk error): the rename
// may not survive a host crash, yet the checkpoint was counted good and the chain went
// on from it. It is now a failed checkpoint, and the next one is full.
TEST_F(CheckpointTest, ACheckpointWhoseDirectoryCannotBeSyncedHasFailed) {
  static std::atomic<int> counter{0};
  const ShardServerOptions o =
      ServerOptions("ckpt-dirsync-" + std::to_string(counter++), 0, dir_ + "/ck", 1);
  auto registry = std::make_shared<prometheus::Registry>();
  ShardServer server(o, registry);
  auto client = StartWithTableE(&server);
  ASSERT_NE(client, nullptr);
  const auto keys = KeyRange(0, 1000);
  auto push = [&](size_t n, int step) {
    ASSERT_TRUE(
        client->PushSparse("e", keys.data(), n, Grad(n * 4, step).data(), {}, nullptr).Wait().ok());
  };
  push(1000, 1);
  ASSERT_EQ(*server.Checkpoint(), server.checkpoint_path());
  push(10, 2);
  g_fail_directory_fsync = true;
  auto failed = server.Checkpoint();
  g_fail_directory_fsync = false;
  ASSERT_FALSE(failed.ok()) << "counted good: " << *failed;
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable) << failed.status().ToString();
  EXPECT_THAT(failed.status().message(),
              HasSubstr("cannot sync its directory " + o.checkpoint_dir));
  push(10, 3);
  auto file = server.Checkpoint();
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  EXPECT_EQ(*file, server.checkpoint_path()) << "a delta after one not known to be durable";
  client.reset();
  server.Stop();
}

// A shard killed while writing a delta left PATH.dN.tmp (and PATH.tmp for a full one),
// which stayed until delta N was written again, maybe never. They are removed at start;
// other shards' files and the checkpoint chain are left alone.
TEST_F(CheckpointTest, TempFilesOfAKilledCheckpointWriteAreRemovedAtStart) {
  static std::atomic<int> counter{0};
  const ShardServerOptions o =
      ServerOptions("ckpt-tmp-" + std::to_string(counter++), 0, dir_ + "/ck", 1);
  const std::string path = o.checkpoint_dir + "/shard-0-of-1.ckpt";
  {
    ShardServer server(o, std::make_shared<prometheus::Registry>());
    auto client = StartWithTableE(&server);
    ASSERT_NE(client, nullptr);
    const auto keys = KeyRange(0, 100);
    ASSERT_TRUE(
        client->PushSparse("e", keys.data(), 100, Grad(400, 1).data(), {}, nullptr).Wait().ok());
    client.reset();
    server.Stop();
  }
  const std::vector<std::string> leftovers = {path + ".tmp", path + ".d7.tmp", path + ".d12.tmp"};
  const std::vector<std::string> kept = {o.checkpoint_dir + "/shard-1-of-2.ckpt.d1.tmp",
                                         path + ".dx.tmp", path + ".notes.tmp"};
  for (const std::string& f : leftovers) WriteFile(f, "half a checkpoint");
  for (const std::string& f : kept) WriteFile(f, "someone else's");
  ShardServer server(o, std::make_shared<prometheus::Registry>());
  auto ep = server.Start();
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  for (const std::string& f : leftovers) EXPECT_FALSE(fs::exists(f)) << f;
  for (const std::string& f : kept) EXPECT_TRUE(fs::exists(f)) << f;
  EXPECT_TRUE(fs::exists(path));
  EXPECT_NE(server.FindTable("e"), nullptr) << "restored";
  server.Stop();
}

// Random histories through chains of checkpoints: pushes of new and existing keys to an
// uncapped Adagrad table, a capped table that evicts, a TTL table that expires rows, and
// a dense table; cuts of either kind (the first full) with more pushes between each cut
// and its write (copy on write) and after it; after each write, the chain restored from
// the files equals the tables as they were at that cut.
TEST_F(CheckpointTest, RandomHistoriesRestoreEveryCutOfTheChain) {
  const ShardIdentity id{0, 1};
  for (uint64_t seed = 1; seed <= 12; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    std::mt19937_64 rng(seed);
    const std::string path = dir_ + "/random-" + std::to_string(seed) + ".ckpt";
    TableSpec ttl = CappedSpec();
    ttl.name = "ttl";
    ttl.max_rows = 0;
    ttl.ttl_ms = 100;
    TableSpec dense = DenseSpec();
    dense.accumulate = 1;
    Tables tables = {{"sparse", NewTable(SparseSpec(), id)},
                     {"capped", NewTable(CappedSpec(), id)},
                     {"ttl", NewTable(ttl, id)},
                     {"dense", NewTable(dense, id)}};
    const auto universe = KeyRange(0, 6000);
    uint64_t now = 1000;
    auto push_some = [&] {
      for (const auto& [name, t] : tables) {
        if (t->spec().kind == TableKind::kDense) {
          Push(*t, Grad(t->local_elements(), static_cast<int>(rng() % 7)));
          continue;
        }
        const uint32_t dim = t->spec().dim;
        std::vector<uint64_t> keys(1 + rng() % 700);
        const uint64_t width = 500 + rng() % universe.size();  // sometimes only old keys
        for (auto& k : keys) k = universe[rng() % std::min<uint64_t>(width, universe.size())];
        PushRequest req;
        req.sender = 1;
        req.keys = keys.data();
        req.num_keys = keys.size();
        std::vector<float> g = Grad(keys.size() * dim, static_cast<int>(rng() % 9));
        req.values = g.data();
        req.num_values = g.size();
        req.now_ms = now;
        ASSERT_TRUE(t->Push(req).ok());
      }
      now += rng() % 60;
      for (const auto& [name, t] : tables) t->Maintain(now);  // the TTL table drops rows
    };
    uint64_t trailer = 0, deltas = 0;
    for (int cut = 0; cut < 8; ++cut) {
      for (int i = rng() % 4; i >= 0; --i) push_some();
      const bool full = cut == 0 || rng() % 4 == 0;
      std::map<std::string, std::string> at_cut;
      for (const auto& [name, t] : tables) {
        ByteWriter w;
        t->Save(&w);
        at_cut[name] = w.buffer();
      }
      ShardSnapshot snap =
          SnapshotShard(id, tables, dedup_, full ? SnapshotKind::kFull : SnapshotKind::kDelta);
      for (int i = rng() % 3; i > 0; --i) push_some();  // updates between the cut and the write
      snap.seq = full ? 0 : deltas + 1;
      snap.prev_trailer = full ? 0 : trailer;
      const std::string file = full ? path : DeltaPath(path, snap.seq);
      ASSERT_TRUE(WriteSnapshot(file, &snap, &trailer).ok());
      snap = {};
      if (full) {
        for (const DeltaFile& f : DeltaFiles(path)) fs::remove(f.path);
        deltas = 0;
      } else {
        ++deltas;
      }
      Dedup d;
      auto r = RestoreCheckpoint(path, id, &d);
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      ASSERT_EQ(r->deltas, deltas);
      Tables expected;
      for (const auto& [name, bytes] : at_cut) {
        expected[name] = NewTable(tables.at(name)->spec(), id);
        ByteReader rd(bytes.data(), bytes.size());
        ASSERT_TRUE(expected[name]->Load(&rd).ok());
      }
      SCOPED_TRACE("cut " + std::to_string(cut) + (full ? " (full)" : " (delta)"));
      ExpectSameTables(r->tables, expected, universe);
    }
  }
}

TEST_F(CheckpointTest, PeriodicCheckpointsOfAnIdleShardWriteNothing) {
  static std::atomic<int> counter{0};
  const ShardServerOptions o = ServerOptions("ckpt-idle-" + std::to_string(counter++), 0, dir_, 1);
  ShardServer server(o, std::make_shared<prometheus::Registry>());
  auto ep = server.Start();
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  auto client = ConnectClient({*ep});
  ASSERT_NE(client, nullptr);
  const std::string path = server.checkpoint_path();
  // Nothing written yet: even an idle shard writes its first checkpoint.
  ASSERT_EQ(*server.Checkpoint(/*skip_if_unchanged=*/true), path);
  const auto written = fs::last_write_time(path);
  EXPECT_EQ(*server.Checkpoint(true), path);
  EXPECT_EQ(fs::last_write_time(path), written) << "idle: not written again";
  ASSERT_TRUE(client->CreateTable(SparseE(4)).ok());
  EXPECT_EQ(*server.Checkpoint(true), path) << "a new table is a change (and the shard "
                                               "had no rows: a full checkpoint)";
  EXPECT_NE(fs::last_write_time(path), written);
  const auto keys = KeyRange(0, 1000);
  ASSERT_TRUE(
      client->PushSparse("e", keys.data(), 1000, Grad(4000, 1).data(), {}, nullptr).Wait().ok());
  ASSERT_EQ(*server.Checkpoint(true), path);  // full: every row is new
  ASSERT_TRUE(
      client->PushSparse("e", keys.data(), 10, Grad(40, 2).data(), {}, nullptr).Wait().ok());
  EXPECT_EQ(*server.Checkpoint(true), DeltaPath(path, 1));
  EXPECT_EQ(*server.Checkpoint(true), DeltaPath(path, 1)) << "idle again";
  EXPECT_FALSE(fs::exists(DeltaPath(path, 2)));
  EXPECT_EQ(*server.Checkpoint(), DeltaPath(path, 2)) << "asked for: written";
  client.reset();
  server.Stop();
}

}  // namespace
}  // namespace onlineps::ps
