// Golden checks of the delay machinery (replay/rng.h, replay/delay.h) and the
// virtual-clock schedule (replay/schedule.h): geometric staleness under exponential
// compute times, exact tau under fixed times and the staleness override, speed skew,
// stragglers, churn, sync rounds, determinism, and the stream's own invariants.
#include "replay/schedule.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "replay/delay.h"
#include "replay/rng.h"

namespace onlineps::replay {
namespace {

Delay D(const std::string& spec) {
  StatusOr<Delay> d = Delay::Parse(spec);
  EXPECT_TRUE(d.ok()) << spec << ": " << d.status().ToString();
  return d.ok() ? d.value() : Delay();
}

Schedule Build(const ScheduleOptions& o) {
  StatusOr<Schedule> s = BuildSchedule(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(s).value() : Schedule();
}

std::vector<Event> Pushes(const Schedule& s) {
  std::vector<Event> out;
  for (const Event& e : s.events) {
    if (e.kind == EventKind::kPush) out.push_back(e);
  }
  return out;
}

// Invariants of every stream: consecutive seq, time order, batch k for the k-th pull,
// a push carries its pull's step / batch / version, exactly `updates` pushes, and (async)
// expected_tau == pushes applied since the pull.
void CheckStream(const Schedule& s, const ScheduleOptions& o) {
  std::map<uint32_t, Event> open;  // worker -> its pull awaiting a push
  uint64_t batches = 0, pushes = 0;
  double t = 0;
  for (size_t i = 0; i < s.events.size(); ++i) {
    const Event& e = s.events[i];
    ASSERT_EQ(e.seq, i);
    ASSERT_GE(e.t_ms, t) << "seq " << i;
    t = e.t_ms;
    if (e.kind == EventKind::kPull) {
      ASSERT_EQ(e.batch, batches++);
      if (o.mode == SyncMode::kAsync) {
        ASSERT_EQ(e.version, pushes);
      }
      open[e.worker] = e;  // a pull replaces an abandoned one (the worker left)
    } else if (e.kind == EventKind::kPush) {
      ASSERT_TRUE(open.count(e.worker)) << "push without pull, seq " << i;
      const Event& pull = open[e.worker];
      EXPECT_EQ(e.step, pull.step);
      EXPECT_EQ(e.batch, pull.batch);
      EXPECT_EQ(e.version, pull.version);
      if (o.mode == SyncMode::kAsync) {
        EXPECT_EQ(e.expected_tau, pushes - pull.version);
      }
      open.erase(e.worker);
      ++pushes;
    }
  }
  EXPECT_EQ(pushes, s.pushes);
}

TEST(RngTest, SameSeedSameStreamOtherSeedDiffers) {
  Rng a(7), b(7), c(8);
  bool differs = false;
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.Next();
    EXPECT_EQ(x, b.Next());
    differs |= x != c.Next();
  }
  EXPECT_TRUE(differs);
}

TEST(RngTest, NormalHasMeanZeroSdOne) {
  Rng rng(3);
  const int n = 200000;
  double sum = 0, sq = 0;
  for (int i = 0; i < n; ++i) {
    const double z = rng.Normal();
    sum += z;
    sq += z * z;
  }
  const double mean = sum / n;
  EXPECT_NEAR(mean, 0, 0.01);
  EXPECT_NEAR(std::sqrt(sq / n - mean * mean), 1, 0.01);
}

TEST(RngTest, UniformAndBelowStayInRangeAndAreUnbiased) {
  Rng rng(5);
  std::vector<int> counts(3);
  for (int i = 0; i < 300000; ++i) {
    const double u = rng.Uniform();
    ASSERT_TRUE(u >= 0 && u < 1);
    ++counts[rng.Below(3)];
  }
  for (int c : counts) EXPECT_NEAR(c / 300000.0, 1 / 3.0, 0.005);
  EXPECT_EQ(rng.Below(1), 0u);
}

TEST(DelayTest, SampleMeanMatchesAnalyticMean) {
  const char* specs[] = {
      "none",           "fixed:2.5",       "uniform:1,3", "normal:5,1",      "normal:1,1",
      "normal:1,2,0.5", "half-normal:1,2", "exp:3",       "shifted-exp:1,2", "lognormal:0,0.5",
      "pareto:1,3",     "list:1,2,6"};
  for (const char* spec : specs) {
    Delay d = D(spec);
    Rng rng(11);
    double sum = 0;
    for (int i = 0; i < 200000; ++i) {
      const double x = d.Sample(rng);
      ASSERT_GE(x, 0) << spec;
      sum += x;
    }
    const double mean = sum / 200000;
    EXPECT_NEAR(mean, d.Mean(), 0.02 * d.Mean()) << spec;
  }
}

TEST(DelayTest, ParetoWithShapeAtMostOneHasInfiniteMean) {
  EXPECT_TRUE(std::isinf(D("pareto:1,1").Mean()));
  EXPECT_DOUBLE_EQ(D("pareto:2,3").Mean(), 3.0);
}

TEST(DelayTest, ParseErrorsNameTheProblem) {
  const std::pair<const char*, const char*> cases[] = {
      {"gamma:1", "unknown kind 'gamma'"},
      {"fixed", "wrong number of parameters"},
      {"fixed:1,2", "wrong number of parameters"},
      {"uniform:1", "wrong number of parameters"},
      {"normal:1,2,3,4", "wrong number of parameters"},
      {"none:3", "wrong number of parameters"},
      {"fixed:-1", "negative value"},
      {"exp:abc", "bad number 'abc'"},
      {"exp:inf", "bad number"},
      {"uniform:3,1", "MIN 3 > MEAN 1"},
      {"normal:1,-1", "SD must be >= 0"},
      {"half-normal:0,-2", "SD must be >= 0"},
      {"pareto:1,0", "SHAPE must be > 0"},
      {"list:", "empty list"},
      {"list:1,,2", "bad number ''"},
      {"list:1,-2", "negative value -2"},
  };
  for (const auto& [spec, problem] : cases) {
    StatusOr<Delay> d = Delay::Parse(spec);
    ASSERT_FALSE(d.ok()) << spec;
    EXPECT_EQ(d.status().code(), StatusCode::kInvalidArgument) << spec;
    EXPECT_NE(d.status().message().find(problem), std::string::npos)
        << spec << " -> " << d.status().message();
    EXPECT_NE(d.status().message().find(spec), std::string::npos) << d.status().message();
  }
}

TEST(DelayTest, LognormalMuMayBeNegative) { EXPECT_TRUE(Delay::Parse("lognormal:-1,0.5").ok()); }

TEST(DelayTest, ToStringRoundTrips) {
  const char* specs[] = {
      "none",         "fixed:0",         "fixed:0.1", "uniform:1,3",     "normal:5,1",
      "normal:5,1,2", "half-normal:1,2", "exp:3",     "shifted-exp:1,2", "lognormal:-1,0.25",
      "pareto:1,3",   "list:1,2.5,6"};
  for (const char* spec : specs) {
    const std::string canonical = D(spec).ToString();
    EXPECT_EQ(canonical, spec);
    EXPECT_EQ(D(canonical).ToString(), canonical);
  }
  EXPECT_EQ(D("normal:5,1,0").ToString(), "normal:5,1");
  EXPECT_EQ(D("fixed:1e-3").ToString(), "fixed:0.001");
}

TEST(DelayTest, IsZeroOnlyForNoneAndFixedZero) {
  EXPECT_TRUE(D("none").IsZero());
  EXPECT_TRUE(D("fixed:0").IsZero());
  EXPECT_FALSE(D("fixed:1").IsZero());
  EXPECT_FALSE(D("exp:1").IsZero());
  EXPECT_TRUE(Delay().IsZero());
}

TEST(DelayTest, ListCyclesInOrderAndCopiesKeepTheirOwnCursor) {
  Delay d = D("list:1,2,3");
  Rng rng(1);
  EXPECT_EQ(d.Sample(rng), 1);
  Delay copy = d;
  EXPECT_EQ(d.Sample(rng), 2);
  EXPECT_EQ(d.Sample(rng), 3);
  EXPECT_EQ(d.Sample(rng), 1);
  EXPECT_EQ(copy.Sample(rng), 2);
}

std::string WriteFile(const std::string& name, const std::string& text) {
  const std::string path = ::testing::TempDir() + name;
  std::ofstream(path) << text;
  return path;
}

TEST(DelayTest, ListFileSkipsCommentsAndCycles) {
  const std::string path = WriteFile("delays_ok.txt", "# header\n4\n\n  5 # five\n6\n");
  Delay d = D("list@" + path);
  Rng rng(1);
  EXPECT_EQ(d.Sample(rng), 4);
  EXPECT_EQ(d.Sample(rng), 5);
  EXPECT_EQ(d.Sample(rng), 6);
  EXPECT_EQ(d.Sample(rng), 4);
  EXPECT_DOUBLE_EQ(d.Mean(), 5);
  EXPECT_EQ(d.ToString(), "list@" + path);
  EXPECT_EQ(D(d.ToString()).Mean(), 5);
}

TEST(DelayTest, ListFileErrorsNamePathAndLine) {
  const std::string bad = WriteFile("delays_bad.txt", "1\n# c\nxyz\n");
  StatusOr<Delay> d = Delay::Parse("list@" + bad);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(bad + ":3: bad number 'xyz'"), std::string::npos)
      << d.status().message();
  const std::string neg = WriteFile("delays_neg.txt", "1\n-2\n");
  d = Delay::Parse("list@" + neg);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(neg + ":2: negative value"), std::string::npos);
  const std::string empty = WriteFile("delays_empty.txt", "# nothing\n\n");
  d = Delay::Parse("list@" + empty);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("empty list"), std::string::npos);
  d = Delay::Parse("list@/nonexistent/delays.txt");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), StatusCode::kNotFound);
  EXPECT_NE(d.status().message().find("cannot read file '/nonexistent/delays.txt'"),
            std::string::npos);
}

ScheduleOptions Async(uint32_t workers, uint64_t updates, const std::string& compute) {
  ScheduleOptions o;
  o.workers = workers;
  o.updates = updates;
  o.compute = D(compute);
  return o;
}

// M workers with i.i.d. exponential compute times: tau ~ geometric, P(k) = (1/M)(1-1/M)^k.
TEST(ScheduleTest, ExponentialComputeGivesGeometricStaleness) {
  for (uint32_t m : {2u, 4u, 8u}) {
    const ScheduleOptions o = Async(m, 200000, "exp:10");
    StatusOr<std::unique_ptr<Scheduler>> sched = Scheduler::Create(o);
    ASSERT_TRUE(sched.ok());
    std::vector<uint64_t> hist(64);
    uint64_t pushes = 0;
    double sum = 0;
    for (Event e; (*sched)->Next(&e);) {
      if (e.kind != EventKind::kPush) continue;
      ++pushes;
      sum += e.expected_tau;
      if (e.expected_tau < hist.size()) ++hist[e.expected_tau];
    }
    ASSERT_EQ(pushes, 200000u);
    const double mean = sum / pushes, p0 = hist[0] / double(pushes);
    double worst = 0;  // largest |P(k) - geometric| over k < 10
    for (int k = 0; k < 10; ++k) {
      const double want = (1.0 / m) * std::pow(1.0 - 1.0 / m, k);
      worst = std::max(worst, std::fabs(hist[k] / double(pushes) - want));
      EXPECT_NEAR(hist[k] / double(pushes), want, 0.01) << "M=" << m << " k=" << k;
    }
    std::printf("M=%u staleness mean %.4f (want %u), P(0) %.4f (want %.4f), max |P(k)-geom| %.4f\n",
                m, mean, m - 1, p0, 1.0 / m, worst);
    EXPECT_NEAR(mean, m - 1.0, 0.02 * (m - 1.0)) << "M=" << m;
  }
}

TEST(ScheduleTest, EqualFixedComputeGivesTauMMinusOneAfterWarmUp) {
  for (uint32_t m : {1u, 2u, 3u, 8u}) {
    const ScheduleOptions o = Async(m, 1000, "fixed:5");
    const Schedule s = Build(o);
    CheckStream(s, o);
    const std::vector<Event> pushes = Pushes(s);
    ASSERT_EQ(pushes.size(), 1000u);
    for (size_t i = m; i < pushes.size(); ++i) ASSERT_EQ(pushes[i].expected_tau, m - 1) << i;
    EXPECT_EQ(s.TauMax(), m - 1);
    EXPECT_EQ(s.TauQuantile(0.5), m - 1);
  }
}

TEST(ScheduleTest, StalenessOverrideFixedGivesExactDelay) {
  for (uint64_t t : {0, 1, 2, 4, 7, 15}) {
    ScheduleOptions o = Async(static_cast<uint32_t>(t + 1), 500, "exp:1");
    o.staleness = D("fixed:" + std::to_string(t));
    const Schedule s = Build(o);
    CheckStream(s, o);
    const std::vector<Event> pushes = Pushes(s);
    ASSERT_EQ(pushes.size(), 500u);
    for (size_t i = t + 1; i < pushes.size(); ++i) {
      ASSERT_EQ(pushes[i].expected_tau, t) << "T=" << t << " push " << i;
    }
    for (const Event& e : s.events) ASSERT_EQ(e.t_ms, 0);
  }
}

TEST(ScheduleTest, StalenessOverrideWithSpareWorkersKeepsTheDelay) {
  for (uint32_t workers : {5u, 16u}) {
    ScheduleOptions o = Async(workers, 500, "fixed:1");
    o.staleness = D("fixed:3");
    const Schedule s = Build(o);
    CheckStream(s, o);
    const std::vector<Event> pushes = Pushes(s);
    for (size_t i = 4; i < pushes.size(); ++i) ASSERT_EQ(pushes[i].expected_tau, 3u) << i;
  }
}

TEST(ScheduleTest, StalenessOverrideRandomTauKeepsTheOrderAndRoughMean) {
  ScheduleOptions o = Async(32, 20000, "fixed:1");
  o.staleness = D("uniform:0,4");  // rounded mean 4; the rule lands somewhat below
  const Schedule s = Build(o);
  CheckStream(s, o);
  EXPECT_EQ(s.pushes, 20000u);
  EXPECT_GT(s.TauMean(), 2.5);
  EXPECT_LT(s.TauMean(), 4.5);
}

TEST(ScheduleTest, SlowWorkerDoesAQuarterOfThePushes) {
  ScheduleOptions o = Async(4, 20000, "exp:1");
  o.speed = {1, 1, 1, 4};
  const Schedule s = Build(o);
  CheckStream(s, o);
  const double fast = (s.worker_pushes[0] + s.worker_pushes[1] + s.worker_pushes[2]) / 3.0;
  EXPECT_NEAR(s.worker_pushes[3] / fast, 0.25, 0.02);
}

TEST(ScheduleTest, StragglerPushesDropInsideItsWindow) {
  ScheduleOptions o = Async(2, 3000, "fixed:1");
  o.stragglers = {{1, 500, 1000, 10}};
  const Schedule s = Build(o);
  CheckStream(s, o);
  uint64_t in[2] = {0, 0}, before[2] = {0, 0};
  for (const Event& e : Pushes(s)) {
    if (e.t_ms >= 510 && e.t_ms < 1000) ++in[e.worker];
    if (e.t_ms < 500) ++before[e.worker];
  }
  EXPECT_NEAR(before[1], before[0], 2);
  EXPECT_NEAR(in[1], in[0] / 10.0, 2);
}

TEST(ScheduleTest, ChurnedWorkerPushesOnlyWhileActive) {
  ScheduleOptions o = Async(3, 2000, "exp:1");
  o.churn = {{2, 100, 300}, {2, 500, std::numeric_limits<double>::infinity()}, {1, 0, 250}};
  const Schedule s = Build(o);
  CheckStream(s, o);
  std::vector<std::pair<double, EventKind>> membership;
  for (const Event& e : s.events) {
    if (e.kind == EventKind::kJoin || e.kind == EventKind::kLeave) {
      membership.push_back({e.t_ms, e.kind});
      EXPECT_NE(e.worker, 0u);
    }
    if (e.worker == 2 && (e.kind == EventKind::kPull || e.kind == EventKind::kPush)) {
      EXPECT_TRUE((e.t_ms >= 100 && e.t_ms < 300) || e.t_ms >= 500) << e.t_ms;
    }
    if (e.worker == 1 && e.kind != EventKind::kJoin) {
      EXPECT_LE(e.t_ms, 250) << e.t_ms;
    }
  }
  const std::vector<std::pair<double, EventKind>> want = {{0, EventKind::kJoin},
                                                          {100, EventKind::kJoin},
                                                          {250, EventKind::kLeave},
                                                          {300, EventKind::kLeave},
                                                          {500, EventKind::kJoin}};
  EXPECT_EQ(membership, want);
  EXPECT_EQ(s.pushes, 2000u);
  EXPECT_GT(s.worker_pushes[2], 0u);
}

TEST(ScheduleTest, LeavingWorkerAbandonsItsStepAndAnotherTakesOver) {
  ScheduleOptions o = Async(2, 3, "fixed:10");
  o.churn = {{0, 0, 15}};
  const Schedule s = Build(o);
  CheckStream(s, o);
  EXPECT_EQ(s.pushes, 3u);
  EXPECT_EQ(s.worker_pushes[0], 1u);  // its second step (10..20) is cut at 15
  EXPECT_EQ(s.duration_ms, 25);       // worker 1, idle since 10, takes the step over at 15
}

TEST(ScheduleTest, EveryWorkerGoneEndsTheStream) {
  ScheduleOptions o = Async(1, 100, "fixed:1");
  o.churn = {{0, 0, 10.5}};
  const Schedule s = Build(o);
  EXPECT_EQ(s.pushes, 10u);
  EXPECT_EQ(s.events.back().kind, EventKind::kLeave);
}

TEST(ScheduleTest, MessageDelayStampsThePullAtItsReply) {
  ScheduleOptions o = Async(1, 2, "fixed:1");
  o.message = D("fixed:0.5");
  const Schedule s = Build(o);
  ASSERT_EQ(s.events.size(), 4u);
  const double want[] = {0.5, 2, 2.5, 4};
  for (int i = 0; i < 4; ++i) EXPECT_EQ(s.events[i].t_ms, want[i]) << i;
}

TEST(ScheduleTest, NoPullBeyondTheLastNeededPush) {
  const ScheduleOptions o = Async(8, 20, "exp:1");
  const Schedule s = Build(o);
  uint64_t pulls = 0;
  for (const Event& e : s.events) pulls += e.kind == EventKind::kPull;
  EXPECT_EQ(pulls, 20u);
  EXPECT_EQ(s.events.back().kind, EventKind::kPush);
}

TEST(ScheduleTest, SyncPushesComeInRoundsOfEqualBaseVersion) {
  ScheduleOptions o = Async(4, 402, "exp:1");
  o.mode = SyncMode::kSync;
  o.message = D("exp:0.1");
  const Schedule s = Build(o);
  CheckStream(s, o);
  const std::vector<Event> pushes = Pushes(s);
  ASSERT_EQ(pushes.size(), 402u);
  for (size_t i = 0; i < pushes.size(); ++i) {
    EXPECT_EQ(pushes[i].version, i / 4) << i;
    EXPECT_EQ(pushes[i].expected_tau, 0u);
  }
  for (const Event& e : s.events) {
    if (e.kind == EventKind::kPull) {
      EXPECT_EQ(e.version, e.batch / 4);
    }
  }
  EXPECT_EQ(s.TauMax(), 0u);
}

TEST(ScheduleTest, SyncRoundWaitsForTheSlowestAndSkipsAbsentWorkers) {
  ScheduleOptions o = Async(3, 30, "fixed:1");
  o.mode = SyncMode::kSync;
  o.speed = {1, 1, 3};
  o.churn = {{1, 6, std::numeric_limits<double>::infinity()}};
  const Schedule s = Build(o);
  CheckStream(s, o);
  for (const Event& e : Pushes(s)) {
    EXPECT_EQ(std::fmod(e.t_ms, 3.0), e.worker == 2 ? 0 : 1) << e.t_ms;
    if (e.worker == 1) {
      EXPECT_GE(e.t_ms, 6);
    }
  }
  EXPECT_EQ(s.worker_pushes[0], 11u);  // rounds at 0, 3 without worker 1, then 3 per round
}

TEST(ScheduleTest, SameSeedSameEventsOtherSeedDiffers) {
  ScheduleOptions o = Async(4, 500, "exp:1");
  o.message = D("uniform:0,0.2");
  const Schedule a = Build(o), b = Build(o);
  o.seed = 2;
  const Schedule c = Build(o);
  ASSERT_EQ(a.events.size(), b.events.size());
  bool differs = a.events.size() != c.events.size();
  for (size_t i = 0; i < a.events.size(); ++i) {
    EXPECT_EQ(a.events[i].t_ms, b.events[i].t_ms);
    EXPECT_EQ(a.events[i].worker, b.events[i].worker);
    EXPECT_EQ(a.events[i].expected_tau, b.events[i].expected_tau);
    differs |= i < c.events.size() && a.events[i].worker != c.events[i].worker;
  }
  EXPECT_TRUE(differs);
}

TEST(ScheduleTest, SummaryQuantiles) {
  Schedule s;
  s.tau_histogram = {5, 3, 0, 2};  // 10 pushes
  s.pushes = 10;
  EXPECT_DOUBLE_EQ(s.TauMean(), (3 + 6) / 10.0);
  EXPECT_EQ(s.TauQuantile(0.5), 0u);
  EXPECT_EQ(s.TauQuantile(0.6), 1u);
  EXPECT_EQ(s.TauQuantile(0.9), 3u);
  EXPECT_EQ(s.TauQuantile(1.0), 3u);
  EXPECT_EQ(s.TauMax(), 3u);
}

TEST(ScheduleTest, InvalidOptionsNameTheField) {
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::pair<ScheduleOptions, std::string>> cases;
  ScheduleOptions o = Async(2, 10, "fixed:1");
  auto add = [&](ScheduleOptions bad, const std::string& field) { cases.push_back({bad, field}); };
  ScheduleOptions bad = o;
  bad.workers = 0;
  add(bad, "workers");
  bad = o, bad.speed = {1};
  add(bad, "speed has 1 entries");
  bad = o, bad.speed = {1, 0};
  add(bad, "speed[1]");
  bad = o, bad.stragglers = {{2, 0, 1, 2}};
  add(bad, "stragglers[0].worker");
  bad = o, bad.stragglers = {{0, 0, 1, 0}};
  add(bad, "stragglers[0].factor");
  bad = o, bad.stragglers = {{0, 5, 5, 2}};
  add(bad, "stragglers[0].to_ms");
  bad = o, bad.churn = {{3, 0, inf}};
  add(bad, "churn[0].worker");
  bad = o, bad.churn = {{0, 5, 4}};
  add(bad, "churn[0].leave_ms");
  bad = o, bad.churn = {{0, 0, 10}, {0, 5, 20}};
  add(bad, "churn[1].join_ms overlaps");
  bad = o, bad.staleness = D("fixed:2"), bad.mode = SyncMode::kSync;
  add(bad, "staleness");
  bad = o, bad.staleness = D("fixed:2"), bad.churn = {{0, 0, 5}};
  add(bad, "staleness");
  bad = o, bad.updates = 100000001;
  add(bad, "updates");
  for (const auto& [options, field] : cases) {
    StatusOr<Schedule> s = BuildSchedule(options);
    ASSERT_FALSE(s.ok()) << field;
    EXPECT_EQ(s.status().code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find(field), std::string::npos) << s.status().message();
  }
  ScheduleOptions none = o;
  none.staleness = D("none");
  none.mode = SyncMode::kSync;
  EXPECT_TRUE(BuildSchedule(none).ok());  // "none" is no override
}

}  // namespace
}  // namespace onlineps::replay
