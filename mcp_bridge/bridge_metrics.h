// BridgeMetrics: the bridge's /metrics. Tool calls are counted as they finish (Observe,
// from the McpServer's call observer); gauges of sessions, contexts and workers are
// copied once per period by a background thread. Start/Stop from the owning thread;
// Observe is thread-safe.
#ifndef ONLINEPS_MCP_BRIDGE_BRIDGE_METRICS_H_
#define ONLINEPS_MCP_BRIDGE_BRIDGE_METRICS_H_

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <chrono>
#include <memory>

#include "common/mutex.h"
#include "common/periodic_thread.h"
#include "mcp_bridge/context_store.h"
#include "mcp_bridge/http_transport.h"
#include "mcp_bridge/mcp_server.h"
#include "mcp_bridge/recorder.h"
#include "mcp_bridge/router.h"
#include "mcp_bridge/worker_pool.h"

namespace onlineps::bridge {

class BridgeMetrics {
 public:
  // The pointers must outlive this object.
  BridgeMetrics(std::shared_ptr<prometheus::Registry> registry, const McpServer* mcp,
                const Router* router, const WorkerPool* pool, const ContextStore* contexts);
  ~BridgeMetrics();  // Stop()s
  void Start(std::chrono::milliseconds period = std::chrono::seconds(1));
  void Stop();
  void Observe(const TraceRecord& call);
  // The HTTP transport whose connections are counted (null: none, e.g. stdio). It must
  // outlive Stop() or a later SetHttp.
  void SetHttp(const HttpTransport* http);
  void Update();

 private:
  const McpServer* const mcp_;
  const Router* const router_;
  const WorkerPool* const pool_;
  const ContextStore* const contexts_;
  prometheus::Family<prometheus::Counter>* calls_;
  prometheus::Family<prometheus::Histogram>* duration_;
  prometheus::Histogram* staleness_;
  prometheus::Gauge *sessions_, *routed_, *contexts_gauge_, *healthy_, *down_;
  prometheus::Counter* moves_;
  double moves_seen_ GUARDED_BY(mu_) = 0;
  prometheus::Gauge* connections_;
  prometheus::Counter *refused_per_address_, *refused_total_, *timed_out_;
  prometheus::Family<prometheus::Counter>* responses_;
  const HttpTransport* http_ GUARDED_BY(mu_) = nullptr;
  HttpTransportStats http_seen_ GUARDED_BY(mu_);

  Mutex mu_;
  onlineps::PeriodicThread thread_;
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_BRIDGE_METRICS_H_
