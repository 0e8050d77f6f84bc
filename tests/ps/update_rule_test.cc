// Tests of the update rules (ps/update_rule.h): closed-form checks of every optimizer
// and staleness policy against scalar double-precision references written here from
// docs/update-rules.md, hand-computed single steps, and the factories' validation.
#include "ps/update_rule.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace onlineps::ps {
namespace {

using ::testing::HasSubstr;

constexpr size_t kN = 13;         // not a multiple of the 8-element kernel block
constexpr double kRelTol = 2e-6;  // float kernels vs double references, per element
constexpr int kSteps = 6;

std::unique_ptr<Optimizer> MakeOptimizer(const std::string& name, const Params& params = {}) {
  auto result = CreateOptimizer(name, params);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return result.ok() ? std::move(result).value() : nullptr;
}

std::unique_ptr<StalenessPolicy> MakePolicy(const std::string& name, const Params& params = {}) {
  auto result = CreateStalenessPolicy(name, params);
  EXPECT_TRUE(result.ok()) << result.status().ToString();
  return result.ok() ? std::move(result).value() : nullptr;
}

// Deterministic gradients in [-1.25, 1.25] with exact zeros and negatives.
std::vector<float> Gradient(int step, size_t n = kN) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) g[i] = static_cast<float>((i * 7 + step * 3) % 11) * 0.25f - 1.25f;
  return g;
}

std::vector<float> InitialWeights(size_t n = kN) {
  std::vector<float> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = 0.1f * static_cast<float>(i % 5) - 0.2f;
  return w;
}

// lr_scale of each step, as a staleness policy would produce.
float ScaleAt(int step) {
  static constexpr float kScales[] = {1.0f, 0.5f, 1.0f, 0.25f, 1.0f, 1.0f / 3};
  return kScales[step % 6];
}

// Weights and state slots of one optimizer, initialized as a shard would.
struct OptimizerRun {
  OptimizerRun(const Optimizer& o, std::vector<float> w0) : opt(o), w(std::move(w0)) {
    for (int k = 0; k < opt.state_slots(); ++k) {
      state.emplace_back(w.size(), opt.InitialState(k));
    }
  }
  void Step(const std::vector<float>& g, float lr_scale = 1.0f, uint64_t step = 1) {
    std::vector<float*> slots;
    for (auto& s : state) slots.push_back(s.data());
    opt.Apply(w.data(), slots.data(), g.data(), w.size(), ApplyArgs{lr_scale, step});
  }
  const Optimizer& opt;
  std::vector<float> w;
  std::vector<std::vector<float>> state;
};

// Double-precision state of a reference run: w and two optimizer slots a, b.
struct Ref {
  explicit Ref(const std::vector<float>& w0, double a0 = 0.0)
      : w(w0.begin(), w0.end()), a(w0.size(), a0), b(w0.size(), 0.0) {}
  std::vector<double> w, a, b;
};

void ExpectNearAll(const std::vector<float>& got, const std::vector<double>& want,
                   double rel_tol = kRelTol) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], rel_tol * std::max(1.0, std::fabs(want[i]))) << "element " << i;
  }
}

bool BitIdentical(const std::vector<float>& x, const std::vector<float>& y) {
  return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
}

// ---- Scalar references, straight from the formulas. ----

void RefSgd(Ref& r, const std::vector<float>& g, double lr, double scale) {
  for (size_t i = 0; i < g.size(); ++i) r.w[i] -= lr * scale * g[i];
}

void RefAdagrad(Ref& r, const std::vector<float>& g, double lr, double eps, double scale) {
  for (size_t i = 0; i < g.size(); ++i) {
    r.a[i] += double{g[i]} * g[i];
    r.w[i] -= lr * scale * g[i] / (std::sqrt(r.a[i]) + eps);
  }
}

// a = z, b = n; the step's gradient is weighed by lr_scale.
void RefFtrl(Ref& r, const std::vector<float>& g, double alpha, double beta, double l1, double l2,
             double scale) {
  const double a = alpha;
  for (size_t i = 0; i < g.size(); ++i) {
    const double gi = double{g[i]} * scale;
    const double sigma = (std::sqrt(r.b[i] + gi * gi) - std::sqrt(r.b[i])) / a;
    r.a[i] += gi - sigma * r.w[i];
    r.b[i] += gi * gi;
    const double z = r.a[i];
    const double sign = z < 0 ? -1.0 : 1.0;
    r.w[i] = std::fabs(z) <= l1 ? 0.0 : -(z - sign * l1) / ((beta + std::sqrt(r.b[i])) / a + l2);
  }
}

// a = m, b = v.
void RefAdam(Ref& r, const std::vector<float>& g, double lr, double b1, double b2, double eps,
             double scale, uint64_t t) {
  for (size_t i = 0; i < g.size(); ++i) {
    r.a[i] = b1 * r.a[i] + (1 - b1) * g[i];
    r.b[i] = b2 * r.b[i] + (1 - b2) * double{g[i]} * g[i];
    const double m_hat = r.a[i] / (1 - std::pow(b1, t));
    const double v_hat = r.b[i] / (1 - std::pow(b2, t));
    r.w[i] -= lr * scale * m_hat / (std::sqrt(v_hat) + eps);
  }
}

std::vector<double> RefDcConstant(const std::vector<float>& g, const std::vector<float>& w,
                                  const std::vector<float>& w_bak, double lambda) {
  std::vector<double> out(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    out[i] = g[i] + lambda * g[i] * g[i] * (double{w[i]} - w_bak[i]);
  }
  return out;
}

std::vector<double> RefDcAdaptive(const std::vector<float>& g, const std::vector<float>& w,
                                  const std::vector<float>& w_bak, std::vector<double>& ms,
                                  double lambda0, double m, double eps) {
  std::vector<double> out(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    ms[i] = m * ms[i] + (1 - m) * g[i] * g[i];
    const double lambda_t = lambda0 / std::sqrt(ms[i] + eps);
    out[i] = g[i] + lambda_t * g[i] * g[i] * (double{w[i]} - w_bak[i]);
  }
  return out;
}

// ---- Closed-form checks, several steps over 13 elements. ----

TEST(UpdateRuleTest, SgdMatchesReference) {
  auto opt = MakeOptimizer("sgd", {{"lr", 0.3}});
  OptimizerRun run(*opt, InitialWeights());
  Ref ref(run.w);
  for (int t = 0; t < kSteps; ++t) {
    run.Step(Gradient(t), ScaleAt(t), t + 1);
    RefSgd(ref, Gradient(t), 0.3, ScaleAt(t));
    ExpectNearAll(run.w, ref.w);
  }
}

TEST(UpdateRuleTest, AdagradMatchesReference) {
  auto opt = MakeOptimizer("adagrad", {{"lr", 0.2}, {"eps", 1e-6}, {"initial_accumulator", 0.5}});
  OptimizerRun run(*opt, InitialWeights());
  Ref ref(run.w, 0.5);
  for (int t = 0; t < kSteps; ++t) {
    run.Step(Gradient(t), ScaleAt(t), t + 1);
    RefAdagrad(ref, Gradient(t), 0.2, 1e-6, ScaleAt(t));
    ExpectNearAll(run.w, ref.w);
    ExpectNearAll(run.state[0], ref.a);
  }
}

TEST(UpdateRuleTest, FtrlMatchesReference) {
  const Params params = {{"alpha", 0.2}, {"beta", 0.5}, {"l1", 0.05}, {"l2", 0.1}};
  auto opt = MakeOptimizer("ftrl", params);
  OptimizerRun run(*opt, InitialWeights());
  Ref ref(run.w);
  for (int t = 0; t < kSteps; ++t) {
    run.Step(Gradient(t), ScaleAt(t), t + 1);
    RefFtrl(ref, Gradient(t), 0.2, 0.5, 0.05, 0.1, ScaleAt(t));
    ExpectNearAll(run.w, ref.w);
    ExpectNearAll(run.state[0], ref.a);
    ExpectNearAll(run.state[1], ref.b);
  }
}

TEST(UpdateRuleTest, AdamMatchesReference) {
  auto opt = MakeOptimizer("adam", {{"lr", 0.01}, {"beta1", 0.8}, {"beta2", 0.99}, {"eps", 1e-6}});
  OptimizerRun run(*opt, InitialWeights());
  Ref ref(run.w);
  for (int t = 0; t < kSteps; ++t) {
    run.Step(Gradient(t), ScaleAt(t), t + 1);
    RefAdam(ref, Gradient(t), 0.01, 0.8, 0.99, 1e-6, ScaleAt(t), t + 1);
    ExpectNearAll(run.w, ref.w);
    ExpectNearAll(run.state[0], ref.a);
    ExpectNearAll(run.state[1], ref.b);
  }
}

TEST(UpdateRuleTest, DcConstantMatchesReference) {
  auto policy = MakePolicy("dc_constant", {{"lambda", 0.5}});
  std::vector<float> w_bak = InitialWeights();
  for (int t = 0; t < kSteps; ++t) {
    std::vector<float> w = InitialWeights();
    for (size_t i = 0; i < kN; ++i)
      w[i] += 0.05f * static_cast<float>(t + 1) * (i % 3 == 0 ? -1 : 1);
    std::vector<float> g = Gradient(t);
    const std::vector<double> want = RefDcConstant(g, w, w_bak, 0.5);
    policy->Compensate(g.data(), w.data(), w_bak.data(), nullptr, kN);
    ExpectNearAll(g, want);
  }
}

TEST(UpdateRuleTest, DcAdaptiveMatchesReference) {
  auto policy = MakePolicy("dc_adaptive", {{"lambda0", 1.5}, {"m", 0.9}, {"eps", 1e-5}});
  std::vector<float> ms(kN, 0.0f);
  std::vector<double> ref_ms(kN, 0.0);
  float* slots[] = {ms.data()};
  const std::vector<float> w_bak = InitialWeights();
  for (int t = 0; t < kSteps; ++t) {
    std::vector<float> w = InitialWeights();
    for (size_t i = 0; i < kN; ++i) w[i] += 0.03f * static_cast<float>(t + 1) * (i % 2 ? -1 : 1);
    std::vector<float> g = Gradient(t);
    const std::vector<double> want = RefDcAdaptive(g, w, w_bak, ref_ms, 1.5, 0.9, 1e-5);
    policy->Compensate(g.data(), w.data(), w_bak.data(), slots, kN);
    ExpectNearAll(g, want, 1e-5);  // lambda_t reaches ~500 where ms is tiny
    ExpectNearAll(ms, ref_ms);
  }
}

// ---- Hand-computed single steps. ----

TEST(UpdateRuleTest, SgdOneStepByHand) {
  auto opt = MakeOptimizer("sgd", {{"lr", 0.1}});
  OptimizerRun run(*opt, {1.0f});
  run.Step({2.0f});
  EXPECT_NEAR(run.w[0], 0.8f, 1e-7);
  run.Step({2.0f}, 0.5f);  // 0.8 - 0.1 * 0.5 * 2
  EXPECT_NEAR(run.w[0], 0.7f, 1e-7);
}

TEST(UpdateRuleTest, AdagradOneStepByHand) {
  auto opt = MakeOptimizer("adagrad", {{"lr", 0.1}});
  OptimizerRun run(*opt, {1.0f});
  run.Step({2.0f});  // G = 4, w = 1 - 0.1 * 2 / 2
  EXPECT_NEAR(run.w[0], 0.9f, 1e-7);
  EXPECT_EQ(run.state[0][0], 4.0f);
}

TEST(UpdateRuleTest, AdagradRespectsInitialAccumulator) {
  auto opt = MakeOptimizer("adagrad", {{"lr", 0.1}, {"initial_accumulator", 5.0}});
  EXPECT_EQ(opt->InitialState(0), 5.0f);
  OptimizerRun run(*opt, {1.0f});
  run.Step({2.0f});  // G = 5 + 4 = 9, w = 1 - 0.1 * 2 / 3
  EXPECT_EQ(run.state[0][0], 9.0f);
  EXPECT_NEAR(run.w[0], 1.0 - 0.2 / 3.0, 1e-7);
}

TEST(UpdateRuleTest, FtrlOneStepByHand) {
  struct Case {
    Params params;
    float lr_scale;
    float want_z, want_n;
    double want_w;
  };
  // g = 2: z = 2 - sigma * 0 = 2, n = 4, w = -(z - sgn(z) l1) / ((beta + 2) / alpha + l2).
  const Case cases[] = {
      {{{"alpha", 0.1}}, 1.0f, 2.0f, 4.0f, -2.0 / 30.0},
      {{{"alpha", 0.1}, {"l1", 1.0}}, 1.0f, 2.0f, 4.0f, -1.0 / 30.0},
      {{{"alpha", 0.1}, {"l2", 10.0}}, 1.0f, 2.0f, 4.0f, -2.0 / 40.0},
      // Scale 0.5 weighs the gradient: g = 1, so z = 1, n = 1, w = -1 / ((1 + 1) / 0.1).
      {{{"alpha", 0.1}}, 0.5f, 1.0f, 1.0f, -1.0 / 20.0},
  };
  for (const Case& c : cases) {
    auto opt = MakeOptimizer("ftrl", c.params);
    OptimizerRun run(*opt, {0.0f});
    run.Step({2.0f}, c.lr_scale);
    EXPECT_EQ(run.state[0][0], c.want_z);
    EXPECT_EQ(run.state[1][0], c.want_n);
    EXPECT_NEAR(run.w[0], c.want_w, 1e-7) << "lr_scale " << c.lr_scale;
  }
}

// A scaled-down (stale) push moves FTRL's weight less than the same push at full rate,
// then and after a later unscaled step. Scaling alpha for the step instead (the rule
// before) broke z's running sum of sigma: a push at 1/100 of the rate followed by a fresh
// push of g = 0 left w = -0.94 where the full-rate push gives -0.09.
TEST(UpdateRuleTest, FtrlStalePushMovesTheWeightLessThanAFreshOne) {
  auto run_with = [](float scale) {
    auto opt = MakeOptimizer("ftrl", {{"alpha", 0.1}});
    OptimizerRun run(*opt, {0.0f});
    run.Step({1.0f}, 1.0f);
    const float before = run.w[0];
    run.Step({1.0f}, scale);
    const float moved = run.w[0] - before;
    run.Step({0.0f}, 1.0f);
    return std::make_pair(moved, run.w[0] - before);
  };
  const auto [fresh_step, fresh_after] = run_with(1.0f);
  const auto [stale_step, stale_after] = run_with(0.01f);
  EXPECT_LT(std::fabs(stale_step), std::fabs(fresh_step));
  EXPECT_LT(std::fabs(stale_after), std::fabs(fresh_after))
      << "the stale push moved w by " << stale_after << " against " << fresh_after;
  EXPECT_LT(stale_after, 0.0f) << "a positive gradient must lower w";
}

TEST(UpdateRuleTest, AdamOneStepByHand) {
  auto opt = MakeOptimizer("adam");
  OptimizerRun run(*opt, {1.0f});
  run.Step({2.0f}, 1.0f, 1);  // m_hat = 2, v_hat = 4: w = 1 - 0.001 * 2 / (2 + 1e-8)
  EXPECT_NEAR(run.state[0][0], 0.2f, 1e-7);
  EXPECT_NEAR(run.state[1][0], 0.004f, 1e-9);
  EXPECT_NEAR(run.w[0], 0.999, 1e-7);
}

TEST(UpdateRuleTest, AdamBiasCorrectedFirstStepIsLrTimesSign) {
  const double lr = 0.001;
  auto opt = MakeOptimizer("adam", {{"lr", lr}});
  const std::vector<float> g = {1e-3f, 0.5f, -3.0f, 100.0f, -1e-2f, 7.0f, -0.25f, 2.0f, -50.0f};
  OptimizerRun run(*opt, std::vector<float>(g.size(), 0.0f));
  run.Step(g, 1.0f, 1);
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_NEAR(run.w[i], g[i] > 0 ? -lr : lr, 1e-4 * lr) << "g = " << g[i];
  }
}

TEST(UpdateRuleTest, FtrlWithLargeL1KeepsWeightsExactlyZero) {
  auto opt = MakeOptimizer("ftrl", {{"alpha", 0.5}, {"l1", 100.0}});
  OptimizerRun run(*opt, std::vector<float>(kN, 0.0f));
  for (int t = 0; t < 20; ++t) {
    run.Step(Gradient(t), ScaleAt(t), t + 1);
    for (size_t i = 0; i < kN; ++i) ASSERT_EQ(run.w[i], 0.0f) << "step " << t << " element " << i;
  }
  EXPECT_NE(run.state[0][1], 0.0f);  // z moved; only the L1 threshold holds w at 0
}

TEST(UpdateRuleTest, DcConstantOneStepByHand) {
  auto policy = MakePolicy("dc_constant");  // lambda = 0.04
  float g = 2.0f;
  const float w = 1.0f, w_bak = 0.5f;
  policy->Compensate(&g, &w, &w_bak, nullptr, 1);  // 2 + 0.04 * 4 * 0.5
  EXPECT_NEAR(g, 2.08f, 1e-6);
}

TEST(UpdateRuleTest, DcAdaptiveOneStepByHand) {
  auto policy = MakePolicy("dc_adaptive");  // lambda0 = 2, m = 0.95, eps = 1e-7
  float g = 2.0f, ms = 0.0f;
  const float w = 1.0f, w_bak = 0.5f;
  float* slots[] = {&ms};
  policy->Compensate(&g, &w, &w_bak, slots, 1);
  EXPECT_NEAR(ms, 0.2f, 1e-7);        // 0.05 * 4
  EXPECT_NEAR(g, 10.94426967, 1e-5);  // 2 + 2 / sqrt(0.2 + 1e-7) * 4 * 0.5
}

// ---- Staleness policies: required properties. ----

TEST(UpdateRuleTest, LrOverTauScalesByInverseStaleness) {
  auto policy = MakePolicy("lr_over_tau");
  EXPECT_EQ(policy->LrScale(0), 1.0f);
  EXPECT_EQ(policy->LrScale(1), 1.0f);
  EXPECT_EQ(policy->LrScale(2), 0.5f);
  EXPECT_EQ(policy->LrScale(4), 0.25f);
  EXPECT_FALSE(policy->NeedsBackup());
  EXPECT_EQ(policy->state_slots(), 0);
}

TEST(UpdateRuleTest, NoStalenessKeepsFullRateAndGradient) {
  auto policy = MakePolicy("none");
  EXPECT_EQ(policy->LrScale(0), 1.0f);
  EXPECT_EQ(policy->LrScale(1000), 1.0f);
  EXPECT_FALSE(policy->NeedsBackup());
  EXPECT_EQ(policy->state_slots(), 0);
}

TEST(UpdateRuleTest, DcPoliciesNeedBackupAndDeclareState) {
  EXPECT_TRUE(MakePolicy("dc_constant")->NeedsBackup());
  EXPECT_EQ(MakePolicy("dc_constant")->state_slots(), 0);
  EXPECT_TRUE(MakePolicy("dc_adaptive")->NeedsBackup());
  EXPECT_EQ(MakePolicy("dc_adaptive")->state_slots(), 1);
  EXPECT_EQ(MakePolicy("dc_constant")->LrScale(7), 1.0f);
}

// Runs 50 steps of every optimizer twice, with and without compensation by `policy`, with
// w_bak lagging three steps behind w, and expects bit-identical weights.
void ExpectCompensationIsNoOp(const StalenessPolicy& policy) {
  for (const std::string& name : OptimizerNames()) {
    SCOPED_TRACE(name);
    auto opt = MakeOptimizer(name);
    OptimizerRun plain(*opt, InitialWeights()), compensated(*opt, InitialWeights());
    std::vector<std::vector<float>> history = {compensated.w};
    std::vector<float> ms(kN, 0.0f);
    float* slots[] = {ms.data()};
    for (int t = 0; t < 50; ++t) {
      const std::vector<float>& w_bak = history[std::max(0, t - 3)];
      std::vector<float> g = Gradient(t);
      policy.Compensate(g.data(), compensated.w.data(), w_bak.data(), slots, kN);
      compensated.Step(g, ScaleAt(t), t + 1);
      plain.Step(Gradient(t), ScaleAt(t), t + 1);
      history.push_back(compensated.w);
    }
    EXPECT_FALSE(BitIdentical(history[0], history[50]));  // w moved, so w != w_bak
    EXPECT_TRUE(BitIdentical(plain.w, compensated.w));
  }
}

TEST(UpdateRuleTest, DcConstantWithZeroLambdaIsBitIdenticalToNoCompensation) {
  ExpectCompensationIsNoOp(*MakePolicy("dc_constant", {{"lambda", 0.0}}));
}

TEST(UpdateRuleTest, DcAdaptiveWithZeroLambda0IsBitIdenticalToNoCompensation) {
  ExpectCompensationIsNoOp(*MakePolicy("dc_adaptive", {{"lambda0", 0.0}}));
}

TEST(UpdateRuleTest, DcCompensationWithUnchangedWeightsLeavesGradient) {
  for (const char* name : {"dc_constant", "dc_adaptive"}) {
    SCOPED_TRACE(name);
    auto policy = MakePolicy(name, {});
    const std::vector<float> w = InitialWeights();
    const std::vector<float> w_bak = w;
    std::vector<float> ms(kN, 0.0f);
    float* slots[] = {ms.data()};
    for (int t = 0; t < kSteps; ++t) {
      std::vector<float> g = Gradient(t);
      policy->Compensate(g.data(), w.data(), w_bak.data(), slots, kN);  // equal copies
      EXPECT_TRUE(BitIdentical(g, Gradient(t)));
      policy->Compensate(g.data(), w.data(), w.data(), slots, kN);  // the same array
      EXPECT_TRUE(BitIdentical(g, Gradient(t)));
    }
  }
}

// ---- Properties shared by every optimizer. ----

struct OptimizerCase {
  std::string name;
  std::string lr_key;  // the parameter lr() reports
  int slots;
};

class UpdateRuleOptimizerTest : public ::testing::TestWithParam<OptimizerCase> {
 protected:
  std::unique_ptr<Optimizer> Make(const Params& params = {}) {
    return MakeOptimizer(GetParam().name, params);
  }
};

TEST_P(UpdateRuleOptimizerTest, NameSlotsAndLrMatchRegistry) {
  auto opt = Make({{GetParam().lr_key, 0.25}});
  EXPECT_EQ(opt->name(), GetParam().name);
  EXPECT_EQ(opt->state_slots(), GetParam().slots);
  EXPECT_EQ(opt->lr(), 0.25);
}

TEST_P(UpdateRuleOptimizerTest, ZeroGradientFromFreshStateLeavesWeightsUnchanged) {
  auto opt = Make();
  // FTRL derives w from (z, n), so only w = 0 is consistent with fresh state.
  const std::vector<float> w0 =
      GetParam().name == "ftrl" ? std::vector<float>(kN, 0.0f) : InitialWeights();
  OptimizerRun run(*opt, w0);
  for (int t = 0; t < kSteps; ++t) run.Step(std::vector<float>(kN, 0.0f), ScaleAt(t), t + 1);
  EXPECT_TRUE(BitIdentical(run.w, w0));
}

TEST_P(UpdateRuleOptimizerTest, TouchesExactlyItsStateSlotsAndNElements) {
  auto opt = Make();
  constexpr float kGuard = 12345.0f;
  constexpr size_t kPad = 8;
  std::vector<float> w(kN + kPad, kGuard), g(kN + kPad, kGuard);
  std::vector<std::vector<float>> state(opt->state_slots(), std::vector<float>(kN + kPad, kGuard));
  std::fill_n(w.begin(), kN, 0.0f);
  for (size_t i = 0; i < kN; ++i) g[i] = 0.5f + 0.1f * static_cast<float>(i);
  std::vector<float*> slots;  // exactly state_slots() pointers
  for (int k = 0; k < opt->state_slots(); ++k) {
    std::fill_n(state[k].begin(), kN, opt->InitialState(k));
    slots.push_back(state[k].data());
  }
  opt->Apply(w.data(), slots.data(), g.data(), kN, ApplyArgs{});
  for (size_t i = kN; i < kN + kPad; ++i) EXPECT_EQ(w[i], kGuard) << "w past n at " << i;
  for (int k = 0; k < opt->state_slots(); ++k) {
    for (size_t i = 0; i < kN; ++i) {
      EXPECT_NE(state[k][i], opt->InitialState(k)) << "slot " << k << " element " << i;
    }
    for (size_t i = kN; i < kN + kPad; ++i) EXPECT_EQ(state[k][i], kGuard) << "slot " << k;
  }
}

TEST_P(UpdateRuleOptimizerTest, TailElementsMatchElementwiseApplication) {
  auto opt = Make();
  OptimizerRun whole(*opt, InitialWeights());
  std::vector<std::unique_ptr<OptimizerRun>> singles;
  for (float w0 : InitialWeights())
    singles.push_back(std::make_unique<OptimizerRun>(*opt, std::vector<float>{w0}));
  for (int t = 0; t < kSteps; ++t) {
    const std::vector<float> g = Gradient(t);
    whole.Step(g, ScaleAt(t), t + 1);
    for (size_t i = 0; i < kN; ++i) singles[i]->Step({g[i]}, ScaleAt(t), t + 1);
  }
  for (size_t i = 0; i < kN; ++i) EXPECT_FLOAT_EQ(whole.w[i], singles[i]->w[0]) << "element " << i;
}

// lr_scale acts as a scaled learning rate; for FTRL, whose rate is not a factor of the
// step, as a weighed gradient (docs/update-rules.md).
TEST_P(UpdateRuleOptimizerTest, LrScaleActsAsAScaledLearningRate) {
  const bool ftrl = GetParam().name == "ftrl";
  auto base = Make({{GetParam().lr_key, 0.08}});
  auto halved = Make({{GetParam().lr_key, ftrl ? 0.08 : 0.04}});
  OptimizerRun scaled(*base, InitialWeights()), direct(*halved, InitialWeights());
  for (int t = 0; t < kSteps; ++t) {
    scaled.Step(Gradient(t), 0.5f, t + 1);
    std::vector<float> g = Gradient(t);
    if (ftrl) {
      for (float& x : g) x *= 0.5f;
    }
    direct.Step(g, 1.0f, t + 1);
  }
  for (size_t i = 0; i < kN; ++i) EXPECT_FLOAT_EQ(scaled.w[i], direct.w[i]) << "element " << i;
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, UpdateRuleOptimizerTest,
                         ::testing::Values(OptimizerCase{"sgd", "lr", 0},
                                           OptimizerCase{"adagrad", "lr", 1},
                                           OptimizerCase{"ftrl", "alpha", 2},
                                           OptimizerCase{"adam", "lr", 2}),
                         [](const auto& info) { return info.param.name; });

// ---- Factories. ----

TEST(UpdateRuleTest, FactoriesListTheirNames) {
  EXPECT_EQ(OptimizerNames(), (std::vector<std::string>{"sgd", "adagrad", "ftrl", "adam"}));
  EXPECT_EQ(StalenessPolicyNames(),
            (std::vector<std::string>{"none", "lr_over_tau", "dc_constant", "dc_adaptive"}));
  for (const std::string& name : StalenessPolicyNames()) EXPECT_EQ(MakePolicy(name)->name(), name);
}

TEST(UpdateRuleTest, FactoryDefaults) {
  EXPECT_EQ(MakeOptimizer("sgd")->lr(), 0.01);
  EXPECT_EQ(MakeOptimizer("adagrad")->lr(), 0.01);
  EXPECT_EQ(MakeOptimizer("adagrad")->InitialState(0), 0.0f);
  EXPECT_EQ(MakeOptimizer("ftrl")->lr(), 0.1);
  EXPECT_EQ(MakeOptimizer("adam")->lr(), 0.001);
}

struct FactoryErrorCase {
  bool optimizer;  // else a staleness policy
  std::string rule;
  Params params;
  std::vector<std::string> message_parts;
};

class UpdateRuleFactoryErrorTest : public ::testing::TestWithParam<FactoryErrorCase> {};

TEST_P(UpdateRuleFactoryErrorTest, RejectsWithInvalidArgumentNamingTheProblem) {
  const FactoryErrorCase& c = GetParam();
  const Status status = c.optimizer ? CreateOptimizer(c.rule, c.params).status()
                                    : CreateStalenessPolicy(c.rule, c.params).status();
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << status.ToString();
  for (const std::string& part : c.message_parts) {
    EXPECT_THAT(status.message(), HasSubstr(part));
  }
}

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();

INSTANTIATE_TEST_SUITE_P(
    AllErrors, UpdateRuleFactoryErrorTest,
    ::testing::Values(
        FactoryErrorCase{true, "sgdd", {}, {"'sgdd'", "sgd, adagrad, ftrl, adam"}},
        FactoryErrorCase{false, "dc", {}, {"'dc'", "none, lr_over_tau, dc_constant, dc_adaptive"}},
        FactoryErrorCase{true, "sgd", {{"momentum", 0.9}}, {"'sgd'", "'momentum'", "lr"}},
        FactoryErrorCase{true, "adam", {{"beta3", 0.9}}, {"'beta3'", "lr, beta1, beta2, eps"}},
        FactoryErrorCase{false, "none", {{"lambda", 1}}, {"'none'", "'lambda'"}},
        FactoryErrorCase{false, "lr_over_tau", {{"lr", 1}}, {"'lr_over_tau'", "'lr'"}},
        FactoryErrorCase{false, "dc_constant", {{"lambda0", 1}}, {"'lambda0'", "lambda"}},
        FactoryErrorCase{true, "sgd", {{"lr", 0.0}}, {"'sgd'", "'lr'", "> 0"}},
        FactoryErrorCase{true, "sgd", {{"lr", -0.1}}, {"'lr'", "> 0"}},
        FactoryErrorCase{true, "adagrad", {{"lr", -1}}, {"'adagrad'", "'lr'"}},
        FactoryErrorCase{true, "adam", {{"lr", 0}}, {"'adam'", "'lr'"}},
        FactoryErrorCase{true, "ftrl", {{"alpha", 0}}, {"'ftrl'", "'alpha'", "> 0"}},
        FactoryErrorCase{true, "adam", {{"beta1", 1.0}}, {"'beta1'", "[0, 1)"}},
        FactoryErrorCase{true, "adam", {{"beta1", -0.1}}, {"'beta1'", "[0, 1)"}},
        FactoryErrorCase{true, "adam", {{"beta2", 1.5}}, {"'beta2'", "[0, 1)"}},
        FactoryErrorCase{false, "dc_adaptive", {{"m", 1.0}}, {"'dc_adaptive'", "'m'", "[0, 1)"}},
        FactoryErrorCase{false, "dc_adaptive", {{"m", -0.5}}, {"'m'", "[0, 1)"}},
        FactoryErrorCase{true, "adam", {{"eps", -1e-8}}, {"'adam'", "'eps'"}},
        FactoryErrorCase{true, "adagrad", {{"eps", -1}}, {"'adagrad'", "'eps'"}},
        FactoryErrorCase{true, "adagrad", {{"eps", 0}}, {"'eps'", "> 0"}},
        FactoryErrorCase{false, "dc_adaptive", {{"eps", -1}}, {"'dc_adaptive'", "'eps'"}},
        FactoryErrorCase{true, "ftrl", {{"l1", -0.1}}, {"'ftrl'", "'l1'", ">= 0"}},
        FactoryErrorCase{true, "ftrl", {{"l2", -0.1}}, {"'ftrl'", "'l2'", ">= 0"}},
        FactoryErrorCase{true, "ftrl", {{"beta", -1}}, {"'beta'", ">= 0"}},
        FactoryErrorCase{
            true, "adagrad", {{"initial_accumulator", -1}}, {"'initial_accumulator'", ">= 0"}},
        FactoryErrorCase{false, "dc_constant", {{"lambda", -0.04}}, {"'dc_constant'", "'lambda'"}},
        FactoryErrorCase{false, "dc_adaptive", {{"lambda0", -2}}, {"'lambda0'", ">= 0"}},
        FactoryErrorCase{true, "sgd", {{"lr", kNaN}}, {"'lr'", "finite"}},
        FactoryErrorCase{true, "adam", {{"lr", kInf}}, {"'lr'", "finite"}},
        FactoryErrorCase{true, "ftrl", {{"l1", -kInf}}, {"'l1'", "finite"}},
        FactoryErrorCase{true, "sgd", {{"lr", 1e300}}, {"'lr'", "finite"}},
        FactoryErrorCase{false, "dc_constant", {{"lambda", kNaN}}, {"'lambda'", "finite"}},
        FactoryErrorCase{false, "dc_adaptive", {{"m", kNaN}}, {"'m'", "finite"}}));

}  // namespace
}  // namespace onlineps::ps
