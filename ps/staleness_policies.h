// The staleness policies behind CreateStalenessPolicy: NoStaleness, LrOverTau,
// DcConstant and DcAdaptive (DC-ASGD, Zheng et al. 2017). Immutable and thread-safe.
// REQUIRES of Compensate: g does not overlap w, w_bak or the state (w and w_bak may be
// the same array). Construct through CreateStalenessPolicy, which validates options.
#ifndef ONLINEPS_PS_STALENESS_POLICIES_H_
#define ONLINEPS_PS_STALENESS_POLICIES_H_

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "ps/update_rule.h"

namespace onlineps::ps {

// Plain async SGD: stale gradients are applied as they are.
class NoStaleness final : public StalenessPolicy {
 public:
  std::string_view name() const override { return "none"; }
};

// Staleness-aware async SGD (Zhang et al. 2016): LrScale(tau) = 1 / max(tau, 1).
class LrOverTau final : public StalenessPolicy {
 public:
  std::string_view name() const override { return "lr_over_tau"; }
  float LrScale(uint64_t tau) const override;
};

// DC-ASGD-c: g += lambda * g*g * (w - w_bak), computed from the original g. No state.
struct DcConstantOptions {
  double lambda = 0.04;
};

class DcConstant final : public StalenessPolicy {
 public:
  explicit DcConstant(const DcConstantOptions& options) : options_(options) {}
  std::string_view name() const override { return "dc_constant"; }
  bool NeedsBackup() const override { return true; }
  void Compensate(float* g, const float* w, const float* w_bak, float* const* state,
                  size_t n) const override;

 private:
  const DcConstantOptions options_;
};

// DC-ASGD-a with one global mean square per element (slot 0, starts at 0):
// ms = m*ms + (1-m)*g*g; g += lambda0 / sqrt(ms + eps) * g*g * (w - w_bak).
struct DcAdaptiveOptions {
  double lambda0 = 2.0;
  double m = 0.95;
  double eps = 1e-7;
};

class DcAdaptive final : public StalenessPolicy {
 public:
  explicit DcAdaptive(const DcAdaptiveOptions& options) : options_(options) {}
  std::string_view name() const override { return "dc_adaptive"; }
  bool NeedsBackup() const override { return true; }
  int state_slots() const override { return 1; }
  void Compensate(float* g, const float* w, const float* w_bak, float* const* state,
                  size_t n) const override;

 private:
  const DcAdaptiveOptions options_;
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_STALENESS_POLICIES_H_
