// RuleSet: a table's optimizer and staleness policy applied together to one segment
// of parameters, plus the shared helpers every table kind needs (finite check,
// bounded-staleness check, deterministic initializer). Immutable; thread-safe.
#ifndef ONLINEPS_PS_RULE_SET_H_
#define ONLINEPS_PS_RULE_SET_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "ps/table_spec.h"
#include "ps/update_rule.h"

namespace onlineps::ps {

class RuleSet {
 public:
  static StatusOr<RuleSet> Create(const TableSpec& spec);

  // Read per row on the apply path: cached at Create, not virtual calls.
  int optimizer_slots() const { return optimizer_slots_; }
  int policy_slots() const { return policy_slots_; }
  bool needs_backup() const { return needs_backup_; }
  const Optimizer& optimizer() const { return *optimizer_; }
  const StalenessPolicy& policy() const { return *policy_; }
  float InitialState(int slot) const { return optimizer_->InitialState(slot); }

  // Applies gradient g (n floats) to w. opt_state/pol_state: per-slot pointers.
  // w_bak: the pusher's backup or nullptr (no compensation). scratch: caller-owned
  // buffer reused across calls (DC-ASGD rewrites a copy of g, never the input).
  // Inline: called per row on the apply path.
  void Apply(float* w, float* const* opt_state, float* const* pol_state, const float* g,
             const float* w_bak, size_t n, float lr_scale, uint64_t step,
             std::vector<float>* scratch) const {
    if (w_bak != nullptr && needs_backup_) {
      ApplyCompensated(w, opt_state, pol_state, g, w_bak, n, lr_scale, step, scratch);
    } else {
      optimizer_->Apply(w, opt_state, g, n, ApplyArgs{lr_scale, step});
    }
  }

  // Rewrites g (a private copy) with the DC-ASGD compensation, if the policy has one.
  void Compensate(float* g, const float* w, const float* w_bak, float* const* pol_state,
                  size_t n) const;

  // Refuses a push of staleness tau in reject mode (kStale, naming both numbers).
  Status CheckBound(const std::string& table, uint64_t tau) const;

 private:
  RuleSet() = default;
  void ApplyCompensated(float* w, float* const* opt_state, float* const* pol_state, const float* g,
                        const float* w_bak, size_t n, float lr_scale, uint64_t step,
                        std::vector<float>* scratch) const;
  std::shared_ptr<const Optimizer> optimizer_;
  std::shared_ptr<const StalenessPolicy> policy_;
  int64_t max_staleness_ = -1;
  BoundMode bound_mode_ = BoundMode::kReject;
  int optimizer_slots_ = 0;
  int policy_slots_ = 0;
  bool needs_backup_ = false;
};

// True when every value is finite. Vectorizable (no early exit).
bool AllFinite(const float* v, size_t n);

// Gradient norm clip: when the L2 norm of v[0..n) exceeds max_norm (> 0), writes v
// scaled to norm max_norm into *scratch and returns it (and sets *clipped); otherwise
// returns v. max_norm 0: no clip.
const float* ClipToNorm(const float* v, size_t n, double max_norm, std::vector<float>* scratch,
                        bool* clipped);

// Writes n initial values of the table's initializer for element `index` onwards
// (dense: flattened element index; sparse: row id, column 0..n-1). Deterministic:
// depends only on (spec.name, spec.seed, init, index), so every shard and replica
// computes the same values.
void InitValues(const TableSpec& spec, uint64_t index, float* out, size_t n, bool sparse_row);

// w_avg += (w - w_avg) / max(1, t - t0): one Polyak-Ruppert averaging step.
void PolyakStep(float* w_avg, const float* w, size_t n, uint64_t t, uint64_t t0);

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_RULE_SET_H_
