// A recorded trace as replay input: every successful `learn` call (or `learn` record)
// becomes one step, batch k = the k-th learn's examples, served by the worker that
// served it. TraceEvents orders the pulls and pushes so that step k's gradient is
// computed at version k - tau_k (tau_k as recorded, or from a staleness override)
// and applied as push number k: the logical replay of the recording.
// Not thread-safe.
#ifndef ONLINEPS_REPLAY_TRACE_STEPS_H_
#define ONLINEPS_REPLAY_TRACE_STEPS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "replay/delay.h"
#include "replay/replayer.h"
#include "replay/trace.h"

namespace onlineps::replay {

struct TraceStep {
  uint64_t record_seq = 0;        // seq of the record it came from
  double t_ms = 0;                // when the call started (t_us - latency_us)
  uint32_t worker = 0;            // index into TraceSteps::workers
  int64_t recorded_tau = 0;       // -1 when the record has none
  int64_t recorded_version = -1;  // model version after it was applied (-1: unknown)
  std::vector<worker::Example> examples;
};

struct TraceSteps {
  TraceHeader header;
  std::vector<std::string> labels;   // from the header's model, else the option
  std::vector<std::string> workers;  // distinct worker names in order of appearance
  std::vector<TraceStep> steps;
  uint64_t records = 0, skipped = 0;  // skipped: errors, infers, context calls
  bool truncated_tail = false;
  double duration_ms = 0;  // of the recording (last t_us)
};

// Reads every record. `labels` is used when the header has no model labels. A learn
// of n examples becomes ceil(n / learn_chunk) steps, as the bridge sends it (one push
// per chunk). Steps are ordered by the recorded model version when every learn has
// one, i.e. in the order the PS applied them (records are written in the order calls
// finished, which concurrent sessions can swap). `limit` > 0 keeps the first `limit` learn records.
// Errors: the reader's (file:line), a learn whose label is not among the labels, a malformed
// example.
StatusOr<TraceSteps> LoadTraceSteps(const std::string& path, std::vector<std::string> labels,
                                    uint64_t limit = 0, uint32_t learn_chunk = 64);

// Batches of a TraceSteps (batch k = step k), with no test set unless one is given.
class TraceBatches : public BatchSource {
 public:
  TraceBatches(const TraceSteps* steps, std::vector<worker::Example> test)
      : steps_(steps), test_(std::move(test)) {}
  StatusOr<std::vector<worker::Example>> Batch(uint64_t batch) override;
  const std::vector<worker::Example>& Test() const override { return test_; }
  nlohmann::json Ref(uint64_t batch) const override;

 private:
  const TraceSteps* steps_;
  std::vector<worker::Example> test_;
};

// The events of a logical replay of `steps`, `loops` times over. Staleness of step k:
// `override` sampled with `seed` when given, else as recorded (0 when not recorded);
// always clamped to [0, k].
std::vector<Event> TraceEvents(const TraceSteps& steps, std::optional<Delay> override,
                               uint64_t seed, uint32_t loops = 1);

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_TRACE_STEPS_H_
