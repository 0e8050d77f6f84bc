// Tests of ps/memory_budget.h: the cgroup memory files read (v2 memory.max, v1
// memory.limit_in_bytes), the budget chosen from the flag and those files, and the
// count a shard keeps against it.
#include "ps/memory_budget.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace onlineps::ps {
namespace {

using ::testing::HasSubstr;

class MemoryBudgetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("memory-budget-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string path = (dir_ / name).string();
    std::ofstream(path) << text;
    return path;
  }
  std::filesystem::path dir_;
};

TEST_F(MemoryBudgetTest, ReadsCgroupV2AndV1Limits) {
  auto v2 = ReadCgroupMemoryLimit(Write("memory.max", "4294967296\n"));
  ASSERT_TRUE(v2.ok()) << v2.status().ToString();
  EXPECT_EQ(*v2, std::optional<uint64_t>(4294967296));
  auto none = ReadCgroupMemoryLimit(Write("v2-none", "max\n"));
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  auto v1 = ReadCgroupMemoryLimit(Write("memory.limit_in_bytes", "1073741824\n"));
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ(*v1, std::optional<uint64_t>(1073741824));
  // cgroup v1 without a limit: LONG_MAX rounded down to a page.
  auto v1_none = ReadCgroupMemoryLimit(Write("v1-none", "9223372036854771712\n"));
  ASSERT_TRUE(v1_none.ok());
  EXPECT_FALSE(v1_none->has_value());
}

TEST_F(MemoryBudgetTest, AFileThatIsNotALimitIsAnErrorNamingIt) {
  const std::string bad = Write("garbage", "12 apples\n");
  auto r = ReadCgroupMemoryLimit(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr(bad));
  EXPECT_THAT(r.status().message(), HasSubstr("'12 apples'"));
  EXPECT_FALSE(ReadCgroupMemoryLimit(Write("empty", "")).ok());
  auto missing = ReadCgroupMemoryLimit((dir_ / "absent").string());
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
}

TEST_F(MemoryBudgetTest, TheDefaultIsHalfTheFirstCgroupLimitElseNone) {
  const std::string v2 = (dir_ / "absent-memory.max").string();
  const std::string v1 = Write("memory.limit_in_bytes", "4294967296\n");
  MemoryBudgetChoice c = ChooseMemoryBudget(-1, {v2, v1});
  EXPECT_EQ(c.bytes, uint64_t{2} << 30);
  EXPECT_THAT(c.source, HasSubstr("half the cgroup memory limit of 4294967296 bytes in " + v1));
  // v2 first when it sets one.
  c = ChooseMemoryBudget(-1, {Write("memory.max", "1048576000\n"), v1});
  EXPECT_EQ(c.bytes, 524288000u);
  // No limit anywhere: no budget, and the log line says why.
  c = ChooseMemoryBudget(-1, {Write("v2-none", "max\n"), Write("v1-none", "9223372036854771712")});
  EXPECT_EQ(c.bytes, 0u);
  EXPECT_THAT(c.source, HasSubstr("sets no limit"));
  // The flag wins, 0 included.
  c = ChooseMemoryBudget(300, {v1});
  EXPECT_EQ(c.bytes, uint64_t{300} << 20);
  EXPECT_EQ(c.source, "--max-memory-mb 300");
  EXPECT_EQ(ChooseMemoryBudget(0, {v1}).bytes, 0u);
}

TEST(MemoryBudgetCountTest, AMeasureReplacesWhatWasAdmittedBeforeIt) {
  MemoryBudget b(1000);
  EXPECT_TRUE(b.enabled());
  EXPECT_TRUE(b.Fits(1000));
  EXPECT_FALSE(b.Fits(1001));
  b.Add(600);
  EXPECT_TRUE(b.stale());
  EXPECT_FALSE(b.Fits(401));
  b.Measure([&b] {
    b.Add(50);  // admitted while the sum is taken: kept until the next measure
    return uint64_t{300};
  });
  EXPECT_EQ(b.used(), 350u);
  EXPECT_TRUE(b.stale());
  b.Measure([] { return uint64_t{1200}; });
  EXPECT_EQ(b.used(), 1200u);
  EXPECT_FALSE(b.stale());
  EXPECT_FALSE(b.Fits(0));  // over: nothing more fits (no wrap-around)
  EXPECT_FALSE(MemoryBudget(0).enabled());
}

// Updates applied at once each reserve before they apply: together they never take
// the count past the limit, and what they settle is counted until the next measure.
TEST(MemoryBudgetCountTest, ReservationsTakenAtOnceNeverTogetherPassTheLimit) {
  MemoryBudget b(1000);
  std::atomic<int> granted{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] { granted += b.TryReserve(300) ? 1 : 0; });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(granted.load(), 3);
  EXPECT_EQ(b.used(), 900u);
  EXPECT_FALSE(b.stale()) << "a reservation is not admitted yet";
  b.Settle(300, 120);  // applied: 120 of its 300 bytes were new rows
  b.Settle(300, 0);    // not applied: all released
  EXPECT_EQ(b.used(), 420u);
  EXPECT_TRUE(b.stale());
  b.Measure([] { return uint64_t{100}; });  // the sum: the settled rows, say
  EXPECT_EQ(b.used(), 400u) << "the reservation still open stays counted";
  EXPECT_FALSE(b.TryReserve(601));
  EXPECT_TRUE(b.TryReserve(600));
  EXPECT_FALSE(b.TryReserve(1)) << "at the limit";
}

}  // namespace
}  // namespace onlineps::ps
