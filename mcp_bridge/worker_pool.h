// WorkerPool: the bridge's view of its workers. Keeps one WorkerClient per worker,
// probes each one (worker_stats) every health_interval, and keeps the Router's
// membership equal to the set of healthy workers. Workers come from a static list
// and/or a DNS name resolved every dns_interval (each address becomes
// tcp://ADDRESS:PORT, as a headless Kubernetes Service gives one per pod).
// Thread-safe; Start/Stop from one owning thread.
#ifndef ONLINEPS_MCP_BRIDGE_WORKER_POOL_H_
#define ONLINEPS_MCP_BRIDGE_WORKER_POOL_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/periodic_thread.h"
#include "common/status.h"
#include "common/wire.h"
#include "mcp_bridge/router.h"
#include "worker/worker_client.h"

namespace onlineps::bridge {

struct WorkerPoolOptions {
  std::vector<std::string> endpoints;  // tcp://host:port
  std::string dns;                     // "host:port"; empty: none
  std::chrono::milliseconds dns_interval{5000};
  std::chrono::milliseconds health_interval{500};
  std::chrono::milliseconds health_timeout{1000};
  int failures_to_down = 2;  // consecutive failed probes before a worker leaves the ring
  CurveOptions curve;        // CurveZMQ to the workers (common/curve.h); off by default
};

struct WorkerInfo {
  std::string endpoint;
  bool healthy = false;
  uint64_t incarnation = 0;  // changes each time the worker (re)joins or restarts
  std::string instance;      // the worker process's instance id (worker_stats)
  std::string last_error;
  nlohmann::json stats;  // the last worker_stats reply
};

class WorkerPool {
 public:
  WorkerPool(WorkerPoolOptions options, Router* router);
  ~WorkerPool();  // Stop()s

  // Resolves, connects and runs one probe round before returning, so a healthy worker
  // is routable at once. kInvalidArgument for a bad endpoint or DNS name.
  Status Start();
  // Stops probing, and ends every call in flight (kDeadlineExceeded) and every later one
  // (kUnavailable or kCancelled) at once, and joins the clients' threads: once it returns
  // no call's callback runs any more, so none outlives what it uses.
  void Stop();

  // One call to `endpoint`. kUnavailable for a worker the pool does not know.
  StatusOr<nlohmann::json> Call(const std::string& endpoint, Op op, const nlohmann::json& body,
                                std::chrono::milliseconds timeout);
  // The same without waiting: `done` as WorkerClient::CallAsync's.
  void CallAsync(const std::string& endpoint, Op op, const nlohmann::json& body,
                 std::chrono::milliseconds timeout, worker::WorkerClient::Done done);
  // A call to `endpoint` got no reply: probe it now and take it out of the ring if the
  // probe fails too. Returns whether it is still healthy.
  bool ReportFailure(const std::string& endpoint);
  // The same without waiting: `done(healthy)` once the probe is answered (or failed).
  void ReportFailureAsync(const std::string& endpoint, std::function<void(bool)> done);

  uint64_t Incarnation(const std::string& endpoint) const;
  // The model's labels as the worker reported them (empty until its first probe). Cheap:
  // no copy of the worker's stats.
  std::shared_ptr<const std::vector<std::string>> Labels(const std::string& endpoint) const;
  std::vector<WorkerInfo> Workers() const;
  size_t healthy() const;
  // {workers known, healthy}, read together.
  std::pair<size_t, size_t> Counts() const;

 private:
  struct Entry {
    WorkerInfo info;
    // Shared: a caller may still hold it while DNS drops the worker (it then waits in
    // retired_ until no one else does).
    std::shared_ptr<worker::WorkerClient> client;
    std::shared_ptr<const std::vector<std::string>> labels;
    int failures = 0;
  };
  Status Resolve();  // adds and drops DNS workers
  void ProbeAll();
  bool Probe(const std::string& endpoint);  // returns healthy
  void Apply(const std::string& endpoint, const StatusOr<nlohmann::json>& probe);
  void HealthTick();  // on health_: DNS when due, then a probe of every worker
  std::shared_ptr<worker::WorkerClient> ClientOf(const std::string& endpoint);
  // Shuts down (outside every lock) the retired clients no one else holds any more; all
  // of them when `all`.
  void DropRetired(bool all);

  const WorkerPoolOptions options_;
  Router* const router_;

  std::atomic<bool> stopping_{false};
  Mutex membership_mu_;  // serializes health transitions with their router calls
  mutable Mutex mu_;     // taken after membership_mu_, never before
  std::map<std::string, Entry> workers_ GUARDED_BY(mu_);
  std::vector<std::string> dns_members_ GUARDED_BY(mu_);
  // Clients of workers that left DNS: their calls were ended, but a caller may still hold
  // one; it is shut down once only this list holds it (never under a lock, never on a
  // thread of its own).
  std::vector<std::shared_ptr<worker::WorkerClient>> retired_ GUARDED_BY(mu_);
  uint64_t next_incarnation_ GUARDED_BY(mu_) = 1;

  std::chrono::steady_clock::time_point next_dns_;  // set by Start; then health_'s only
  PeriodicThread health_;                           // last: stopped before the members it uses go
};

// "host:port" -> tcp://ADDRESS:PORT for each address the name resolves to (IPv6 in
// brackets). kInvalidArgument for a bad form; kUnavailable when resolution fails.
StatusOr<std::vector<std::string>> ResolveWorkers(const std::string& host_port);

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_WORKER_POOL_H_
