// The bridge process: flags, the components wired together, serving until a signal.
// Flags, ONLINEPS_* env vars and --config are documented in docs/configuration.md;
// `onlineps_mcp_bridge --help` lists them.
#include "mcp_bridge/bridge_app.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <iostream>
#include <thread>

#include "common/admin_server.h"
#include "common/config.h"
#include "common/curve.h"
#include "common/flags.h"
#include "common/logging.h"
#include "common/periodic_thread.h"
#include "common/port_probe.h"
#include "common/signals.h"
#include "common/transport.h"
#include "mcp_bridge/backend.h"
#include "mcp_bridge/bridge_metrics.h"
#include "mcp_bridge/context_store.h"
#include "mcp_bridge/http_transport.h"
#include "mcp_bridge/mcp_server.h"
#include "mcp_bridge/recorder.h"
#include "mcp_bridge/router.h"
#include "mcp_bridge/state_dir.h"
#include "mcp_bridge/stdio_transport.h"
#include "mcp_bridge/tools.h"
#include "mcp_bridge/worker_pool.h"

namespace {

namespace bridge = onlineps::bridge;

using std::chrono::milliseconds;

struct Flags {
  std::string transport = "http";
  bridge::HttpTransportOptions http;
  std::string tokens_file;
  onlineps::CurveFlags curve;
  bridge::McpServerOptions mcp;
  int64_t session_idle_s = 3600;
  bridge::RouterOptions router;
  bridge::WorkerPoolOptions pool;
  int64_t health_interval_ms = 500, health_timeout_ms = 1000, wait_workers_s = 10;
  bridge::ContextStoreOptions context;
  bridge::StateDirOptions state;
  int64_t context_ttl_s = 1800, context_resync_s = 600;
  int64_t infer_timeout_ms = 6000, learn_timeout_ms = 30000;
  int64_t first_request_timeout_ms = 5000;
  bridge::ToolsOptions tools;
  std::string record;
  uint64_t record_max_bytes = 1ull << 30;
  std::string admin_host = "127.0.0.1";
  int admin_port = 9300;
  onlineps::LogOptions log;
};

void AddFlags(CLI::App& app, Flags* f) {
  app.add_option("--transport", f->transport, "http (Streamable HTTP) | stdio")
      ->check(CLI::IsMember({"http", "stdio"}))
      ->capture_default_str();
  app.add_option("--host", f->http.host, "HTTP bind address (keep loopback unless fronted)")
      ->capture_default_str();
  app.add_option("--port", f->http.port, "HTTP port (0: any free port)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  app.add_option("--path", f->http.path, "MCP endpoint path")->capture_default_str();
  app.add_option("--allowed-hosts", f->http.allowed_hosts,
                 "Host header names accepted, comma separated; '*' accepts any")
      ->delimiter(',')
      ->capture_default_str();
  app.add_option("--allowed-origins", f->http.allowed_origins,
                 "Origin values accepted (scheme://host[:port]), comma separated; default: "
                 "loopback origins only")
      ->delimiter(',');
  app.add_option("--tokens-file", f->tokens_file,
                 "Bearer tokens, one 'identity token' per line; enables auth (sessions are "
                 "bound to the identity)");
  // A size of 0 would start a bridge that refuses every request: refused at start instead.
  app.add_option("--max-request-bytes", f->http.max_request_bytes, "Largest request body")
      ->check(CLI::Range(size_t{1024}, size_t{1} << 31))
      ->capture_default_str();
  app.add_option("--http-threads", f->http.threads,
                 "MCP requests that may block run at once (context tools, initialize, "
                 "DELETE, SSE streams: one thread each until its answer); infer and learn "
                 "calls and idle connections hold none")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--http-io-threads", f->http.io_threads,
                 "Threads reading and writing every HTTP connection and starting the calls "
                 "that cannot block (infer, learn); with 2 or more, a request that may "
                 "block runs on the thread that read it while another is free (1: each "
                 "goes to --http-threads)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--keep-alive-s", f->http.keep_alive_s,
                 "How long a kept-alive connection may wait for its next request")
      ->check(CLI::Range(1, 3600))
      ->capture_default_str();
  app.add_option("--first-request-timeout-ms", f->first_request_timeout_ms,
                 "A new connection's first request must be in (headers) within this; "
                 "else it is closed")
      ->check(CLI::Range(10, 600000))
      ->capture_default_str();
  app.add_option("--max-connections-per-address", f->http.max_connections_per_address,
                 "Open HTTP connections per client address (IPv6: per /64; not 127.0.0.1 "
                 "and ::1, where a local proxy connects for all); past it a new one is "
                 "answered 503")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--max-connections", f->http.max_connections,
                 "Open HTTP connections in total; past it a new one is answered 503")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--max-sessions", f->mcp.max_sessions, "MCP sessions held at once")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--max-sessions-per-client", f->mcp.max_sessions_per_client,
                 "MCP sessions one client holds at once: one token's identity, or without "
                 "--tokens-file one address (IPv6: per /64; not 127.0.0.1 and ::1, where a "
                 "local proxy connects for all). A client past it ends its own least recently "
                 "used session (one without a call in flight) for the new one, so it cannot "
                 "lock others out. With --tokens-file it also caps the contexts one identity "
                 "holds (a new one past it is refused). 0: no limit")
      ->capture_default_str();
  app.add_option("--session-idle-s", f->session_idle_s, "An idle MCP session ends after this")
      ->check(onlineps::LifetimeS(1))
      ->capture_default_str();
  app.add_option("--rate-limit", f->mcp.rate_limit,
                 "tools/call per second per session (0: unlimited)")
      ->check(onlineps::NumberIn(0, HUGE_VAL))
      ->capture_default_str();
  // A bucket that never holds a whole token would refuse every call as rate-limited.
  app.add_option("--rate-burst", f->mcp.rate_burst, "Calls a session may make at once")
      ->check(onlineps::NumberIn(1, HUGE_VAL))
      ->capture_default_str();
}

void AddRoutingFlags(CLI::App& app, Flags* f) {
  app.add_option("--workers", f->pool.endpoints, "Worker endpoints, comma separated")
      ->delimiter(',');
  app.add_option("--workers-dns", f->pool.dns,
                 "host:port resolved periodically; each address is a worker (headless Service)");
  app.add_option("--load-factor", f->router.load_factor,
                 "Bounded loads: no worker above this times the mean session count")
      ->check(onlineps::NumberIn(1.0, 100.0))
      ->capture_default_str();
  app.add_option("--virtual-nodes", f->router.virtual_nodes, "Hash-ring points per worker")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  app.add_option("--health-interval-ms", f->health_interval_ms, "Worker probe period")
      ->check(onlineps::TimeoutMs())
      ->capture_default_str();
  app.add_option("--health-timeout-ms", f->health_timeout_ms, "Worker probe deadline")
      ->check(onlineps::TimeoutMs())
      ->capture_default_str();
  app.add_option("--wait-workers-s", f->wait_workers_s,
                 "At start, wait this long for a healthy worker before serving")
      ->check(onlineps::LifetimeS(0))
      ->capture_default_str();
  app.add_option("--infer-timeout-ms", f->infer_timeout_ms, "Deadline of an infer or context call")
      ->check(onlineps::TimeoutMs())
      ->capture_default_str();
  app.add_option("--learn-timeout-ms", f->learn_timeout_ms, "Deadline of one learn chunk")
      ->check(onlineps::TimeoutMs())
      ->capture_default_str();
}

void AddToolFlags(CLI::App& app, Flags* f) {
  app.add_option("--context-max-sessions", f->context.max_sessions, "Session contexts held")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--context-max-items", f->context.max_items, "Text items per context")
      ->capture_default_str();
  app.add_option("--context-max-bytes", f->context.max_bytes, "Text bytes per context")
      ->capture_default_str();
  app.add_option("--context-max-features", f->context.max_features, "Features per context")
      ->capture_default_str();
  app.add_option("--context-ttl-s", f->context_ttl_s,
                 "A context unused this long is dropped (0: never)")
      ->check(onlineps::LifetimeS(0))
      ->capture_default_str();
  app.add_option("--state-dir", f->state.path,
                 "Keep MCP sessions and contexts in this directory so that they survive a bridge "
                 "restart (one bridge per directory); default: in memory only");
  app.add_flag("--state-fsync", f->state.fsync,
               "Flush every --state-dir write to disk before answering (survives a host crash, "
               "not only a process crash; slower)");
  app.add_option("--context-resync-s", f->context_resync_s,
                 "Re-send a context to its worker after this long (keep below the worker's "
                 "--context-ttl-s)")
      ->check(onlineps::LifetimeS(1))
      ->capture_default_str();
  app.add_option("--max-examples", f->tools.max_examples,
                 "Examples per infer or learn call (an infer goes to the worker in one call: keep "
                 "it at most the worker's --max-batch)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 20))
      ->capture_default_str();
  app.add_option("--max-text-bytes", f->tools.max_text_bytes,
                 "Bytes of the text of one example (at most the worker's --max-text-bytes)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--max-tokens", f->tools.max_tokens,
                 "Words in the texts of one worker call: an infer, or a learn's --learn-chunk "
                 "examples (at most the worker's --max-tokens)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--max-features", f->tools.max_features,
                 "Feature values of one example (at most the worker's --max-features)")
      ->check(CLI::Range(size_t{1}, size_t{1} << 30))
      ->capture_default_str();
  app.add_option("--learn-chunk", f->tools.learn_chunk,
                 "Examples per worker call of a learn; progress is reported after each")
      ->check(CLI::Range(size_t{1}, size_t{65536}))
      ->capture_default_str();
  app.add_option("--record", f->record,
                 "Write every tools/call to this trace file (docs/trace.md)");
  app.add_option("--record-max-bytes", f->record_max_bytes, "Stop recording past this size")
      ->capture_default_str();
  app.add_option("--admin-host", f->admin_host, "Admin HTTP address (/metrics, /healthz, /readyz)")
      ->capture_default_str();
  app.add_option("--admin-port", f->admin_port, "Admin HTTP port (-1: off, 0: any)")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
  onlineps::AddLoggingFlags(app, &f->log);
  onlineps::AddCurveFlags(app, &f->curve, /*server=*/false, /*client=*/true);
}

onlineps::Status Finish(Flags* f) {
  if (f->http.allowed_hosts.size() == 1 && f->http.allowed_hosts[0] == "*") {
    f->http.allowed_hosts.clear();
  }
  // Host names are case-insensitive, and the Host header is compared lower-cased.
  for (std::string& host : f->http.allowed_hosts) {
    std::transform(host.begin(), host.end(), host.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  }
  if (!f->tokens_file.empty()) {
    ONLINEPS_ASSIGN_OR_RETURN(f->http.tokens, bridge::LoadTokens(f->tokens_file));
  }
  ONLINEPS_ASSIGN_OR_RETURN(f->pool.curve, onlineps::LoadCurve(f->curve));
  for (const std::string& w : f->pool.endpoints) {
    ONLINEPS_RETURN_IF_ERROR(onlineps::CheckEndpoint(w).WithContext("--workers"));
  }
  f->mcp.session_idle = std::chrono::seconds(f->session_idle_s);
  f->http.first_request_timeout = milliseconds(f->first_request_timeout_ms);
  f->pool.health_interval = milliseconds(f->health_interval_ms);
  f->pool.health_timeout = milliseconds(f->health_timeout_ms);
  f->context.ttl_ms = f->context_ttl_s * 1000;
  // One identity's contexts (its MCP sessions' and its named handles') are capped alike.
  f->context.max_per_identity = f->mcp.max_sessions_per_client;
  // MCP sessions and named handles are placed apart: handles clients never end cannot
  // fill the router and shut new MCP sessions out.
  f->router.max_sessions = f->mcp.max_sessions * 2;
  f->router.max_handles = std::max<size_t>(f->mcp.max_sessions, f->context.max_sessions) * 2;
  return onlineps::Status::Ok();
}

// Returns the shutdown signal that ended the wait, or 0: a bridge stopped while it waits
// (a pod deleted before its workers are up) exits at once, not after the wait, serving.
int WaitForWorker(const bridge::WorkerPool& pool, int64_t seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (pool.healthy() == 0 && std::chrono::steady_clock::now() < deadline) {
    if (const int sig = onlineps::TakePendingShutdownSignal(); sig != 0) return sig;
    std::this_thread::sleep_for(milliseconds(100));
  }
  if (pool.healthy() == 0) {
    spdlog::warn("no healthy worker yet; calls fail with a clear error until one answers");
  }
  return 0;
}

}  // namespace

namespace onlineps::bridge {

int RunBridge(int argc, char** argv, const std::function<void(McpServer*)>& extend) {
  onlineps::BlockShutdownSignals();
  Flags f;
  f.log.component = "bridge";
  CLI::App app("onlineps MCP bridge: MCP over Streamable HTTP or stdio, routed to workers");
  AddFlags(app, &f);
  AddRoutingFlags(app, &f);
  AddToolFlags(app, &f);
  // --help and --print-config print to stdout and exit, whatever the transport: nothing
  // of MCP has started (f.transport is not parsed yet here).
  auto parsed = onlineps::ParseFlags(app, argc, argv);
  if (!parsed.ok()) {
    std::cerr << "onlineps_mcp_bridge: " << parsed.status().ToString() << "\n";
    return 2;
  }
  if (parsed->exit_now) return 0;
  if (auto s = onlineps::InitLogging(f.log); !s.ok()) {
    std::cerr << "onlineps_mcp_bridge: " << s.ToString() << "\n";
    return 2;
  }
  if (auto s = Finish(&f); !s.ok()) {
    spdlog::error("{}", s.ToString());
    return 2;
  }

  std::unique_ptr<bridge::StateDir> state;
  if (!f.state.path.empty()) {
    auto opened = bridge::StateDir::Open(f.state, {"sessions", "contexts"});
    if (!opened.ok()) {
      spdlog::error("{}", opened.status().ToString());
      return 2;
    }
    state = std::move(*opened);
  }

  // The ports first: one taken is reported at once, not after --wait-workers-s.
  if (f.transport == "http") {
    if (Status st = onlineps::ProbeTcpBind(f.http.host, f.http.port); !st.ok()) {
      spdlog::error("{} (--host {} --port {})", st.ToString(), f.http.host, f.http.port);
      return 2;
    }
  }
  if (f.admin_port > 0) {
    if (Status st = onlineps::ProbeTcpBind(f.admin_host, f.admin_port); !st.ok()) {
      spdlog::error("{} (--admin-host {} --admin-port {})", st.ToString(), f.admin_host,
                    f.admin_port);
      return 2;
    }
  }
  bridge::Router router(f.router);
  bridge::WorkerPool pool(f.pool, &router);
  if (auto s = pool.Start(); !s.ok()) {
    spdlog::error("{}", s.ToString());
    return 2;
  }
  if (const int sig = WaitForWorker(pool, f.wait_workers_s); sig != 0) {
    spdlog::info("signal {} while waiting for a worker: exiting", sig);
    return 0;
  }
  bridge::ContextStore contexts(f.context);
  if (state) {
    spdlog::info("state: {} contexts restored from {}", contexts.Persist(state.get()),
                 state->path());
  }
  bridge::BackendOptions bo;
  bo.infer_timeout = milliseconds(f.infer_timeout_ms);
  bo.learn_timeout = milliseconds(f.learn_timeout_ms);
  bo.context_resync = milliseconds(f.context_resync_s * 1000);
  bridge::Backend backend(bo, &router, &pool, &contexts);
  bridge::Tools tools(f.tools, &backend, &contexts, &pool, &router);

  std::unique_ptr<bridge::Recorder> recorder;
  if (!f.record.empty()) {
    nlohmann::json header = {{"workers", f.pool.endpoints}};
    for (const auto& w : pool.Workers()) {
      if (w.healthy) {
        header["model"] = {{"labels", w.stats.value("labels", nlohmann::json::array())},
                           {"tables", w.stats.value("params", nlohmann::json::array())}};
        break;
      }
    }
    auto r = bridge::Recorder::Open(f.record, f.record_max_bytes, header);
    if (!r.ok()) {
      spdlog::error("{}", r.status().ToString());
      return 2;
    }
    recorder = std::move(*r);
  }
  bridge::McpServer mcp(f.mcp, &tools, recorder.get(), [&](const std::string& key) {
    contexts.Clear(key);
    backend.EndSession(key);
  });
  if (state) {
    spdlog::info("state: {} MCP sessions restored from {}", mcp.Persist(state.get()),
                 state->path());
  }
  if (extend) extend(&mcp);

  std::unique_ptr<onlineps::AdminServer> admin;
  std::unique_ptr<bridge::BridgeMetrics> metrics;
  if (f.admin_port >= 0) {
    admin = std::make_unique<onlineps::AdminServer>();
    metrics =
        std::make_unique<bridge::BridgeMetrics>(admin->registry(), &mcp, &router, &pool, &contexts);
    mcp.SetCallObserver([m = metrics.get()](const bridge::TraceRecord& r) { m->Observe(r); });
    metrics->Start();
    admin->SetReadyCheck([&pool]() -> onlineps::Status {
      if (pool.healthy() == 0) return onlineps::Unavailable("no healthy worker");
      return onlineps::Status::Ok();
    });
    auto port = admin->Start(f.admin_host, f.admin_port);
    if (!port.ok()) {
      spdlog::error("{}", port.status().ToString());
      return 2;
    }
    spdlog::info("admin on http://{}:{}/metrics", f.admin_host, *port);
    if (f.transport == "http") std::cout << "ADMIN " << f.admin_host << ":" << *port << std::endl;
  }

  // Ends idle MCP sessions, expired contexts and idle placements, so that clients that
  // walk away without DELETE (or stateless handles never used again) free their state.
  onlineps::PeriodicThread sweeper;
  sweeper.Start(
      std::chrono::seconds(10),
      [&] {
        mcp.ExpireIdle();
        contexts.Expire();
        backend.Forget(router.ReleaseIdle(std::chrono::seconds(f.session_idle_s)));
      },
      /*tick_first=*/false);

  if (f.transport == "stdio") {
    // Never destroyed: the signal thread may still use it while main() winds down.
    auto& stdio = *new bridge::StdioTransport({}, &mcp);
    spdlog::info("serving MCP on stdio with {} healthy worker(s)", pool.healthy());
    // The MCP stdio shutdown is: close stdin, then SIGTERM. A SIGTERM while stdin is still
    // open must end the process too; the reader blocks in fgets, so exit from here once
    // the message being written is out.
    std::thread([&stdio] {  // NOLINT: stdio lives to the end of the process
      const int sig = onlineps::WaitForShutdownSignal();
      spdlog::info("signal {}: exiting", sig);
      stdio.FlushAndExit(0);
    })
        .detach();
    stdio.Run();
    if (metrics) metrics->Stop();
    pool.Stop();
    return 0;
  }
  bridge::HttpTransport http(f.http, &mcp);
  auto port = http.Start();
  if (!port.ok()) {
    spdlog::error("{} (--host {} --port {})", port.status().ToString(), f.http.host, f.http.port);
    return 2;
  }
  if (metrics) metrics->SetHttp(&http);
  const std::string url = "http://" + f.http.host + ":" + std::to_string(*port) + f.http.path;
  std::cout << "LISTENING " << url << std::endl;
  spdlog::info("serving MCP on {} with {} healthy worker(s)", url, pool.healthy());
  const int sig = onlineps::WaitForShutdownSignal();
  spdlog::info("signal {}: stopping (in-flight calls finish first)", sig);
  http.Stop();
  if (metrics) metrics->Stop();
  pool.Stop();
  if (admin) admin->Stop();
  return 0;
}

}  // namespace onlineps::bridge
