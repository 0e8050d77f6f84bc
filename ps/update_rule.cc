#include "ps/update_rule.h"

#include <cfloat>
#include <cmath>
#include <sstream>

#include "ps/optimizers.h"
#include "ps/staleness_policies.h"

namespace onlineps::ps {
namespace {

// What a parameter's value must satisfy, beyond being finite as a float.
enum class Bound {
  kPositive,     // > 0: learning rates, and eps, which keeps 0/0 out of the kernels
  kNonNegative,  // >= 0
  kUnitRange,    // [0, 1): decay rates; 1 would freeze the average, and bias correction
                 // would divide by zero
};

struct ParamSpec {
  std::string_view name;
  Bound bound;
};

// One row of a registry. create receives only validated parameters; absent ones keep the
// defaults of the options struct, which is the single place defaults are written.
template <typename Rule>
struct RuleEntry {
  std::string_view name;
  std::vector<ParamSpec> params;
  std::unique_ptr<Rule> (*create)(const Params& params);
};

// Overwrites *field with params[key] when the caller set it.
void Override(const Params& params, const char* key, double* field) {
  auto it = params.find(key);
  if (it != params.end()) *field = it->second;
}

// Creators: each copies the caller's parameters over the options struct's defaults.

std::unique_ptr<Optimizer> NewSgd(const Params& p) {
  SgdOptions o;
  Override(p, "lr", &o.lr);
  return std::make_unique<Sgd>(o);
}

std::unique_ptr<Optimizer> NewAdagrad(const Params& p) {
  AdagradOptions o;
  Override(p, "lr", &o.lr);
  Override(p, "eps", &o.eps);
  Override(p, "initial_accumulator", &o.initial_accumulator);
  return std::make_unique<Adagrad>(o);
}

std::unique_ptr<Optimizer> NewFtrl(const Params& p) {
  FtrlOptions o;
  Override(p, "alpha", &o.alpha);
  Override(p, "beta", &o.beta);
  Override(p, "l1", &o.l1);
  Override(p, "l2", &o.l2);
  return std::make_unique<Ftrl>(o);
}

std::unique_ptr<Optimizer> NewAdam(const Params& p) {
  AdamOptions o;
  Override(p, "lr", &o.lr);
  Override(p, "beta1", &o.beta1);
  Override(p, "beta2", &o.beta2);
  Override(p, "eps", &o.eps);
  return std::make_unique<Adam>(o);
}

std::unique_ptr<StalenessPolicy> NewNoStaleness(const Params&) {
  return std::make_unique<NoStaleness>();
}

std::unique_ptr<StalenessPolicy> NewLrOverTau(const Params&) {
  return std::make_unique<LrOverTau>();
}

std::unique_ptr<StalenessPolicy> NewDcConstant(const Params& p) {
  DcConstantOptions o;
  Override(p, "lambda", &o.lambda);
  return std::make_unique<DcConstant>(o);
}

std::unique_ptr<StalenessPolicy> NewDcAdaptive(const Params& p) {
  DcAdaptiveOptions o;
  Override(p, "lambda0", &o.lambda0);
  Override(p, "m", &o.m);
  Override(p, "eps", &o.eps);
  return std::make_unique<DcAdaptive>(o);
}

// Registries are leaked function-local statics: no destruction-order hazards at exit.
// The order of the rows is the order of the names in --help and error messages.
const std::vector<RuleEntry<Optimizer>>& OptimizerRegistry() {
  static const auto* const kRegistry = new std::vector<RuleEntry<Optimizer>>{
      {"sgd", {{"lr", Bound::kPositive}}, NewSgd},
      {"adagrad",
       {{"lr", Bound::kPositive},
        {"eps", Bound::kPositive},
        {"initial_accumulator", Bound::kNonNegative}},
       NewAdagrad},
      {"ftrl",
       {{"alpha", Bound::kPositive},
        {"beta", Bound::kNonNegative},
        {"l1", Bound::kNonNegative},
        {"l2", Bound::kNonNegative}},
       NewFtrl},
      {"adam",
       {{"lr", Bound::kPositive},
        {"beta1", Bound::kUnitRange},
        {"beta2", Bound::kUnitRange},
        {"eps", Bound::kPositive}},
       NewAdam},
  };
  return *kRegistry;
}

const std::vector<RuleEntry<StalenessPolicy>>& PolicyRegistry() {
  static const auto* const kRegistry = new std::vector<RuleEntry<StalenessPolicy>>{
      {"none", {}, NewNoStaleness},
      {"lr_over_tau", {}, NewLrOverTau},
      {"dc_constant", {{"lambda", Bound::kNonNegative}}, NewDcConstant},
      {"dc_adaptive",
       {{"lambda0", Bound::kNonNegative}, {"m", Bound::kUnitRange}, {"eps", Bound::kPositive}},
       NewDcAdaptive},
  };
  return *kRegistry;
}

template <typename Rule>
std::vector<std::string> NamesOf(const std::vector<RuleEntry<Rule>>& registry) {
  std::vector<std::string> names;
  for (const auto& entry : registry) names.emplace_back(entry.name);
  return names;
}

std::string Join(const std::vector<std::string>& items) {
  if (items.empty()) return "(none)";
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

// Returns "" when value satisfies bound, else what is wrong with it.
std::string BoundViolation(double value, Bound bound) {
  // The kernels run in float, so a double that overflows or rounds to 0 there is bad too.
  if (!std::isfinite(value) || std::fabs(value) > FLT_MAX) return "must be finite (as a float)";
  switch (bound) {
    case Bound::kPositive:
      return value > 0 && static_cast<float>(value) > 0 ? "" : "must be > 0";
    case Bound::kNonNegative:
      return value >= 0 ? "" : "must be >= 0";
    case Bound::kUnitRange:
      return value >= 0 && value < 1 ? "" : "must be in [0, 1)";
  }
  return "has an unknown bound";  // unreachable: the switch covers every Bound
}

template <typename Rule>
Status CheckParam(std::string_view kind, const RuleEntry<Rule>& entry, const std::string& key,
                  double value) {
  std::ostringstream prefix;
  prefix << kind << " '" << entry.name << "': ";
  for (const ParamSpec& spec : entry.params) {
    if (spec.name != key) continue;
    const std::string problem = BoundViolation(value, spec.bound);
    if (problem.empty()) return Status::Ok();
    std::ostringstream msg;
    msg << prefix.str() << "parameter '" << key << "' " << problem << ", got " << value;
    return InvalidArgument(msg.str());
  }
  std::vector<std::string> valid;
  for (const ParamSpec& spec : entry.params) valid.emplace_back(spec.name);
  return InvalidArgument(prefix.str() + "unknown parameter '" + key +
                         "'; valid parameters: " + Join(valid));
}

template <typename Rule>
StatusOr<std::unique_ptr<Rule>> CreateFromRegistry(std::string_view kind,
                                                   const std::vector<RuleEntry<Rule>>& registry,
                                                   const std::string& name, const Params& params) {
  for (const RuleEntry<Rule>& entry : registry) {
    if (entry.name != name) continue;
    for (const auto& [key, value] : params) {
      ONLINEPS_RETURN_IF_ERROR(CheckParam(kind, entry, key, value));
    }
    return entry.create(params);
  }
  return InvalidArgument("unknown " + std::string(kind) + " '" + name + "'; valid " +
                         std::string(kind) + " names: " + Join(NamesOf(registry)));
}

}  // namespace

StatusOr<std::unique_ptr<Optimizer>> CreateOptimizer(const std::string& name,
                                                     const Params& params) {
  return CreateFromRegistry<Optimizer>("optimizer", OptimizerRegistry(), name, params);
}

StatusOr<std::unique_ptr<StalenessPolicy>> CreateStalenessPolicy(const std::string& name,
                                                                 const Params& params) {
  return CreateFromRegistry<StalenessPolicy>("staleness policy", PolicyRegistry(), name, params);
}

std::vector<std::string> OptimizerNames() { return NamesOf(OptimizerRegistry()); }

std::vector<std::string> StalenessPolicyNames() { return NamesOf(PolicyRegistry()); }

}  // namespace onlineps::ps
