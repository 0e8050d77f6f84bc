// Tests of the shard tables (ps/table.h) driven directly through Table::Create: closed
// forms of the update rules applied by a table, staleness bookkeeping, DC-ASGD backups,
// accumulation, bounded staleness, Polyak averaging, delta pushes, input validation,
// and the sparse row lifecycle (deterministic init, admission, LRU cap, TTL). Expected
// values are computed here, in double precision, from the documented formulas.
#include "ps/table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace onlineps::ps {
namespace {

using ::testing::ContainsRegex;
using ::testing::HasSubstr;

// Every table in the kind-parameterized tests exposes 4 floats: a dense tensor of shape
// {4}, or two sparse rows of dim 2 (keys kKeys).
const std::vector<uint64_t> kKeys = {3, 11};
constexpr size_t kFloats = 4;
constexpr double kLr = 0.1;
constexpr double kW0 = 1.0;  // constant initializer

std::unique_ptr<Table> NewTable(const TableSpec& spec, uint32_t shard = 0,
                                uint32_t num_shards = 1) {
  auto t = Table::Create(spec, shard, num_shards);
  EXPECT_TRUE(t.ok()) << t.status().ToString();
  return t.ok() ? std::move(t).value() : nullptr;
}

bool IsSparse(const Table& t) { return t.spec().kind == TableKind::kSparse; }

StatusOr<PullResult> TryPull(Table& t, uint64_t sender, bool averaged = false, uint64_t now = 0,
                             bool record_backup = true, const std::vector<uint64_t>& keys = kKeys) {
  PullRequest req;
  req.sender = sender;
  req.averaged = averaged;
  req.record_backup = record_backup;
  req.now_ms = now;
  if (IsSparse(t)) {
    req.keys = keys.data();
    req.num_keys = keys.size();
  }
  return t.Pull(req);
}

// Pulls and returns the values (empty on error, which is reported).
std::vector<float> Pull(Table& t, uint64_t sender, uint64_t* version = nullptr,
                        bool averaged = false, uint64_t now = 0, bool record_backup = true,
                        const std::vector<uint64_t>& keys = kKeys) {
  auto r = TryPull(t, sender, averaged, now, record_backup, keys);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  if (!r.ok()) return {};
  if (version != nullptr) *version = r->version;
  return r->values;
}

StatusOr<PushResult> Push(Table& t, uint64_t sender, uint64_t base, const std::vector<float>& g,
                          bool delta = false, uint64_t now = 0,
                          const std::vector<uint64_t>& keys = kKeys) {
  PushRequest req;
  req.sender = sender;
  req.base_version = base;
  req.delta = delta;
  req.values = g.data();
  req.num_values = g.size();
  req.now_ms = now;
  if (IsSparse(t)) {
    req.keys = keys.data();
    req.num_keys = keys.size();
  }
  return t.Push(req);
}

// Pushes and returns the result; a failed push is reported and yields a default result.
PushResult MustPush(Table& t, uint64_t sender, uint64_t base, const std::vector<float>& g,
                    bool delta = false, uint64_t now = 0,
                    const std::vector<uint64_t>& keys = kKeys) {
  auto r = Push(t, sender, base, g, delta, now, keys);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : PushResult{};
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

void ExpectNear(const std::vector<float>& got, const std::vector<double>& want, double tol = 1e-5) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_NEAR(got[i], want[i], tol * std::max(1.0, std::fabs(want[i]))) << "element " << i;
  }
}

void ExpectBitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// w - lr * g, in double.
std::vector<double> SgdStep(const std::vector<double>& w, const std::vector<float>& g,
                            double lr = kLr) {
  std::vector<double> out(w);
  for (size_t i = 0; i < w.size(); ++i) out[i] -= lr * g[i];
  return out;
}

// The DC-ASGD-c gradient g + lambda * g^2 * (w - w_bak), in double.
std::vector<float> DcGradient(const std::vector<float>& g, const std::vector<double>& w,
                              const std::vector<double>& w_bak, double lambda) {
  std::vector<float> out(g.size());
  for (size_t i = 0; i < g.size(); ++i) {
    out[i] = static_cast<float>(g[i] + lambda * g[i] * g[i] * (w[i] - w_bak[i]));
  }
  return out;
}

const std::vector<float> kG1 = {1.0f, -2.0f, 0.5f, 3.0f};
const std::vector<float> kG2 = {2.0f, 1.0f, -1.0f, 0.5f};
const std::vector<float> kG3 = {-1.0f, 0.5f, 2.0f, 1.0f};
const std::vector<float> kG4 = {0.5f, -0.5f, 1.0f, -2.0f};

// --------------------------------------------------------------- both table kinds

class TableKindTest : public ::testing::TestWithParam<TableKind> {
 protected:
  TableSpec Spec() const {
    TableSpec s;
    s.name = "t";
    s.kind = GetParam();
    if (s.kind == TableKind::kDense) {
      s.shape = {kFloats};
    } else {
      s.dim = 2;
    }
    s.optimizer_params = {{"lr", kLr}};
    s.init = "constant";
    s.init_value = kW0;
    return s;
  }
};

TEST_P(TableKindTest, PushAppliesSgdClosedForm) {
  auto t = NewTable(Spec());
  ASSERT_NE(t, nullptr);
  uint64_t v = 99;
  EXPECT_EQ(Pull(*t, 1, &v), std::vector<float>(kFloats, 1.0f));
  EXPECT_EQ(v, 0u);
  PushResult r = MustPush(*t, 1, 0, kG1);
  EXPECT_EQ(r.version, 1u);
  EXPECT_EQ(r.tau, 0u);
  EXPECT_FALSE(r.queued);
  EXPECT_FALSE(r.hold);
  std::vector<double> w = SgdStep(std::vector<double>(kFloats, kW0), kG1);
  ExpectNear(Pull(*t, 1, &v), w, 1e-6);
  EXPECT_EQ(v, 1u);
  MustPush(*t, 1, 1, kG2);
  ExpectNear(Pull(*t, 1, &v), SgdStep(w, kG2), 1e-6);
  EXPECT_EQ(v, 2u);
  EXPECT_EQ(t->version(), 2u);
}

TEST_P(TableKindTest, ClipNormScalesLargePushesAndLeavesSmallOnes) {
  TableSpec spec = Spec();
  spec.clip_norm = 1.0;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  // kG1 has norm sqrt(1 + 4 + 0.25 + 9) ~ 3.77: applied as kG1 / 3.77.
  double norm = 0;
  for (float g : kG1) norm += g * g;
  norm = std::sqrt(norm);
  std::vector<float> scaled;
  for (float g : kG1) scaled.push_back(static_cast<float>(g / norm));
  MustPush(*t, 1, 0, kG1);
  std::vector<double> w = SgdStep(std::vector<double>(kFloats, kW0), scaled);
  ExpectNear(Pull(*t, 1), w, 1e-6);
  EXPECT_EQ(t->Stats().clipped_pushes, 1u);
  // A push within the bound is applied as is, and not counted.
  const std::vector<float> small = {0.1f, -0.2f, 0.3f, 0.1f};
  MustPush(*t, 1, 1, small);
  ExpectNear(Pull(*t, 1), SgdStep(w, small), 1e-6);
  EXPECT_EQ(t->Stats().clipped_pushes, 1u);
  // Deltas are clipped too (one bad worker cannot move the model far either way).
  const std::vector<float> huge = {1e6f, 0, 0, 0};
  const std::vector<double> before = ToDouble(Pull(*t, 1));
  MustPush(*t, 1, 2, huge, /*delta=*/true);
  std::vector<double> want = before;
  want[0] += 1.0;
  ExpectNear(Pull(*t, 1), want, 1e-6);
  EXPECT_EQ(t->Stats().clipped_pushes, 2u);
  // Off by default.
  auto plain = NewTable(Spec());
  MustPush(*plain, 1, 0, huge, /*delta=*/true);
  EXPECT_NEAR(Pull(*plain, 1)[0], kW0 + 1e6, 1.0);
  EXPECT_EQ(plain->Stats().clipped_pushes, 0u);
}

// A seed (a DELTA push flagged kFlagSeed: a model file's initial values) is applied whole:
// clip_norm bounds gradients and training deltas, and clipped the seed, so a TorchScript
// model started from its weights scaled down to the clip norm.
TEST_P(TableKindTest, ASeedIsNotClippedAndOtherDeltasAre) {
  TableSpec spec = Spec();
  spec.clip_norm = 0.1;
  spec.init_value = 0.0;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  const std::vector<float> seed = {1.0f, -2.0f, 0.5f, 3.0f};
  PushRequest req;
  req.sender = 1;
  req.delta = true;
  req.seed = true;
  req.values = seed.data();
  req.num_values = seed.size();
  if (IsSparse(*t)) {
    req.keys = kKeys.data();
    req.num_keys = kKeys.size();
  }
  ASSERT_TRUE(t->Push(req).ok());
  EXPECT_EQ(Pull(*t, 1), seed);
  EXPECT_EQ(t->Stats().clipped_pushes, 0u);
  MustPush(*t, 1, 1, seed, /*delta=*/true);  // an ordinary delta is clipped
  EXPECT_EQ(t->Stats().clipped_pushes, 1u);
}

TEST(TableSpecClipTest, NegativeClipNormIsRefusedAndZeroIsOff) {
  TableSpec s;
  s.name = "t";
  s.shape = {2};
  auto m = EncodeSpec(s);
  EXPECT_EQ(m.count("clip_norm"), 0u);
  m["clip_norm"] = "-1";
  auto bad = DecodeSpec(m);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("clip_norm"), std::string::npos) << bad.status().ToString();
  m["clip_norm"] = "2.5";
  auto good = DecodeSpec(m);
  ASSERT_TRUE(good.ok()) << good.status().ToString();
  EXPECT_EQ(good->clip_norm, 2.5);
  EXPECT_EQ(DecodeSpec(EncodeSpec(*good))->clip_norm, 2.5);
}

TEST_P(TableKindTest, PushWithStaleBaseReportsTau) {
  auto t = NewTable(Spec());
  ASSERT_NE(t, nullptr);
  uint64_t base_a = 99, base_b = 99;
  Pull(*t, /*A*/ 1, &base_a);
  EXPECT_EQ(base_a, 0u);
  for (int i = 0; i < 2; ++i) {
    Pull(*t, /*B*/ 2, &base_b);
    PushResult r = MustPush(*t, 2, base_b, kG2);
    EXPECT_EQ(r.tau, 0u) << "B push " << i;
    EXPECT_EQ(r.version, static_cast<uint64_t>(i + 1));
  }
  PushResult r = MustPush(*t, 1, base_a, kG1);
  EXPECT_EQ(r.tau, 2u);
  EXPECT_EQ(r.version, 3u);
  // B's base is now 1 behind (A pushed once since B's last pull).
  r = MustPush(*t, 2, base_b, kG3);
  EXPECT_EQ(r.tau, 2u);  // version 3 at apply, B's base 1
  // A base from the future (a replica ahead) is not negative staleness.
  r = MustPush(*t, 1, 1000, kG3);
  EXPECT_EQ(r.tau, 0u);
}

TEST_P(TableKindTest, LrOverTauScalesStepByInverseTau) {
  TableSpec spec = Spec();
  spec.staleness = "lr_over_tau";
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  uint64_t base_a = 0, base_b = 0;
  Pull(*t, 1, &base_a);
  // tau 0: full step (1 / max(0, 1)).
  Pull(*t, 2, &base_b);
  EXPECT_EQ(MustPush(*t, 2, base_b, kG2).tau, 0u);
  std::vector<double> w = SgdStep(std::vector<double>(kFloats, kW0), kG2);
  ExpectNear(Pull(*t, 2, &base_b), w, 1e-6);
  EXPECT_EQ(MustPush(*t, 2, base_b, kG3).tau, 0u);
  w = SgdStep(w, kG3);
  // tau 2: half step.
  PushResult r = MustPush(*t, 1, base_a, kG1);
  EXPECT_EQ(r.tau, 2u);
  w = SgdStep(w, kG1, kLr / 2);
  ExpectNear(Pull(*t, 1), w, 1e-6);
  // tau 3 (base 0, version 3): a third of the step.
  EXPECT_EQ(MustPush(*t, 1, 0, kG4).tau, 3u);
  ExpectNear(Pull(*t, 1), SgdStep(w, kG4, kLr / 3), 1e-6);
}

TEST_P(TableKindTest, DcConstantWithZeroLambdaIsBitIdenticalToNone) {
  for (const char* optimizer : {"sgd", "adam"}) {
    SCOPED_TRACE(optimizer);
    TableSpec plain = Spec();
    plain.optimizer = optimizer;
    TableSpec dc = plain;
    dc.staleness = "dc_constant";
    dc.staleness_params = {{"lambda", 0.0}};
    auto a = NewTable(plain), b = NewTable(dc);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    // Interleaved pulls and pushes of three senders; every push is stale for someone.
    struct Step {
      uint64_t sender;
      bool push;
      const std::vector<float>* g;
    };
    const std::vector<Step> steps = {{1, false, nullptr}, {2, false, nullptr}, {3, false, nullptr},
                                     {2, true, &kG2},     {1, true, &kG1},     {2, false, nullptr},
                                     {3, true, &kG3},     {1, false, nullptr}, {2, true, &kG4},
                                     {3, false, nullptr}, {1, true, &kG2},     {3, true, &kG1},
                                     {2, true, &kG3},     {1, true, &kG4}};
    uint64_t base_a[4] = {}, base_b[4] = {};
    for (size_t i = 0; i < steps.size(); ++i) {
      const Step& s = steps[i];
      SCOPED_TRACE("step " + std::to_string(i));
      if (s.push) {
        PushResult ra = MustPush(*a, s.sender, base_a[s.sender], *s.g);
        PushResult rb = MustPush(*b, s.sender, base_b[s.sender], *s.g);
        EXPECT_EQ(ra.tau, rb.tau);
        EXPECT_EQ(ra.version, rb.version);
      } else {
        ExpectBitEqual(Pull(*a, s.sender, &base_a[s.sender]),
                       Pull(*b, s.sender, &base_b[s.sender]));
      }
      ExpectBitEqual(Pull(*a, 9, nullptr, false, 0, false), Pull(*b, 9, nullptr, false, 0, false));
    }
    EXPECT_EQ(b->Stats().backup_misses, 0u);
  }
}

TEST_P(TableKindTest, DcConstantCompensatesWithWhatThatSenderLastPulled) {
  TableSpec spec = Spec();
  spec.staleness = "dc_constant";
  spec.staleness_params = {{"lambda", 0.5}};
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  const double lambda = 0.5;
  const std::vector<double> w0(kFloats, kW0);
  Pull(*t, /*A*/ 1);  // A's backup: w0
  Pull(*t, /*B*/ 2);  // B's backup: w0
  MustPush(*t, 2, 0, kG2);
  const std::vector<double> w1 = SgdStep(w0, DcGradient(kG2, w0, w0, lambda));  // = plain step
  ExpectNear(Pull(*t, 9, nullptr, false, 0, /*record_backup=*/false), w1);
  MustPush(*t, 1, 0, kG1);
  const std::vector<double> w2 = SgdStep(w1, DcGradient(kG1, w1, w0, lambda));
  ExpectNear(Pull(*t, 9, nullptr, false, 0, false), w2);
  Pull(*t, 2);  // B's backup: w2
  // A has not pulled again: its backup is still w0.
  MustPush(*t, 1, 1, kG3);
  const std::vector<double> w3 = SgdStep(w2, DcGradient(kG3, w2, w0, lambda));
  ExpectNear(Pull(*t, 9, nullptr, false, 0, false), w3);
  // B compensates against w2, what it last pulled, not w0.
  MustPush(*t, 2, 2, kG4);
  const std::vector<double> w4 = SgdStep(w3, DcGradient(kG4, w3, w2, lambda));
  ExpectNear(Pull(*t, 9, nullptr, false, 0, false), w4);
  // A pull with record_backup=false must not replace A's backup (still w0).
  Pull(*t, 1, nullptr, false, 0, /*record_backup=*/false);
  MustPush(*t, 1, 4, kG2);
  ExpectNear(Pull(*t, 9, nullptr, false, 0, false), SgdStep(w4, DcGradient(kG2, w4, w0, lambda)));
  EXPECT_EQ(t->Stats().backup_misses, 0u);
}

TEST_P(TableKindTest, AccumulateKEqualsOnePushOfSumOrMean) {
  for (bool mean : {false, true}) {
    SCOPED_TRACE(mean ? "accumulate_mean=true" : "accumulate_mean=false");
    TableSpec spec = Spec();
    spec.accumulate = 3;
    spec.accumulate_mean = mean;
    auto acc = NewTable(spec), ref = NewTable(Spec());
    ASSERT_NE(acc, nullptr);
    ASSERT_NE(ref, nullptr);
    const std::vector<float>* gs[] = {&kG1, &kG2, &kG3};
    for (int i = 0; i < 2; ++i) {
      PushResult r = MustPush(*acc, 1 + i, 0, *gs[i]);
      EXPECT_TRUE(r.queued) << "push " << i;
      EXPECT_EQ(r.version, 0u);
      uint64_t v = 99;
      EXPECT_EQ(Pull(*acc, 5, &v), std::vector<float>(kFloats, 1.0f)) << "push " << i;
      EXPECT_EQ(v, 0u);
    }
    PushResult r = MustPush(*acc, 3, 0, kG3);
    EXPECT_FALSE(r.queued);
    EXPECT_EQ(r.version, 1u);
    std::vector<float> combined(kFloats);
    for (size_t i = 0; i < kFloats; ++i) {
      const double sum = double{kG1[i]} + kG2[i] + kG3[i];
      combined[i] = static_cast<float>(mean ? sum / 3 : sum);
    }
    MustPush(*ref, 1, 0, combined);
    const std::vector<float> got = Pull(*acc, 5), want = Pull(*ref, 5);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << i;
    // The next window starts empty.
    EXPECT_TRUE(MustPush(*acc, 1, 1, kG4).queued);
    EXPECT_EQ(acc->version(), 1u);
  }
}

TEST_P(TableKindTest, DcCompensatesEachAccumulatedPushAgainstItsSendersBackup) {
  TableSpec spec = Spec();
  spec.staleness = "dc_constant";
  spec.staleness_params = {{"lambda", 0.5}};
  spec.accumulate = 2;
  spec.accumulate_mean = false;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  const double lambda = 0.5;
  const std::vector<double> w0(kFloats, kW0);
  Pull(*t, 1);  // A's backup: w0
  Pull(*t, 2);  // B's backup: w0
  EXPECT_TRUE(MustPush(*t, 1, 0, kG1).queued);
  EXPECT_FALSE(MustPush(*t, 2, 0, kG2).queued);
  std::vector<float> sum(kFloats);
  for (size_t i = 0; i < kFloats; ++i) sum[i] = kG1[i] + kG2[i];  // w == w0: no correction
  const std::vector<double> w1 = SgdStep(w0, sum);
  ExpectNear(Pull(*t, 9, nullptr, false, 0, false), w1);
  // Second window: each push is compensated against its sender's backup (w0) at the
  // weights it meets (w1), then the corrected gradients are summed.
  EXPECT_TRUE(MustPush(*t, 1, 1, kG3).queued);
  EXPECT_FALSE(MustPush(*t, 2, 1, kG4).queued);
  const std::vector<float> c3 = DcGradient(kG3, w1, w0, lambda);
  const std::vector<float> c4 = DcGradient(kG4, w1, w0, lambda);
  for (size_t i = 0; i < kFloats; ++i) sum[i] = c3[i] + c4[i];
  ExpectNear(Pull(*t, 9, nullptr, false, 0, false), SgdStep(w1, sum));
  EXPECT_EQ(t->Stats().backup_misses, 0u);
}

TEST_P(TableKindTest, RejectModeRefusesPushBeyondBoundAndAppliesNothing) {
  TableSpec spec = Spec();
  spec.max_staleness = 1;
  spec.bound_mode = BoundMode::kReject;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  uint64_t base_a = 0, base_b = 0;
  Pull(*t, 1, &base_a);
  for (int i = 0; i < 2; ++i) {
    Pull(*t, 2, &base_b);
    MustPush(*t, 2, base_b, kG2);
  }
  const std::vector<float> before = Pull(*t, 9);
  auto r = Push(*t, 1, base_a, kG1);  // tau 2 > s 1
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kStale);
  EXPECT_THAT(r.status().message(), ContainsRegex("tau[^0-9]*2([^0-9]|$)"));
  EXPECT_THAT(r.status().message(), ContainsRegex("s[^0-9a-z]*1([^0-9]|$)"));
  EXPECT_EQ(t->version(), 2u);
  ExpectBitEqual(Pull(*t, 9), before);
  // tau 1 <= s: applied.
  PushResult ok = MustPush(*t, 1, 1, kG1);
  EXPECT_EQ(ok.tau, 1u);
  EXPECT_EQ(ok.version, 3u);
  ExpectNear(Pull(*t, 9), SgdStep(ToDouble(before), kG1), 1e-6);
  // tau 0 is within any bound.
  EXPECT_EQ(MustPush(*t, 1, 3, kG1).tau, 0u);
}

TEST_P(TableKindTest, BlockModeHoldsFastSenderUntilSlowSenderPushes) {
  TableSpec spec = Spec();
  spec.max_staleness = 0;
  spec.bound_mode = BoundMode::kBlock;
  spec.block_timeout_ms = 10000;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  constexpr uint64_t kNow = 5000;
  std::vector<double> w(kFloats, kW0);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    // Both senders pull; in round 1 the other sender goes first.
    const uint64_t first = round == 0 ? 1 : 2, second = round == 0 ? 2 : 1;
    uint64_t base = 0;
    Pull(*t, first, &base, false, kNow);
    Pull(*t, second, nullptr, false, kNow);
    PushResult r1 = MustPush(*t, first, base, kG1, false, kNow);
    EXPECT_TRUE(r1.hold);
    EXPECT_FALSE(t->Releasable(first, kNow));
    EXPECT_TRUE(t->Releasable(second, kNow));
    PushResult r2 = MustPush(*t, second, base, kG2, false, kNow);
    EXPECT_FALSE(r2.hold);
    EXPECT_EQ(r2.tau, 1u);  // block mode applies stale pushes instead of refusing them
    EXPECT_TRUE(t->Releasable(first, kNow));
    EXPECT_TRUE(t->Releasable(second, kNow));
    // Synchronous SGD with the summed gradient.
    std::vector<float> sum(kFloats);
    for (size_t i = 0; i < kFloats; ++i) sum[i] = kG1[i] + kG2[i];
    w = SgdStep(w, sum);
    // Read as a participant: any puller joins the SSP clocks and would be waited for.
    ExpectNear(Pull(*t, first, nullptr, false, kNow), w, 1e-6);
  }
}

TEST_P(TableKindTest, BlockModeStopsWaitingForSenderSilentPastTimeout) {
  TableSpec spec = Spec();
  spec.max_staleness = 0;
  spec.bound_mode = BoundMode::kBlock;
  spec.block_timeout_ms = 100;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  Pull(*t, 1, nullptr, false, 1000);
  Pull(*t, 2, nullptr, false, 1000);
  EXPECT_TRUE(MustPush(*t, 1, 0, kG1, false, 1000).hold);
  EXPECT_FALSE(t->Releasable(1, 1100));  // sender 2 last seen 100 ms ago: still live
  EXPECT_TRUE(t->Releasable(1, 1101));   // silent for longer than the lease
}

TEST_P(TableKindTest, BlockModeSenderBackAfterItsLeaseRejoinsAtTheSlowestLiveClock) {
  TableSpec spec = Spec();
  spec.max_staleness = 0;
  spec.bound_mode = BoundMode::kBlock;
  spec.block_timeout_ms = 100;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  Pull(*t, 1, nullptr, false, 1000);
  Pull(*t, 2, nullptr, false, 1000);
  // Sender 2 goes silent; once its lease ends sender 1 goes on alone.
  for (uint64_t i = 0; i < 50; ++i) EXPECT_FALSE(MustPush(*t, 1, i, kG1, false, 2000 + i).hold);
  // Sender 2 comes back: like a newcomer it starts at the slowest live clock, instead of
  // holding sender 1 until it has made up the 50 pushes it missed.
  Pull(*t, 2, nullptr, false, 2050);
  EXPECT_TRUE(t->Releasable(1, 2050));
  EXPECT_TRUE(MustPush(*t, 1, 50, kG1, false, 2050).hold);  // one ahead of sender 2: held
  EXPECT_FALSE(MustPush(*t, 2, 50, kG2, false, 2050).hold);
  EXPECT_TRUE(t->Releasable(1, 2050));
}

TEST_P(TableKindTest, BlockModeSenderIsReleasableOnceNoSenderIsLive) {
  TableSpec spec = Spec();
  spec.max_staleness = 1;
  spec.bound_mode = BoundMode::kBlock;
  spec.block_timeout_ms = 100;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  EXPECT_FALSE(MustPush(*t, 1, 0, kG1, false, 1000).hold);
  EXPECT_FALSE(MustPush(*t, 1, 1, kG1, false, 1000).hold);
  // Every lease ended (a resend of the last push comes after its attempt timeout, which
  // exceeds block_timeout_ms): nobody is waited for, so its reply is not held again.
  EXPECT_TRUE(t->Releasable(1, 2000));
}

// Regression: a client that only pulls (a reader: an inference client, a dashboard)
// joined the clocks at its first pull and, pulling on, stayed live at that clock for
// good: every pusher was held after s pushes, each reply until block_timeout_ms. A
// sender that has only pulled is now waited for during one lease from its first pull.
TEST_P(TableKindTest, BlockModeDoesNotWaitForAReaderThatNeverPushes) {
  TableSpec spec = Spec();
  spec.max_staleness = 0;
  spec.bound_mode = BoundMode::kBlock;
  spec.block_timeout_ms = 100;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  Pull(*t, 9, nullptr, false, 1000);  // the reader, from now on every 50 ms
  Pull(*t, 1, nullptr, false, 1000);
  // Within the reader's first lease it may be a worker about to push: waited for.
  EXPECT_TRUE(MustPush(*t, 1, 0, kG1, false, 1050).hold);
  for (uint64_t now = 1050; now <= 1400; now += 50) {
    Pull(*t, 9, nullptr, false, now);
    if (now < 1150) continue;
    // Past its first lease, still pulling, never pushed: not waited for.
    EXPECT_TRUE(t->Releasable(1, now)) << "at " << now;
    EXPECT_FALSE(MustPush(*t, 1, t->version(), kG1, false, now).hold)
        << "a push at " << now << " was held for a sender that only pulls";
  }
  // Its first push: it joins at the pusher's clock (not its own, 0), so it is one ahead;
  // from then on it is waited for like every pusher.
  EXPECT_TRUE(MustPush(*t, 9, t->version(), kG2, false, 1450).hold);
  EXPECT_TRUE(t->Releasable(1, 1450));
  EXPECT_FALSE(t->Releasable(9, 1450));
  EXPECT_FALSE(MustPush(*t, 1, t->version(), kG1, false, 1450).hold);
  EXPECT_TRUE(t->Releasable(9, 1450));
  EXPECT_TRUE(MustPush(*t, 1, t->version(), kG1, false, 1460).hold) << "9 is waited for";
}

TEST_P(TableKindTest, BlockModeCountsSenderSeenAMillisecondLaterAsLive) {
  TableSpec spec = Spec();
  spec.max_staleness = 0;
  spec.bound_mode = BoundMode::kBlock;
  spec.block_timeout_ms = 10000;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  Pull(*t, 1, nullptr, false, 1000);
  Pull(*t, 2, nullptr, false, 1001);  // handled on another thread, which read its clock later
  // Sender 1's push read the clock at 1000, before sender 2's pull: 2 is 0 s old, not dead.
  EXPECT_TRUE(MustPush(*t, 1, 0, kG1, false, 1000).hold);
  EXPECT_FALSE(t->Releasable(1, 1000));
}

TEST_P(TableKindTest, PolyakAveragedPullReturnsRunningMeanOfIterates) {
  for (uint64_t start : {0, 2}) {
    SCOPED_TRACE("polyak_start=" + std::to_string(start));
    TableSpec spec = Spec();
    spec.polyak = true;
    spec.polyak_start = start;
    auto t = NewTable(spec);
    ASSERT_NE(t, nullptr);
    ExpectNear(Pull(*t, 1, nullptr, /*averaged=*/true), std::vector<double>(kFloats, kW0));
    std::vector<std::vector<double>> iterates = {std::vector<double>(kFloats, kW0)};
    const std::vector<float>* gs[] = {&kG1, &kG2, &kG3, &kG4};
    for (uint64_t k = 0; k < 4; ++k) {
      MustPush(*t, 1, k, *gs[k]);
      iterates.push_back(SgdStep(iterates.back(), *gs[k]));
      // Mean of the iterates w_t for t in (start, k + 1]; before that, the weights.
      std::vector<double> avg(kFloats, 0.0);
      const uint64_t t_now = k + 1;
      if (t_now <= start) {
        avg = iterates.back();
      } else {
        for (uint64_t s = start + 1; s <= t_now; ++s) {
          for (size_t i = 0; i < kFloats; ++i) avg[i] += iterates[s][i] / (t_now - start);
        }
      }
      ExpectNear(Pull(*t, 1, nullptr, true), avg);
      ExpectNear(Pull(*t, 1, nullptr, false), iterates.back());
    }
  }
}

// Finite pushes past what float arithmetic holds (|g| > 1.8e19 squares to Inf; deltas
// that sum past 3.4e38): every rule keeps the table finite, saturating at the float
// range, and the weights still move on later pushes. Before, FTRL's weight became NaN
// for good, Adagrad's and Adam's froze (an Inf accumulator), a delta left Inf, and DC
// compensation of a huge gradient at w == w_bak gave Inf * 0.
TEST_P(TableKindTest, FinitePushesBeyondFloatArithmeticKeepTheTableFinite) {
  struct Case {
    std::string optimizer, staleness;
    float g;
  };
  for (const Case& c : std::vector<Case>{{"sgd", "none", 3e38f},
                                         {"adagrad", "none", 2e19f},
                                         {"ftrl", "none", 2e19f},
                                         {"adam", "none", 1e21f},
                                         {"sgd", "dc_constant", 1e30f},
                                         {"adagrad", "dc_adaptive", 1e30f}}) {
    SCOPED_TRACE(c.optimizer + " " + c.staleness + " g=" + std::to_string(c.g));
    TableSpec spec = Spec();
    spec.optimizer = c.optimizer;
    spec.optimizer_params = c.optimizer == "ftrl" ? std::map<std::string, double>{{"alpha", 0.1}}
                                                  : std::map<std::string, double>{{"lr", 0.01}};
    spec.staleness = c.staleness;
    spec.polyak = true;
    auto t = NewTable(spec);
    ASSERT_NE(t, nullptr);
    Pull(*t, 1);  // the DC backup: w == w_bak
    MustPush(*t, 1, 0, std::vector<float>(kFloats, c.g));
    const std::vector<float> after = Pull(*t, 1);
    ASSERT_EQ(after.size(), kFloats);
    for (float x : after) EXPECT_TRUE(std::isfinite(x)) << x;
    for (float x : Pull(*t, 1, nullptr, /*averaged=*/true)) EXPECT_TRUE(std::isfinite(x)) << x;
    EXPECT_NE(after[0], static_cast<float>(kW0)) << "the push moved nothing";
    // A later push as large, the other way, moves the weights back (a saturated state is
    // not a frozen one: an Inf accumulator made every later step 0).
    MustPush(*t, 1, 1, std::vector<float>(kFloats, -c.g));
    const std::vector<float> later = Pull(*t, 1);
    ASSERT_EQ(later.size(), kFloats);
    for (float x : later) EXPECT_TRUE(std::isfinite(x)) << x;
    EXPECT_GT(later[0], after[0]);
  }
  // Deltas that sum past the range saturate at it.
  auto t = NewTable(Spec());
  ASSERT_NE(t, nullptr);
  for (int i = 0; i < 2; ++i) MustPush(*t, 1, i, std::vector<float>(kFloats, 3e38f), true);
  for (float x : Pull(*t, 1)) EXPECT_EQ(x, std::numeric_limits<float>::max());
}

TEST(TableSpecRangeTest, DeltaScaleAndInitValuePastTheFloatRangeAreRefused) {
  for (const char* field : {"delta_scale", "init_value"}) {
    TableSpec s;
    s.name = "t";
    s.shape = {4};
    auto m = EncodeSpec(s);
    m[field] = "1e300";
    auto bad = DecodeSpec(m);
    ASSERT_FALSE(bad.ok()) << field;
    EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
    EXPECT_THAT(bad.status().message(), HasSubstr(field));
    EXPECT_THAT(bad.status().message(), HasSubstr("float range"));
    m[field] = "-3e38";
    EXPECT_TRUE(DecodeSpec(m).ok()) << field;
  }
}

TEST_P(TableKindTest, AveragedPullWithoutPolyakIsInvalidArgument) {
  auto t = NewTable(Spec());
  ASSERT_NE(t, nullptr);
  auto r = TryPull(*t, 1, /*averaged=*/true);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("'t'"));
  EXPECT_THAT(r.status().message(), HasSubstr("polyak"));
}

TEST_P(TableKindTest, DeltaPushAddsScaledDeltaWithoutOptimizer) {
  TableSpec spec = Spec();
  spec.optimizer = "adam";  // a gradient step would look nothing like w + s * delta
  spec.optimizer_params = {{"lr", 0.1}};
  spec.delta_scale = 0.5;
  spec.accumulate = 3;  // deltas are not accumulated
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  const std::vector<float> delta = {1.0f, -2.0f, 0.25f, 4.0f};
  PushResult r = MustPush(*t, 1, 0, delta, /*delta=*/true);
  EXPECT_FALSE(r.queued);
  EXPECT_EQ(r.version, 1u);
  EXPECT_EQ(Pull(*t, 1), (std::vector<float>{1.5f, 0.0f, 1.125f, 3.0f}));
  MustPush(*t, 1, 1, delta, true);
  EXPECT_EQ(Pull(*t, 1), (std::vector<float>{2.0f, -1.0f, 1.25f, 5.0f}));
}

TEST_P(TableKindTest, NonFinitePushIsRefusedAndAppliesNothing) {
  auto t = NewTable(Spec());
  ASSERT_NE(t, nullptr);
  MustPush(*t, 1, 0, kG1);
  const std::vector<float> before = Pull(*t, 1);
  const uint64_t rows = t->Stats().rows;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::vector<float>& bad :
       {std::vector<float>{0.5f, nan, 1.0f, 1.0f}, std::vector<float>{1.0f, 1.0f, 1.0f, -inf},
        std::vector<float>{inf, 0.0f, 0.0f, 0.0f}}) {
    for (bool delta : {false, true}) {
      auto r = Push(*t, 1, 1, bad, delta);
      ASSERT_FALSE(r.ok());
      EXPECT_EQ(r.status().code(), StatusCode::kNonFinite);
      EXPECT_THAT(r.status().message(), HasSubstr("'t'"));
    }
  }
  EXPECT_EQ(t->version(), 1u);
  EXPECT_EQ(t->Stats().rows, rows);
  ExpectBitEqual(Pull(*t, 1), before);
}

TEST_P(TableKindTest, WrongValueCountIsShapeMismatchNamingBothCounts) {
  auto t = NewTable(Spec());
  ASSERT_NE(t, nullptr);
  const std::vector<float> seven(7, 1.0f);
  auto r = Push(*t, 1, 0, seven);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kShapeMismatch);
  EXPECT_THAT(r.status().message(), HasSubstr("4"));  // expected: 4 values
  EXPECT_THAT(r.status().message(), HasSubstr("7"));  // carried: 7 values
  EXPECT_EQ(t->version(), 0u);
  EXPECT_EQ(Pull(*t, 1), std::vector<float>(kFloats, 1.0f));
}

INSTANTIATE_TEST_SUITE_P(Kinds, TableKindTest,
                         ::testing::Values(TableKind::kDense, TableKind::kSparse),
                         [](const auto& info) {
                           return info.param == TableKind::kDense ? "Dense" : "Sparse";
                         });

// --------------------------------------------------------------- dense only

TEST(DenseTableTest, DcBackupLruEvictsOldestSenderAndCountsMiss) {
  TableSpec spec;
  spec.name = "d";
  spec.shape = {kFloats};
  spec.optimizer_params = {{"lr", kLr}};
  spec.staleness = "dc_constant";
  spec.staleness_params = {{"lambda", 0.5}};
  spec.dc_max_backups = 2;
  spec.init = "constant";
  spec.init_value = kW0;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  const std::vector<double> w0(kFloats, kW0);
  for (uint64_t s : {1, 2, 3}) Pull(*t, s);  // sender 1's backup is evicted by 3's
  EXPECT_EQ(t->Stats().backups, 2u);
  MustPush(*t, 2, 0, kG2);
  const std::vector<double> w1 = SgdStep(w0, kG2);
  EXPECT_EQ(t->Stats().backup_misses, 0u);
  MustPush(*t, 1, 0, kG1);  // no backup: a plain async step
  const std::vector<double> w2 = SgdStep(w1, kG1);
  EXPECT_EQ(t->Stats().backup_misses, 1u);
  ExpectNear(Pull(*t, 9, nullptr, false, 0, false), w2);
  MustPush(*t, 3, 0, kG3);  // still has its backup w0
  ExpectNear(Pull(*t, 9, nullptr, false, 0, false), SgdStep(w2, DcGradient(kG3, w2, w0, 0.5)));
  EXPECT_EQ(t->Stats().backup_misses, 1u);
}

TEST(DenseTableTest, ShardsHoldDisjointPartsOfTheTensor) {
  TableSpec spec;
  spec.name = "big";
  spec.shape = {10, 7};
  spec.init = "uniform";
  spec.init_value = 1.0;
  auto s0 = NewTable(spec, 0, 2), s1 = NewTable(spec, 1, 2), whole = NewTable(spec, 0, 1);
  ASSERT_NE(s0, nullptr);
  ASSERT_NE(s1, nullptr);
  ASSERT_NE(whole, nullptr);
  EXPECT_EQ(s0->local_elements() + s1->local_elements(), 70u);
  EXPECT_GT(s0->local_elements(), 0u);
  EXPECT_GT(s1->local_elements(), 0u);
  // The dense initializer depends on the element index only: together the two shards
  // hold exactly the values of the single-shard tensor.
  std::vector<float> all = Pull(*whole, 1), parts = Pull(*s0, 1), p1 = Pull(*s1, 1);
  parts.insert(parts.end(), p1.begin(), p1.end());
  std::sort(all.begin(), all.end());
  std::sort(parts.begin(), parts.end());
  EXPECT_EQ(all, parts);
  auto wrong = Push(*s0, 1, 0, std::vector<float>(70, 0.0f));
  EXPECT_EQ(wrong.status().code(), StatusCode::kShapeMismatch);
}

// --------------------------------------------------------------- sparse only

TableSpec SparseSpec(uint32_t dim = 2) {
  TableSpec s;
  s.name = "emb";
  s.kind = TableKind::kSparse;
  s.dim = dim;
  s.optimizer_params = {{"lr", 1.0}};
  s.init = "constant";
  s.init_value = 0.5;
  return s;
}

TEST(SparseTableTest, InitIsIdenticalAcrossShardsForSameId) {
  TableSpec spec = SparseSpec(4);
  spec.init = "uniform";
  spec.init_value = 0.5;
  spec.seed = 7;
  auto a = NewTable(spec, 0, 2), b = NewTable(spec, 1, 2);
  TableSpec other_seed = spec;
  other_seed.seed = 8;
  auto c = NewTable(other_seed, 0, 2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_NE(c, nullptr);
  const std::vector<uint64_t> key = {12345}, next = {12346};
  const std::vector<float> ra = Pull(*a, 1, nullptr, false, 0, true, key);
  ASSERT_EQ(ra.size(), 4u);
  ExpectBitEqual(Pull(*b, 1, nullptr, false, 0, true, key), ra);
  EXPECT_NE(Pull(*a, 1, nullptr, false, 0, true, next), ra);
  EXPECT_NE(Pull(*c, 1, nullptr, false, 0, true, key), ra);
  EXPECT_NE(ra, std::vector<float>(4, ra[0]));  // not one value repeated
  // A row created by a push starts from the same values: a zero gradient leaves them.
  MustPush(*b, 1, 0, std::vector<float>(4, 0.0f), false, 0, key);
  EXPECT_EQ(b->Stats().rows, 1u);
  ExpectBitEqual(Pull(*b, 1, nullptr, false, 0, true, key), ra);
}

TEST(SparseTableTest, UniformInitStaysWithinHalfWidth) {
  TableSpec spec = SparseSpec(4);
  spec.init = "uniform";
  spec.init_value = 0.5;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  std::vector<uint64_t> keys(200);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = i * 1000003;
  const std::vector<float> v = Pull(*t, 1, nullptr, false, 0, true, keys);
  ASSERT_EQ(v.size(), 800u);
  double sum = 0;
  for (float x : v) {
    EXPECT_GE(x, -0.5f);
    EXPECT_LE(x, 0.5f);
    sum += x;
  }
  EXPECT_LT(*std::min_element(v.begin(), v.end()), -0.4f);
  EXPECT_GT(*std::max_element(v.begin(), v.end()), 0.4f);
  EXPECT_NEAR(sum / v.size(), 0.0, 0.05);
}

// A push or pull of thousands of keys applies half of its stripes on a second thread
// (ps/apply_helper.h); it must give exactly what the same keys give in small calls,
// applied on one: Adagrad (per-row state, so a key pushed twice in one call must be
// applied in order), a Polyak average, RETURN_VALUES, and pulls.
TEST(SparseTableTest, LargeCallsApplyAsSmallOnesDo) {
  TableSpec spec = SparseSpec(8);
  spec.optimizer = "adagrad";
  spec.optimizer_params = {{"lr", 0.1}};
  spec.init = "uniform";
  spec.polyak = true;
  auto big = NewTable(spec), small = NewTable(spec);
  ASSERT_NE(big, nullptr);
  ASSERT_NE(small, nullptr);
  // The same calls as `big` on one thread (a row cap turns the two-thread apply off): the
  // reference for the averages, which step once per call for a key the call repeats.
  TableSpec capped = spec;
  capped.max_rows = 1u << 30;
  auto serial = NewTable(capped);
  ASSERT_NE(serial, nullptr);
  std::vector<uint64_t> keys(12000);
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = (i % 9000) * 2654435761u + 1;  // repeats
  std::vector<float> g(keys.size() * 8);
  for (size_t i = 0; i < g.size(); ++i) g[i] = static_cast<float>((i * 37) % 11) * 0.1f - 0.5f;
  for (int round = 0; round < 3; ++round) {
    std::vector<float> after(g.size());
    PushRequest req;
    req.sender = 1;
    req.keys = keys.data();
    req.num_keys = keys.size();
    req.values = g.data();
    req.num_values = g.size();
    req.values_after = after.data();
    auto r = big->Push(req);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_TRUE(r->values_read);
    req.values_after = nullptr;
    ASSERT_TRUE(serial->Push(req).ok());
    // The same keys in calls of 1,000 (one thread each), then the values read back.
    for (size_t from = 0; from < keys.size(); from += 1000) {
      const std::vector<uint64_t> k(keys.begin() + from, keys.begin() + from + 1000);
      const std::vector<float> part(g.begin() + from * 8, g.begin() + (from + 1000) * 8);
      MustPush(*small, 1, 0, part, false, 0, k);
    }
    // A key pushed twice reads, at both places, as both pushes left it.
    ExpectBitEqual(after, Pull(*small, 1, nullptr, false, 0, true, keys));
  }
  ExpectBitEqual(Pull(*big, 1, nullptr, false, 0, true, keys),
                 Pull(*small, 1, nullptr, false, 0, true, keys));
  ExpectBitEqual(Pull(*big, 1, nullptr, true, 0, true, keys),
                 Pull(*serial, 1, nullptr, true, 0, true, keys));
  EXPECT_EQ(big->Stats().rows, 9000u);
}

// A key a push repeats is one update of its row: the Polyak average takes one step, with
// the weights after the push's last occurrence (the weights in between are never pulled).
TEST(SparseTableTest, PolyakAverageStepsOncePerPushForARepeatedKey) {
  TableSpec spec = SparseSpec(1);
  spec.optimizer_params = {{"lr", 0.5}};
  spec.init = "zeros";
  spec.polyak = true;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  MustPush(*t, 1, 0, {1.0f}, false, 0, {1});                    // w = -0.5
  MustPush(*t, 1, 1, {1.0f, 3.0f, 2.0f}, false, 0, {1, 1, 7});  // w = -2.5; key 7: -1
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 0, true, {1, 7}), (std::vector<float>{-2.5f, -1.0f}));
  // Key 1: mean of -0.5 and -2.5 (not of -0.5, -1.0 and -2.5); key 7: its only iterate.
  ExpectNear(Pull(*t, 1, nullptr, /*averaged=*/true, 0, true, {1, 7}), {-1.5, -1.0});
  MustPush(*t, 1, 2, {-1.0f}, false, 0, {1});  // w = -2.0
  ExpectNear(Pull(*t, 1, nullptr, true, 0, true, {1}), {(-0.5 - 2.5 - 2.0) / 3});
}

TEST(SparseTableTest, PullOfUnknownRowDoesNotCreateItButPushDoes) {
  auto t = NewTable(SparseSpec());
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Pull(*t, 1), std::vector<float>(4, 0.5f));
  Pull(*t, 2);
  EXPECT_EQ(t->Stats().rows, 0u);
  EXPECT_EQ(t->version(), 0u);
  MustPush(*t, 1, 0, {1, 2, 3, 4});
  EXPECT_EQ(t->Stats().rows, 2u);
  EXPECT_EQ(t->Stats().elements, 4u);
  EXPECT_EQ(Pull(*t, 1), (std::vector<float>{-0.5f, -1.5f, -2.5f, -3.5f}));
}

TEST(SparseTableTest, AdmissionCreatesRowOnThirdPush) {
  TableSpec spec = SparseSpec(1);
  spec.admit_after = 3;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  const std::vector<uint64_t> key = {5};
  for (int i = 0; i < 2; ++i) {
    MustPush(*t, 1, 0, {1.0f}, false, 0, key);
    for (int p = 0; p < 3; ++p) {  // pulls are not touches for admission
      EXPECT_EQ(Pull(*t, 1, nullptr, false, 0, true, key), std::vector<float>{0.5f});
    }
    EXPECT_EQ(t->Stats().rows, 0u) << "after push " << i + 1;
  }
  MustPush(*t, 1, 0, {2.0f}, false, 0, key);  // admitted: only this gradient applies
  EXPECT_EQ(t->Stats().rows, 1u);
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 0, true, key), std::vector<float>{-1.5f});
  // Another key is counted separately.
  MustPush(*t, 1, 0, {1.0f}, false, 0, {6});
  EXPECT_EQ(t->Stats().rows, 1u);
}

TEST(SparseTableTest, MaxRowsEvictsLeastRecentlyUsedRow) {
  TableSpec spec = SparseSpec(1);
  spec.max_rows = 2;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  const std::vector<uint64_t> a = {100}, b = {200}, c = {300};
  MustPush(*t, 1, 0, {1.0f}, false, 1, a);
  MustPush(*t, 1, 0, {2.0f}, false, 2, b);
  EXPECT_EQ(t->Stats().rows, 2u);
  MustPush(*t, 1, 0, {3.0f}, false, 3, c);
  TableStats st = t->Stats();
  EXPECT_EQ(st.rows, 2u);
  EXPECT_EQ(st.evicted_rows, 1u);
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 4, true, a), std::vector<float>{0.5f});  // init again
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 4, true, b), std::vector<float>{-1.5f});
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 4, true, c), std::vector<float>{-2.5f});
  EXPECT_EQ(t->Stats().rows, 2u);
}

// A restored table goes on as the original would. A sum pending at the checkpoint was
// applied in the iteration order of the restored map, which differs from the
// original's: under a row cap the two evicted different rows (and a backup loaded from
// its primary's snapshot diverged from it the same way).
TEST(SparseTableTest, ARestoredPendingSumUnderARowCapEvictsWhatTheOriginalDoes) {
  TableSpec spec = SparseSpec(1);
  spec.accumulate = 2;
  spec.max_rows = 2;
  auto original = NewTable(spec);
  ASSERT_NE(original, nullptr);
  const std::vector<uint64_t> keys = {10, 20, 30, 40, 50}, all = {10, 20, 30, 40, 50, 60};
  EXPECT_TRUE(MustPush(*original, 1, 0, {1, 2, 3, 4, 5}, false, 0, keys).queued);
  ByteWriter saved;
  original->Save(&saved);
  auto restored = NewTable(spec);
  ASSERT_NE(restored, nullptr);
  ByteReader r(saved.buffer().data(), saved.buffer().size());
  ASSERT_TRUE(restored->Load(&r).ok());
  for (Table* t : {original.get(), restored.get()}) {
    EXPECT_FALSE(MustPush(*t, 1, 0, {6}, false, 0, {60}).queued);
  }
  // sum/2 applied in key order with lr 1: rows 50 and 60 are the last created and stay.
  EXPECT_EQ(Pull(*original, 2, nullptr, false, 0, false, all),
            (std::vector<float>{0.5f, 0.5f, 0.5f, 0.5f, -2.0f, -2.5f}));
  EXPECT_EQ(Pull(*restored, 2, nullptr, false, 0, false, all),
            Pull(*original, 2, nullptr, false, 0, false, all));
  ByteWriter a, b;
  original->Save(&a);
  restored->Save(&b);
  EXPECT_TRUE(a.buffer() == b.buffer());
}

// TTL expiry goes on for the life of a table, and its erase churn rebuilds the stripe's
// index now and then. A key expired while such a rebuild was under way used to be found
// again at its freed slot: a pull read the expired row instead of a new one, and a push
// would have written a row no longer in the table (and touched its freed LRU links).
TEST(SparseTableTest, KeysExpiredDuringIndexRebuildsReadAsNew) {
  TableSpec spec = SparseSpec(1);
  spec.ttl_ms = 100;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  constexpr uint64_t kBatch = 32;  // ~200 live rows a stripe: rebuilds move for a while
  auto batch = [](uint64_t ms) {
    std::vector<uint64_t> keys(kBatch);
    for (uint64_t j = 0; j < kBatch; ++j) keys[j] = ms * kBatch + j;
    return keys;
  };
  for (uint64_t ms = 1; ms <= 3000; ++ms) {
    // lr 1 from 0.5: each row holds 0.5 - ms, unlike the init.
    MustPush(*t, 1, 0, std::vector<float>(kBatch, static_cast<float>(ms)), false, ms, batch(ms));
    t->Maintain(ms);  // expires the batch pushed at ms - 101
    if (ms <= 101) continue;
    ASSERT_EQ(Pull(*t, 1, nullptr, false, ms, true, batch(ms - 101)),
              std::vector<float>(kBatch, 0.5f))
        << "expired batch read after " << ms;
  }
  EXPECT_EQ(t->Stats().rows, 101 * kBatch);
}

// ttl_ms takes any uint64, and 2^64-1 is the natural "never": last_ms + ttl_ms wrapped,
// and every row was expired at the next maintenance tick (about once a second).
TEST(SparseTableTest, AHugeTtlNeverExpiresARow) {
  TableSpec spec = SparseSpec(1);
  spec.ttl_ms = std::numeric_limits<uint64_t>::max();
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  MustPush(*t, 1, 0, {1.0f}, false, 1000, {42});
  t->Maintain(1001);
  t->Maintain(uint64_t{1} << 62);
  EXPECT_EQ(t->Stats().rows, 1u) << "a TTL of 2^64-1 ms expired the row";
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 1001, true, {42}), std::vector<float>{-0.5f});
  // A max_rows that large is no cap (its per-stripe share was computed with a wrap).
  TableSpec capped = SparseSpec(1);
  capped.max_rows = std::numeric_limits<uint64_t>::max() - 3;
  auto c = NewTable(capped);
  ASSERT_NE(c, nullptr);
  for (uint64_t k = 1; k <= 100; ++k) MustPush(*c, 1, 0, {1.0f}, false, k, {k});
  EXPECT_EQ(c->Stats().rows, 100u);
  EXPECT_EQ(c->Stats().evicted_rows, 0u);
}

// admit_after counts pushes, not occurrences: a push that repeats a missing key counts
// one touch, so a rare id seen several times in one minibatch is not admitted at once.
TEST(SparseTableTest, APushRepeatingAKeyCountsOneAdmissionTouch) {
  TableSpec spec = SparseSpec(1);
  spec.admit_after = 2;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  MustPush(*t, 1, 0, {1.0f, 1.0f, 1.0f}, false, 1000, {5, 5, 5});
  EXPECT_EQ(t->Stats().rows, 0u) << "key 5 admitted by its first push";
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 1000, true, {5}), std::vector<float>{0.5f});
  // The second push admits it, with every gradient the push carries for it.
  MustPush(*t, 1, 0, {1.0f, 2.0f}, false, 1001, {5, 5});
  EXPECT_EQ(t->Stats().rows, 1u);
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 1001, true, {5}), std::vector<float>{0.5f - 3.0f});
}

// With accumulate = K, admission counted one touch per applied sum, not per push: a row
// needed about admit_after x K pushes. Pushes count, as without accumulation; the sum
// that holds the admitting push is applied to the new row.
TEST(SparseTableTest, AdmissionCountsAccumulatedPushesNotAppliedSums) {
  TableSpec spec = SparseSpec(1);
  spec.admit_after = 3;
  spec.accumulate = 2;
  spec.accumulate_mean = false;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  const std::vector<uint64_t> key = {5};
  EXPECT_TRUE(MustPush(*t, 1, 0, {1.0f}, false, 0, key).queued);
  EXPECT_FALSE(MustPush(*t, 1, 0, {1.0f}, false, 0, key).queued);  // 2 touches: dropped
  EXPECT_EQ(t->Stats().rows, 0u);
  EXPECT_TRUE(MustPush(*t, 1, 0, {1.0f, 1.0f}, false, 0, {5, 5}).queued);  // the 3rd push
  EXPECT_FALSE(MustPush(*t, 1, 0, {4.0f}, false, 0, key).queued);
  EXPECT_EQ(t->Stats().rows, 1u) << "not admitted by its 4th push";
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 0, true, key), std::vector<float>{0.5f - 6.0f});
  // A key in one push only is still counted once, and another key separately.
  MustPush(*t, 1, 0, {1.0f}, false, 0, {6});
  MustPush(*t, 1, 0, {1.0f}, false, 0, {7});
  EXPECT_EQ(t->Stats().rows, 1u);
}

// A huge accumulate let a capped table's pending sum grow without bound (every key of
// K pushes, however many more than max_rows): it is applied early once it holds max_rows
// rows' worth of values (at least 16 MiB), and counted in the table's memory.
TEST(SparseTableTest, APendingSumIsAppliedEarlyAtItsBound) {
  TableSpec spec = SparseSpec(1024);  // 4 KiB a row: 16 MiB is 4096 keys
  spec.max_rows = 4;
  spec.accumulate = 1000000;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  const std::vector<float> g(1024 * 1024, 1.0f);
  uint64_t applied_at = 0;
  for (uint64_t p = 1; p <= 7; ++p) {
    std::vector<uint64_t> keys(1024);
    for (uint64_t j = 0; j < keys.size(); ++j) keys[j] = p * 1024 + j;
    if (!MustPush(*t, 1, 0, g, false, 0, keys).queued && applied_at == 0) applied_at = p;
    EXPECT_LE(t->Stats().memory_bytes, uint64_t{18} << 20) << "after push " << p;
  }
  EXPECT_EQ(applied_at, 4u) << "the sum of 4096 keys (16 MiB) was not applied";
  EXPECT_EQ(t->version(), 1u);
  EXPECT_EQ(t->Stats().rows, 4u);
  // Pushes 5 to 7 pending: 3072 keys.
  EXPECT_GE(t->Stats().memory_bytes, uint64_t{12} << 20) << "the pending sum is not counted";
}

TEST(SparseTableTest, PullTouchKeepsRowFromLruEviction) {
  TableSpec spec = SparseSpec(1);
  spec.max_rows = 2;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  const std::vector<uint64_t> a = {100}, b = {200}, c = {300};
  MustPush(*t, 1, 0, {1.0f}, false, 1, a);
  MustPush(*t, 1, 0, {2.0f}, false, 2, b);
  Pull(*t, 1, nullptr, false, 3, true, a);  // a is now the most recent
  MustPush(*t, 1, 0, {3.0f}, false, 4, c);
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 5, true, a), std::vector<float>{-0.5f});
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 5, true, b), std::vector<float>{0.5f});  // evicted
  EXPECT_EQ(t->Stats().evicted_rows, 1u);
}

TEST(SparseTableTest, TtlExpiresUntouchedRowsInMaintain) {
  TableSpec spec = SparseSpec(1);
  spec.ttl_ms = 100;
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  const std::vector<uint64_t> a = {1}, b = {2};
  MustPush(*t, 1, 0, {1.0f}, false, 1000, a);
  MustPush(*t, 1, 0, {1.0f}, false, 1050, b);
  t->Maintain(1100);  // a untouched for exactly ttl: kept
  EXPECT_EQ(t->Stats().rows, 2u);
  t->Maintain(1101);
  EXPECT_EQ(t->Stats().rows, 1u);
  EXPECT_EQ(t->Stats().evicted_rows, 1u);
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 1101, true, a), std::vector<float>{0.5f});
  EXPECT_EQ(t->Stats().rows, 1u);
  // A pull is a touch: it extends b's life.
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 1140, true, b), std::vector<float>{-0.5f});
  t->Maintain(1200);
  EXPECT_EQ(t->Stats().rows, 1u);
  t->Maintain(1241);
  EXPECT_EQ(t->Stats().rows, 0u);
  EXPECT_EQ(t->Stats().evicted_rows, 2u);
  EXPECT_EQ(Pull(*t, 1, nullptr, false, 1241, true, b), std::vector<float>{0.5f});
}

TEST(SparseTableTest, NoTtlMeansMaintainKeepsRows) {
  auto t = NewTable(SparseSpec());
  ASSERT_NE(t, nullptr);
  MustPush(*t, 1, 0, {1, 1, 1, 1}, false, 1);
  t->Maintain(std::numeric_limits<uint64_t>::max() / 2);
  EXPECT_EQ(t->Stats().rows, 2u);
}

// Scalar double-precision reference of one optimizer on one element.
struct ScalarOptimizer {
  std::string name;
  double w = 0.2, s0 = 0, s1 = 0;

  void Step(double g, uint64_t t) {
    if (name == "adagrad") {  // lr 0.1, eps 1e-10, initial_accumulator 0.1
      s0 += g * g;
      w -= 0.1 * g / (std::sqrt(s0) + 1e-10);
    } else if (name == "ftrl") {  // alpha 0.5, beta 1, l1 0.01, l2 0.1
      const double alpha = 0.5, beta = 1, l1 = 0.01, l2 = 0.1;
      const double n_new = s1 + g * g;
      const double sigma = (std::sqrt(n_new) - std::sqrt(s1)) / alpha;
      s0 += g - sigma * w;
      s1 = n_new;
      w = std::fabs(s0) <= l1
              ? 0.0
              : -(s0 - std::copysign(l1, s0)) / ((beta + std::sqrt(s1)) / alpha + l2);
    } else if (name == "sgd") {  // lr 0.05
      w -= 0.05 * g;
    } else {  // adam: lr 0.05, beta1 0.9, beta2 0.999, eps 1e-8
      s0 = 0.9 * s0 + 0.1 * g;
      s1 = 0.999 * s1 + 0.001 * g * g;
      const double m_hat = s0 / (1 - std::pow(0.9, t)), v_hat = s1 / (1 - std::pow(0.999, t));
      w -= 0.05 * m_hat / (std::sqrt(v_hat) + 1e-8);
    }
  }
};

// `spec` set to optimizer `name` with the parameters ScalarOptimizer assumes, and that
// reference at a row's or element's start (w 0.2).
void UseReferenceOptimizer(const std::string& name, TableSpec* spec) {
  spec->optimizer = name;
  spec->init_value = 0.2;
  if (name == "adagrad") {
    spec->optimizer_params = {{"lr", 0.1}, {"initial_accumulator", 0.1}};
  } else if (name == "ftrl") {
    spec->optimizer_params = {{"alpha", 0.5}, {"beta", 1}, {"l1", 0.01}, {"l2", 0.1}};
  } else {
    spec->optimizer_params = {{"lr", 0.05}};
  }
}
ScalarOptimizer ReferenceAtStart(const std::string& name) {
  ScalarOptimizer o{name};
  if (name == "adagrad") o.s0 = 0.1;  // initial_accumulator
  return o;
}

class SparseTableOptimizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SparseTableOptimizerTest, StatePersistsAcrossPushesPerRow) {
  TableSpec spec = SparseSpec(3);
  UseReferenceOptimizer(GetParam(), &spec);
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  // Two rows pushed alternately: each keeps its own state, while Adam's bias correction
  // uses the table's update count (1-based), which advances with every push.
  const std::vector<uint64_t> rows[2] = {{42}, {99}};
  std::vector<ScalarOptimizer> ref;
  for (int i = 0; i < 2 * 3; ++i) ref.push_back(ReferenceAtStart(GetParam()));
  for (uint64_t step = 1; step <= 10; ++step) {
    const int r = static_cast<int>(step % 2);
    std::vector<float> g(3);
    for (int j = 0; j < 3; ++j) {
      g[j] = static_cast<float>((static_cast<int>(step * 3 + j * 5 + r) % 7) - 3) * 0.5f;
      ref[r * 3 + j].Step(g[j], step);
    }
    MustPush(*t, 1, step - 1, g, false, 0, rows[r]);
    for (int rr = 0; rr < 2; ++rr) {
      std::vector<double> want(3);
      for (int j = 0; j < 3; ++j) want[j] = ref[rr * 3 + j].w;
      SCOPED_TRACE("step " + std::to_string(step) + " row " + std::to_string(rr));
      ExpectNear(Pull(*t, 1, nullptr, false, 0, true, rows[rr]), want, 2e-5);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, SparseTableOptimizerTest,
                         ::testing::Values("adagrad", "ftrl", "adam"),
                         [](const auto& info) { return info.param; });

// A dense gradient this large is applied in chunks on two threads (DenseTable::ApplyLocked):
// every element, the last partial chunk's too, steps with its own optimizer state.
class DenseTableLargeTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DenseTableLargeTest, ChunkedApplyStepsEveryElementWithItsOwnState) {
  constexpr size_t kN = 300'007;  // above the parallel threshold, not a chunk multiple
  TableSpec spec;
  spec.name = "large";
  spec.shape = {kN};
  spec.init = "constant";
  UseReferenceOptimizer(GetParam(), &spec);
  auto t = NewTable(spec);
  ASSERT_NE(t, nullptr);
  std::vector<ScalarOptimizer> ref(kN, ReferenceAtStart(GetParam()));
  for (uint64_t step = 1; step <= 3; ++step) {
    std::vector<float> g(kN);
    for (size_t i = 0; i < kN; ++i) {
      g[i] = static_cast<float>(static_cast<int>((i * 7 + step * 3) % 11) - 5) * 0.25f;
      ref[i].Step(g[i], step);
    }
    MustPush(*t, 1, step - 1, g);
  }
  std::vector<double> want(kN);
  for (size_t i = 0; i < kN; ++i) want[i] = ref[i].w;
  const std::vector<float> got = Pull(*t, 1);
  ASSERT_EQ(got.size(), kN);
  size_t wrong = 0;
  for (size_t i = 0; i < kN; ++i) {
    if (std::fabs(got[i] - want[i]) > 2e-5 * std::max(1.0, std::fabs(want[i]))) {
      if (wrong++ < 5) ADD_FAILURE() << "element " << i << ": " << got[i] << ", want " << want[i];
    }
  }
  EXPECT_EQ(wrong, 0u);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, DenseTableLargeTest,
                         ::testing::Values("sgd", "adagrad", "ftrl", "adam"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace onlineps::ps
