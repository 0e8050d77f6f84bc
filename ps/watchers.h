// Watchers: a shard's table-change notices (docs/protocol.md, "21 · watch"). A watch
// names tables with the version the watcher holds of each; it is answered as soon as one
// of them differs here, or when its wait ends (a heartbeat), with the version of every
// named table and, for a sparse table that changed, the keys pushed since the watcher's
// version (or "all" once they are no longer remembered). One answer per watch: the
// watcher sends the next one, so notices coalesce while it is busy. Every answer carries
// this object's incarnation, new at every start of the shard: a watcher that sees it
// change knows the versions it holds may name another history. Thread-safe.
#ifndef ONLINEPS_PS_WATCHERS_H_
#define ONLINEPS_PS_WATCHERS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/frame.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/wire.h"
#include "ps/table.h"

namespace onlineps::ps {

struct WatchersOptions {
  // Held at once; past it a watch gets RESOURCE_EXHAUSTED, as past max_watches x 1,024
  // tables named by the held watches in all.
  size_t max_watches = 4096;
  size_t max_logged_keys = 65536;  // per sparse table: keys of recent pushes remembered
  uint64_t max_wait_ms = 60000;    // a longer requested wait is cut to this
};

class Watchers {
 public:
  using TableMap = std::map<std::string, std::shared_ptr<Table>>;
  using TablesFn = std::function<std::shared_ptr<const TableMap>()>;
  using ReplyFn = std::function<void(const std::string& peer, const Header& reply, Frames payload)>;

  // `tables` returns the shard's tables now; `reply` sends an answer (thread-safe).
  Watchers(WatchersOptions options, TablesFn tables, ReplyFn reply);

  // A watch from `peer`: answered at once when a named table differs, else held until
  // one does or its wait ends. Errors (the caller answers them): kInvalidArgument for a
  // bad field or more tables than allowed, kResourceExhausted past max_watches (or their
  // tables in all), kUnavailable once stopped.
  Status Watch(const std::string& peer, const Header& req, uint64_t now_ms);

  // Wraps the apply of a sparse push to `table`: a watch answer never reads the version
  // the push makes without its keys. `apply` returns the push's result; its keys, and the
  // rows it evicted (PushResult::evicted), are remembered once some watch has named the
  // table.
  StatusOr<PushResult> ApplySparse(const std::string& table, const uint64_t* keys, size_t n,
                                   const std::function<StatusOr<PushResult>()>& apply);
  // After a push (dense or sparse) to `table` from `pusher`: answers the watches it
  // concerns, except the pusher's own (its push reply tells it the new version); an
  // empty `pusher` answers that one too (a push that evicted rows: the reply names none).
  void Changed(const std::string& table, std::string_view pusher);
  // Answers every watch whose wait has ended (call periodically).
  void Expire(uint64_t now_ms);
  // After the whole state was replaced (a snapshot from the primary): changed keys are
  // no longer known; watches learn "all" for sparse tables that changed.
  void Reset();
  // Answers every held watch with the current versions; later watches are refused.
  void Stop();

  size_t held() const;

 private:
  struct Held {
    std::string peer;
    Header req;
    std::map<std::string, uint64_t> known;  // table -> version the watcher holds
    uint64_t deadline_ms = 0;
  };
  // Keys of recent pushes to one sparse table.
  struct ChangeLog {
    struct Entry {
      uint64_t to;  // version at which the keys are visible
      std::vector<uint64_t> keys;
    };
    // Shared by pushes across apply + record; exclusive while an answer reads a version
    // and the keys that led to it.
    SharedMutex gate ACQUIRED_BEFORE(mu);
    Mutex mu;
    bool active GUARDED_BY(mu) = false;  // recording: some watch named the table
    uint64_t since GUARDED_BY(mu) = 0;   // every push that made a version > since is here
    std::deque<Entry> entries GUARDED_BY(mu);
    size_t keys GUARDED_BY(mu) = 0;
  };

  ChangeLog* LogOf(const std::string& table);
  // Whether some table named by `w` differs from the version the watcher holds.
  bool Differs(const Held& w, const TableMap& tables) const;
  void Answer(const Held& w);
  // Takes the held watches `due` selects out of held_ and answers them.
  void AnswerHeld(const std::function<bool(const Held&)>& due);

  const WatchersOptions options_;
  const TablesFn tables_;
  const ReplyFn reply_;
  const std::string incarnation_;  // random, 16 hex digits

  Mutex logs_mu_ ACQUIRED_BEFORE(mu_);
  std::map<std::string, std::unique_ptr<ChangeLog>> logs_ GUARDED_BY(logs_mu_);  // never erased

  mutable Mutex mu_;
  std::vector<Held> held_ GUARDED_BY(mu_);
  size_t held_names_ GUARDED_BY(mu_) = 0;  // the tables held_ names, summed
  bool stopped_ GUARDED_BY(mu_) = false;
  std::atomic<size_t> num_held_{0};  // held_.size(), read without mu_ on every push
};

}  // namespace onlineps::ps

#endif  // ONLINEPS_PS_WATCHERS_H_
