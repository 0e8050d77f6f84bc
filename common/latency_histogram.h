// LatencyHistogram: request durations counted into fixed buckets with relaxed atomics, so
// a request path records its time without a lock or a metrics library; an exporter reads
// a Snapshot now and then and adds the difference to a prometheus histogram
// (Histogram::ObserveMultiple). Thread-safe.
#ifndef ONLINEPS_COMMON_LATENCY_HISTOGRAM_H_
#define ONLINEPS_COMMON_LATENCY_HISTOGRAM_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

namespace onlineps {

class LatencyHistogram {
 public:
  // Upper bounds in seconds (the +Inf bucket is implicit): 100 us to 30 s.
  static constexpr std::array<double, 12> kBounds = {1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2,
                                                     0.1,  0.3,  1,    3,    10,   30};

  struct Snapshot {
    std::array<uint64_t, kBounds.size() + 1> buckets{};  // not cumulative; last is +Inf
    uint64_t sum_ns = 0;
    uint64_t count() const {
      uint64_t n = 0;
      for (uint64_t b : buckets) n += b;
      return n;
    }
  };

  void Observe(double seconds) {
    size_t i = 0;
    while (i < kBounds.size() && seconds > kBounds[i]) ++i;
    buckets_[i].fetch_add(1, std::memory_order_relaxed);
    const double ns = seconds > 0 ? seconds * 1e9 : 0;
    sum_ns_.fetch_add(static_cast<uint64_t>(ns), std::memory_order_relaxed);
  }

  Snapshot Read() const {
    Snapshot s;
    for (size_t i = 0; i < buckets_.size(); ++i) {
      s.buckets[i] = buckets_[i].load(std::memory_order_relaxed);
    }
    s.sum_ns = sum_ns_.load(std::memory_order_relaxed);
    return s;
  }

  // What `now` adds to `before`, per bucket (for ObserveMultiple), and in seconds.
  static std::vector<double> BucketDelta(const Snapshot& now, const Snapshot& before) {
    std::vector<double> d(now.buckets.size());
    for (size_t i = 0; i < d.size(); ++i) {
      d[i] = static_cast<double>(now.buckets[i] - before.buckets[i]);
    }
    return d;
  }
  static double SumDelta(const Snapshot& now, const Snapshot& before) {
    return static_cast<double>(now.sum_ns - before.sum_ns) * 1e-9;
  }

 private:
  std::array<std::atomic<uint64_t>, kBounds.size() + 1> buckets_{};
  std::atomic<uint64_t> sum_ns_{0};
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_LATENCY_HISTOGRAM_H_
