#include "ps/ssp_clock.h"

#include <algorithm>
#include <limits>

namespace onlineps::ps {

bool SspClock::Counts(const Entry& e, uint64_t now_ms) const {
  // Handler threads read the clock at slightly different times: a sender seen "later"
  // than now_ms is live, not 2^64 ms old.
  auto within_lease = [&](uint64_t t) { return t >= now_ms || now_ms - t <= lease_ms_; };
  return within_lease(e.last_ms) && (e.pushed || within_lease(e.since_ms));
}

void SspClock::CatchUp(Entry* e, uint64_t now_ms) {
  const uint64_t min_live = MinLiveClock(now_ms);
  if (min_live != std::numeric_limits<uint64_t>::max()) e->clock = std::max(e->clock, min_live);
}

uint64_t SspClock::MinLiveClock(uint64_t now_ms) {
  uint64_t min_clock = std::numeric_limits<uint64_t>::max();
  for (const auto& [id, e] : senders_) {
    if (Counts(e, now_ms) && e.clock < min_clock) min_clock = e.clock;
  }
  return min_clock;
}

void SspClock::Touch(uint64_t sender, uint64_t now_ms) {
  MutexLock lock(&mu_);
  auto it = senders_.find(sender);
  if (it != senders_.end()) {
    Entry& e = it->second;
    if (e.last_ms < now_ms && now_ms - e.last_ms > lease_ms_) {
      // Back after its lease: it rejoins like a newcomer, rather than hold every live
      // sender until it has made up the pushes it missed meanwhile.
      CatchUp(&e, now_ms);
      e.since_ms = now_ms;
      e.pushed = false;
    }
    e.last_ms = now_ms;
    return;
  }
  if (senders_.size() >= max_senders_) {
    // Drop the longest-silent sender; it re-registers on its next call.
    auto oldest = senders_.begin();
    for (auto i = senders_.begin(); i != senders_.end(); ++i) {
      if (i->second.last_ms < oldest->second.last_ms) oldest = i;
    }
    senders_.erase(oldest);
  }
  // A newcomer starts at the slowest live clock so it neither blocks nor is blocked.
  uint64_t start = MinLiveClock(now_ms);
  if (start == std::numeric_limits<uint64_t>::max()) start = 0;
  senders_[sender] = Entry{start, now_ms, now_ms, false};
}

void SspClock::Tick(uint64_t sender, uint64_t now_ms) {
  Touch(sender, now_ms);
  MutexLock lock(&mu_);
  Entry& e = senders_[sender];
  if (!e.pushed) {
    // A reader's first push: it joins at the slowest live clock, as a newcomer does,
    // not at the clock it was registered with (the others went on meanwhile).
    CatchUp(&e, now_ms);
    e.pushed = true;
  }
  e.clock++;
}

bool SspClock::Releasable(uint64_t sender, uint64_t now_ms) {
  MutexLock lock(&mu_);
  auto it = senders_.find(sender);
  if (it == senders_.end()) return true;
  const uint64_t min_clock = MinLiveClock(now_ms);
  // No sender live (not even this one, back with a resend): nobody to wait for. Written
  // without min_clock + bound_, which would wrap.
  return min_clock == std::numeric_limits<uint64_t>::max() || it->second.clock <= min_clock ||
         it->second.clock - min_clock <= bound_;
}

}  // namespace onlineps::ps
