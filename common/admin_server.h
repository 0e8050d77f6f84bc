// Admin HTTP endpoint of every onlineps process: /metrics (Prometheus text format),
// /livez and /healthz (200 while the process serves HTTP; no dependency checks, since
// a failing liveness probe restarts the pod) and /readyz (the ready check's verdict).
// Start/Stop/destructor: call from one owning thread. SetReadyCheck: thread-safe.
#ifndef ONLINEPS_COMMON_ADMIN_SERVER_H_
#define ONLINEPS_COMMON_ADMIN_SERVER_H_

#include <prometheus/registry.h>

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace onlineps {

class AdminServer {
 public:
  // Serves `registry` (a new one when null) and registers
  // onlineps_build_info{version="0.1.0"} 1 in it.
  explicit AdminServer(std::shared_ptr<prometheus::Registry> registry = nullptr);
  ~AdminServer();  // Stop()s
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  // Binds host:port (0 = ephemeral) and serves on a background thread with a small
  // bounded worker pool. Returns the bound port once requests are accepted.
  // kUnavailable naming host:port when the bind fails; kFailedPrecondition if
  // called twice (a stopped server is not restarted: make a new one).
  StatusOr<int> Start(const std::string& host, int port);

  // Stops accepting, finishes in-flight requests and joins the threads. Idempotent.
  void Stop();

  // /readyz returns 200 "ready\n" when `check` returns OK, else 503 with the Status
  // text. Without a check the process is ready. `check` runs on server threads and
  // must be thread-safe and quick (probes time out after ~1 s by default).
  void SetReadyCheck(std::function<Status()> check);

  const std::shared_ptr<prometheus::Registry>& registry() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;  // keeps httplib.h out of every includer
};

}  // namespace onlineps

#endif  // ONLINEPS_COMMON_ADMIN_SERVER_H_
