// CallGate: one key's calls run one at a time in arrival order, whether they wait with a
// continuation (no thread held) or block; other keys never wait; no memory stays behind.
#include "mcp_bridge/call_gate.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace onlineps::bridge {
namespace {

TEST(CallGateTest, CallsOfAKeyRunInArrivalOrderOneAtATime) {
  CallGate gate;
  std::vector<std::string> ran;
  gate.Enter("a", [&] { ran.push_back("a1"); });  // free: runs here, now
  gate.Enter("a", [&] { ran.push_back("a2"); });  // waits behind a1
  gate.Enter("b", [&] { ran.push_back("b1"); });  // another key: at once
  gate.Enter("a", [&] { ran.push_back("a3"); });
  EXPECT_EQ(ran, (std::vector<std::string>{"a1", "b1"}));
  EXPECT_EQ(gate.keys(), 2u);
  gate.Leave("a");  // a1 done: a2 runs on this thread
  EXPECT_EQ(ran, (std::vector<std::string>{"a1", "b1", "a2"}));
  gate.Leave("b");
  gate.Leave("a");
  EXPECT_EQ(ran, (std::vector<std::string>{"a1", "b1", "a2", "a3"}));
  gate.Leave("a");
  EXPECT_EQ(gate.keys(), 0u);
  gate.Leave("a");  // a Leave without its Enter changes nothing
  EXPECT_EQ(gate.keys(), 0u);
}

// Calls that end as soon as they run (refused at once) leave from inside the Leave that
// ran them: a long queue of those runs in order without growing the stack.
TEST(CallGateTest, AQueueOfCallsThatEndAtOnceRunsInOrderWithoutRecursion) {
  CallGate gate;
  constexpr int kCalls = 200000;
  std::vector<int> order;
  gate.Enter("k", [] {});
  for (int i = 0; i < kCalls; ++i) {
    gate.Enter("k", [&gate, &order, i] {
      order.push_back(i);
      gate.Leave("k");
    });
  }
  gate.Leave("k");
  ASSERT_EQ(order.size(), static_cast<size_t>(kCalls));
  for (int i = 0; i < kCalls; ++i) ASSERT_EQ(order[i], i);
  EXPECT_EQ(gate.keys(), 0u);
}

TEST(CallGateTest, ABlockingCallWaitsForItsTurnAndKeepsItUntilItLeaves) {
  CallGate gate;
  std::atomic<int> stage{0};
  gate.Enter("s", [&] { stage = 1; });  // an asynchronous call is running
  std::thread blocking([&] {
    gate.EnterAndWait("s");  // must wait for the running call
    stage = 2;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stage = 3;
    gate.Leave("s");
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_EQ(stage.load(), 1);  // still waiting
  std::atomic<bool> third_ran{false};
  gate.Enter("s", [&] {
    // Behind the blocking call: it has left by the time this runs.
    EXPECT_EQ(stage.load(), 3);
    third_ran = true;
  });
  gate.Leave("s");  // hands the turn to the blocking call
  blocking.join();  // whose Leave ran the third call on its thread
  EXPECT_TRUE(third_ran.load());
  gate.Leave("s");
  EXPECT_EQ(gate.keys(), 0u);
}

TEST(CallGateTest, ManyThreadsNeverOverlapWithinAKey) {
  CallGate gate;
  std::atomic<int> inside{0}, overlaps{0}, done{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        gate.EnterAndWait("k");
        if (inside.fetch_add(1) != 0) ++overlaps;
        inside.fetch_sub(1);
        ++done;
        gate.Leave("k");
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(overlaps.load(), 0);
  EXPECT_EQ(done.load(), 1600);
  EXPECT_EQ(gate.keys(), 0u);
}

}  // namespace
}  // namespace onlineps::bridge
