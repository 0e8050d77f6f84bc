// Dedup: exactly-once pushes. Each push carries (sender, seq) with seq counting up from 1
// per (sender, shard). A shard remembers, per sender, the highest seq seen and which of
// the kWindow seqs below it were applied, so a retried push is recognised and not
// applied twice. Bounded: at most max_senders senders (least recently seen evicted).
// Thread-safe.
#ifndef ONLINEPS_PS_DEDUP_H_
#define ONLINEPS_PS_DEDUP_H_

#include <bitset>
#include <cstdint>
#include <vector>

#include "common/bytes.h"
#include "common/lru_map.h"
#include "common/mutex.h"
#include "common/status.h"

namespace onlineps::ps {

class Dedup {
 public:
  static constexpr uint64_t kWindow = 4096;

  enum class Verdict {
    kNew,         // reserved: apply it, then Commit or Abort
    kDuplicate,   // already applied: do not apply again
    kInProgress,  // the same push is being applied right now (retry later)
    kTooOld,      // below the window: cannot tell; refused
  };

  explicit Dedup(size_t max_senders = 65536) : senders_(max_senders) {}

  // seq == 0 means "no dedup requested" and always returns kNew.
  Verdict Begin(uint64_t sender, uint64_t seq);
  void Commit(uint64_t sender, uint64_t seq);
  void Abort(uint64_t sender, uint64_t seq);

  size_t senders() const;
  size_t evictions() const;

  void Save(ByteWriter* w) const;
  Status Load(ByteReader* r);

 private:
  struct Window {
    uint64_t high = 0;             // highest seq seen (reserved or applied)
    std::bitset<kWindow> applied;  // bit (seq % kWindow) for seqs in (high-kWindow, high]
    std::bitset<kWindow> in_progress;
  };
  static void Advance(Window* w, uint64_t seq);

  mutable Mutex mu_;
  LruMap<uint64_t, Window> senders_ GUARDED_BY(mu_);
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_DEDUP_H_
