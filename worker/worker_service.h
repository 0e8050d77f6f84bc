// WorkerService: infer and learn against the PS, plus session context. Torch-free: the
// model hides libtorch behind worker/model.h. Reads go through the ParamCache; learn
// pushes sparse gradients (only the touched rows) at once and dense gradients after
// accumulating k examples or t ms, each with the base version its parameters were read
// at, so the PS measures true staleness. Context is input only and never pushed.
// Thread-safe; calls from many threads run concurrently.
#ifndef ONLINEPS_WORKER_WORKER_SERVICE_H_
#define ONLINEPS_WORKER_WORKER_SERVICE_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "common/periodic_thread.h"
#include "common/status.h"
#include "ps/ps_client.h"
#include "ps/table_spec.h"
#include "worker/accumulator.h"
#include "worker/context_store.h"
#include "worker/group_reducer.h"
#include "worker/held_pushes.h"
#include "worker/local_steps.h"
#include "worker/model.h"
#include "worker/param_cache.h"
#include "worker/request_limits.h"

namespace onlineps::worker {

enum class ReplyWhen {
  kApplied,  // default: learn replies after the PS acknowledged every push
  kQueued,   // learn replies once its pushes are handed to the PS client
};

struct WorkerServiceOptions {
  ParamCacheOptions cache;
  ContextStoreOptions context;
  // Dense gradients: push after accumulating this many examples (1: every learn) ...
  uint32_t accumulate_examples = 1;
  // ... or when the oldest accumulated gradient is this old (0: no time trigger).
  int64_t accumulate_ms = 0;
  ReplyWhen reply_when = ReplyWhen::kApplied;
  // Drop the cached copy of what a push touched once it is acknowledged, so the next
  // read sees it (one pull per learn). false: reads rely on the freshness bounds alone
  // (faster learns, larger measured staleness).
  bool read_own_writes = true;
  // Local-steps mode (0: off): apply dense gradients to a local copy with local_lr and
  // push the parameter delta (flag delta) every local_steps learn calls.
  uint32_t local_steps = 0;
  double local_lr = 0.05;
  // Local group (hierarchical aggregation): when set, dense gradients are summed across
  // the group every group_round_ms and only the leader pushes. If a round fails, this
  // worker pushes its own gradients directly from then on. Must outlive the service.
  GroupReducer* group = nullptr;
  int64_t group_round_ms = 100;
  // What one infer or learn may carry (batch, text, words, features); checked before
  // anything proportional to the request is allocated.
  RequestLimits limits;
  size_t max_inflight_pushes = 256;  // queued mode: pushes not yet acknowledged
  // The dense tables a learn (or flush) pushes go to each shard as one push_batch
  // message instead of one push_dense per table (tables in block bound mode go alone).
  bool batch_pushes = true;
  // Dynamic batching of infer: calls that arrive while the model is busy (from other
  // handler threads) wait, and the next forward pass serves all of them at once, up to
  // limits.max_batch examples. Calls with a session context run alone (the context is
  // input to their own pass). false: every call runs its own pass.
  bool batch_infer = true;
  // How long the first call of a pass waits for more calls before it starts (0: none;
  // the batch is whatever arrived while the previous passes ran).
  std::chrono::microseconds batch_wait{0};
  // Infer passes that may run at once; calls wait (and are batched) only while this many
  // run. 0: one per CPU core (a CPU model's pass uses --torch-threads, 1 by default); on a
  // GPU, 1 gathers the largest batches.
  int infer_passes = 0;
  std::chrono::milliseconds push_timeout{5000};
  // Accumulated learns whose push failed (a shard down or slow) are held and pushed again
  // every held_retry_ms with the same (sender, seq), so none is lost or applied twice.
  // While more than max_held_bytes are held, learns are refused (RESOURCE_EXHAUSTED).
  size_t max_held_bytes = size_t{256} << 20;
  int64_t held_retry_ms = 1000;
  // Table template for CreateTables (optimizer, staleness policy, bounds); name, kind,
  // shape, dim and init come from the model.
  ps::TableSpec table_template;
};

struct Prediction {
  std::string label;
  int64_t index = -1;
  std::vector<float> scores;  // per label, softmax
};

struct InferReply {
  std::vector<Prediction> predictions;
  // Per table, per shard: the version of the copy this call read (sparse: the oldest
  // among its rows from that shard; 0 where it read no row from that shard).
  std::map<std::string, std::vector<uint64_t>> versions;
  uint64_t version = 0;       // the largest of `versions`
  int64_t params_age_ms = 0;  // age of the oldest parameter copy read
};

enum class LearnOutcome {
  kApplied,      // every push acknowledged and applied by the PS
  kQueued,       // pushed, acknowledged as accumulated on the PS, or not yet acknowledged
  kAccumulated,  // dense gradient kept in the worker's accumulator, not yet pushed
};
std::string_view LearnOutcomeName(LearnOutcome o);

struct LearnReply {
  double loss = 0;
  size_t examples = 0;
  LearnOutcome outcome = LearnOutcome::kApplied;
  uint64_t version = 0;  // newest table version after this call's pushes (or read)
  // Per table pushed, per shard: its version there once this call's push was applied
  // (0: the push touched no row of that shard). A reader whose infer `versions` are at
  // least these has seen this learn.
  std::map<std::string, std::vector<uint64_t>> versions;
  uint64_t tau = 0;  // largest staleness the PS measured for this call's pushes
  size_t sparse_rows_pushed = 0;
  bool dense_pushed = false;
  // Tables some shard took this call's push to, even when another push of it failed:
  // a failed learn's error names them (kPartlyApplied).
  std::set<std::string> landed;
};

struct WorkerStats {
  uint64_t infer_requests = 0, infer_examples = 0, learn_requests = 0, learn_examples = 0;
  // Forward passes run for infer: infer_requests / infer_passes is the mean number of
  // calls the batcher served with one pass.
  uint64_t infer_passes = 0;
  uint64_t pushes = 0, push_errors = 0, rejected_nonfinite = 0, max_tau = 0;
  // Payload bytes of the pushes started: 4 per float, 8 per sparse key (frozen
  // parameters never add to it; model_info says what one learn's dense push carries).
  uint64_t push_bytes = 0;
  uint64_t group_rounds = 0;  // local-group rounds completed (0 without a group)
  bool group_active = false;
  size_t inflight_pushes = 0;
  HeldPushes::Stats held;  // accumulated pushes that failed, held to be pushed again
  ParamCacheStats cache;
  ContextStoreStats context;
};

// The PS table of one model parameter: `table_template`'s rules with the parameter's
// name, kind, shape and initializer, and a seed of its own.
ps::TableSpec TableSpecFor(const ParamInfo& p, const ps::TableSpec& table_template);

// Accumulation in the worker (accumulate_examples > 1, or a local group when `grouped`)
// answers learns "accumulated" before their push, and holds a push of them that fails
// under a sender of its own (HeldPushes): wrong for tables whose shards keep state per
// sender (block bound mode, DC-ASGD). INVALID_ARGUMENT naming the flags there; else OK.
Status CheckAccumulationRules(const WorkerServiceOptions& o, bool grouped);

class WorkerService {
 public:
  // `client` and `model` must outlive the service.
  WorkerService(ps::PsClient* client, Model* model, WorkerServiceOptions options);
  ~WorkerService();

  // Creates the model's tables on the PS (idempotent across workers with equal specs),
  // registers them in the cache, starts background threads.
  Status Start();
  // Flushes accumulated gradients, waits for in-flight pushes, stops threads. Idempotent.
  Status Stop();

  // context_revision (the bridge's): refuse with kFailedPrecondition (kContextNotHeld)
  // unless the session's context is held at that revision, before anything is read or
  // pushed; nullopt: use whatever context the session has here.
  StatusOr<InferReply> Infer(const std::string& session, const std::vector<Example>& batch,
                             std::optional<uint64_t> context_revision = std::nullopt);
  StatusOr<LearnReply> Learn(const std::string& session, const std::vector<Example>& batch,
                             std::optional<uint64_t> context_revision = std::nullopt);
  // The same without waiting for the pushes: `done` gets the outcome exactly once, on
  // the PS client's thread that got the last push's reply, or on this one before
  // LearnAsync returns (an error, nothing pushed, and the local-steps and kQueued modes,
  // which run Learn). `batch` may go once LearnAsync returns. `done` must not block.
  using LearnDone = std::function<void(StatusOr<LearnReply>)>;
  void LearnAsync(const std::string& session, const std::vector<Example>& batch, LearnDone done,
                  std::optional<uint64_t> context_revision = std::nullopt);
  // Pushes whatever the accumulators hold now.
  Status Flush();
  // Pushes again the held pushes no attempt is in flight for, and waits for them: the
  // oldest alone first, the others only once a shard took it.
  Status RetryHeld();

  ContextStore& context() { return context_; }
  const Model& model() const { return *model_; }
  const RequestLimits& limits() const { return options_.limits; }
  WorkerStats stats() const;
  // The parameter cache (tests and benchmarks read it directly).
  ParamCache& cache() { return cache_; }
  // Table specs this worker creates (for docs and tests).
  std::vector<ps::TableSpec> TableSpecs() const;

 private:
  // Logs when a sparse table exists with other caps than `asked` (it keeps its own).
  void WarnIfCapsDiffer(const ps::TableSpec& asked);
  struct Read;
  // What one infer forward pass read and computed, shared by the calls it served.
  struct InferRun {
    InferOutput out;
    std::map<std::string, std::vector<uint64_t>> versions;
    uint64_t version = 0;
    int64_t age_ms = 0;
  };
  // One infer call waiting for the batcher.
  struct InferSlot {
    const std::vector<Example>* batch = nullptr;
    std::shared_ptr<InferRun> run;  // set when done and ok
    size_t offset = 0;              // its first example's index in run->out
    Status status;
    bool taken = false;  // in a pass (its own or another leader's): it waits for that one
    bool done = false;
    CondVar cv;  // signalled when done, or when it may lead the next pass
  };
  // `read_failed` (optional): set when the parameters could not be read (the same for
  // every call of a shared pass), not the model's refusal of an example.
  StatusOr<InferRun> RunInfer(const std::vector<Example>& batch, const ContextInput& ctx,
                              bool* read_failed = nullptr);
  // Queues `me` and returns once a pass (led by this thread or another) has served it.
  Status CombineInfer(InferSlot* me);
  void RunInferPass(const std::vector<InferSlot*>& slots);
  // An asynchronous learn waiting for its pushes' replies.
  struct LearnRun {
    Mutex mu;
    LearnReply reply GUARDED_BY(mu);    // the pushes' part (tau, versions, outcome)
    Status first GUARDED_BY(mu);        // the first push error
    size_t pending GUARDED_BY(mu) = 1;  // pushes not done, plus one until all are started
    LearnReply head;                    // the starter's part: written before its count is released
    bool kept = false;
    bool held GUARDED_BY(mu) = false;  // a failed push of it was held (HeldPushes)
    LearnDone done;
    // One more push to wait for; counted before it is sent (its reply may come first).
    void AddPending() {
      MutexLock lock(&mu);
      ++pending;
    }
  };
  // Pushes started by one call, finished by FinishPushes.
  struct Pushes {
    struct One {
      std::string table;
      ps::Ticket ticket;
      std::shared_ptr<ps::PushReply> reply;
      // After the push is acknowledged: makes our cached copy show it (read-your-writes).
      std::function<void(const ps::PushReply&)> forget;
      bool batched = false;  // shares its ticket with the other tables of a push_batch
      // Set for an accumulated push of learns answered before: held when it fails.
      std::shared_ptr<const HeldPushes::Push> held;
    };
    std::vector<One> items;
    // Dense pushes not sent yet: FinishPushes sends them, batched when it may.
    struct Dense {
      ps::DensePush push;
      std::function<void(const ps::PushReply&)> forget;
      std::shared_ptr<const HeldPushes::Push> held;  // goes alone, with its fixed seq
    };
    std::vector<Dense> dense;
    // Sparse pushes not sent yet (batched pushes only: otherwise they go at once).
    struct Sparse {
      ps::SparsePush push;
      std::function<void(const ps::PushReply&)> forget;
    };
    std::vector<Sparse> sparse;
    // LearnAsync: each push's callback reports to it once its own work is done (null:
    // FinishPushes waits for the tickets).
    std::shared_ptr<LearnRun> run;
    bool held = false;  // FinishPushes: a failed push was held (its learns stay taken)
  };
  // Learn up to its pushes: reads, gradients, and the pushes queued in `pushes` (sparse
  // ones started at once when pushes are not batched; local-steps mode: under the
  // caller's lock of local_->mu()).
  Status StartLearn(const std::string& session, std::optional<uint64_t> context_revision,
                    const std::vector<Example>& batch, Pushes* pushes, LearnReply* reply,
                    bool* kept);
  // The session's context input (none without a session), checked at context_revision.
  StatusOr<ContextInput> ContextOf(const std::string& session,
                                   std::optional<uint64_t> context_revision);
  // The last of Learn: the outcome once the pushes are done, and the stats.
  StatusOr<LearnReply> EndLearn(LearnReply reply, bool kept);
  // Folds one push's outcome into `out` (`first`: the first error).
  static void FoldPush(const std::string& table, const ps::PushReply& reply, const Status& st,
                       bool batched, LearnReply* out, Status* first);
  // A failed learn's error naming the tables some shard applied its push to all the same
  // (kPartlyApplied): retrying that learn would apply those parts twice.
  static Status PartlyApplied(const Status& failed, const std::set<std::string>& landed);
  // A push of `run` is done (or, from LearnAsync, every push is started): ends the learn
  // when it was the last.
  void LearnPartDone(const std::shared_ptr<LearnRun>& run);
  // Pushes each dense param's `initial` values into its table, once across all workers,
  // if no update was applied to it yet.
  Status SeedInitialValues();
  Status CheckBatch(const std::vector<Example>& batch, bool need_labels) const;
  Status CheckFinite(const GradOutput& grads);
  // `cache_failed` (optional): set when the error is the cache's (a pull), not the model's.
  StatusOr<Read> ReadParams(const std::vector<Example>& batch, const ContextInput& ctx,
                            bool* cache_failed = nullptr);
  void PushSparse(const std::vector<ps::VersionVector>& base, const GradOutput& grads,
                  Pushes* pushes, LearnReply* out);
  // `answered`: the batch sums learns answered "accumulated" before this push: it is
  // held when it fails (HeldPushes), so it carries a fixed (sender, seq).
  void PushDense(size_t param, Accumulator::Batch batch, Pushes* pushes, bool answered);
  // Whether held pushes may use their own sender: not for tables whose shards key state
  // by sender (block bound mode's held replies, DC-ASGD's backups).
  bool MayHold() const;
  void PushDelta(size_t param, std::vector<float> delta, Pushes* pushes);
  void StartPush(const std::string& table, uint64_t bytes, Pushes* pushes,
                 std::function<void(const ps::PushReply&)> forget,
                 const std::function<ps::Ticket(ps::PushReply*, ps::PsClient::Callback)>& send,
                 std::shared_ptr<const HeldPushes::Push> held = nullptr);
  // A holdable push is done: held (returns true) when it failed in a way a retry mends.
  bool HeldDone(const HeldPushes::Push& p, const Status& st);
  // Sends pushes->dense: one push_batch per shard, or one push per table.
  // Sends the queued dense and sparse pushes: one push_batch per shard when batching is
  // on and there are two or more, else one push each.
  void SendQueued(Pushes* pushes);
  bool BatchesPushes() const;
  // Starts one dense push now, alone (its forget and held moved into the push's item).
  void StartDense(Pushes::Dense* d, Pushes* pushes);
  // Starts one sparse push now (its forget moved into the push's item).
  void StartSparse(Pushes::Sparse* sp, Pushes* pushes);
  // Waits until `n` more pushes may be in flight (max_inflight_pushes), then counts them.
  void ReservePushes(size_t n, uint64_t bytes);
  // `forget` as it runs after an acknowledged push: once, and not at all without
  // read-your-writes.
  std::function<void(const ps::PushReply&)> OnceForget(
      std::function<void(const ps::PushReply&)> forget) const;
  std::function<void(const ps::PushReply&)> ForgetDense(const std::string& table);
  // Read-your-writes through the push reply (PushOptions::updated) rather than dropping
  // the copy and pulling it back: not for DC-ASGD tables, whose shards must record what
  // a pusher reads, nor with --no-read-own-writes.
  bool InstallsPushedValues() const;
  // Whether a push reply's versions make older cached copies stale. Not without
  // read-your-writes where notices flow: the copy then serves until another worker's
  // push is announced (with the age bound alone, a version bound still counts them).
  bool ObservesOwnPushes() const;
  // `warn`: log a failure (once per message, not per table of a batch).
  void OnPushDone(const std::string& table, const ps::PushReply& reply, const Status& st,
                  const std::function<void(const ps::PushReply&)>& forget, bool warn = true);
  // Waits for the pushes (kApplied) or leaves them in flight (kQueued) and fills `out`.
  Status FinishPushes(Pushes& pushes, ReplyWhen when, LearnReply* out);
  Status FlushDue(bool force);
  // The flusher's periodic work: a flush of what is due, or a local-group round.
  void TimedFlush();
  // RetryHeld, at most every held_retry_ms (the flusher's ticks may come more often).
  void RetryHeldIfDue();
  // Pushes `due` again and waits; `*still_held`: one of them failed again and is held.
  Status RetryHeld(std::vector<HeldPushes::Push> due, bool* still_held);
  void GroupTick();
  Status GroupRound();

  ps::PsClient* const client_;
  Model* const model_;
  const WorkerServiceOptions options_;
  ParamCache cache_;
  ContextStore context_;
  std::vector<std::string> dense_tables_;                   // dense params' tables, in model order
  std::vector<size_t> dense_index_;                         // their param indices
  std::vector<std::unique_ptr<Accumulator>> accumulators_;  // per param; null for sparse
  std::unique_ptr<LocalSteps> local_;                       // local-steps mode only
  // Group mode: dense gradients wait here for the next round (never pushed by count).
  std::vector<std::unique_ptr<Accumulator>> group_acc_;
  std::atomic<bool> group_active_{false};
  HeldPushes held_;
  const uint64_t held_sender_;  // the sender of held-able pushes: random per service
  std::atomic<uint64_t> held_seq_{0};
  int64_t last_retry_ms_ = 0;  // the flusher's (and Stop's, once it is stopped)

  Mutex batch_mu_;  // never held while a pass runs
  std::deque<InferSlot*> batch_queue_ GUARDED_BY(batch_mu_);
  int passes_running_ GUARDED_BY(batch_mu_) = 0;
  int max_passes_ = 1;  // set by the constructor from options_.infer_passes

  mutable Mutex mu_;
  WorkerStats stats_ GUARDED_BY(mu_);  // cache and context filled in by stats()
  CondVar inflight_cv_;
  size_t inflight_ GUARDED_BY(mu_) = 0;

  std::atomic<bool> stopping_{false};
  PeriodicThread flusher_;
  std::atomic<bool> started_{false};
};

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_WORKER_SERVICE_H_
