// WorkerMetrics: exports a worker's counters on the admin port's /metrics. A background
// thread copies WorkerService::stats() into prometheus families once per period (the
// service counts under its own lock; nothing on the request path touches prometheus).
// Start/Stop; thread-safe.
#ifndef ONLINEPS_WORKER_WORKER_METRICS_H_
#define ONLINEPS_WORKER_WORKER_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <chrono>
#include <memory>

#include "common/mutex.h"
#include "common/periodic_thread.h"
#include "worker/worker_server.h"
#include "worker/worker_service.h"

namespace onlineps::worker {

class WorkerMetrics {
 public:
  // `service` and `server` must outlive this object.
  WorkerMetrics(const WorkerService* service, const WorkerServer* server,
                std::shared_ptr<prometheus::Registry> registry,
                std::chrono::milliseconds period = std::chrono::seconds(1));
  ~WorkerMetrics();
  void Start();
  void Stop();
  // Copies the current counters now (the thread calls this every period).
  void Update();

 private:
  struct Counter {
    prometheus::Counter* c;
    double last = 0;
    void Set(double v);
  };
  const WorkerService* const service_;
  const WorkerServer* const server_;
  const std::chrono::milliseconds period_;
  std::shared_ptr<prometheus::Registry> registry_;

  Mutex mu_;
  Counter infer_requests_ GUARDED_BY(mu_), infer_examples_ GUARDED_BY(mu_),
      infer_passes_ GUARDED_BY(mu_), learn_requests_ GUARDED_BY(mu_),
      learn_examples_ GUARDED_BY(mu_), pushes_ GUARDED_BY(mu_), push_bytes_ GUARDED_BY(mu_),
      push_errors_ GUARDED_BY(mu_), nonfinite_ GUARDED_BY(mu_), rpc_errors_ GUARDED_BY(mu_),
      rpc_dropped_ GUARDED_BY(mu_), rpc_unsent_ GUARDED_BY(mu_), dense_pulls_ GUARDED_BY(mu_),
      sparse_pulls_ GUARDED_BY(mu_), refresher_pulls_ GUARDED_BY(mu_), notices_ GUARDED_BY(mu_),
      watch_errors_ GUARDED_BY(mu_), held_lost_ GUARDED_BY(mu_);
  prometheus::Gauge *max_tau_, *inflight_, *sessions_, *sparse_rows_, *shards_noticing_,
      *held_pushes_, *held_bytes_;
  // Request latency by op: created at an op's first request.
  prometheus::Family<prometheus::Histogram>* latency_family_;
  std::array<prometheus::Histogram*, static_cast<size_t>(kLastOp) + 1> latency_ GUARDED_BY(mu_){};
  std::array<LatencyHistogram::Snapshot, static_cast<size_t>(kLastOp) + 1> latency_seen_
      GUARDED_BY(mu_);
  PeriodicThread thread_;  // last: stopped before the members it writes go
};

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_WORKER_METRICS_H_
