// Accumulator: sums the dense gradients of several learn calls before one push, so the
// PS sees one push of the sum instead of k small ones. The batch carries, per shard, the
// oldest base version among the summed gradients (the staleness the PS should measure).
// The sum saturates at +-FLT_MAX: finite gradients never sum to Inf. Thread-safe.
#ifndef ONLINEPS_WORKER_ACCUMULATOR_H_
#define ONLINEPS_WORKER_ACCUMULATOR_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "common/mutex.h"
#include "ps/ps_client.h"

namespace onlineps::worker {

class Accumulator {
 public:
  struct Batch {
    std::vector<float> sum;
    ps::VersionVector base;  // per shard: min over the summed gradients
    uint64_t examples = 0;
    uint64_t calls = 0;
  };

  // Ready when `examples` examples are summed, or the oldest is `max_ms` old (0: never).
  Accumulator(size_t size, uint64_t examples, int64_t max_ms);

  // Adds one call's gradient. Returns the batch to push when this makes it ready.
  // REQUIRES: grad.size() == size.
  std::optional<Batch> Add(const std::vector<float>& grad, const ps::VersionVector& base,
                           uint64_t examples, int64_t now_ms);
  // The batch if its time is up (or `force` and non-empty); resets the accumulator.
  std::optional<Batch> TakeIfDue(int64_t now_ms, bool force);
  uint64_t pending_examples() const;

 private:
  std::optional<Batch> TakeLocked() REQUIRES(mu_);

  const size_t size_;
  const uint64_t examples_;
  const int64_t max_ms_;
  mutable Mutex mu_;
  Batch cur_ GUARDED_BY(mu_);
  int64_t first_ms_ GUARDED_BY(mu_) = 0;
};

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_ACCUMULATOR_H_
