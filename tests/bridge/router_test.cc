#include "mcp_bridge/router.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

namespace onlineps::bridge {
namespace {

std::vector<std::string> Workers(int n) {
  std::vector<std::string> w;
  for (int i = 0; i < n; ++i) w.push_back("tcp://10.0.0." + std::to_string(i) + ":7400");
  return w;
}

std::string Session(int i) { return "m:session-" + std::to_string(i); }

size_t MaxLoad(const RouterStats& s) {
  size_t m = 0;
  for (const auto& [w, l] : s.loads) m = std::max(m, l);
  return m;
}

TEST(RouterTest, NoWorkerIsUnavailable) {
  Router r({});
  auto w = r.Route("s");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kUnavailable);
}

TEST(RouterTest, SessionStaysOnItsWorker) {
  Router r({});
  for (const auto& w : Workers(3)) r.AddWorker(w);
  const std::string first = r.Route("abc").value();
  for (int i = 0; i < 100; ++i) r.Route(Session(i)).value();
  EXPECT_EQ(r.Route("abc").value(), first);
  EXPECT_EQ(r.OwnerOf("abc"), first);
  EXPECT_TRUE(r.Release("abc"));
  EXPECT_EQ(r.OwnerOf("abc"), "");
  EXPECT_FALSE(r.Release("abc"));
}

TEST(RouterTest, NoWorkerAboveTheLoadBound) {
  for (double c : {1.1, 1.25, 1.5}) {
    RouterOptions o;
    o.load_factor = c;
    Router r(o);
    for (const auto& w : Workers(5)) r.AddWorker(w);
    const int m = 3000;
    for (int i = 0; i < m; ++i) r.Route(Session(i)).value();
    const RouterStats s = r.stats();
    EXPECT_EQ(s.sessions, static_cast<size_t>(m));
    EXPECT_LE(MaxLoad(s), static_cast<size_t>(std::ceil(c * m / 5.0))) << "c=" << c;
  }
}

TEST(RouterTest, UnboundedHashingIsLessBalancedThanBoundedLoads) {
  // The bound does work: with c = 100 (effectively plain consistent hashing) and few
  // ring points, the fullest worker holds more than with c = 1.25.
  auto max_load = [](double c) {
    RouterOptions o;
    o.load_factor = c;
    o.virtual_nodes = 4;
    Router r(o);
    for (const auto& w : Workers(5)) r.AddWorker(w);
    for (int i = 0; i < 3000; ++i) r.Route(Session(i)).value();
    return MaxLoad(r.stats());
  };
  EXPECT_GT(max_load(100.0), max_load(1.25));
}

TEST(RouterTest, AddingAWorkerMovesAboutOneNthOfTheSessions) {
  Router r({});
  for (const auto& w : Workers(4)) r.AddWorker(w);
  const int m = 4000;
  std::map<std::string, std::string> before;
  for (int i = 0; i < m; ++i) before[Session(i)] = r.Route(Session(i)).value();
  const std::string added = "tcp://10.0.1.1:7400";
  ASSERT_TRUE(r.AddWorker(added));
  ASSERT_FALSE(r.AddWorker(added));
  int moved = 0, moved_elsewhere = 0;
  for (const auto& [s, w] : before) {
    const std::string now = r.OwnerOf(s);
    if (now != w) {
      ++moved;
      if (now != added) ++moved_elsewhere;
    }
  }
  // Ideal: 1/5 of the sessions, all to the new worker.
  EXPECT_GT(moved, m / 10);
  EXPECT_LT(moved, m * 3 / 10);
  EXPECT_LT(moved_elsewhere, m / 50);
  EXPECT_EQ(r.stats().moves, static_cast<uint64_t>(moved));
  EXPECT_LE(MaxLoad(r.stats()), static_cast<size_t>(std::ceil(1.25 * m / 5.0)));
}

// The shape of BridgeRoutingTest.AJoiningWorker... over many ring layouts: 37 sessions
// on 2 workers, a third joins. The bound drops from 24 to 16 sessions per worker, and
// what an old worker sheds goes to the new one (it has room), never to the other old one.
TEST(RouterTest, AJoiningWorkerTakesTheOverflowItself) {
  int layouts_with_moves = 0;
  for (int layout = 0; layout < 300; ++layout) {
    Router r({});
    const auto name = [&](int w) {
      return "tcp://127.0.0.1:" + std::to_string(30000 + layout * 7 + w * 1000);
    };
    r.AddWorker(name(0));
    r.AddWorker(name(1));
    std::map<std::string, std::string> before;
    for (int i = 0; i < 37; ++i) before[Session(i)] = r.Route(Session(i)).value();
    ASSERT_TRUE(r.AddWorker(name(2)));
    int moved = 0;
    for (const auto& [s, w] : before) {
      const std::string now = r.OwnerOf(s);
      if (now == w) continue;
      ++moved;
      EXPECT_EQ(now, name(2)) << "layout " << layout << ": " << s << " moved from " << w;
    }
    layouts_with_moves += moved > 0;
    EXPECT_LE(MaxLoad(r.stats()), 16u) << "layout " << layout;
  }
  EXPECT_EQ(layouts_with_moves, 300);
}

TEST(RouterTest, RemovingAWorkerMovesOnlyItsSessions) {
  Router r({});
  const auto workers = Workers(4);
  for (const auto& w : workers) r.AddWorker(w);
  std::map<std::string, std::string> before;
  for (int i = 0; i < 2000; ++i) before[Session(i)] = r.Route(Session(i)).value();
  ASSERT_TRUE(r.RemoveWorker(workers[2]));
  ASSERT_FALSE(r.RemoveWorker(workers[2]));
  for (const auto& [s, w] : before) {
    const std::string now = r.OwnerOf(s);
    if (w == workers[2]) {
      EXPECT_NE(now, workers[2]);
      EXPECT_FALSE(now.empty());
    } else {
      EXPECT_EQ(now, w) << s;
    }
  }
  EXPECT_LE(MaxLoad(r.stats()), static_cast<size_t>(std::ceil(1.25 * 2000 / 3.0)));
}

TEST(RouterTest, LastWorkerLeavingUnplacesItsSessions) {
  Router r({});
  r.AddWorker("tcp://a:1");
  r.Route("s1").value();
  r.RemoveWorker("tcp://a:1");
  EXPECT_EQ(r.OwnerOf("s1"), "");
  EXPECT_EQ(r.stats().sessions, 0u);
  r.AddWorker("tcp://b:1");
  EXPECT_EQ(r.Route("s1").value(), "tcp://b:1");
}

// Every worker down: the sessions are unplaced, but the bridge still holds what it sent
// their workers (Backend's copies), forgotten only for the sessions ReleaseIdle returns.
// One never used again must be returned once idle, or that record is kept for ever.
TEST(RouterTest, ASessionUnplacedWhenTheLastWorkerLeftIsStillReleasedWhenIdle) {
  int64_t now = 0;
  Router r({}, [&now] { return now; });
  r.AddWorker("tcp://a:1");
  r.Route("abandoned").value();
  r.Route("back").value();
  r.RemoveWorker("tcp://a:1");
  r.AddWorker("tcp://a:1");
  now = 5000;
  r.Route("back").value();
  now = 9000;
  EXPECT_EQ(r.ReleaseIdle(std::chrono::milliseconds(6000)), std::vector<std::string>{"abandoned"});
  EXPECT_EQ(r.OwnerOf("back"), "tcp://a:1");
  EXPECT_TRUE(r.ReleaseIdle(std::chrono::milliseconds(6000)).empty());
}

TEST(RouterTest, PlacementIsDeterministic) {
  Router a({}), b({});
  for (const auto& w : Workers(4)) a.AddWorker(w);
  auto ws = Workers(4);
  std::reverse(ws.begin(), ws.end());
  for (const auto& w : ws) b.AddWorker(w);
  for (int i = 0; i < 500; ++i) EXPECT_EQ(a.Route(Session(i)).value(), b.Route(Session(i)).value());
}

TEST(RouterTest, SessionLimitIsAClearError) {
  RouterOptions o;
  o.max_sessions = 3;
  Router r(o);
  r.AddWorker("tcp://a:1");
  for (int i = 0; i < 3; ++i) r.Route(Session(i)).value();
  auto w = r.Route("one-more");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(w.status().message().find("--max-sessions"), std::string::npos);
  EXPECT_TRUE(r.Route(Session(0)).ok());  // placed sessions still route
}

// Named handles (a tool's `session` argument, chosen by clients: a new one per call
// costs nothing) have a bound of their own. Before, they shared the router's one bound
// with MCP sessions, and a client making up handles shut new MCP sessions out.
TEST(RouterTest, NamedHandlesCannotFillTheRouterForMcpSessions) {
  RouterOptions o;
  o.max_sessions = 3;
  o.max_handles = 3;
  Router r(o);
  r.AddWorker("tcp://a:1");
  EXPECT_TRUE(IsNamedHandle("s:x"));
  EXPECT_TRUE(IsNamedHandle("alice/s:x"));
  EXPECT_FALSE(IsNamedHandle("m:x"));
  EXPECT_FALSE(IsNamedHandle("alice/m:s:x"));
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(r.Route("alice/s:handle-" + std::to_string(i)).ok());
  auto handle = r.Route("alice/s:one-more");
  ASSERT_FALSE(handle.ok());
  EXPECT_EQ(handle.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(handle.status().message().find("named session handles"), std::string::npos)
      << handle.status().ToString();
  for (int i = 0; i < 3; ++i) {
    auto w = r.Route(Session(i));
    EXPECT_TRUE(w.ok()) << "an MCP session shut out by handles: " << w.status().ToString();
  }
  EXPECT_FALSE(r.Route(Session(3)).ok());  // its own bound holds
  // A released handle makes room for another; a worker leaving and joining keeps the count.
  EXPECT_TRUE(r.Release("alice/s:handle-0"));
  r.AddWorker("tcp://b:1");
  r.RemoveWorker("tcp://a:1");
  EXPECT_TRUE(r.Route("alice/s:one-more").ok());
  EXPECT_FALSE(r.Route("alice/s:two-more").ok());
}

TEST(RouterTest, IdleSessionsAreReleased) {
  int64_t now = 0;
  Router r({}, [&now] { return now; });
  r.AddWorker("tcp://a:1");
  r.AddWorker("tcp://b:1");
  r.Route("old").value();
  r.Route("busy").value();
  now = 5000;
  r.Route("busy").value();  // a route refreshes it
  r.Route("new").value();
  now = 9000;
  std::vector<std::string> released = r.ReleaseIdle(std::chrono::milliseconds(6000));
  EXPECT_EQ(released, std::vector<std::string>{"old"});
  EXPECT_EQ(r.OwnerOf("old"), "");
  EXPECT_NE(r.OwnerOf("busy"), "");
  EXPECT_EQ(r.stats().sessions, 2u);
  size_t total = 0;
  for (const auto& [w, l] : r.stats().loads) total += l;
  EXPECT_EQ(total, 2u);  // loads follow
  EXPECT_TRUE(r.ReleaseIdle(std::chrono::milliseconds(6000)).empty());
}

}  // namespace
}  // namespace onlineps::bridge
