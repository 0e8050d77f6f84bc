// RowStore (ps/row_store.h): every key found at its slot with its bytes intact across
// the incremental index rebuilds of growth and of erase churn, checked against
// std::unordered_map; erased keys gone while a rebuild is under way; slots reused; memory
// that follows the row count.
#include "ps/row_store.h"

#include <gtest/gtest.h>

#include <random>
#include <unordered_map>
#include <vector>

namespace onlineps::ps {
namespace {

// Writes a row's floats from its key, so that a row read at the wrong slot shows.
void Fill(RowStore& s, uint32_t slot, uint64_t key, size_t floats) {
  for (size_t j = 0; j < floats; ++j) s.Floats(slot)[j] = static_cast<float>((key * 7 + j) % 1000);
}

bool Intact(const RowStore& s, uint32_t slot, uint64_t key, size_t floats) {
  if (s.KeyOf(slot) != key) return false;
  for (size_t j = 0; j < floats; ++j) {
    if (s.Floats(slot)[j] != static_cast<float>((key * 7 + j) % 1000)) return false;
  }
  return true;
}

TEST(RowStoreTest, FindsEveryKeyThroughGrowth) {
  constexpr size_t kFloats = 5;
  RowStore s(8, kFloats);
  std::unordered_map<uint64_t, uint32_t> ref;
  for (uint64_t k = 0; k < 200000; ++k) {
    const uint64_t key = k * 0x9e3779b97f4a7c15ULL;  // includes key 0
    ASSERT_EQ(s.Find(key), RowStore::kNoSlot) << k;
    const uint32_t slot = s.Insert(key);
    Fill(s, slot, key, kFloats);
    ref[key] = slot;
    // Every earlier key is still found, checked at powers of two (around each rebuild).
    if ((k & (k + 1)) == 0) {
      for (const auto& [rk, rs] : ref) ASSERT_EQ(s.Find(rk), rs) << "after " << k;
    }
  }
  EXPECT_EQ(s.size(), ref.size());
  for (const auto& [key, slot] : ref) {
    ASSERT_EQ(s.Find(key), slot);
    ASSERT_TRUE(Intact(s, slot, key, kFloats));
  }
  EXPECT_EQ(s.Find(12345), RowStore::kNoSlot);
}

TEST(RowStoreTest, RandomInsertEraseMatchesReference) {
  constexpr size_t kFloats = 3;
  RowStore s(24, kFloats);
  std::unordered_map<uint64_t, uint32_t> ref;
  std::mt19937_64 rng(7);
  for (int op = 0; op < 400000; ++op) {
    // Few distinct keys: heavy churn, so deleted marks pile up and force clean rebuilds.
    const uint64_t key = rng() % 5000;
    const uint32_t slot = s.Find(key);
    auto it = ref.find(key);
    ASSERT_EQ(slot == RowStore::kNoSlot, it == ref.end()) << "op " << op;
    if (it == ref.end()) {
      const uint32_t fresh = s.Insert(key);
      Fill(s, fresh, key, kFloats);
      ref[key] = fresh;
    } else {
      ASSERT_EQ(slot, it->second);
      ASSERT_TRUE(Intact(s, slot, key, kFloats));
      if (rng() % 2) {
        s.Erase(slot);
        ref.erase(it);
      }
    }
    ASSERT_EQ(s.size(), ref.size());
  }
  // Erased slots are reused: slots never outgrow the most rows held at once.
  EXPECT_LE(s.slot_end(), 5000u);
}

// Rows erased while the index grows (a TTL or max_rows eviction during a rebuild) are
// gone from both arrays: a Find of an erased key once returned its freed slot, which the
// next Insert gives to another key, so a push of the evicted key wrote that key's row.
TEST(RowStoreTest, EraseDuringRebuildIsNotFoundAgain) {
  constexpr size_t kFloats = 2;
  RowStore s(8, kFloats);
  std::vector<uint64_t> live;
  std::mt19937_64 rng(3);
  for (uint64_t k = 1; k <= 300000; ++k) {
    const uint32_t fresh = s.Insert(k);
    Fill(s, fresh, k, kFloats);
    live.push_back(k);
    if (k % 3 != 0) continue;
    const size_t j = rng() % live.size();
    const uint64_t key = live[j];
    live[j] = live.back();
    live.pop_back();
    const uint32_t slot = s.Find(key);
    ASSERT_NE(slot, RowStore::kNoSlot) << key;
    s.Erase(slot);
    ASSERT_EQ(s.Find(key), RowStore::kNoSlot) << "erased key " << key << " found at " << k;
  }
  ASSERT_EQ(s.size(), live.size());
  for (const uint64_t key : live) {
    const uint32_t slot = s.Find(key);
    ASSERT_NE(slot, RowStore::kNoSlot) << key;
    ASSERT_TRUE(Intact(s, slot, key, kFloats)) << key;
  }
}

TEST(RowStoreTest, MemoryFollowsRowCount) {
  constexpr size_t kFloats = 16;
  RowStore s(8, kFloats);
  const size_t empty = s.memory_bytes();
  EXPECT_LT(empty, 1024u);
  for (uint64_t k = 0; k < 100000; ++k) s.Insert(k);
  const double per_row = static_cast<double>(s.memory_bytes()) / s.size();
  // 72 bytes of record plus at most 32 of index: 8 bytes a bucket, the new array at
  // least 3/8 full and the old one, 3/4 full, until it is moved.
  EXPECT_GE(per_row, 72.0);
  EXPECT_LE(per_row, 72.0 + 32.0 + 1.0);
}

}  // namespace
}  // namespace onlineps::ps
