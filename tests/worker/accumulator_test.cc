// Accumulator (worker/accumulator.h): the k-examples and age triggers, forced flushes,
// the per-shard minimum of base versions, and exact sums under concurrent adds.
#include "worker/accumulator.h"

#include <gtest/gtest.h>

#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

namespace onlineps::worker {
namespace {

TEST(AccumulatorTest, ReadyWhenExampleCountReached) {
  Accumulator acc(3, /*examples=*/4, /*max_ms=*/0);
  EXPECT_FALSE(acc.Add({1, 2, 3}, {5, 5}, 2, 100).has_value());
  EXPECT_EQ(acc.pending_examples(), 2u);
  auto batch = acc.Add({10, 20, 30}, {5, 5}, 2, 101);
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->sum, (std::vector<float>{11, 22, 33}));
  EXPECT_EQ(batch->examples, 4u);
  EXPECT_EQ(batch->calls, 2u);
  EXPECT_EQ(acc.pending_examples(), 0u);
}

TEST(AccumulatorTest, SingleCallOverTheCountIsReadyAtOnce) {
  Accumulator acc(1, 4, 0);
  auto batch = acc.Add({7}, {}, 9, 0);
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->examples, 9u);
  EXPECT_EQ(batch->calls, 1u);
}

TEST(AccumulatorTest, ReadyWhenOldestGradientReachesMaxAge) {
  Accumulator acc(2, /*examples=*/100, /*max_ms=*/50);
  EXPECT_FALSE(acc.Add({1, 1}, {}, 1, 1000).has_value());
  EXPECT_FALSE(acc.Add({1, 1}, {}, 1, 1049).has_value());
  auto batch = acc.Add({1, 1}, {}, 1, 1050);
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->sum, (std::vector<float>{3, 3}));
  EXPECT_EQ(batch->calls, 3u);
}

// Finite gradients past half the float range summed to Inf, a push every shard refuses.
TEST(AccumulatorTest, TheSumSaturatesAtTheFloatRangeInsteadOfOverflowing) {
  const float big = std::numeric_limits<float>::max() * 0.75f;
  Accumulator acc(3, /*examples=*/3, /*max_ms=*/0);
  EXPECT_FALSE(acc.Add({big, -big, 1}, {}, 1, 0).has_value());
  EXPECT_FALSE(acc.Add({big, -big, 1}, {}, 1, 0).has_value());
  auto batch = acc.Add({-big, big, 1}, {}, 1, 0);
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->sum[0], std::numeric_limits<float>::max() - big);
  EXPECT_EQ(batch->sum[1], -(std::numeric_limits<float>::max() - big));
  EXPECT_EQ(batch->sum[2], 3.0f);
}

TEST(AccumulatorTest, TakeIfDueWaitsForTheAgeOfTheFirstAdd) {
  Accumulator acc(1, 100, 50);
  EXPECT_FALSE(acc.TakeIfDue(5000, false).has_value());  // empty: never due
  EXPECT_FALSE(acc.Add({2}, {}, 1, 1000).has_value());
  EXPECT_FALSE(acc.Add({3}, {}, 1, 1040).has_value());
  EXPECT_FALSE(acc.TakeIfDue(1049, false).has_value());
  auto batch = acc.TakeIfDue(1050, false);
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->sum, std::vector<float>{5});
  EXPECT_FALSE(acc.TakeIfDue(9999, false).has_value());  // reset: nothing left
  EXPECT_FALSE(acc.TakeIfDue(9999, true).has_value());   // force does not invent a batch
}

TEST(AccumulatorTest, AgeIsMeasuredFromTheFirstAddOfTheCurrentBatch) {
  Accumulator acc(1, 100, 50);
  EXPECT_FALSE(acc.Add({1}, {}, 1, 0).has_value());
  ASSERT_TRUE(acc.TakeIfDue(10, true).has_value());
  EXPECT_FALSE(acc.Add({1}, {}, 1, 1000).has_value());
  EXPECT_FALSE(acc.TakeIfDue(1049, false).has_value());
  EXPECT_TRUE(acc.TakeIfDue(1050, false).has_value());
}

TEST(AccumulatorTest, NoTimeTriggerWhenMaxMsIsZeroButForceTakes) {
  Accumulator acc(2, 100, 0);
  EXPECT_FALSE(acc.Add({1, 2}, {3}, 5, 0).has_value());
  EXPECT_FALSE(acc.Add({1, 2}, {3}, 5, 1'000'000'000).has_value());
  EXPECT_FALSE(acc.TakeIfDue(2'000'000'000, false).has_value());
  auto batch = acc.TakeIfDue(0, true);
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->sum, (std::vector<float>{2, 4}));
  EXPECT_EQ(batch->examples, 10u);
  EXPECT_EQ(acc.pending_examples(), 0u);
}

TEST(AccumulatorTest, BaseIsPerShardMinimumOfTheSummedGradients) {
  Accumulator acc(1, 100, 0);
  EXPECT_FALSE(acc.Add({1}, {5, 9}, 1, 0).has_value());
  EXPECT_FALSE(acc.Add({1}, {7, 3}, 1, 0).has_value());
  EXPECT_FALSE(acc.Add({1}, {}, 1, 0).has_value());  // no versions: no effect
  auto batch = acc.TakeIfDue(0, true);
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->base, (ps::VersionVector{5, 3}));
}

TEST(AccumulatorTest, EmptyFirstBaseIsReplacedByLaterVersions) {
  Accumulator acc(1, 100, 0);
  EXPECT_FALSE(acc.Add({1}, {}, 1, 0).has_value());
  EXPECT_FALSE(acc.Add({1}, {4, 6}, 1, 0).has_value());
  EXPECT_FALSE(acc.Add({1}, {8, 2}, 1, 0).has_value());
  auto batch = acc.TakeIfDue(0, true);
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->base, (ps::VersionVector{4, 2}));
}

TEST(AccumulatorTest, NextBatchStartsFromZeroWithItsOwnBase) {
  Accumulator acc(2, 2, 0);
  ASSERT_TRUE(acc.Add({1, 1}, {1, 1}, 2, 0).has_value());
  auto batch = acc.Add({4, 5}, {9, 8}, 2, 0);
  ASSERT_TRUE(batch.has_value());
  EXPECT_EQ(batch->sum, (std::vector<float>{4, 5}));
  EXPECT_EQ(batch->base, (ps::VersionVector{9, 8}));
  EXPECT_EQ(batch->calls, 1u);
}

TEST(AccumulatorTest, ConcurrentAddsSumExactly) {
  constexpr int kThreads = 4, kAdds = 2000;
  Accumulator acc(3, /*examples=*/1000, 0);
  std::vector<float> total(3, 0);
  uint64_t examples = 0, calls = 0;
  std::mutex mu;
  auto take = [&](std::optional<Accumulator::Batch> b) {
    if (!b) return;
    std::lock_guard<std::mutex> lock(mu);
    for (size_t i = 0; i < 3; ++i) total[i] += b->sum[i];
    examples += b->examples;
    calls += b->calls;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < kAdds; ++i) take(acc.Add({1, 2, 0.5f}, {}, 1, i));
    });
  }
  for (auto& t : threads) t.join();
  take(acc.TakeIfDue(0, true));
  EXPECT_EQ(examples, uint64_t{kThreads * kAdds});
  EXPECT_EQ(calls, uint64_t{kThreads * kAdds});
  EXPECT_EQ(total, (std::vector<float>{8000, 16000, 4000}));
}

}  // namespace
}  // namespace onlineps::worker
