// Delay: a non-negative random duration or count, parsed from a spec string. The
// units are the caller's (the schedule simulator: ms of virtual time; the staleness
// override: counts, rounded to the nearest integer). Value type, copyable; Sample()
// advances the cursor of the list kinds, so copies sample independently.
#ifndef ONLINEPS_REPLAY_DELAY_H_
#define ONLINEPS_REPLAY_DELAY_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "replay/rng.h"

namespace onlineps::replay {

// Spec forms (every parameter >= 0 except the lognormal MU):
//   none                  always 0
//   fixed:V               always V
//   uniform:MIN,MEAN      uniform on [MIN, 2*MEAN-MIN] (FLSim convention); MIN <= MEAN
//   normal:MEAN,SD[,MIN]  max(MIN, N(MEAN, SD)): clamped below at MIN (default 0)
//   half-normal:MIN,SD    MIN + |N(0, SD)|
//   exp:MEAN              exponential with mean MEAN
//   shifted-exp:SHIFT,MEAN  SHIFT + exponential with mean MEAN
//   lognormal:MU,SIGMA    exp(N(MU, SIGMA)): MU and SIGMA of the underlying normal
//   pareto:SCALE,SHAPE    x_m = SCALE, alpha = SHAPE > 0; mean finite only if SHAPE > 1
//   list:V1,V2,...        the values in order, cycled
//   list@PATH             one number per line of PATH ('#' starts a comment), cycled
class Delay {
 public:
  Delay() = default;  // none

  // Errors (INVALID_ARGUMENT; NOT_FOUND for an unreadable file) quote the spec and name
  // the problem: unknown kind, parameter count, bad or negative number, MIN > MEAN,
  // SD < 0, SHAPE <= 0, empty list, "PATH:LINE" for a bad line of a list file.
  static StatusOr<Delay> Parse(const std::string& spec);

  // One draw (>= 0). Uses `rng` except for none, fixed and the list kinds.
  double Sample(Rng& rng);
  // Analytic mean; +infinity for pareto with SHAPE <= 1.
  double Mean() const;
  // Canonical spec; Parse(ToString()) gives an equal Delay (list@PATH re-reads PATH).
  std::string ToString() const;
  // True for none and fixed:0.
  bool IsZero() const;

 private:
  enum class Kind {
    kNone,
    kFixed,
    kUniform,
    kNormal,
    kHalfNormal,
    kExp,
    kShiftedExp,
    kLogNormal,
    kPareto,
    kList,
  };
  struct KindInfo;
  static const KindInfo* FindKind(const std::string& name);
  static StatusOr<Delay> ParseParams(const std::string& spec, const KindInfo& info,
                                     const std::string& args);
  static StatusOr<Delay> ParseList(const std::string& spec, const std::string& args);
  static StatusOr<Delay> ReadListFile(const std::string& spec, const std::string& path);

  Kind kind_ = Kind::kNone;
  double p_[3] = {0, 0, 0};  // the kind's parameters in spec order
  // List kinds: values shared between copies (immutable), each copy with its own cursor.
  std::shared_ptr<const std::vector<double>> list_;
  std::string path_;  // list@PATH: the path; empty for list:V1,...
  size_t cursor_ = 0;
};

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_DELAY_H_
