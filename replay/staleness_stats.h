// StalenessStats: a bounded histogram of staleness values (tau) with mean, quantiles
// and max. Values above kMaxExact share the last bucket; the max stays exact.
// Value type; thread-compatible.
#ifndef ONLINEPS_REPLAY_STALENESS_STATS_H_
#define ONLINEPS_REPLAY_STALENESS_STATS_H_

#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace onlineps::replay {

class StalenessStats {
 public:
  static constexpr uint64_t kMaxExact = 65535;
  void Add(uint64_t tau);
  uint64_t count() const { return count_; }
  double Mean() const;
  // Smallest tau with at least q of the values at or below it (0 when empty).
  uint64_t Quantile(double q) const;
  uint64_t Max() const { return max_; }
  double Fraction(uint64_t tau) const;  // share of values equal to tau
  const std::vector<uint64_t>& histogram() const { return hist_; }
  // {"count","mean","p50","p90","p99","max"}
  nlohmann::json ToJson() const;

 private:
  std::vector<uint64_t> hist_;
  uint64_t count_ = 0;
  long double sum_ = 0;
  uint64_t max_ = 0;
};

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_STALENESS_STATS_H_
