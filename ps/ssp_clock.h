// SspClock: per-sender push clocks for bounded staleness in block mode (Stale
// Synchronous Parallel, Ho et al. 2013). A sender's clock counts its pushes to the
// table; a sender more than s pushes ahead of the slowest live sender is held. A sender
// silent for longer than the lease stops counting, so a dead worker never blocks the
// others for good; when it comes back it rejoins at the slowest live clock, as a
// newcomer does. A sender that has only pulled is waited for during one lease from its
// registration (a worker about to push), then not until it pushes: a reader that never
// pushes would otherwise hold every pusher for good. Bounded: at most max_senders clocks
// (oldest dropped). Thread-safe.
#ifndef ONLINEPS_PS_SSP_CLOCK_H_
#define ONLINEPS_PS_SSP_CLOCK_H_

#include <cstdint>
#include <unordered_map>

#include "common/mutex.h"

namespace onlineps::ps {

class SspClock {
 public:
  SspClock(uint64_t bound, uint64_t lease_ms, size_t max_senders = 4096)
      : bound_(bound), lease_ms_(lease_ms), max_senders_(max_senders) {}

  // A pull registers the sender (at the slowest live clock, if new or back after its
  // lease) so it is waited for.
  void Touch(uint64_t sender, uint64_t now_ms);
  // Counts one push of `sender`.
  void Tick(uint64_t sender, uint64_t now_ms);
  // True when sender's clock - min live clock <= bound.
  bool Releasable(uint64_t sender, uint64_t now_ms);

 private:
  struct Entry {
    uint64_t clock = 0;
    uint64_t last_ms = 0;
    uint64_t since_ms = 0;  // registered (new, or back after its lease)
    bool pushed = false;    // since registered
  };
  // Whether `e` is waited for at `now_ms`.
  bool Counts(const Entry& e, uint64_t now_ms) const;
  uint64_t MinLiveClock(uint64_t now_ms) REQUIRES(mu_);
  // Raises `e`'s clock to the slowest live one (a sender joining or rejoining).
  void CatchUp(Entry* e, uint64_t now_ms) REQUIRES(mu_);

  const uint64_t bound_, lease_ms_;
  const size_t max_senders_;
  Mutex mu_;
  std::unordered_map<uint64_t, Entry> senders_ GUARDED_BY(mu_);
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_SSP_CLOCK_H_
