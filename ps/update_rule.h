// Pluggable update rules applied by a shard: an Optimizer (how a gradient moves the
// weights) combined with a StalenessPolicy (how the staleness tau of a push changes
// that). Both are chosen by name at table creation through the registries below.
//
// All Apply/Compensate functions work on raw float arrays of n elements so that the
// compiler can vectorize them; they are called with the table's stripe lock held, so
// they must not block. Objects are immutable after Create and thread-safe.
#ifndef ONLINEPS_PS_UPDATE_RULE_H_
#define ONLINEPS_PS_UPDATE_RULE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace onlineps::ps {

// Hyper-parameters by name, e.g. {"lr": 0.1, "beta1": 0.9}. Parsed from the table spec.
using Params = std::map<std::string, double>;

// Per-call arguments of an optimizer step.
struct ApplyArgs {
  float lr_scale = 1.0f;  // from the staleness policy (e.g. 1/max(tau,1))
  uint64_t step = 1;      // 1-based count of updates applied to this table (Adam bias correction)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual std::string_view name() const = 0;
  // Floats of optimizer state per parameter element (SGD 0, Adagrad 1, FTRL 2, Adam 2).
  virtual int state_slots() const = 0;
  // Initial value of each state slot (e.g. Adagrad's initial accumulator).
  virtual float InitialState(int slot) const { return 0.0f; }
  // w -= update(g). state[k] points at n floats of slot k (state_slots() pointers).
  virtual void Apply(float* w, float* const* state, const float* g, size_t n,
                     const ApplyArgs& args) const = 0;
  // The configured base learning rate (reported by table info).
  virtual double lr() const = 0;
};

// Staleness handling that is applied before the optimizer step.
class StalenessPolicy {
 public:
  virtual ~StalenessPolicy() = default;
  virtual std::string_view name() const = 0;
  // Learning-rate multiplier for a push of staleness tau (1 for most policies).
  virtual float LrScale(uint64_t tau) const { return 1.0f; }
  // True when Compensate needs w_bak: the exact weights the pushing worker last pulled.
  virtual bool NeedsBackup() const { return false; }
  // Floats of policy state per parameter element (DC-ASGD adaptive: 1, the mean square).
  virtual int state_slots() const { return 0; }
  // Rewrites the gradient g in place (DC-ASGD: g += lambda * g*g*(w - w_bak)).
  // `state` has state_slots() pointers to n floats. Called only when NeedsBackup() and a
  // backup exists for the pushing worker.
  virtual void Compensate(float* g, const float* w, const float* w_bak, float* const* state,
                          size_t n) const {}
};

// Creates optimizers: "sgd" {lr}, "adagrad" {lr, eps, initial_accumulator},
// "ftrl" {alpha, beta, l1, l2}, "adam" {lr, beta1, beta2, eps}.
// Unknown name or bad value -> kInvalidArgument naming the problem.
StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const std::string& name, const Params& params);

// Creates staleness policies: "none", "lr_over_tau" (lr * 1/max(tau,1)),
// "dc_constant" {lambda}, "dc_adaptive" {lambda0, m, eps}.
StatusOr<std::unique_ptr<StalenessPolicy>> CreateStalenessPolicy(const std::string& name,
                                                                 const Params& params);

// Names accepted by the factories, for --help text and error messages.
std::vector<std::string> OptimizerNames();
std::vector<std::string> StalenessPolicyNames();

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_UPDATE_RULE_H_
