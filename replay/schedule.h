// Virtual-clock schedule: turns a worker model (compute and network delays, speed
// skew, stragglers, churn, or a direct staleness override) into one ordered stream
// of pull / push / join / leave events for an executor to run against a real PS.
// Deterministic for a seed: the same options give the same events, bit for bit.
#ifndef ONLINEPS_REPLAY_SCHEDULE_H_
#define ONLINEPS_REPLAY_SCHEDULE_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "common/status.h"
#include "replay/delay.h"

namespace onlineps::replay {

// Compute times of `worker` are multiplied by `factor` for the steps whose compute
// starts (= its pull event's t_ms) in [from_ms, to_ms). Overlapping entries multiply.
struct Straggler {
  uint32_t worker = 0;
  double from_ms = 0, to_ms = 0;
  double factor = 1;
};

// `worker` is active only in [join_ms, leave_ms); leave_ms = +inf: never leaves. A
// worker with no entry is active from 0 forever; several entries of one worker must
// not overlap (it rejoins). A leaving worker finishes nothing more: a pull reply or
// push arriving at or after leave_ms is abandoned (no event). Only workers with
// entries get kJoin / kLeave events.
struct Churn {
  uint32_t worker = 0;
  double join_ms = 0;
  double leave_ms = std::numeric_limits<double>::infinity();
};

// kAsync: each worker loops pull -> compute -> push on its own.
// kSync: rounds; every active worker pulls the same version, computes, pushes; the
// round's pushes are applied together (the PS accumulates them) and the next round
// starts when the slowest pushed.
enum class SyncMode { kAsync, kSync };

struct ScheduleOptions {
  uint32_t workers = 1;
  uint64_t updates = 100;  // pushes to schedule: the stream ends after this many
  Delay compute = Delay::Parse("fixed:1").value();  // per-step compute time, ms
  // Per-message network delay, ms: the pull (request + reply) counts once, the push once.
  Delay message = Delay::Parse("none").value();
  std::vector<double> speed;  // per-worker compute-time multiplier; empty: all 1
  std::vector<Straggler> stragglers;
  std::vector<Churn> churn;
  // Direct staleness override (when set and not "none"): ordering ignores timing
  // (compute, message, speed; stragglers and churn are refused; async mode only) and
  // every event has t_ms = 0. A pull at version v queues its push with due = v + tau,
  // tau = round(staleness.Sample()); each worker has at most one step in flight. Each
  // Next() takes the first rule that applies (v = pushes applied so far; "first" push
  // = smallest due, ties: earliest pull; a pull needs a free worker and applied + queued
  // < updates, and goes to the next free worker round-robin after the last puller):
  //   1. the first push is overdue (due < v): apply it;
  //   2. nobody has pulled at v yet: pull;
  //   3. the first push is due (due == v): apply it;
  //   4. the queue is empty or holds no more pushes than versions before the first
  //      is due (size <= due - v): pull again at v;
  //   5. apply the first push early.
  // expected_tau is what the PS measures (v at apply - base). fixed:T with workers >= T+1:
  // every push after the first T+1 has expected_tau == T. Random tau is approximated: the measured
  // mean is somewhat below the sampled one (e.g. 2.97 for uniform:0,4, whose rounded mean is 4).
  std::optional<Delay> staleness;
  SyncMode mode = SyncMode::kAsync;
  uint64_t seed = 1;
};

enum class EventKind { kPull, kPush, kJoin, kLeave };

struct Event {
  uint64_t seq = 0;  // 0, 1, 2, ...: execute in this order
  double t_ms = 0;   // virtual time; nondecreasing in seq (0 in staleness mode)
  EventKind kind = EventKind::kPull;
  uint32_t worker = 0;
  uint64_t step = 0;   // per-worker step number (pulls); a push carries its pull's step
  uint64_t batch = 0;  // global batch: the k-th pull of the run gets k; a push carries it
  // Pull: the version read. Push: the base version it was computed at. Async: pushes
  // applied so far. Sync: rounds applied so far (a round is applied after its last
  // push, i.e. before the first event of the next version).
  uint64_t version = 0;
  uint64_t expected_tau = 0;  // push: pushes applied between its pull and it (0 in sync)
};

// A whole schedule with its staleness summary (over pushes).
struct Schedule {
  std::vector<Event> events;
  std::vector<uint64_t> tau_histogram;  // index = expected_tau
  std::vector<uint64_t> worker_pushes;  // index = worker
  double duration_ms = 0;               // t_ms of the last event
  uint64_t pushes = 0;

  double TauMean() const;
  // Smallest tau with at least a fraction q of the pushes at or below it (0 if none).
  uint64_t TauQuantile(double q) const;
  uint64_t TauMax() const;
};

// Streaming form: events one at a time, O(workers) memory. Not thread-safe.
//
// Async timing semantics: an active worker starts a pull (the message delay passes,
// then the pull event, stamped at the reply, reads the pushes applied by then),
// computes for compute.Sample() * speed[w] * straggler factors, and its push arrives
// one message delay later and is applied at once (version + 1); then the worker pulls
// again. Simultaneous events go by worker id, then by scheduling order. A pull starts
// only while applied + in-flight pushes < updates; a worker refused one waits and is
// woken (lowest id first) when a leaving worker abandons its step.
//
// Sync: a round starts at T with the workers active at T (lowest ids first, no more
// than the pushes still needed); they pull version r at T + message, and the round
// ends at the latest push (or leave of a participant that abandons). A round whose
// pushes were all abandoned applies nothing (the version stays).
class Scheduler {
 public:
  virtual ~Scheduler() = default;
  // Validates the options (see BuildSchedule).
  static StatusOr<std::unique_ptr<Scheduler>> Create(const ScheduleOptions& options);
  // Writes the next event; false when `updates` pushes were emitted or every worker left.
  virtual bool Next(Event* out) = 0;
};

// The whole schedule in memory. INVALID_ARGUMENT naming the field for: workers < 1,
// speed size not 0 or workers, speed <= 0, straggler / churn worker >= workers, factor
// <= 0, to_ms <= from_ms, leave_ms <= join_ms, overlapping churn of one worker,
// staleness with sync / stragglers / churn, and updates > 1e8.
StatusOr<Schedule> BuildSchedule(const ScheduleOptions& options);

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_SCHEDULE_H_
