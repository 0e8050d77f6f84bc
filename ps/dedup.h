// Dedup: exactly-once pushes. Each push carries (sender, seq) with seq counting up from 1
// per (sender, shard). A shard remembers, per sender, the highest seq seen and which of
// the kWindow seqs below it were applied, so a retried push is recognised and not
// applied twice. Bounded: at most max_senders senders (least recently seen evicted). An
// evicted sender's highest seq is kept a while longer (4 x max_senders of them, 16 bytes
// each, not in checkpoints): if it comes back, its pushes at or below that seq are
// refused as too old (cannot tell whether they were applied) instead of applied again.
// Thread-safe.
#ifndef ONLINEPS_PS_DEDUP_H_
#define ONLINEPS_PS_DEDUP_H_

#include <algorithm>
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

  explicit Dedup(size_t max_senders = 65536)
      : senders_(max_senders), evicted_(4 * std::max<size_t>(max_senders, 1)) {}

  // seq == 0 means "no dedup requested" and always returns kNew. `refuse_forgotten`:
  // refuse a returning evicted sender's seqs at or below its remembered high (kTooOld).
  // A backup applying its primary's log passes false: the primary decided already, and
  // what each replica remembers of evicted senders is not replicated.
  Verdict Begin(uint64_t sender, uint64_t seq, bool refuse_forgotten = true);
  void Commit(uint64_t sender, uint64_t seq);
  void Abort(uint64_t sender, uint64_t seq);

  size_t senders() const;
  size_t evictions() const;

  void Save(ByteWriter* w) const;
  Status Load(ByteReader* r);

 private:
  struct Window {
    uint64_t high = 0;             // highest seq seen (reserved or applied)
    uint64_t floor = 0;            // seqs at or below it cannot be told (evicted, back)
    std::bitset<kWindow> applied;  // bit (seq % kWindow) for seqs in (high-kWindow, high]
    std::bitset<kWindow> in_progress;
  };
  static void Advance(Window* w, uint64_t seq);

  mutable Mutex mu_;
  LruMap<uint64_t, Window> senders_ GUARDED_BY(mu_);
  LruMap<uint64_t, uint64_t> evicted_ GUARDED_BY(mu_);  // evicted sender -> its high
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_DEDUP_H_
