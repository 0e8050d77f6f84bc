#include "worker/worker_metrics.h"

namespace onlineps::worker {
namespace {

prometheus::Counter* NewCounter(prometheus::Registry& r, const std::string& name,
                                const std::string& help) {
  return &prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Gauge* NewGauge(prometheus::Registry& r, const std::string& name,
                            const std::string& help) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add({});
}

}  // namespace

void WorkerMetrics::Counter::Set(double v) {
  if (v > last) c->Increment(v - last);
  last = v;
}

WorkerMetrics::WorkerMetrics(const WorkerService* service, const WorkerServer* server,
                             std::shared_ptr<prometheus::Registry> registry,
                             std::chrono::milliseconds period)
    : service_(service), server_(server), period_(period), registry_(std::move(registry)) {
  auto& r = *registry_;
  infer_requests_.c = NewCounter(r, "onlineps_worker_infer_requests_total", "infer calls served");
  infer_examples_.c = NewCounter(r, "onlineps_worker_infer_examples_total", "examples inferred");
  infer_passes_.c = NewCounter(r, "onlineps_worker_infer_passes_total",
                               "forward passes run for infer (calls per pass: requests / passes)");
  learn_requests_.c = NewCounter(r, "onlineps_worker_learn_requests_total", "learn calls served");
  learn_examples_.c = NewCounter(r, "onlineps_worker_learn_examples_total", "examples learned");
  pushes_.c = NewCounter(r, "onlineps_worker_pushes_total", "pushes completed (ok or not)");
  push_bytes_.c = NewCounter(r, "onlineps_worker_push_bytes_total",
                             "payload bytes of the pushes started (4 per float, 8 per key)");
  push_errors_.c = NewCounter(r, "onlineps_worker_push_errors_total", "pushes that failed");
  nonfinite_.c = NewCounter(r, "onlineps_worker_nonfinite_rejected_total",
                            "learn calls refused for a NaN/Inf loss or gradient");
  rpc_errors_.c =
      NewCounter(r, "onlineps_worker_rpc_errors_total", "requests answered with an error");
  rpc_dropped_.c =
      NewCounter(r, "onlineps_worker_rpc_overloaded_total", "requests refused: handler queue full");
  rpc_unsent_.c = NewCounter(
      r, "onlineps_worker_rpc_replies_dropped_total",
      "replies dropped: their peer had not read those before (--max-unsent-reply-bytes)");
  dense_pulls_.c = NewCounter(r, "onlineps_worker_dense_pulls_total", "dense pulls on a read");
  sparse_pulls_.c = NewCounter(r, "onlineps_worker_sparse_pulls_total", "sparse pulls on a read");
  refresher_pulls_.c =
      NewCounter(r, "onlineps_worker_refresher_pulls_total", "dense pulls by the refresher");
  notices_.c = NewCounter(r, "onlineps_worker_notices_total",
                          "shard notices that a table this worker holds changed");
  watch_errors_.c = NewCounter(r, "onlineps_worker_watch_errors_total",
                               "watches of a shard that failed (retried; age bounds meanwhile)");
  shards_noticing_ = NewGauge(r, "onlineps_worker_shards_noticing",
                              "shards whose change notices reach this worker now");
  max_tau_ = NewGauge(r, "onlineps_worker_max_staleness", "largest tau the PS reported");
  inflight_ = NewGauge(r, "onlineps_worker_inflight_pushes", "pushes not yet acknowledged");
  sessions_ = NewGauge(r, "onlineps_worker_context_sessions", "sessions holding context");
  sparse_rows_ = NewGauge(r, "onlineps_worker_cached_sparse_rows", "sparse rows in the cache");
  held_pushes_ = NewGauge(r, "onlineps_worker_held_pushes",
                          "accumulated pushes that failed, held to be pushed again");
  held_bytes_ = NewGauge(r, "onlineps_worker_held_bytes", "bytes of the held pushes");
  held_lost_.c = NewCounter(r, "onlineps_worker_held_lost_learns_total",
                            "accumulated learns lost: their push was refused for good");
  latency_family_ = &prometheus::BuildHistogram()
                         .Name("onlineps_worker_request_duration_seconds")
                         .Help(
                             "Time from a request's arrival to its reply, queueing "
                             "included, by op (infer, learn, ...)")
                         .Register(r);
}

WorkerMetrics::~WorkerMetrics() { Stop(); }

void WorkerMetrics::Start() {
  thread_.Start(
      period_, [this] { Update(); }, /*tick_first=*/false);
}

void WorkerMetrics::Stop() { thread_.Stop(); }

void WorkerMetrics::Update() {
  const WorkerStats s = service_->stats();
  const WorkerServerStats rpc = server_->stats();
  MutexLock lock(&mu_);
  for (size_t op = 0; op < latency_.size(); ++op) {
    const LatencyHistogram::Snapshot& now = rpc.latency[op];
    if (now.count() == latency_seen_[op].count()) continue;
    if (latency_[op] == nullptr) {
      latency_[op] = &latency_family_->Add(
          {{"op", std::string(OpName(static_cast<Op>(op)))}},
          prometheus::Histogram::BucketBoundaries(LatencyHistogram::kBounds.begin(),
                                                  LatencyHistogram::kBounds.end()));
    }
    latency_[op]->ObserveMultiple(LatencyHistogram::BucketDelta(now, latency_seen_[op]),
                                  LatencyHistogram::SumDelta(now, latency_seen_[op]));
    latency_seen_[op] = now;
  }
  infer_requests_.Set(static_cast<double>(s.infer_requests));
  infer_examples_.Set(static_cast<double>(s.infer_examples));
  infer_passes_.Set(static_cast<double>(s.infer_passes));
  learn_requests_.Set(static_cast<double>(s.learn_requests));
  learn_examples_.Set(static_cast<double>(s.learn_examples));
  pushes_.Set(static_cast<double>(s.pushes));
  push_bytes_.Set(static_cast<double>(s.push_bytes));
  push_errors_.Set(static_cast<double>(s.push_errors));
  nonfinite_.Set(static_cast<double>(s.rejected_nonfinite));
  rpc_errors_.Set(static_cast<double>(rpc.errors));
  rpc_dropped_.Set(static_cast<double>(rpc.dropped));
  rpc_unsent_.Set(static_cast<double>(rpc.unsent_dropped));
  dense_pulls_.Set(static_cast<double>(s.cache.dense_pulls));
  sparse_pulls_.Set(static_cast<double>(s.cache.sparse_pulls));
  refresher_pulls_.Set(static_cast<double>(s.cache.refresher_pulls));
  notices_.Set(static_cast<double>(s.cache.notices));
  watch_errors_.Set(static_cast<double>(s.cache.watch_errors));
  shards_noticing_->Set(static_cast<double>(s.cache.shards_noticing));
  max_tau_->Set(static_cast<double>(s.max_tau));
  inflight_->Set(static_cast<double>(s.inflight_pushes));
  sessions_->Set(static_cast<double>(s.context.sessions));
  sparse_rows_->Set(static_cast<double>(s.cache.sparse_rows));
  held_pushes_->Set(static_cast<double>(s.held.pushes));
  held_bytes_->Set(static_cast<double>(s.held.bytes));
  held_lost_.Set(static_cast<double>(s.held.dropped_calls));
}

}  // namespace onlineps::worker
