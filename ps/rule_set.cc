#include "ps/rule_set.h"

#include <cmath>
#include <cstring>

#include "common/partition.h"
#include "ps/cpu_clones.h"
#include "ps/optimizers.h"

namespace onlineps::ps {

StatusOr<RuleSet> RuleSet::Create(const TableSpec& spec) {
  RuleSet r;
  auto opt = CreateOptimizer(spec.optimizer, spec.optimizer_params);
  if (!opt.ok()) return opt.status();
  auto pol = CreateStalenessPolicy(spec.staleness, spec.staleness_params);
  if (!pol.ok()) return pol.status();
  r.optimizer_ = std::move(opt).value();
  r.policy_ = std::move(pol).value();
  r.max_staleness_ = spec.max_staleness;
  r.bound_mode_ = spec.bound_mode;
  r.optimizer_slots_ = r.optimizer_->state_slots();
  r.policy_slots_ = r.policy_->state_slots();
  r.needs_backup_ = r.policy_->NeedsBackup();
  return r;
}

void RuleSet::Compensate(float* g, const float* w, const float* w_bak, float* const* pol_state,
                         size_t n) const {
  policy_->Compensate(g, w, w_bak, pol_state, n);
}

void RuleSet::ApplyCompensated(float* w, float* const* opt_state, float* const* pol_state,
                               const float* g, const float* w_bak, size_t n, float lr_scale,
                               uint64_t step, std::vector<float>* scratch) const {
  scratch->assign(g, g + n);
  policy_->Compensate(scratch->data(), w, w_bak, pol_state, n);
  optimizer_->Apply(w, opt_state, scratch->data(), n, ApplyArgs{lr_scale, step});
}

Status RuleSet::CheckBound(const std::string& table, uint64_t tau) const {
  if (max_staleness_ < 0 || bound_mode_ != BoundMode::kReject) return Status::Ok();
  if (tau <= static_cast<uint64_t>(max_staleness_)) return Status::Ok();
  return Stale("table '" + table + "': push staleness tau=" + std::to_string(tau) +
               " exceeds the bound s=" + std::to_string(max_staleness_) +
               "; pull fresh parameters and recompute");
}

const float* ClipToNorm(const float* v, size_t n, double max_norm, std::vector<float>* scratch,
                        bool* clipped) {
  *clipped = false;
  if (max_norm <= 0) return v;
  double sq = 0;
  for (size_t i = 0; i < n; ++i) sq += static_cast<double>(v[i]) * v[i];
  const double norm = std::sqrt(sq);
  if (norm <= max_norm) return v;
  const float scale = static_cast<float>(max_norm / norm);
  scratch->resize(n);
  for (size_t i = 0; i < n; ++i) (*scratch)[i] = v[i] * scale;
  *clipped = true;
  return scratch->data();
}

ONLINEPS_AVX2_CLONES bool AllFinite(const float* v, size_t n) {
  // Inf and NaN are the floats whose exponent bits are all ones, so that with the sign
  // cleared, adding one to the exponent carries into bit 31. Or-ing those sums keeps the
  // loop to an and, an add and an or per lane with no compare or max in the dependency
  // chain (an SSE2 max of uint32 is emulated, several times slower).
  uint32_t acc = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, sizeof(bits));
    acc |= (bits & 0x7fffffffu) + 0x00800000u;
  }
  return (acc & 0x80000000u) == 0;
}

namespace {

// Uniform in [0, 1) from a 64-bit hash (53 random bits).
double Unit(uint64_t h) { return static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0); }

}  // namespace

void InitValues(const TableSpec& spec, uint64_t index, float* out, size_t n, bool sparse_row) {
  if (spec.init == "zeros" || spec.init == "constant") {
    const float v = spec.init == "zeros" ? 0.0f : static_cast<float>(spec.init_value);
    for (size_t i = 0; i < n; ++i) out[i] = v;
    return;
  }
  const uint64_t table_key = HashString(spec.name) ^ Mix64(spec.seed + 0x9e3779b97f4a7c15ULL);
  const uint64_t row_key = sparse_row ? Mix64(index ^ table_key) : table_key;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t elem = sparse_row ? i : index + i;
    const uint64_t h1 = Mix64(row_key + 2 * elem + 1);
    if (spec.init == "uniform") {
      out[i] = internal::SaturateToFloat((2.0 * Unit(h1) - 1.0) * spec.init_value);
    } else {  // normal, Box-Muller
      const double u1 = 1.0 - Unit(h1), u2 = Unit(Mix64(h1 ^ 0x5bd1e995ULL));
      out[i] = internal::SaturateToFloat(spec.init_value * std::sqrt(-2.0 * std::log(u1)) *
                                         std::cos(6.283185307179586 * u2));
    }
  }
}

void PolyakStep(float* w_avg, const float* w, size_t n, uint64_t t, uint64_t t0) {
  using internal::Saturate;
  const float mu = 1.0f / static_cast<float>(t > t0 + 1 ? t - t0 : 1);
  for (size_t i = 0; i < n; ++i) w_avg[i] = Saturate(w_avg[i] + Saturate(w[i] - w_avg[i]) * mu);
}

}  // namespace onlineps::ps
