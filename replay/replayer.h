// Replayer: runs an ordered stream of pull / push events (a Schedule, or a recorded
// trace turned into events) against a parameter-server cluster, computing each
// gradient with a worker::Model on the parameters that event's pull read. Logical
// mode: one thread issues every call and waits for it, so the PS applies pushes in
// event order and the run is bit-for-bit repeatable. Each virtual worker has its own
// PsClient (its own sender id), so DC-ASGD backups and SSP clocks are per worker.
// Not thread-safe; one Run per object.
#ifndef ONLINEPS_REPLAY_REPLAYER_H_
#define ONLINEPS_REPLAY_REPLAYER_H_

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "ps/table_spec.h"
#include "replay/schedule.h"
#include "replay/staleness_stats.h"
#include "worker/model.h"

namespace onlineps::replay {

class TraceWriter;

// The examples of global batch k (Event::batch). Implementations: dataset batches,
// the examples of a recorded learn call.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual StatusOr<std::vector<worker::Example>> Batch(uint64_t batch) = 0;
  // Held-out examples for evaluation (empty: no evaluation).
  virtual const std::vector<worker::Example>& Test() const = 0;
  // Trace reference of batch k, e.g. {"split":"train","offset":96,"count":32}.
  virtual nlohmann::json Ref(uint64_t batch) const = 0;
};

struct ClusterOptions {
  // Shard endpoints of a running cluster; empty: start `inproc_shards` shards in this
  // process over mem:// (no sockets), stopped when the Replayer is destroyed.
  std::vector<std::string> shards;
  uint32_t inproc_shards = 1;
  std::chrono::milliseconds timeout{30000};  // per PS call
};

struct ReplayOptions {
  // Optimizer, staleness policy, accumulation, averaging: name, kind and shape are
  // filled per model parameter (tables "<table_prefix><param>").
  ps::TableSpec table_template;
  uint64_t eval_every = 0;        // pushes between evaluations (0: only at the end)
  size_t eval_rows = 0;           // test examples per evaluation (0: all)
  bool eval_averaged = false;     // evaluate the Polyak-averaged copy
  bool progressive = false;       // also score each batch before learning it (online accuracy)
  uint64_t sender_base = 1000;    // worker w pushes as sender sender_base + w
  TraceWriter* events = nullptr;  // optional: one pull / push record per event
  // Called about every 0.5 s and at the end with (pushes done, pushes expected).
  std::function<void(uint64_t, uint64_t)> progress;
};

struct EvalRow {
  uint64_t updates = 0;   // pushes applied (rejected ones excluded)
  uint64_t samples = 0;   // examples in those pushes
  double virtual_ms = 0;  // schedule time of the last event
  double wall_s = 0;
  double train_loss = 0;  // mean batch loss since the previous row
  double test_loss = 0;   // mean cross-entropy on the test examples
  double test_accuracy = 0;
  double progressive_accuracy = -1;  // predict-then-learn accuracy so far (-1: off)
};

struct ReplayResult {
  std::vector<EvalRow> curve;
  StalenessStats overall;
  std::vector<StalenessStats> per_worker;        // index: worker
  std::vector<StalenessStats> per_shard;         // index: shard
  uint64_t pulls = 0, pushes = 0, rejected = 0;  // rejected: STALE answers (bounded, reject)
  // The last pushes a shard only accumulated (--accumulate K, or --sync with fewer pushes
  // in the last round than workers): never applied, so not in the final parameters.
  uint64_t queued_at_end = 0;
  double wall_s = 0;
  double compute_s = 0;       // time inside Model::Gradients
  std::string params_sha256;  // of the final parameters (dense, then touched sparse rows)
};

class Replayer {
 public:
  // `model` and `batches` must outlive the Replayer. Creates the model's tables.
  static StatusOr<std::unique_ptr<Replayer>> Create(worker::Model* model, BatchSource* batches,
                                                    const ClusterOptions& cluster,
                                                    ReplayOptions options);
  virtual ~Replayer() = default;
  // Runs events from `next` until it returns false. `expected_pushes` feeds progress.
  virtual StatusOr<ReplayResult> Run(const std::function<bool(Event*)>& next,
                                     uint64_t expected_pushes) = 0;
};

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_REPLAYER_H_
