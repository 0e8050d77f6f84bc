// The logical replayer. Gradients are computed at pull time on the parameters that
// pull read and kept until the matching push: the same result as computing them at
// push time, with one scratch buffer per parameter instead of one per pending step.
#include "replay/replayer.h"

#include <prometheus/registry.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <unordered_set>

#include "common/sha256.h"
#include "ps/ps_client.h"
#include "ps/shard_server.h"
#include "replay/trace.h"
#include "worker/worker_service.h"

namespace onlineps::replay {
namespace {

using worker::Example;
using worker::GradOutput;
using worker::ParamKind;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxTrackedKeys = size_t{1} << 24;  // sparse keys hashed at the end
constexpr size_t kEvalChunk = 512;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

// What a pull read and the gradient computed on it, waiting for its push.
struct Pending {
  uint32_t worker = 0;
  std::vector<ps::VersionVector> base;  // per param
  GradOutput grad;
  size_t examples = 0;
  uint64_t version = 0;  // max shard version of param 0 at the pull
};

class ReplayerImpl : public Replayer {
 public:
  ReplayerImpl(worker::Model* model, BatchSource* batches, ClusterOptions cluster,
               ReplayOptions options)
      : model_(model),
        batches_(batches),
        cluster_(std::move(cluster)),
        options_(std::move(options)) {}

  ~ReplayerImpl() override {
    clients_.clear();
    eval_.reset();
    for (auto& s : servers_) s->Stop();
  }

  Status Init() {
    const bool external = !cluster_.shards.empty();
    if (!external) ONLINEPS_RETURN_IF_ERROR(StartInprocShards());
    ONLINEPS_ASSIGN_OR_RETURN(eval_, Connect(options_.sender_base - 1));
    if (external) {
      // A --ps list in the wrong order, or missing a shard, is refused before any push.
      Status st = eval_->WaitForShards(cluster_.timeout);
      if (!st.ok()) return st.WithContext("--ps");
    }
    for (const worker::ParamInfo& p : model_->params()) {
      Status st = eval_->CreateTable(worker::TableSpecFor(p, options_.table_template));
      if (!st.ok()) return st.WithContext("creating table '" + p.name + "'");
      scratch_.emplace_back(p.kind == ParamKind::kDense ? p.size() : 0);
    }
    touched_.resize(model_->params().size());
    return Status::Ok();
  }

  StatusOr<ReplayResult> Run(const std::function<bool(Event*)>& next,
                             uint64_t expected_pushes) override {
    start_ = last_progress_ = Clock::now();
    Event ev;
    while (next(&ev)) {
      // The time reached: a trace's steps run in the order the shard applied them, and
      // a learn applied later may have started earlier (its t_ms), which the clock
      // does not go back for.
      virtual_ms_ = std::max(virtual_ms_, ev.t_ms);
      if (ev.kind == EventKind::kPull) {
        Status st = Pull(ev);
        if (!st.ok()) return st.WithContext("pull of batch " + std::to_string(ev.batch));
      } else if (ev.kind == EventKind::kPush) {
        Status st = Push(ev);
        if (!st.ok()) return st.WithContext("push of batch " + std::to_string(ev.batch));
        if (options_.eval_every && result_.pushes % options_.eval_every == 0 &&
            result_.pushes > last_eval_pushes_) {
          ONLINEPS_RETURN_IF_ERROR(Evaluate());
        }
      }
      if (options_.progress && Seconds(last_progress_) > 0.5) {
        last_progress_ = Clock::now();
        options_.progress(result_.pushes + result_.rejected, expected_pushes);
      }
    }
    if (result_.pushes > last_eval_pushes_ || result_.curve.empty()) {
      ONLINEPS_RETURN_IF_ERROR(Evaluate());
    }
    if (options_.progress) options_.progress(result_.pushes + result_.rejected, expected_pushes);
    result_.wall_s = Seconds(start_);
    result_.queued_at_end = trailing_queued_;
    ONLINEPS_ASSIGN_OR_RETURN(result_.params_sha256, HashParams());
    return result_;
  }

 private:
  Status StartInprocShards() {
    static std::atomic<uint64_t> counter{0};
    const uint64_t run = counter++;
    for (uint32_t i = 0; i < cluster_.inproc_shards; ++i) {
      ps::ShardServerOptions o;
      o.shard = i;
      o.num_shards = cluster_.inproc_shards;
      o.listen = "mem://replay-" + std::to_string(::getpid()) + "-" + std::to_string(run) + "-" +
                 std::to_string(i);
      o.handler_threads = 1;
      // The replayer's threads wait for each call and hold nothing the shard takes: a
      // small call runs on the caller's thread instead of waking the shard's.
      o.run_on_sender = true;
      auto server = std::make_unique<ps::ShardServer>(o, std::make_shared<prometheus::Registry>());
      auto ep = server->Start();
      if (!ep.ok()) return ep.status().WithContext("starting in-process shard");
      cluster_.shards.push_back(*ep);
      servers_.push_back(std::move(server));
    }
    return Status::Ok();
  }

  StatusOr<std::unique_ptr<ps::PsClient>> Connect(uint64_t sender) {
    ps::PsClientOptions o;
    o.shards = cluster_.shards;
    o.sender_id = sender;
    o.timeout = cluster_.timeout;
    o.attempt_timeout = std::min(cluster_.timeout, std::chrono::milliseconds(10000));
    return ps::PsClient::Connect(o);
  }

  StatusOr<ps::PsClient*> Client(uint32_t w) {
    if (w >= clients_.size()) clients_.resize(w + 1);
    if (!clients_[w]) {
      ONLINEPS_ASSIGN_OR_RETURN(clients_[w], Connect(options_.sender_base + w));
    }
    if (result_.per_worker.size() <= w) result_.per_worker.resize(w + 1);
    return clients_[w].get();
  }

  // Reads every parameter the batch needs into `view` (dense into scratch_).
  Status Read(ps::PsClient* client, const std::vector<Example>& batch, ps::PullOptions opts,
              worker::ParamView* view, std::vector<worker::SparseRows>* rows,
              std::vector<ps::VersionVector>* versions) {
    const auto& params = model_->params();
    ONLINEPS_ASSIGN_OR_RETURN(auto keys, model_->SparseKeys(batch, {}));
    view->dense.assign(params.size(), nullptr);
    view->sparse.assign(params.size(), nullptr);
    rows->assign(params.size(), {});
    versions->assign(params.size(), {});
    std::vector<ps::Ticket> tickets;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].kind == ParamKind::kDense) {
        tickets.push_back(
            client->PullDense(params[i].name, scratch_[i].data(), &(*versions)[i], opts));
        view->dense[i] = scratch_[i].data();
      } else {
        (*rows)[i].keys = keys[i];
        (*rows)[i].values.resize(keys[i].size() * params[i].size());
        tickets.push_back(client->PullSparse(params[i].name, (*rows)[i].keys.data(), keys[i].size(),
                                             (*rows)[i].values.data(), &(*versions)[i], opts));
        view->sparse[i] = &(*rows)[i];
      }
    }
    for (ps::Ticket& t : tickets) ONLINEPS_RETURN_IF_ERROR(t.Wait());
    return Status::Ok();
  }

  Status Pull(const Event& ev) {
    ONLINEPS_ASSIGN_OR_RETURN(ps::PsClient * client, Client(ev.worker));
    ONLINEPS_ASSIGN_OR_RETURN(std::vector<Example> batch, batches_->Batch(ev.batch));
    Pending p;
    p.worker = ev.worker;
    p.examples = batch.size();
    worker::ParamView view;
    std::vector<worker::SparseRows> rows;
    ONLINEPS_RETURN_IF_ERROR(Read(client, batch, {}, &view, &rows, &p.base));
    if (options_.progressive) ONLINEPS_RETURN_IF_ERROR(Score(batch, view));
    const auto t0 = Clock::now();
    ONLINEPS_ASSIGN_OR_RETURN(p.grad, model_->Gradients(batch, {}, view));
    result_.compute_s += Seconds(t0);
    if (!p.base.empty() && !p.base[0].empty()) {
      p.version = *std::max_element(p.base[0].begin(), p.base[0].end());
    }
    ++result_.pulls;
    if (options_.events) ONLINEPS_RETURN_IF_ERROR(LogPull(ev, p));
    if (pending_.size() >= kMaxPending) {
      return ResourceExhausted("more than " + std::to_string(kMaxPending) +
                               " pulls wait for their push");
    }
    pending_[ev.batch] = std::move(p);
    return Status::Ok();
  }

  Status Score(const std::vector<Example>& batch, const worker::ParamView& view) {
    ONLINEPS_ASSIGN_OR_RETURN(worker::InferOutput out, model_->Infer(batch, {}, view));
    for (size_t i = 0; i < batch.size(); ++i) {
      progressive_right_ += out.predicted[i] == batch[i].label;
      ++progressive_seen_;
    }
    return Status::Ok();
  }

  Status Push(const Event& ev) {
    auto it = pending_.find(ev.batch);
    if (it == pending_.end()) return FailedPrecondition("no pull of this batch came before");
    Pending p = std::move(it->second);
    pending_.erase(it);
    ONLINEPS_ASSIGN_OR_RETURN(ps::PsClient * client, Client(p.worker));
    const auto& params = model_->params();
    std::vector<ps::PushReply> replies(params.size());
    std::vector<ps::Ticket> tickets;
    uint64_t nnz = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (params[i].kind == ParamKind::kDense) {
        tickets.push_back(
            client->PushDense(params[i].name, p.grad.dense[i].data(), p.base[i], &replies[i]));
        nnz += p.grad.dense[i].size();
      } else {
        const worker::SparseRows& g = p.grad.sparse[i];
        tickets.push_back(client->PushSparse(params[i].name, g.keys.data(), g.keys.size(),
                                             g.values.data(), p.base[i], &replies[i]));
        nnz += g.values.size();
        Track(i, g.keys);
      }
    }
    bool stale = false;
    for (ps::Ticket& t : tickets) {
      Status st = t.Wait();
      if (st.code() == StatusCode::kStale) {
        stale = true;
      } else if (!st.ok()) {
        return st;
      }
    }
    if (stale) {
      ++result_.rejected;
    } else {
      // Tables pulled together have one staleness; the max guards against any that lag.
      for (const ps::PushReply& r : replies)
        replies[0].max_tau = std::max(replies[0].max_tau, r.max_tau);
      Count(p, replies[0]);
      loss_sum_ += p.grad.loss;
      ++loss_n_;
      bool queued = false;
      for (const ps::PushReply& r : replies) queued |= r.queued;
      trailing_queued_ = queued ? trailing_queued_ + 1 : 0;
    }
    if (options_.events) ONLINEPS_RETURN_IF_ERROR(LogPush(ev, p, replies[0], nnz, stale));
    return Status::Ok();
  }

  void Count(const Pending& p, const ps::PushReply& r) {
    ++result_.pushes;
    samples_ += p.examples;
    result_.overall.Add(r.max_tau);
    result_.per_worker[p.worker].Add(r.max_tau);
    if (result_.per_shard.size() < r.taus.size()) result_.per_shard.resize(r.taus.size());
    for (size_t s = 0; s < r.taus.size(); ++s) {
      if (s < r.versions.size() && r.versions[s] != 0) result_.per_shard[s].Add(r.taus[s]);
    }
  }

  void Track(size_t param, const std::vector<uint64_t>& keys) {
    std::unordered_set<uint64_t>& t = touched_[param];
    for (uint64_t k : keys) {
      if (t.size() >= kMaxTrackedKeys) return;
      t.insert(k);
    }
  }

  Status LogPull(const Event& ev, const Pending& p) {
    TraceRecord r;
    r.kind = RecordKind::kPull;
    r.seq = ++log_seq_;
    r.t_us = static_cast<int64_t>(ev.t_ms * 1000);
    r.worker = "w" + std::to_string(ev.worker);
    r.base_version = static_cast<int64_t>(p.version);
    r.ref = batches_->Ref(ev.batch);
    return options_.events->Write(r);
  }

  Status LogPush(const Event& ev, const Pending& p, const ps::PushReply& reply, uint64_t nnz,
                 bool stale) {
    TraceRecord r;
    r.kind = RecordKind::kPush;
    r.seq = ++log_seq_;
    r.t_us = static_cast<int64_t>(ev.t_ms * 1000);
    r.worker = "w" + std::to_string(p.worker);
    r.base_version = static_cast<int64_t>(p.version);
    if (!stale) {
      r.applied_version = static_cast<int64_t>(reply.max_version);
      r.tau = static_cast<int64_t>(reply.max_tau);
    } else {
      r.summary = "stale";
    }
    r.nnz = nnz;
    r.bytes = nnz * sizeof(float);
    r.loss = p.grad.loss;
    r.ref = batches_->Ref(ev.batch);
    return options_.events->Write(r);
  }

  Status Evaluate() {
    last_eval_pushes_ = result_.pushes;
    EvalRow row;
    row.updates = result_.pushes;
    row.samples = samples_;
    row.virtual_ms = virtual_ms_;
    row.train_loss = loss_n_ ? loss_sum_ / static_cast<double>(loss_n_) : NAN;
    loss_sum_ = 0;
    loss_n_ = 0;
    if (progressive_seen_) {
      row.progressive_accuracy =
          static_cast<double>(progressive_right_) / static_cast<double>(progressive_seen_);
    }
    const std::vector<Example>& test = batches_->Test();
    const size_t n = options_.eval_rows ? std::min(options_.eval_rows, test.size()) : test.size();
    double loss = 0;
    size_t right = 0;
    ps::PullOptions opts;
    opts.averaged = options_.eval_averaged;
    opts.record_backup = false;
    for (size_t at = 0; at < n; at += kEvalChunk) {
      std::vector<Example> chunk(
          test.begin() + static_cast<ptrdiff_t>(at),
          test.begin() + static_cast<ptrdiff_t>(std::min(n, at + kEvalChunk)));
      worker::ParamView view;
      std::vector<worker::SparseRows> rows;
      std::vector<ps::VersionVector> versions;
      ONLINEPS_RETURN_IF_ERROR(Read(eval_.get(), chunk, opts, &view, &rows, &versions));
      ONLINEPS_ASSIGN_OR_RETURN(worker::InferOutput out, model_->Infer(chunk, {}, view));
      for (size_t i = 0; i < chunk.size(); ++i) {
        const int64_t y = chunk[i].label;
        const double s = y >= 0 && static_cast<size_t>(y) < out.scores[i].size()
                             ? out.scores[i][static_cast<size_t>(y)]
                             : 0.0;
        loss -= std::log(std::max(s, 1e-12));
        right += out.predicted[i] == y;
      }
    }
    row.test_loss = n ? loss / static_cast<double>(n) : NAN;
    row.test_accuracy = n ? static_cast<double>(right) / static_cast<double>(n) : NAN;
    row.wall_s = Seconds(start_);
    result_.curve.push_back(row);
    return Status::Ok();
  }

  // SHA-256 over every dense table, then the sorted touched rows of every sparse table.
  StatusOr<std::string> HashParams() {
    const auto& params = model_->params();
    std::string bytes;
    for (size_t i = 0; i < params.size(); ++i) {
      std::vector<float> values;
      ps::PullOptions opts;
      opts.record_backup = false;
      if (params[i].kind == ParamKind::kDense) {
        values.resize(params[i].size());
        ONLINEPS_RETURN_IF_ERROR(
            eval_->PullDense(params[i].name, values.data(), nullptr, opts).Wait());
      } else {
        std::vector<uint64_t> keys(touched_[i].begin(), touched_[i].end());
        std::sort(keys.begin(), keys.end());  // the hash covers the rows in key order
        values.resize(keys.size() * params[i].size());
        ONLINEPS_RETURN_IF_ERROR(
            eval_
                ->PullSparse(params[i].name, keys.data(), keys.size(), values.data(), nullptr, opts)
                .Wait());
        bytes.append(reinterpret_cast<const char*>(keys.data()), keys.size() * sizeof(uint64_t));
      }
      bytes.append(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
    }
    return Sha256Hex(bytes.data(), bytes.size());
  }

  static constexpr size_t kMaxPending = size_t{1} << 20;

  worker::Model* const model_;
  BatchSource* const batches_;
  ClusterOptions cluster_;
  const ReplayOptions options_;

  std::vector<std::unique_ptr<ps::ShardServer>> servers_;
  std::vector<std::unique_ptr<ps::PsClient>> clients_;  // index: virtual worker
  std::unique_ptr<ps::PsClient> eval_;
  std::vector<std::vector<float>> scratch_;  // dense pull buffers, per param
  // Sparse keys pushed, per param (for params_sha256 at the end). A hash set: an ordered
  // set's insert per pushed key cost more than the shard's own apply (docs/benchmarks.md).
  std::vector<std::unordered_set<uint64_t>> touched_;
  std::map<uint64_t, Pending> pending_;  // by batch

  ReplayResult result_;
  Clock::time_point start_, last_progress_;
  double virtual_ms_ = 0;
  uint64_t samples_ = 0, last_eval_pushes_ = 0, log_seq_ = 0;
  uint64_t trailing_queued_ = 0;  // pushes answered "queued" since the last one applied
  double loss_sum_ = 0;
  uint64_t loss_n_ = 0;
  uint64_t progressive_right_ = 0, progressive_seen_ = 0;
};

}  // namespace

StatusOr<std::unique_ptr<Replayer>> Replayer::Create(worker::Model* model, BatchSource* batches,
                                                     const ClusterOptions& cluster,
                                                     ReplayOptions options) {
  if (cluster.shards.empty() && cluster.inproc_shards == 0) {
    return InvalidArgument("an in-process cluster needs at least one shard");
  }
  if (options.table_template.bound_mode == ps::BoundMode::kBlock &&
      options.table_template.max_staleness >= 0) {
    return InvalidArgument(
        "bound mode 'block' holds a push's reply until slower workers catch up, which a "
        "logical replay (one call at a time) can never do; use 'reject', or bound the "
        "staleness in the schedule (--staleness)");
  }
  auto r = std::make_unique<ReplayerImpl>(model, batches, cluster, std::move(options));
  ONLINEPS_RETURN_IF_ERROR(r->Init());
  return std::unique_ptr<Replayer>(std::move(r));
}

}  // namespace onlineps::replay
