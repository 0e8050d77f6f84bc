// HeldPushes: accumulated dense gradients whose push failed, kept to be pushed again.
// Every learn summed into such a push was answered "accumulated" (taken), so a failed
// push is not dropped: it is held, with the (sender, seq) of its first attempt, and
// retried until a shard takes it; a shard that applied it before answers the retry as a
// duplicate, so nothing is applied twice. Bounded by bytes: past max_bytes, CheckRoom
// refuses new learns; and by seqs: a shard remembers the last ps::Dedup::kWindow seqs of
// a sender, so CheckRoom also refuses learns while a push not yet taken is kMaxSeqSpan
// seqs behind the newest started. Pushes whose error no retry can mend are dropped, with
// an error log naming the learns lost. Thread-safe.
#ifndef ONLINEPS_WORKER_HELD_PUSHES_H_
#define ONLINEPS_WORKER_HELD_PUSHES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/frame.h"
#include "common/mutex.h"
#include "common/status.h"
#include "ps/dedup.h"
#include "ps/ps_client.h"

namespace onlineps::worker {

class HeldPushes {
 public:
  // One accumulated push: what it sends, and the learns summed into it.
  struct Push {
    std::string table;
    Frame values;  // the sum, shared with the push that sends it
    ps::VersionVector base;
    uint64_t seq = 0;  // its fixed seq (the sender is the service's held-push sender)
    uint64_t examples = 0;
    uint64_t calls = 0;
  };
  struct Stats {
    size_t pushes = 0;  // held now
    size_t bytes = 0;
    uint64_t calls = 0;          // learns summed into the held pushes
    uint64_t retries = 0;        // retry attempts started
    uint64_t resolved = 0;       // held pushes a later attempt got taken
    uint64_t dropped_calls = 0;  // learns lost: their push failed for good
  };

  // How far the newest push started may be ahead of the oldest not yet taken: half the
  // shards' dedup window, leaving room for the pushes of learns already past CheckRoom.
  // Further, a shard that took the newer ones would answer a retry of the old one "below
  // the dedup window" (a refusal for good), and the old push would be lost.
  static constexpr uint64_t kMaxSeqSpan = ps::Dedup::kWindow / 2;

  explicit HeldPushes(size_t max_bytes) : max_bytes_(max_bytes) {}

  // Whether a push that failed with `st` may be taken by a retry (a shard down, slow or
  // not primary), rather than refused for good (bad shape, no such table, too stale).
  static bool MayPassOnRetry(const Status& st);
  // `p`'s push (first attempt or retry) is sent: not taken until Succeeded, or Failed
  // for good.
  void Started(const Push& p);
  // `p`'s push (first attempt or retry) failed with `st`. Returns whether it is held
  // (MayPassOnRetry); otherwise it is dropped, logged as lost.
  bool Failed(const Push& p, const Status& st);
  // `p`'s push was taken: no longer held.
  void Succeeded(const Push& p);
  // The held pushes no retry is in flight for (only the oldest of them with
  // `oldest_only`), marked in flight (Failed or Succeeded ends each).
  std::vector<Push> TakeForRetry(bool oldest_only = false);
  // RESOURCE_EXHAUSTED naming what is held while more than max_bytes are, or while the
  // oldest push not yet taken is kMaxSeqSpan seqs behind the newest; else OK.
  Status CheckRoom() const;
  Stats stats() const;

 private:
  struct Entry {
    Push push;
    bool in_flight = false;
    uint64_t attempts = 1;
    std::string last_error;
  };
  const size_t max_bytes_;
  mutable Mutex mu_;
  std::map<uint64_t, Entry> held_ GUARDED_BY(mu_);  // by seq: oldest first
  // Seqs of pushes started and not yet taken (nor dropped), held or not, by seq.
  std::map<uint64_t, std::string> untaken_ GUARDED_BY(mu_);  // seq -> table
  uint64_t newest_ GUARDED_BY(mu_) = 0;                      // the highest seq started
  Stats stats_ GUARDED_BY(mu_);
};

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_HELD_PUSHES_H_
