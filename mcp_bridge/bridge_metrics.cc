#include "mcp_bridge/bridge_metrics.h"

namespace onlineps::bridge {
namespace {

prometheus::Gauge* NewGauge(prometheus::Registry& r, const std::string& name,
                            const std::string& help, const prometheus::Labels& labels = {}) {
  return &prometheus::BuildGauge().Name(name).Help(help).Register(r).Add(labels);
}

prometheus::Histogram::BucketBoundaries LatencyBuckets() {
  return {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
          0.1,    0.25,    0.5,    1,     2.5,    5,     10,   30};
}

}  // namespace

BridgeMetrics::BridgeMetrics(std::shared_ptr<prometheus::Registry> registry, const McpServer* mcp,
                             const Router* router, const WorkerPool* pool,
                             const ContextStore* contexts)
    : mcp_(mcp), router_(router), pool_(pool), contexts_(contexts) {
  auto& r = *registry;
  calls_ = &prometheus::BuildCounter()
                .Name("onlineps_bridge_tool_calls_total")
                .Help("tools/call served, by tool and result (ok or error)")
                .Register(r);
  duration_ = &prometheus::BuildHistogram()
                   .Name("onlineps_bridge_tool_call_duration_seconds")
                   .Help("time the bridge spent on a tools/call, by tool")
                   .Register(r);
  staleness_ = &prometheus::BuildHistogram()
                    .Name("onlineps_bridge_learn_staleness")
                    .Help("largest staleness (tau) the PS measured for a learn call's pushes")
                    .Register(r)
                    .Add({}, prometheus::Histogram::BucketBoundaries{0, 1, 2, 4, 8, 16, 32, 64, 128,
                                                                     256, 1024});
  sessions_ = NewGauge(r, "onlineps_bridge_mcp_sessions", "stateful MCP sessions held");
  routed_ = NewGauge(r, "onlineps_bridge_routed_sessions", "sessions placed on a worker");
  contexts_gauge_ = NewGauge(r, "onlineps_bridge_contexts", "session contexts held");
  auto& workers = prometheus::BuildGauge()
                      .Name("onlineps_bridge_workers")
                      .Help("workers known to the bridge, by state")
                      .Register(r);
  healthy_ = &workers.Add({{"state", "healthy"}});
  down_ = &workers.Add({{"state", "down"}});
  moves_ = &prometheus::BuildCounter()
                .Name("onlineps_bridge_session_moves_total")
                .Help("sessions moved to another worker by membership changes")
                .Register(r)
                .Add({});
  connections_ = NewGauge(r, "onlineps_bridge_http_connections", "HTTP connections open");
  auto& refused = prometheus::BuildCounter()
                      .Name("onlineps_bridge_http_connections_refused_total")
                      .Help("new HTTP connections answered 503 and closed, by the cap they hit")
                      .Register(r);
  refused_per_address_ = &refused.Add({{"reason", "per_address_limit"}});
  refused_total_ = &refused.Add({{"reason", "total_limit"}});
  timed_out_ = &prometheus::BuildCounter()
                    .Name("onlineps_bridge_http_connections_timed_out_total")
                    .Help(
                        "HTTP connections closed by a timeout (first request, keep-alive, "
                        "body, answer)")
                    .Register(r)
                    .Add({});
  responses_ = &prometheus::BuildCounter()
                    .Name("onlineps_bridge_http_responses_total")
                    .Help(
                        "HTTP responses sent by the MCP endpoint, by status code (401 and 403: "
                        "auth; 413: body too large; 503: connection caps)")
                    .Register(r);
  // The codes an operator alerts on exist from the start, so increase() sees the first.
  for (const char* code : {"200", "400", "401", "403", "404", "413", "500", "503"}) {
    responses_->Add({{"code", code}});
  }
}

BridgeMetrics::~BridgeMetrics() { Stop(); }

void BridgeMetrics::SetHttp(const HttpTransport* http) {
  MutexLock lock(&mu_);
  http_ = http;
}

void BridgeMetrics::Observe(const TraceRecord& call) {
  calls_->Add({{"tool", call.tool}, {"result", call.is_error ? "error" : "ok"}}).Increment();
  duration_->Add({{"tool", call.tool}}, LatencyBuckets())
      .Observe(static_cast<double>(call.latency_us) * 1e-6);
  if (call.tool == "learn" && call.tau >= 0) staleness_->Observe(static_cast<double>(call.tau));
}

void BridgeMetrics::Update() {
  sessions_->Set(static_cast<double>(mcp_->sessions()));
  const RouterStats rs = router_->stats();
  routed_->Set(static_cast<double>(rs.sessions));
  contexts_gauge_->Set(static_cast<double>(contexts_->stats().sessions));
  const auto [known, healthy] = pool_->Counts();
  healthy_->Set(static_cast<double>(healthy));
  down_->Set(static_cast<double>(known - healthy));
  MutexLock lock(&mu_);
  const double moves = static_cast<double>(rs.moves);
  if (moves > moves_seen_) moves_->Increment(moves - moves_seen_);
  moves_seen_ = moves;
  if (http_ == nullptr) return;
  const HttpTransportStats h = http_->stats();
  connections_->Set(static_cast<double>(h.open));
  auto add = [](prometheus::Counter* c, uint64_t now, uint64_t seen) {
    if (now > seen) c->Increment(static_cast<double>(now - seen));
  };
  add(refused_per_address_, h.refused_per_address, http_seen_.refused_per_address);
  add(refused_total_, h.refused_total, http_seen_.refused_total);
  add(timed_out_, h.timed_out, http_seen_.timed_out);
  for (const auto& [code, n] : h.responses) {
    const auto seen = http_seen_.responses.find(code);
    add(&responses_->Add({{"code", std::to_string(code)}}), n,
        seen == http_seen_.responses.end() ? 0 : seen->second);
  }
  http_seen_ = h;
}

void BridgeMetrics::Start(std::chrono::milliseconds period) {
  Update();
  thread_.Start(
      period, [this] { Update(); }, /*tick_first=*/false);
}

void BridgeMetrics::Stop() { thread_.Stop(); }

}  // namespace onlineps::bridge
