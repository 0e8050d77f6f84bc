#include "worker/worker_service.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <thread>

#include "common/clock.h"
#include "common/partition.h"
#include "worker/guarded.h"
#include "worker/local_steps.h"

namespace onlineps::worker {
namespace {

int64_t Now() { return static_cast<int64_t>(NowMs()); }

bool AllFinite(const std::vector<float>& v) {
  float acc = 0;
  // x * 0 is 0 for finite x and NaN otherwise: one branch-free pass.
  for (float x : v) acc += x * 0.0f;
  return acc == 0.0f;
}

Status NonFinite(const std::string& what) {
  return onlineps::NonFinite(what + " is NaN or Inf; nothing was pushed");
}

ContextStoreOptions WithModelFeatures(ContextStoreOptions o, const Model& model) {
  o.model_features = model.context_features();
  return o;
}

// Random, so that a restarted worker's held pushes (seqs from 1 again) are not taken by
// the shards for duplicates of the last run's.
uint64_t NewHeldSender() {
  std::random_device rd;
  return ((uint64_t{rd()} << 32) ^ rd()) | 1;
}

}  // namespace

std::string_view LearnOutcomeName(LearnOutcome o) {
  switch (o) {
    case LearnOutcome::kApplied:
      return "applied";
    case LearnOutcome::kQueued:
      return "queued";
    case LearnOutcome::kAccumulated:
      return "accumulated";
  }
  return "unknown";
}

// Everything one call read: views handed to the model plus the versions a gradient on
// them must carry.
struct WorkerService::Read {
  ParamView view;
  std::vector<std::shared_ptr<const DenseSnapshot>> dense;
  std::vector<SparseRows> rows;
  std::vector<ps::VersionVector> base;  // per param
  std::vector<ps::VersionVector> read;  // per param: the versions actually read
  uint64_t version = 0;                 // the largest of `read`
  int64_t oldest_ms = 0;
};

WorkerService::WorkerService(ps::PsClient* client, Model* model, WorkerServiceOptions options)
    : client_(client),
      model_(model),
      options_(std::move(options)),
      cache_(client, options_.cache),
      context_(WithModelFeatures(options_.context, *model)),
      held_(options_.max_held_bytes),
      held_sender_(NewHeldSender()) {
  if (options_.infer_passes > 0) {
    max_passes_ = options_.infer_passes;
  } else if (model_->device().rfind("cuda", 0) == 0) {
    max_passes_ = 1;  // one device: the largest batches
  } else {
    max_passes_ = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  }
}

WorkerService::~WorkerService() { static_cast<void>(Stop()); }

Status CheckAccumulationRules(const WorkerServiceOptions& o, bool grouped) {
  if (!grouped && o.accumulate_examples <= 1) return Status::Ok();
  const ps::TableSpec& t = o.table_template;
  std::string rule, fix;
  if (ps::RecordsPullBackups(t)) {
    rule = "--staleness-policy " + t.staleness +
           ": a DC-ASGD table compensates each push against what its sender last pulled";
    fix = "another --staleness-policy";
  } else if (ps::HoldsReplies(t)) {
    rule = "--bound-mode block (--max-staleness " + std::to_string(t.max_staleness) +
           "): the shards hold a push's reply by its sender's push count";
    fix = "--bound-mode reject";
  } else {
    return Status::Ok();
  }
  const std::string what = grouped
                               ? std::string("--group")
                               : "--accumulate-examples " + std::to_string(o.accumulate_examples);
  return InvalidArgument(what + " with " + rule +
                         ", and a push of accumulated learns that failed (a shard down) could "
                         "only be pushed again under a sender of its own: learns answered "
                         "'accumulated' would be lost. Use " +
                         (grouped ? "no --group" : "--accumulate-examples 1") +
                         " (each learn then waits for its own push) or " + fix);
}

ps::TableSpec TableSpecFor(const ParamInfo& p, const ps::TableSpec& table_template) {
  ps::TableSpec s = table_template;
  s.name = p.name;
  s.init = p.init;
  s.init_value = p.init_value;
  // Different tables must not start from the same random stream.
  s.seed = table_template.seed ^ HashString(p.name);
  if (p.kind == ParamKind::kDense) {
    s.kind = ps::TableKind::kDense;
    s.shape = p.shape;
    s.admit_after = 0;  // the caps are for sparse rows
    s.ttl_ms = 0;
    s.max_rows = 0;
  } else {
    s.kind = ps::TableKind::kSparse;
    s.dim = static_cast<uint32_t>(p.size());
  }
  return s;
}

std::vector<ps::TableSpec> WorkerService::TableSpecs() const {
  std::vector<ps::TableSpec> specs;
  for (const ParamInfo& p : model_->params()) {
    specs.push_back(TableSpecFor(p, options_.table_template));
    specs.back().base = model_->base();
  }
  return specs;
}

// A table that existed keeps the caps it was created with (ps/table_spec.h).
void WorkerService::WarnIfCapsDiffer(const ps::TableSpec& asked) {
  auto have = client_->OpenTable(asked.name);
  if (!have.ok()) return;  // the first pull reads the spec again and reports
  if (have->max_rows == asked.max_rows && have->ttl_ms == asked.ttl_ms &&
      have->admit_after == asked.admit_after) {
    return;
  }
  spdlog::warn(
      "table '{}' exists with {}; this worker's flags ask {}: the table keeps its caps (they "
      "are fixed when a table is created)",
      asked.name, ps::DescribeCaps(*have), ps::DescribeCaps(asked));
}

Status WorkerService::Start() {
  if (started_.exchange(true)) return Status::Ok();
  ONLINEPS_RETURN_IF_ERROR(CheckAccumulationRules(options_, options_.group != nullptr));
  const auto& params = model_->params();
  // A per-table freshness bound (--freshness) must name one of the model's tables: a
  // misspelt one would leave the table it meant on the default bound, unnoticed.
  for (const auto& entry : options_.cache.tables) {
    const std::string& table = entry.first;
    if (std::none_of(params.begin(), params.end(),
                     [&](const ParamInfo& p) { return p.name == table; })) {
      std::string names;
      for (const ParamInfo& p : params) names += (names.empty() ? "" : ", ") + p.name;
      return InvalidArgument("--freshness names table '" + table +
                             "', which this model does not have (its tables: " + names + ")");
    }
  }
  for (const ps::TableSpec& spec : TableSpecs()) {
    Status st = client_->CreateTable(spec);
    if (!st.ok()) {
      // Only a table that exists with another spec may be another worker's doing.
      return Status(st.code(), "creating table '" + spec.name + "': " + st.message() +
                                   (st.code() == StatusCode::kAlreadyExists
                                        ? " (another worker may have created it with other options)"
                                        : ""));
    }
    if (spec.kind == ps::TableKind::kSparse) WarnIfCapsDiffer(spec);
  }
  ONLINEPS_RETURN_IF_ERROR(SeedInitialValues());
  accumulators_.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].kind == ParamKind::kDense) {
      cache_.AddDense(params[i].name, params[i].size());
      dense_tables_.push_back(params[i].name);
      dense_index_.push_back(i);
      accumulators_[i] = std::make_unique<Accumulator>(
          params[i].size(), std::max<uint32_t>(options_.accumulate_examples, 1),
          options_.accumulate_ms);
    } else {
      cache_.AddSparse(params[i].name, static_cast<uint32_t>(params[i].size()));
    }
  }
  if (options_.local_steps > 0) {
    local_ = std::make_unique<LocalSteps>(&cache_, model_, options_.local_steps, options_.local_lr);
  }
  if (options_.group != nullptr) {
    group_acc_.resize(params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].kind != ParamKind::kDense) continue;
      group_acc_[i] = std::make_unique<Accumulator>(params[i].size(), UINT64_MAX, 0);
    }
    group_active_ = true;
  }
  cache_.Start();
  if (options_.group) {
    flusher_.Start(
        std::chrono::milliseconds(std::max<int64_t>(options_.group_round_ms, 1)),
        [this] { GroupTick(); }, /*tick_first=*/false);
  } else if (options_.accumulate_ms > 0 || options_.accumulate_examples > 1) {
    // Also without a time trigger: held pushes are retried from here.
    const int64_t period =
        options_.accumulate_ms > 0 ? options_.accumulate_ms / 4 : options_.held_retry_ms;
    flusher_.Start(
        std::chrono::milliseconds(std::max<int64_t>(period, 1)), [this] { TimedFlush(); },
        /*tick_first=*/false);
  }
  return Status::Ok();
}

Status WorkerService::SeedInitialValues() {
  for (const ParamInfo& p : model_->params()) {
    if (p.kind != ParamKind::kDense || p.initial.empty()) continue;
    std::vector<float> now(p.size());
    ps::VersionVector versions;
    ONLINEPS_RETURN_IF_ERROR(client_->PullDense(p.name, now.data(), &versions).Wait());
    // A table someone already updated holds trained values: leave it alone.
    if (*std::max_element(versions.begin(), versions.end()) != 0) continue;
    std::vector<float> delta(p.size());
    for (size_t j = 0; j < delta.size(); ++j) delta[j] = p.initial[j] - now[j];
    // Every worker seeding this table sends the same (sender, seq): applied once.
    ps::PushOptions opts;
    opts.delta = true;
    opts.seed = true;  // the file's values, whole: --clip-norm bounds gradients
    opts.sender = HashString("onlineps-seed:" + p.name) | 1;
    opts.seq = 1;
    ps::PushReply reply;
    Status st = client_->PushDense(p.name, delta.data(), versions, &reply, opts).Wait();
    if (!st.ok()) return Status(st.code(), "seeding table '" + p.name + "': " + st.message());
    spdlog::info("table '{}' seeded with the model file's values{}", p.name,
                 reply.duplicate ? " (by another worker first)" : "");
  }
  return Status::Ok();
}

Status WorkerService::Stop() {
  if (!started_.load()) return Status::Ok();
  if (stopping_.exchange(true)) return Status::Ok();
  flusher_.Stop();
  group_active_ = false;
  Status st = Flush();
  {
    MutexLock lock(&mu_);
    inflight_cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return inflight_ == 0; });
  }
  // One more try (bounded by the push timeout) for what a shard did not take before.
  // A ticket's Wait returns before its callback has run: wait for those too, or one
  // would run on this service destroyed.
  static_cast<void>(RetryHeld());
  {
    MutexLock lock(&mu_);
    inflight_cv_.Wait(&mu_, [&]() REQUIRES(mu_) { return inflight_ == 0; });
  }
  if (const HeldPushes::Stats held = held_.stats(); held.pushes > 0) {
    spdlog::error(
        "stopping with {} accumulated pushes ({} learns answered 'accumulated') the PS has "
        "not taken: they are lost",
        held.pushes, held.calls);
    if (st.ok()) {
      st = Unavailable("stopped with " + std::to_string(held.calls) +
                       " accumulated learns the PS did not take");
    }
  }
  cache_.Stop();
  return st;
}

void WorkerService::TimedFlush() {
  Status st = FlushDue(/*force=*/false);
  if (!st.ok()) spdlog::warn("timed flush of accumulated gradients failed: {}", st.ToString());
  RetryHeldIfDue();
}

void WorkerService::RetryHeldIfDue() {
  if (Now() - last_retry_ms_ < options_.held_retry_ms) return;
  last_retry_ms_ = Now();
  static_cast<void>(RetryHeld());
}

Status WorkerService::Flush() { return FlushDue(/*force=*/true); }

Status WorkerService::FlushDue(bool force) {
  Pushes pushes;
  for (size_t i = 0; i < accumulators_.size(); ++i) {
    if (accumulators_[i] == nullptr) continue;
    auto batch = accumulators_[i]->TakeIfDue(Now(), force);
    // Every learn in it was answered "accumulated" already.
    if (batch) PushDense(i, std::move(*batch), &pushes, /*answered=*/true);
    // What a left or broken group did not aggregate goes out directly.
    if (i < group_acc_.size() && group_acc_[i] && !group_active_) {
      if (auto left = group_acc_[i]->TakeIfDue(Now(), true))
        PushDense(i, std::move(*left), &pushes, /*answered=*/true);
    }
  }
  LearnReply ignored;
  return FinishPushes(pushes, ReplyWhen::kApplied, &ignored);
}

Status WorkerService::CheckBatch(const std::vector<Example>& batch, bool need_labels) const {
  if (batch.empty()) return InvalidArgument("no examples");
  // The RPC checked these before building `batch`; in-process callers meet them here,
  // still before any tokenizing or pull.
  const RequestLimits& limits = options_.limits;
  ONLINEPS_RETURN_IF_ERROR(CheckBatchSize(batch.size(), limits));
  size_t words = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const std::string where = "examples[" + std::to_string(i) + "]";
    ONLINEPS_RETURN_IF_ERROR(CheckTextBytes(batch[i].text.size(), where + ".text", limits));
    ONLINEPS_RETURN_IF_ERROR(
        CheckFeatureCount(batch[i].features.size(), where + ".features", limits));
    words += CountWords(batch[i].text);
  }
  ONLINEPS_RETURN_IF_ERROR(CheckTokens(words, limits));
  if (!need_labels) return Status::Ok();
  const auto n = static_cast<int64_t>(model_->labels().size());
  for (size_t i = 0; i < batch.size(); ++i) {
    if (batch[i].label < 0 || batch[i].label >= n) {
      return InvalidArgument("example " + std::to_string(i) + " has no valid label (label index " +
                             std::to_string(batch[i].label) + ", model has " + std::to_string(n) +
                             " labels)");
    }
  }
  return Status::Ok();
}

StatusOr<WorkerService::Read> WorkerService::ReadParams(const std::vector<Example>& batch,
                                                        const ContextInput& ctx,
                                                        bool* cache_failed) {
  const auto& params = model_->params();
  ONLINEPS_ASSIGN_OR_RETURN(auto keys,
                            Guarded("the model", [&] { return model_->SparseKeys(batch, ctx); }));
  // From here on an error is the cache's (a pull), not the model's about an example.
  if (cache_failed != nullptr) *cache_failed = true;
  Read r;
  r.view.dense.assign(params.size(), nullptr);
  r.view.sparse.assign(params.size(), nullptr);
  r.dense.resize(params.size());
  r.rows.resize(params.size());
  r.base.resize(params.size());
  r.read.resize(params.size());
  r.oldest_ms = Now();
  // Every dense table in one call: stale ones are pulled concurrently.
  ONLINEPS_ASSIGN_OR_RETURN(auto snaps, cache_.DenseAll(dense_tables_));
  for (size_t d = 0; d < dense_index_.size(); ++d) {
    const size_t i = dense_index_[d];
    r.dense[i] = std::move(snaps[d]);
    r.view.dense[i] = r.dense[i]->values.data();
    r.base[i] = r.dense[i]->versions;
    r.read[i] = r.dense[i]->versions;
    r.oldest_ms = std::min(r.oldest_ms, r.dense[i]->fetched_ms);
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const ParamInfo& p = params[i];
    if (p.kind == ParamKind::kSparse) {
      SparseRows& rows = r.rows[i];
      rows.keys = std::move(keys[i]);
      rows.values.resize(rows.keys.size() * p.size());
      if (!rows.keys.empty()) {
        ONLINEPS_RETURN_IF_ERROR(cache_.Sparse(p.name, rows.keys.data(), rows.keys.size(),
                                               rows.values.data(), &r.base[i], &r.read[i]));
      }
      // One entry per shard, 0 where no row was read (docs/protocol.md, infer replies).
      r.read[i].resize(client_->num_shards(), 0);
      r.view.sparse[i] = &rows;
    }
    for (uint64_t v : r.read[i]) r.version = std::max(r.version, v);
  }
  if (cache_failed != nullptr) *cache_failed = false;
  return r;
}

StatusOr<WorkerService::InferRun> WorkerService::RunInfer(const std::vector<Example>& batch,
                                                          const ContextInput& ctx,
                                                          bool* read_failed) {
  ONLINEPS_ASSIGN_OR_RETURN(Read read, ReadParams(batch, ctx, read_failed));
  ONLINEPS_ASSIGN_OR_RETURN(
      InferOutput out, Guarded("the model", [&] { return model_->Infer(batch, ctx, read.view); }));
  InferRun run;
  run.out = std::move(out);
  run.version = read.version;
  for (size_t i = 0; i < model_->params().size(); ++i) {
    run.versions[model_->params()[i].name] = read.read[i];
  }
  run.age_ms = Now() - read.oldest_ms;
  {
    MutexLock lock(&mu_);
    stats_.infer_passes++;
  }
  return run;
}

Status WorkerService::CombineInfer(InferSlot* me) {
  MutexLock lock(&batch_mu_);
  batch_queue_.push_back(me);
  while (!me->done) {
    if (me->taken || passes_running_ >= max_passes_) {
      me->cv.Wait(&batch_mu_);
      continue;
    }
    // Lead a pass: everything queued, in arrival order, up to max_batch examples (this
    // call itself may be left for the next pass when older calls fill it).
    passes_running_++;
    if (options_.batch_wait.count() > 0) {
      const auto until = std::chrono::steady_clock::now() + options_.batch_wait;
      me->cv.WaitUntil(&batch_mu_, until, [] { return false; });
    }
    std::vector<InferSlot*> slots;
    size_t examples = 0;
    while (!batch_queue_.empty() &&
           (slots.empty() ||
            examples + batch_queue_.front()->batch->size() <= options_.limits.max_batch)) {
      examples += batch_queue_.front()->batch->size();
      slots.push_back(batch_queue_.front());
      slots.back()->taken = true;
      batch_queue_.pop_front();
    }
    // Another leader, waking first, took every queued call (this one's too): no pass.
    if (slots.empty()) {
      passes_running_--;
      continue;
    }
    lock.Unlock();
    // Whatever throws, the pass ends below: its calls are answered and the pass is free.
    const Status threw = Guarded("infer", [&] {
      RunInferPass(slots);
      return Status::Ok();
    });
    for (InferSlot* s : slots) {
      if (!threw.ok() && s->run == nullptr && s->status.ok()) s->status = threw;
    }
    lock.Lock();
    passes_running_--;
    for (InferSlot* s : slots) {
      s->done = true;
      if (s != me) s->cv.Signal();
    }
    // A pass is free: the oldest waiting call leads the next one.
    if (!batch_queue_.empty()) batch_queue_.front()->cv.Signal();
  }
  return me->status;
}

void WorkerService::RunInferPass(const std::vector<InferSlot*>& slots) {
  auto alone = [this](InferSlot* s) {
    StatusOr<InferRun> run = RunInfer(*s->batch, ContextInput{});
    s->offset = 0;
    if (run.ok()) {
      s->run = std::make_shared<InferRun>(std::move(*run));
    } else {
      s->status = run.status();
    }
  };
  if (slots.size() == 1) return alone(slots[0]);
  std::vector<Example> all;
  for (InferSlot* s : slots) {
    s->offset = all.size();
    all.insert(all.end(), s->batch->begin(), s->batch->end());
  }
  bool read_failed = false;
  StatusOr<InferRun> run = RunInfer(all, ContextInput{}, &read_failed);
  if (!run.ok()) {
    // A read failed (a shard down, a deadline): the same for every call, and running
    // each alone would wait for it once per call, one after another.
    if (read_failed) {
      for (InferSlot* s : slots) s->status = run.status();
      return;
    }
    // A model error names an example of the combined batch: run each call alone so that
    // each gets its own answer, and its own error naming its own example.
    for (InferSlot* s : slots) alone(s);
    return;
  }
  auto shared = std::make_shared<InferRun>(std::move(*run));
  for (InferSlot* s : slots) s->run = shared;
}

StatusOr<ContextInput> WorkerService::ContextOf(const std::string& session,
                                                std::optional<uint64_t> context_revision) {
  if (session.empty()) return ContextInput{};
  if (context_revision) return context_.InputAt(session, *context_revision);
  return context_.Input(session);
}

StatusOr<InferReply> WorkerService::Infer(const std::string& session,
                                          const std::vector<Example>& batch,
                                          std::optional<uint64_t> context_revision) {
  ONLINEPS_RETURN_IF_ERROR(CheckBatch(batch, /*need_labels=*/false));
  ONLINEPS_ASSIGN_OR_RETURN(const ContextInput ctx, ContextOf(session, context_revision));
  std::shared_ptr<InferRun> run;
  size_t offset = 0;
  if (options_.batch_infer && ctx.empty()) {
    InferSlot me;
    me.batch = &batch;
    ONLINEPS_RETURN_IF_ERROR(CombineInfer(&me));
    run = std::move(me.run);
    offset = me.offset;
  } else {
    ONLINEPS_ASSIGN_OR_RETURN(InferRun alone, RunInfer(batch, ctx));
    run = std::make_shared<InferRun>(std::move(alone));
  }
  InferReply reply;
  reply.version = run->version;
  reply.versions = run->versions;
  if (run->out.scores.size() != batch.size()) {
    // A pass shared with other calls: a sparse table's versions are the oldest rows the
    // whole pass read; a shard none of this call's rows came from is 0 for it.
    ONLINEPS_ASSIGN_OR_RETURN(
        auto keys, Guarded("the model", [&] { return model_->SparseKeys(batch, ContextInput{}); }));
    const auto& params = model_->params();
    const auto shards = static_cast<uint32_t>(client_->num_shards());
    reply.version = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      auto& v = reply.versions[params[i].name];
      if (params[i].kind == ParamKind::kSparse) {
        std::vector<bool> read(shards, false);
        for (uint64_t k : keys[i]) read[ShardOfKey(k, shards)] = true;
        for (uint32_t sh = 0; sh < shards && sh < v.size(); ++sh) {
          if (!read[sh]) v[sh] = 0;
        }
      }
      for (uint64_t x : v) reply.version = std::max(reply.version, x);
    }
  }
  reply.params_age_ms = run->age_ms;
  const auto& labels = model_->labels();
  // The calls of one pass read disjoint ranges of its output.
  for (size_t i = offset; i < offset + batch.size() && i < run->out.scores.size(); ++i) {
    Prediction p;
    p.index = run->out.predicted[i];
    p.label = labels[static_cast<size_t>(p.index)];
    p.scores = std::move(run->out.scores[i]);
    reply.predictions.push_back(std::move(p));
  }
  {
    MutexLock lock(&mu_);
    stats_.infer_requests++;
    stats_.infer_examples += batch.size();
  }
  return reply;
}

Status WorkerService::CheckFinite(const GradOutput& g) {
  Status st;
  const auto& params = model_->params();
  if (!std::isfinite(g.loss)) st = NonFinite("the loss");
  for (size_t i = 0; i < params.size() && st.ok(); ++i) {
    const bool ok =
        params[i].kind == ParamKind::kDense ? AllFinite(g.dense[i]) : AllFinite(g.sparse[i].values);
    if (!ok) st = NonFinite("the gradient of '" + params[i].name + "'");
  }
  if (!st.ok()) {
    MutexLock lock(&mu_);
    stats_.rejected_nonfinite++;
  }
  return st;
}

Status WorkerService::StartLearn(const std::string& session,
                                 std::optional<uint64_t> context_revision,
                                 const std::vector<Example>& batch, Pushes* pushes,
                                 LearnReply* reply, bool* kept) {
  ONLINEPS_RETURN_IF_ERROR(CheckBatch(batch, /*need_labels=*/true));
  // Bounded: while the PS has not taken what is held, new learns would only add to it.
  ONLINEPS_RETURN_IF_ERROR(held_.CheckRoom());
  ONLINEPS_ASSIGN_OR_RETURN(const ContextInput ctx, ContextOf(session, context_revision));
  ONLINEPS_ASSIGN_OR_RETURN(Read read, ReadParams(batch, ctx));
  if (local_) ONLINEPS_RETURN_IF_ERROR(local_->Substitute(&read.view, &read.base));
  ONLINEPS_ASSIGN_OR_RETURN(GradOutput grads, Guarded("the model", [&] {
                              return model_->Gradients(batch, ctx, read.view);
                            }));
  ONLINEPS_RETURN_IF_ERROR(CheckFinite(grads));

  reply->loss = grads.loss;
  reply->examples = batch.size();
  reply->version = read.version;
  PushSparse(read.base, grads, pushes, reply);
  const auto& params = model_->params();
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].kind != ParamKind::kDense) continue;
    if (local_) {
      auto delta = local_->Step(i, grads.dense[i]);
      if (delta) PushDelta(i, std::move(*delta), pushes);
      *kept |= !delta.has_value();
      continue;
    }
    if (group_active_) {
      static_cast<void>(group_acc_[i]->Add(grads.dense[i], read.base[i], batch.size(), Now()));
      *kept = true;
      continue;
    }
    auto ready = accumulators_[i]->Add(grads.dense[i], read.base[i], batch.size(), Now());
    // More than this call in it: learns answered "accumulated" before ride on this push.
    if (ready) PushDense(i, std::move(*ready), pushes, /*answered=*/ready->calls > 1);
    *kept |= !ready.has_value();
  }
  reply->dense_pushed = !pushes->dense.empty();  // sent by FinishPushes or LearnAsync
  return Status::Ok();
}

StatusOr<LearnReply> WorkerService::EndLearn(LearnReply reply, bool kept) {
  if (kept && reply.outcome == LearnOutcome::kApplied) reply.outcome = LearnOutcome::kAccumulated;
  MutexLock lock(&mu_);
  stats_.learn_requests++;
  stats_.learn_examples += reply.examples;
  stats_.max_tau = std::max(stats_.max_tau, reply.tau);
  return reply;
}

StatusOr<LearnReply> WorkerService::Learn(const std::string& session,
                                          const std::vector<Example>& batch,
                                          std::optional<uint64_t> context_revision) {
  // Local-steps mode reads and updates one local copy: its learns run one at a time.
  std::unique_lock<std::mutex> local_lock;
  if (local_) local_lock = std::unique_lock<std::mutex>(local_->mu());
  LearnReply reply;
  Pushes pushes;
  bool kept = false;
  ONLINEPS_RETURN_IF_ERROR(StartLearn(session, context_revision, batch, &pushes, &reply, &kept));
  const Status pushed = FinishPushes(pushes, options_.reply_when, &reply);
  kept |= pushes.held;  // its gradient is held with the learns before it
  // A delta sent is never sent again, whatever came of it: on a failure (outcome unknown)
  // shards that answered have applied it, and the next delta, measured from the same
  // anchor, would apply its steps there twice. The local copy starts over from the PS.
  if (local_ && reply.dense_pushed) local_->Reset();
  ONLINEPS_RETURN_IF_ERROR(pushed);
  return EndLearn(std::move(reply), kept);
}

void WorkerService::LearnAsync(const std::string& session, const std::vector<Example>& batch,
                               LearnDone done, std::optional<uint64_t> context_revision) {
  if (local_ || options_.reply_when != ReplyWhen::kApplied) {
    return done(Learn(session, batch, context_revision));
  }
  auto run = std::make_shared<LearnRun>();
  run->done = std::move(done);
  Pushes pushes;
  pushes.run = run;
  if (Status st = StartLearn(session, context_revision, batch, &pushes, &run->head, &run->kept);
      !st.ok()) {
    return run->done(std::move(st));  // nothing was pushed: StartLearn pushes last
  }
  SendQueued(&pushes);
  LearnPartDone(run);  // every push is started: the starter's count
}

void WorkerService::LearnPartDone(const std::shared_ptr<LearnRun>& run) {
  LearnReply reply;
  Status first;
  bool held = false;
  {
    MutexLock lock(&run->mu);
    if (--run->pending > 0) return;
    reply = std::move(run->reply);
    first = std::move(run->first);
    held = run->held;
  }
  if (!first.ok()) return run->done(PartlyApplied(first, reply.landed));
  // The starter's fields with the pushes' (the version: the newer of the read and the
  // pushes').
  const LearnReply& head = run->head;
  reply.loss = head.loss;
  reply.examples = head.examples;
  reply.version = std::max(reply.version, head.version);
  reply.sparse_rows_pushed = head.sparse_rows_pushed;
  reply.dense_pushed = head.dense_pushed;
  run->done(EndLearn(std::move(reply), run->kept || held));
}

WorkerStats WorkerService::stats() const {
  WorkerStats s;
  {
    MutexLock lock(&mu_);
    s = stats_;
    s.inflight_pushes = inflight_;
    s.group_active = group_active_;
  }
  s.cache = cache_.stats();
  s.context = context_.stats();
  s.held = held_.stats();
  return s;
}

}  // namespace onlineps::worker
