// Request ids and bounded maps: the pieces that keep a months-long process bounded.
#include "common/request_ids.h"

#include <gtest/gtest.h>

#include <set>

#include "common/lru_map.h"

namespace onlineps {
namespace {

TEST(RequestIdPoolTest, InFlightIdsAreUniqueNonZeroAndExhaustionIsReported) {
  RequestIdPool pool(8);
  std::set<uint32_t> ids;
  for (int i = 0; i < 8; ++i) {
    auto id = pool.Acquire();
    ASSERT_TRUE(id.has_value());
    EXPECT_NE(*id, 0u);
    EXPECT_TRUE(ids.insert(*id).second) << "duplicate id " << *id;
  }
  EXPECT_FALSE(pool.Acquire().has_value());
  EXPECT_EQ(pool.in_flight(), 8u);
  pool.Release(*ids.begin());
  EXPECT_TRUE(pool.Acquire().has_value());
}

TEST(RequestIdPoolTest, ReleasedIdNoLongerMatchesSoALateReplyIsDropped) {
  RequestIdPool pool(1);
  const uint32_t first = *pool.Acquire();
  ASSERT_TRUE(pool.SlotOf(first).has_value());
  pool.Release(first);
  EXPECT_FALSE(pool.SlotOf(first).has_value());
  const uint32_t second = *pool.Acquire();
  EXPECT_NE(second, first) << "a recycled slot must carry a new generation";
  EXPECT_FALSE(pool.SlotOf(first).has_value());
  EXPECT_TRUE(pool.SlotOf(second).has_value());
  pool.Release(second);
  pool.Release(second);  // double release is harmless
  EXPECT_EQ(pool.in_flight(), 0u);
}

TEST(RequestIdPoolTest, GenerationsWrapWithoutEverIssuingZeroOrOverflowing) {
  RequestIdPool pool(1);
  uint32_t previous = 0;
  // 200,000 reuses of one slot: the 16-bit generation wraps about three times.
  for (int i = 0; i < 200000; ++i) {
    auto id = pool.Acquire();
    ASSERT_TRUE(id.has_value()) << "iteration " << i;
    ASSERT_NE(*id, 0u) << "iteration " << i;
    ASSERT_NE(*id, previous) << "iteration " << i;
    ASSERT_EQ(*pool.SlotOf(*id), 0u);
    pool.Release(*id);
    previous = *id;
  }
}

TEST(RequestIdPoolTest, UnknownIdsAreRejected) {
  RequestIdPool pool(4);
  EXPECT_FALSE(pool.SlotOf(0).has_value());
  EXPECT_FALSE(pool.SlotOf(0x00010009u).has_value()) << "slot 9 does not exist";
  EXPECT_FALSE(pool.SlotOf(0x00050001u).has_value()) << "generation never issued";
}

TEST(LruMapTest, EvictsLeastRecentlyUsedWhenFull) {
  LruMap<int, std::string> m(2);
  m.Put(1, "a");
  m.Put(2, "b");
  ASSERT_NE(m.Find(1), nullptr);  // 1 is now the most recent
  m.Put(3, "c");                  // evicts 2
  EXPECT_EQ(m.Find(2), nullptr);
  ASSERT_NE(m.Find(1), nullptr);
  EXPECT_EQ(*m.Find(1), "a");
  EXPECT_EQ(*m.Find(3), "c");
  EXPECT_EQ(m.size(), 2u);
  EXPECT_EQ(m.evictions(), 1u);
}

TEST(LruMapTest, PutReplacesAndEvictWhileStopsAtFirstKeeper) {
  LruMap<int, int> m(10);
  for (int i = 0; i < 5; ++i) m.Put(i, i * 10);
  m.Put(2, 99);
  EXPECT_EQ(*m.Find(2), 99);
  EXPECT_EQ(m.size(), 5u);
  // Recency order, oldest first: 0, 1, 3, 4, 2. Drop entries while value < 20.
  size_t removed = m.EvictWhile([](int, int v) { return v < 20; });
  EXPECT_EQ(removed, 2u);
  EXPECT_EQ(m.Find(0), nullptr);
  EXPECT_EQ(m.Find(1), nullptr);
  EXPECT_NE(m.Find(3), nullptr);
  EXPECT_TRUE(m.Erase(3));
  EXPECT_FALSE(m.Erase(3));
  EXPECT_EQ(m.size(), 2u);
}

}  // namespace
}  // namespace onlineps
