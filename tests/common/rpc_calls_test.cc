// RpcCalls, the RPC core of PsClient and WorkerClient: every call handed back exactly
// once (reply, deadline, resend or Stop), ids never reused while in flight, bounded.
#include "common/rpc_calls.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <set>
#include <thread>
#include <vector>

namespace onlineps {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

struct Call {
  int tag = 0;
  uint32_t id = 0;  // set by the sender
};

// Collects what the timer thread hands back.
struct Returned {
  Mutex mu;
  CondVar cv;
  std::vector<int> tags GUARDED_BY(mu);

  void Add(std::unique_ptr<Call> c) {
    MutexLock lock(&mu);
    tags.push_back(c->tag);
    cv.SignalAll();
  }
  std::vector<int> WaitFor(size_t n, milliseconds timeout) {
    MutexLock lock(&mu);
    cv.WaitFor(&mu, timeout, [&]() REQUIRES(mu) { return tags.size() >= n; });
    return tags;
  }
};

std::unique_ptr<Call> NewCall(int tag) {
  auto c = std::make_unique<Call>();
  c->tag = tag;
  return c;
}

// Adds a call that records its id; returns the id (0 on error).
uint32_t AddCall(RpcCalls<Call>& calls, int tag, milliseconds deadline) {
  auto c = NewCall(tag);
  StatusOr<uint32_t> id =
      calls.Add(&c, Clock::now() + deadline, [](uint32_t id, Call& call) { call.id = id; });
  EXPECT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(c, nullptr) << "a registered call is owned by the table";
  return id.ok() ? *id : 0;
}

// AddThen sends without the table's lock: a reply that arrives on the sending thread
// itself (an in-process server run on the sender) takes its call there. With Add the same
// Take would wait for the lock its own thread holds.
TEST(RpcCallsTest, AddThenTransmitsOutsideTheLockSoTheSenderCanTakeItsReply) {
  RpcCalls<Call> calls(
      16, [](std::unique_ptr<Call>) {}, nullptr);
  calls.Start();
  auto c = NewCall(7);
  std::unique_ptr<Call> taken;
  uint32_t sent_id = 0;
  StatusOr<uint32_t> id = calls.AddThen(
      &c, Clock::now() + milliseconds(60000),
      [](uint32_t i, Call& call) {
        call.id = i;
        return std::make_pair(i, call.tag);
      },
      [&](std::pair<uint32_t, int>&& out) {
        sent_id = out.first;
        EXPECT_EQ(out.second, 7);
        taken = calls.Take(out.first);  // the reply, on this thread, before AddThen returns
      });
  ASSERT_TRUE(id.ok()) << id.status().ToString();
  EXPECT_EQ(sent_id, *id);
  ASSERT_NE(taken, nullptr);
  EXPECT_EQ(taken->tag, 7);
  EXPECT_EQ(taken->id, *id);
  EXPECT_EQ(calls.in_flight(), 0u);
}

TEST(RpcCallsTest, ReplyTakesTheCallOnceAndLateRepliesMatchNothing) {
  Returned expired;
  RpcCalls<Call> calls(
      16, [&](std::unique_ptr<Call> c) { expired.Add(std::move(c)); }, nullptr);
  calls.Start();
  const uint32_t a = AddCall(calls, 1, milliseconds(60000));
  const uint32_t b = AddCall(calls, 2, milliseconds(60000));
  ASSERT_NE(a, 0u);
  ASSERT_NE(b, 0u);
  EXPECT_NE(a, b);
  EXPECT_EQ(calls.in_flight(), 2u);
  std::unique_ptr<Call> got = calls.Take(b);
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->tag, 2);
  EXPECT_EQ(got->id, b) << "the sender saw the id the reply carries";
  EXPECT_EQ(calls.Take(b), nullptr) << "a second reply to the same id";
  EXPECT_EQ(calls.Take(b ^ 0x10000), nullptr) << "an id never issued";
  // The slot is reused with a new generation: the old id still matches nothing.
  const uint32_t c = AddCall(calls, 3, milliseconds(60000));
  EXPECT_NE(c, b);
  EXPECT_EQ(calls.Take(b), nullptr);
  EXPECT_EQ(calls.in_flight(), 2u);
}

TEST(RpcCallsTest, AForeignReplyLeavesTheCallInFlight) {
  RpcCalls<Call> calls(
      4, [](std::unique_ptr<Call>) {}, nullptr);
  calls.Start();
  const uint32_t id = AddCall(calls, 7, milliseconds(60000));
  EXPECT_EQ(calls.Take(id, [](const Call& c) { return c.tag == 8; }), nullptr);
  std::unique_ptr<Call> got = calls.Take(id, [](const Call& c) { return c.tag == 7; });
  ASSERT_NE(got, nullptr);
  EXPECT_EQ(got->tag, 7);
}

TEST(RpcCallsTest, UnansweredCallsExpireInDeadlineOrderAndOnlyOnce) {
  Returned expired;
  RpcCalls<Call> calls(
      16, [&](std::unique_ptr<Call> c) { expired.Add(std::move(c)); }, nullptr);
  calls.Start();
  const auto t0 = Clock::now();
  AddCall(calls, 2, milliseconds(120));
  AddCall(calls, 1, milliseconds(40));
  const uint32_t answered = AddCall(calls, 3, milliseconds(80));
  ASSERT_NE(calls.Take(answered), nullptr);
  const std::vector<int> tags = expired.WaitFor(2, milliseconds(5000));
  EXPECT_GE(Clock::now() - t0, milliseconds(120));
  EXPECT_EQ(tags, (std::vector<int>{1, 2})) << "answered calls never expire";
  std::this_thread::sleep_for(milliseconds(100));
  EXPECT_EQ(expired.WaitFor(2, milliseconds(0)).size(), 2u);
  EXPECT_EQ(calls.in_flight(), 0u);
}

// Deadlines of several timeouts, more kinds than the timer keeps queues for, added out of
// order: each call expires at its own deadline, in order, whichever queue or heap holds it.
TEST(RpcCallsTest, MixedTimeoutsExpireInDeadlineOrder) {
  Returned expired;
  RpcCalls<Call> calls(
      64, [&](std::unique_ptr<Call> c) { expired.Add(std::move(c)); }, nullptr);
  calls.Start();
  const int ms[] = {300, 60, 240, 20, 180, 100, 280, 40, 140, 220, 80, 260};
  for (int m : ms) AddCall(calls, m, milliseconds(m));
  const uint32_t answered = AddCall(calls, 200, milliseconds(200));
  ASSERT_NE(calls.Take(answered), nullptr);
  std::vector<int> want(std::begin(ms), std::end(ms));
  std::sort(want.begin(), want.end());
  EXPECT_EQ(expired.WaitFor(want.size(), milliseconds(5000)), want);
  EXPECT_EQ(calls.in_flight(), 0u);
}

// The deadlines of answered calls do not pile up until they pass: a client making
// 100,000 calls a second with a 5 s timeout would otherwise hold half a million.
TEST(RpcCallsTest, AnsweredCallsLeaveNoDeadlinesBehind) {
  RpcCalls<Call> calls(
      64, [](std::unique_ptr<Call>) { ADD_FAILURE() << "nothing expires"; }, nullptr);
  calls.Start();
  std::vector<uint32_t> window;
  for (int i = 0; i < 20000; ++i) {
    // Two timeouts interleaved, four calls in flight, answered in order.
    window.push_back(AddCall(calls, i, milliseconds(i % 2 ? 60000 : 30000)));
    if (window.size() == 4) {
      ASSERT_NE(calls.Take(window.front()), nullptr);
      window.erase(window.begin());
    }
  }
  EXPECT_LE(calls.deadlines_held(), 8u);
  for (uint32_t id : window) ASSERT_NE(calls.Take(id), nullptr);
  EXPECT_EQ(calls.deadlines_held(), 0u);
}

TEST(RpcCallsTest, LaterRunsOnDueAfterItsTime) {
  Returned due;
  RpcCalls<Call> calls(
      4, [](std::unique_ptr<Call>) {}, [&](std::unique_ptr<Call> c) { due.Add(std::move(c)); });
  calls.Start();
  const auto t0 = Clock::now();
  EXPECT_EQ(calls.Later(t0 + milliseconds(60), NewCall(5)), nullptr);
  EXPECT_EQ(due.WaitFor(1, milliseconds(5000)), std::vector<int>{5});
  EXPECT_GE(Clock::now() - t0, milliseconds(60));
}

TEST(RpcCallsTest, FullTableRefusesOrWaitsForAFreeId) {
  RpcCalls<Call> calls(
      2, [](std::unique_ptr<Call>) {}, nullptr);
  calls.Start();
  const uint32_t first = AddCall(calls, 1, milliseconds(60000));
  AddCall(calls, 2, milliseconds(60000));
  auto c = NewCall(3);
  StatusOr<uint32_t> refused =
      calls.Add(&c, Clock::now() + milliseconds(60000), [](uint32_t, Call&) {});
  EXPECT_EQ(refused.status().code(), StatusCode::kResourceExhausted) << refused.status().ToString();
  ASSERT_NE(c, nullptr) << "a refused call stays with the caller";
  std::thread reply([&] {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_NE(calls.Take(first), nullptr);
  });
  StatusOr<uint32_t> waited = calls.Add(
      &c, Clock::now() + milliseconds(60000), [](uint32_t, Call&) {},
      Clock::now() + milliseconds(5000));
  reply.join();
  EXPECT_TRUE(waited.ok()) << waited.status().ToString();
  EXPECT_EQ(c, nullptr);
}

TEST(RpcCallsTest, StopHandsBackEveryCallAndRefusesNewOnes) {
  RpcCalls<Call> calls(
      8, [](std::unique_ptr<Call>) {}, [](std::unique_ptr<Call>) {});
  calls.Start();
  AddCall(calls, 1, milliseconds(60000));
  AddCall(calls, 2, milliseconds(60000));
  EXPECT_EQ(calls.Later(Clock::now() + milliseconds(60000), NewCall(3)), nullptr);
  std::set<int> left;
  for (auto& c : calls.Stop()) left.insert(c->tag);
  EXPECT_EQ(left, (std::set<int>{1, 2, 3}));
  EXPECT_TRUE(calls.Stop().empty()) << "Stop is idempotent";
  auto c = NewCall(4);
  StatusOr<uint32_t> after =
      calls.Add(&c, Clock::now() + milliseconds(1000), [](uint32_t, Call&) {});
  EXPECT_EQ(after.status().code(), StatusCode::kCancelled) << after.status().ToString();
  EXPECT_NE(c, nullptr);
  std::unique_ptr<Call> back = calls.Later(Clock::now(), NewCall(5));
  ASSERT_NE(back, nullptr) << "after Stop, Later hands the call back";
  EXPECT_EQ(back->tag, 5);
}

// Many threads adding and answering at once: every call comes back exactly once, by its
// reply or by its deadline.
TEST(RpcCallsTest, ConcurrentCallsComeBackExactlyOnce) {
  std::atomic<int> expired{0};
  RpcCalls<Call> calls(
      64, [&](std::unique_ptr<Call>) { expired++; }, nullptr);
  calls.Start();
  constexpr int kThreads = 4, kCalls = 2000;
  std::atomic<int> answered{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kCalls; ++i) {
        auto c = NewCall(t * kCalls + i);
        // Every 10th call is left to its (short) deadline.
        const auto deadline = Clock::now() + milliseconds(i % 10 == 0 ? 1 : 60000);
        StatusOr<uint32_t> id = calls.Add(
            &c, deadline, [](uint32_t, Call&) {}, Clock::now() + milliseconds(10000));
        ASSERT_TRUE(id.ok()) << id.status().ToString();
        if (i % 10 != 0 && calls.Take(*id) != nullptr) answered++;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 500 && answered + expired < kThreads * kCalls; ++i) {
    std::this_thread::sleep_for(milliseconds(10));
  }
  EXPECT_EQ(answered + expired, kThreads * kCalls);
  EXPECT_EQ(expired.load(), kThreads * kCalls / 10);
  EXPECT_EQ(calls.in_flight(), 0u);
}

}  // namespace
}  // namespace onlineps
