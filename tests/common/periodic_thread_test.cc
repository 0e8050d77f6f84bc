// PeriodicThread (common/periodic_thread.h): ticks every period, first at once only when
// asked, stops at once mid-wait, and starts again after a stop.
#include "common/periodic_thread.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

namespace onlineps {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// Waits (bounded) until `n` reaches `want`.
bool Reaches(const std::atomic<int>& n, int want) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (n.load() < want) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(milliseconds(1));
  }
  return true;
}

TEST(PeriodicThreadTest, TicksEveryPeriodUntilStopped) {
  std::atomic<int> ticks{0};
  PeriodicThread t;
  t.Start(
      milliseconds(5), [&] { ++ticks; }, /*tick_first=*/false);
  EXPECT_TRUE(Reaches(ticks, 3));
  t.Stop();
  const int after = ticks.load();
  std::this_thread::sleep_for(milliseconds(30));
  EXPECT_EQ(ticks.load(), after);  // no tick after Stop returned
}

TEST(PeriodicThreadTest, FirstTickAtOnceOnlyWhenAsked) {
  std::atomic<int> first{0}, later{0};
  PeriodicThread a, b;
  a.Start(
      std::chrono::hours(1), [&] { ++first; }, /*tick_first=*/true);
  b.Start(
      std::chrono::hours(1), [&] { ++later; }, /*tick_first=*/false);
  EXPECT_TRUE(Reaches(first, 1));
  std::this_thread::sleep_for(milliseconds(20));
  EXPECT_EQ(later.load(), 0);
}

TEST(PeriodicThreadTest, StopWakesTheWaitingThreadAtOnce) {
  PeriodicThread t;
  t.Start(
      std::chrono::hours(1), [] {}, /*tick_first=*/false);
  const auto start = Clock::now();
  t.Stop();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
  t.Stop();  // idempotent
}

TEST(PeriodicThreadTest, StartsAgainAfterStopAndIgnoresASecondStart) {
  std::atomic<int> ticks{0}, other{0};
  PeriodicThread t;
  t.Start(
      milliseconds(2), [&] { ++ticks; }, /*tick_first=*/true);
  t.Start(
      milliseconds(2), [&] { ++other; }, /*tick_first=*/true);  // already running
  EXPECT_TRUE(Reaches(ticks, 2));
  t.Stop();
  EXPECT_EQ(other.load(), 0);
  const int before = ticks.load();
  t.Start(
      milliseconds(2), [&] { ++ticks; }, /*tick_first=*/false);
  EXPECT_TRUE(Reaches(ticks, before + 2));
  t.Stop();
}

TEST(PeriodicThreadTest, StopNeverStartedIsANoOp) {
  PeriodicThread t;
  t.Stop();
}

}  // namespace
}  // namespace onlineps
