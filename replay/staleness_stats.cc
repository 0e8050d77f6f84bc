#include "replay/staleness_stats.h"

#include <algorithm>
#include <cmath>

namespace onlineps::replay {

void StalenessStats::Add(uint64_t tau) {
  const uint64_t b = std::min(tau, kMaxExact);
  if (hist_.size() <= b) hist_.resize(b + 1, 0);
  ++hist_[b];
  ++count_;
  sum_ += static_cast<long double>(tau);
  max_ = std::max(max_, tau);
}

double StalenessStats::Mean() const {
  return count_ ? static_cast<double>(sum_ / static_cast<long double>(count_)) : 0.0;
}

uint64_t StalenessStats::Quantile(double q) const {
  if (count_ == 0) return 0;
  const uint64_t need = static_cast<uint64_t>(std::ceil(q * static_cast<double>(count_)));
  uint64_t seen = 0;
  for (uint64_t t = 0; t < hist_.size(); ++t) {
    seen += hist_[t];
    if (seen >= std::max<uint64_t>(need, 1)) return t == kMaxExact ? max_ : t;
  }
  return max_;
}

double StalenessStats::Fraction(uint64_t tau) const {
  if (count_ == 0 || tau >= hist_.size()) return 0;
  return static_cast<double>(hist_[tau]) / static_cast<double>(count_);
}

nlohmann::json StalenessStats::ToJson() const {
  return {{"count", count_},      {"mean", Mean()},        {"p50", Quantile(0.5)},
          {"p90", Quantile(0.9)}, {"p99", Quantile(0.99)}, {"max", max_}};
}

}  // namespace onlineps::replay
