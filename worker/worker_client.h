// WorkerClient: calls a worker's RPC (tests, benchmarks, the MCP bridge). Bodies are
// JSON values sent as msgpack. Thread-safe: many threads may have calls in flight on
// one client; each call has a deadline. Torch-free (library onlineps_worker_client).
#ifndef ONLINEPS_WORKER_WORKER_CLIENT_H_
#define ONLINEPS_WORKER_WORKER_CLIENT_H_

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"

namespace onlineps::worker {

struct WorkerClientOptions {
  std::string endpoint;
  std::chrono::milliseconds timeout{10000};  // per call
  // Calls in flight. A blocking Call past it waits for one to end; CallAsync is refused
  // from max_inflight - reserved_for_blocking on, so that blocking calls (health probes,
  // context tools) still get through while asynchronous ones fill the client.
  size_t max_inflight = 4096;
  size_t reserved_for_blocking = 64;  // capped at max_inflight / 4
  TransportOptions transport;
};

// Ends the message of every call the client ended without the worker's answer (its
// deadline passed, the connection dropped, the worker left the ring, shutdown). A
// DEADLINE_EXCEEDED the worker itself answered (its own PS call timed out) lacks it.
inline constexpr char kNoWorkerAnswer[] = " (no answer from the worker)";
// In the error of a learn some of whose pushes were applied (or queued) by a shard while
// another push of it failed: then follows the list of tables that took their part, and
// ")". Retrying such a learn applies that part twice. A learn failing without it was not
// applied, unless it is a DEADLINE_EXCEEDED (its outcome unknown).
inline constexpr char kPartlyApplied[] = " (part of this learn was applied, to tables: ";
// In the FAILED_PRECONDITION a worker answers, before doing anything, to an infer or learn
// naming a `context_revision` of the session's context it does not hold (it restarted,
// or dropped the context as idle or for room): the caller re-sends the context.
inline constexpr char kContextNotHeld[] = "does not hold the session's context at revision";

class WorkerClient {
 public:
  static StatusOr<std::unique_ptr<WorkerClient>> Connect(WorkerClientOptions options);
  virtual ~WorkerClient() = default;

  // Sends `op` with `body` and waits for the reply body. An error reply becomes its
  // Status (code and message from the worker); no reply in time is kDeadlineExceeded.
  virtual StatusOr<nlohmann::json> Call(Op op, const nlohmann::json& body) = 0;
  virtual StatusOr<nlohmann::json> Call(Op op, const nlohmann::json& body,
                                        std::chrono::milliseconds timeout) = 0;
  // The same without waiting: `done` gets the outcome exactly once, on the thread that
  // receives the reply, the deadline's timer thread, or (for a call that could not be
  // sent, or with max_inflight - reserved_for_blocking calls in flight:
  // kResourceExhausted, not sent) the
  // caller's before CallAsync returns.
  // `done` must not block: other calls' replies wait for it.
  using Done = std::function<void(StatusOr<nlohmann::json>)>;
  virtual void CallAsync(Op op, const nlohmann::json& body, std::chrono::milliseconds timeout,
                         Done done) = 0;
  // Ends every call in flight at once with kDeadlineExceeded saying `why` (their outcome
  // is unknown: the worker may have applied them). Done by the client itself when the
  // connection to the worker drops; the bridge also does it when a worker leaves the ring.
  virtual void FailInFlight(const std::string& why) = 0;
  // Ends the client for good: calls in flight end as by FailInFlight, later calls are
  // refused at once (kCancelled, not sent), and its threads are joined, so once this
  // returns no `done` of this client runs any more. Not from a `done` of this client.
  // Idempotent; the destructor does it too.
  virtual void Shutdown(const std::string& why) = 0;
};

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_WORKER_CLIENT_H_
