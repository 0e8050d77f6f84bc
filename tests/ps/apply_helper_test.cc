// Tests of ApplyHelper (ps/apply_helper.h): a task runs once on the helper or is taken
// back, an exception thrown on the helper reaches the caller's Finish, and the helper is
// free again afterwards.
#include "ps/apply_helper.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

namespace onlineps::ps {
namespace {

// REQUIRES: a helper (the tests skip on one core).
ApplyHelper& Helper() { return *ApplyHelper::Get(); }

TEST(ApplyHelperTest, ATaskRunsOnceOnTheHelperOrIsTakenBack) {
  if (ApplyHelper::Get() == nullptr) GTEST_SKIP() << "one core";
  int ran_on_helper = 0, taken_back = 0;
  for (int i = 0; i < 2000; ++i) {
    std::atomic<int> runs{0};
    ASSERT_TRUE(Helper().TryStart([&] { runs.fetch_add(1); }));
    EXPECT_FALSE(Helper().TryStart([] {})) << "busy until Finish";
    if (i % 2 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
    if (Helper().Finish()) {
      ++ran_on_helper;
      EXPECT_EQ(runs.load(), 1);
    } else {
      ++taken_back;
      EXPECT_EQ(runs.load(), 0);
    }
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(10));  // a late helper runs nothing
  EXPECT_GT(ran_on_helper, 0);
  EXPECT_EQ(ran_on_helper + taken_back, 2000);
}

TEST(ApplyHelperTest, WhatTheTaskThrowsReachesFinishAndTheHelperIsFreeAfterwards) {
  if (ApplyHelper::Get() == nullptr) GTEST_SKIP() << "one core";
  int thrown = 0;
  for (int i = 0; i < 50; ++i) {
    std::atomic<bool> started{false};
    ASSERT_TRUE(Helper().TryStart([&] {
      started = true;
      throw std::runtime_error("out of memory, say");
    }));
    while (!started) std::this_thread::yield();  // on the helper: Finish waits for it
    try {
      Helper().Finish();
    } catch (const std::runtime_error& e) {
      ++thrown;
      EXPECT_STREQ(e.what(), "out of memory, say");
    }
  }
  EXPECT_EQ(thrown, 50);
  std::atomic<int> runs{0};
  ASSERT_TRUE(Helper().TryStart([&] { runs.fetch_add(1); }));
  while (runs.load() == 0) std::this_thread::yield();
  EXPECT_TRUE(Helper().Finish());
}

}  // namespace
}  // namespace onlineps::ps
