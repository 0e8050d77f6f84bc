// Admin HTTP endpoint of every onlineps process: /metrics (Prometheus text format),
// /livez and /healthz (200 while the process serves HTTP; no dependency checks, since
// a failing liveness probe restarts the pod) and /readyz (the ready check's verdict).
// One epoll I/O thread serves every connection, so slow or idle clients cost memory,
// not threads. Start/Stop/destructor: call from one owning thread. SetReadyCheck:
// thread-safe.
#ifndef ONLINEPS_COMMON_ADMIN_SERVER_H_
#define ONLINEPS_COMMON_ADMIN_SERVER_H_

#include <prometheus/registry.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace onlineps {

// Limits that keep slow, idle or hostile clients from starving the probes. A connection
// past a deadline is closed; one past a cap is answered 503 and closed. Each is counted
// in onlineps_admin_connections_{timed_out,refused}_total{reason=...}.
struct AdminServerOptions {
  // From accept, or from the first byte of a later request on a kept-alive connection,
  // to the end of the request's headers.
  std::chrono::milliseconds request_deadline{5000};
  // How long a kept-alive connection may wait for its next request.
  std::chrono::milliseconds idle_timeout{60000};
  // From a response being ready to its last byte sent (a client that does not read).
  std::chrono::milliseconds write_deadline{10000};
  // Open connections per client (IPv4 address, or IPv6 /64) and in total.
  size_t max_connections_per_address = 16;
  size_t max_connections = 1024;
  // Request line plus headers; a larger request is answered 431.
  size_t max_header_bytes = 8192;
};

class AdminServer {
 public:
  // Serves `registry` (a new one when null) and registers in it
  // onlineps_build_info{version="0.1.0",commit="..."} 1 and the server's own onlineps_admin_*
  // metrics; each scrape adds the process_* families (common/process_metrics.h).
  explicit AdminServer(std::shared_ptr<prometheus::Registry> registry = nullptr,
                       AdminServerOptions options = {});
  ~AdminServer();  // Stop()s
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Binds and listens on host:port (0 = ephemeral) and serves on one background
  // thread; connections are queued from the moment it returns the bound port.
  // kUnavailable naming host:port when the bind fails; kInvalidArgument for a bad port
  // or option; kFailedPrecondition if called twice (a stopped server is not restarted:
  // make a new one).
  StatusOr<int> Start(const std::string& host, int port);

  // Closes the listening socket and every connection (responses still unsent are
  // dropped) and joins the thread. Idempotent; a no-op before Start.
  void Stop();

  // /readyz returns 200 "ready\n" when `check` returns OK, else 503 with the Status
  // text. Without a check the process is ready. `check` runs on the I/O thread: it must
  // be thread-safe and must not block (a blocked check stalls /livez too).
  void SetReadyCheck(std::function<Status()> check);

  const std::shared_ptr<prometheus::Registry>& registry() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_ADMIN_SERVER_H_
