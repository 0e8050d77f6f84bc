// The replayer through a real (in-process) parameter server: golden checks of the delay
// machinery against closed-form results, determinism, and equivalences between rules.
#include <gtest/gtest.h>

#include <cmath>

#include "replay/batches.h"
#include "replay/dataset.h"
#include "replay/models.h"
#include "replay/replayer.h"
#include "replay/schedule.h"
#include "replay/trace_steps.h"

namespace onlineps::replay {
namespace {

// Batches for models that ignore their input (the quadratic).
class NoBatches : public BatchSource {
 public:
  StatusOr<std::vector<worker::Example>> Batch(uint64_t) override {
    return std::vector<worker::Example>(1);
  }
  const std::vector<worker::Example>& Test() const override { return test_; }
  nlohmann::json Ref(uint64_t) const override { return nullptr; }

 private:
  std::vector<worker::Example> test_;
};

ReplayResult RunQuadratic(double lr, const ScheduleOptions& so, uint64_t eval_every) {
  auto model = MakeQuadraticModel({});
  NoBatches batches;
  ReplayOptions ro;
  ro.table_template.optimizer_params["lr"] = lr;
  ro.eval_every = eval_every;
  auto replayer = Replayer::Create(model.get(), &batches, {}, ro);
  EXPECT_TRUE(replayer.ok()) << replayer.status().ToString();
  auto scheduler = Scheduler::Create(so);
  EXPECT_TRUE(scheduler.ok()) << scheduler.status().ToString();
  auto r = (*replayer)->Run([&](Event* e) { return (*scheduler)->Next(e); }, so.updates);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ReplayResult{};
}

// A trace's steps run in the order the shard applied them, and a learn applied later may
// have started earlier: the curve's virtual time ran backwards then (seen as a flaky
// Replay.TraceFromLiveBridge). It is the time reached, which never goes back.
TEST(ReplayTraceTimeTest, VirtualTimeNeverRunsBackwards) {
  TraceSteps steps;
  for (double t : {0.0, 10.0, 5.0, 20.0, 15.0}) {
    TraceStep s;
    s.t_ms = t;
    steps.steps.push_back(s);
  }
  steps.duration_ms = 20;
  const std::vector<Event> events = TraceEvents(steps, std::nullopt, /*seed=*/1, /*loops=*/2);
  auto model = MakeQuadraticModel({});
  NoBatches batches;
  ReplayOptions ro;
  ro.eval_every = 1;
  auto replayer = Replayer::Create(model.get(), &batches, {}, ro);
  ASSERT_TRUE(replayer.ok()) << replayer.status().ToString();
  size_t next = 0;
  auto r = (*replayer)->Run(
      [&](Event* e) {
        if (next == events.size()) return false;
        *e = events[next++];
        return true;
      },
      steps.steps.size() * 2);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->curve.size(), 10u);
  for (size_t i = 1; i < r->curve.size(); ++i) {
    EXPECT_GE(r->curve[i].virtual_ms, r->curve[i - 1].virtual_ms) << "evaluation " << i;
  }
  EXPECT_DOUBLE_EQ(r->curve.back().virtual_ms, 40.0);  // the second loop, one span on
}

// Gradient descent on f(x) = h x^2 / 2 with a fixed delay tau is x' = x - a x_{t-tau}
// (a = lr h), stable iff a < 2 sin(pi / (2 (2 tau + 1))) (Levin and May). The delay is
// injected by the schedule and measured by the shard; the loss (h x^2 / 2 at the pulled
// x) must fall by 100x at 0.98 of the threshold and grow by 100x at 1.02.
TEST(ReplayGoldenTest, FixedDelayStabilityThresholdThroughThePs) {
  for (int tau : {0, 1, 2, 4, 7, 15}) {
    const double threshold = 2 * std::sin(M_PI / (2 * (2 * tau + 1)));
    for (double factor : {0.98, 1.02}) {
      ScheduleOptions so;
      so.workers = static_cast<uint32_t>(tau + 1);
      so.updates = 400 * static_cast<uint64_t>(tau + 1);
      so.staleness = Delay::Parse("fixed:" + std::to_string(tau)).value();
      const uint64_t window = 20 * static_cast<uint64_t>(tau + 1);
      ReplayResult r = RunQuadratic(threshold * factor, so, window);
      ASSERT_GE(r.curve.size(), 3u);
      // After warm-up the shard measured exactly tau for every push.
      EXPECT_EQ(r.overall.Max(), static_cast<uint64_t>(tau));
      EXPECT_GT(r.overall.Fraction(tau), 0.99) << "tau " << tau;
      const double first = r.curve.front().train_loss, last = r.curve.back().train_loss;
      if (factor < 1) {
        EXPECT_LT(last, first / 100) << "tau " << tau << " a " << threshold * factor;
      } else {
        EXPECT_GT(last, first * 100) << "tau " << tau << " a " << threshold * factor;
      }
    }
  }
}

// M workers with i.i.d. exponential compute times: the staleness the shard measures is
// geometric with mean M - 1 and P(0) = 1/M.
TEST(ReplayGoldenTest, ExponentialComputeTimesGiveGeometricStalenessAtTheShard) {
  for (uint32_t m : {2u, 4u, 8u}) {
    ScheduleOptions so;
    so.workers = m;
    so.updates = 20000;
    so.compute = Delay::Parse("exp:10").value();
    so.seed = 7;
    ReplayResult r = RunQuadratic(1e-4, so, 0);
    ASSERT_EQ(r.pushes, so.updates);
    EXPECT_NEAR(r.overall.Mean(), m - 1.0, 0.05 * m) << "M " << m;
    EXPECT_NEAR(r.overall.Fraction(0), 1.0 / m, 0.02) << "M " << m;
    ASSERT_EQ(r.per_worker.size(), m);
    for (const StalenessStats& w : r.per_worker) EXPECT_NEAR(w.Mean(), m - 1.0, 0.15 * m);
  }
}

// Real data without libtorch: sklearn's digits as "is it a 0?" for the sparse-lr model,
// each pixel a word naming its position and intensity level.
class DigitsZero : public BatchSource {
 public:
  explicit DigitsZero(const Dataset* d) : inner_(d, 16, 3, true) {
    for (worker::Example e : inner_.Test()) test_.push_back(Binary(e));
  }
  StatusOr<std::vector<worker::Example>> Batch(uint64_t k) override {
    ONLINEPS_ASSIGN_OR_RETURN(auto b, inner_.Batch(k));
    for (auto& e : b) e = Binary(e);
    return b;
  }
  const std::vector<worker::Example>& Test() const override { return test_; }
  nlohmann::json Ref(uint64_t k) const override { return inner_.Ref(k); }

 private:
  // Pixels become words "p<index>v<intensity bucket>" for the hashed model.
  static worker::Example Binary(worker::Example e) {
    std::string text;
    for (size_t i = 0; i < e.features.size(); ++i) {
      const int level = static_cast<int>(e.features[i] * 3.99f);
      if (level > 0) text += "p" + std::to_string(i) + "v" + std::to_string(level) + " ";
    }
    e.text = text;
    e.features.clear();
    e.label = e.label == 0 ? 1 : 0;
    return e;
  }
  DatasetBatches inner_;
  std::vector<worker::Example> test_;
};

struct DigitsRun {
  std::string policy = "none";
  std::map<std::string, double> policy_params;
  uint64_t seed = 5;
};

ReplayResult RunDigits(const Dataset& data, const DigitsRun& run) {
  auto model = MakeSparseLrModel({});
  DigitsZero batches(&data);
  ReplayOptions ro;
  ro.table_template.optimizer_params["lr"] = 0.5;
  ro.table_template.staleness = run.policy;
  ro.table_template.staleness_params = run.policy_params;
  ro.eval_every = 100;
  ClusterOptions cluster;
  cluster.inproc_shards = 2;
  auto replayer = Replayer::Create(model.get(), &batches, cluster, ro);
  EXPECT_TRUE(replayer.ok()) << replayer.status().ToString();
  ScheduleOptions so;
  so.workers = 4;
  so.updates = 400;
  so.compute = Delay::Parse("exp:5").value();
  so.seed = run.seed;
  auto scheduler = Scheduler::Create(so);
  auto r = (*replayer)->Run([&](Event* e) { return (*scheduler)->Next(e); }, so.updates);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : ReplayResult{};
}

TEST(ReplayDeterminismTest, SameSeedSameParametersBitForBit) {
  auto data = LoadDataset("digits", {});
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  ReplayResult a = RunDigits(*data, {}), b = RunDigits(*data, {});
  DigitsRun other;
  other.seed = 6;
  ReplayResult c = RunDigits(*data, other);
  ASSERT_FALSE(a.params_sha256.empty());
  EXPECT_EQ(a.params_sha256, b.params_sha256);
  EXPECT_NE(a.params_sha256, c.params_sha256);
  // It learned: "is it a 0" is far better than the 90% of always answering no.
  ASSERT_FALSE(a.curve.empty());
  EXPECT_GT(a.curve.back().test_accuracy, 0.95);
  EXPECT_GT(a.overall.Mean(), 1.0);  // it really was asynchronous
}

// DC-ASGD with lambda = 0 is plain async SGD, bit for bit (update-rules.md section 4.1).
TEST(ReplayDeterminismTest, DcWithZeroLambdaEqualsPlainAsync) {
  auto data = LoadDataset("digits", {});
  ASSERT_TRUE(data.ok()) << data.status().ToString();
  DigitsRun dc;
  dc.policy = "dc_constant";
  dc.policy_params = {{"lambda", 0.0}};
  DigitsRun dc_on = dc;
  dc_on.policy_params = {{"lambda", 0.5}};
  const std::string plain = RunDigits(*data, {}).params_sha256;
  EXPECT_EQ(RunDigits(*data, dc).params_sha256, plain);
  EXPECT_NE(RunDigits(*data, dc_on).params_sha256, plain);
}

}  // namespace
}  // namespace onlineps::replay
