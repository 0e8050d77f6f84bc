// WorkerServer: serves the worker RPC over a ServerTransport (ZeroMQ ROUTER or mem://).
// Requests are ordered per session, not per peer: the bridge is one peer carrying many
// sessions, so requests are handed to a pool of handler threads keyed by session id.
// The receiving thread only checks a request against the service's limits() and routes
// it (worker_stats it answers at once); handler threads decode and run. Bad requests get
// error replies; the server keeps serving. Start/Stop; Stop drains.
#ifndef ONLINEPS_WORKER_WORKER_SERVER_H_
#define ONLINEPS_WORKER_WORKER_SERVER_H_

#include <array>
#include <atomic>
#include <chrono>
#include <deque>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <unordered_map>

#include "common/handler_pool.h"
#include "common/latency_histogram.h"
#include "common/mutex.h"
#include "common/status.h"
#include "common/transport.h"
#include "common/wire.h"
#include "worker/worker_service.h"

namespace onlineps::worker {

struct WorkerServerOptions {
  std::string listen = "tcp://127.0.0.1:0";
  int handler_threads = 2;  // threads running infer / learn
  size_t max_queue = 1024;  // requests waiting per handler thread
  // Replies to one peer that it has not read, in bytes: a peer that sends requests and
  // never reads the replies pins at most this much. Enforced as ZeroMQ's send high-water
  // mark (transport.send_hwm, a count, lowered to this divided by the largest reply
  // MaxReplyBytes allows, at least 16); replies beyond it are dropped, counted
  // (WorkerServerStats::unsent_dropped) and logged (rate-limited).
  size_t max_unsent_reply_bytes = size_t{64} << 20;
  // max_message_bytes is set to twice the service's limits().max_request_bytes: larger
  // frames are dropped by ZeroMQ, smaller ones over the limit get TOO_LARGE undecoded.
  TransportOptions transport;
};

struct WorkerServerStats {
  uint64_t requests = 0, errors = 0, dropped = 0;
  // Replies dropped because their peer had not read the send high-water mark's worth
  // before them (--max-unsent-reply-bytes).
  uint64_t unsent_dropped = 0;
  // Time from a request's arrival to its reply (queueing included), by op (indexed by
  // Op); worker ops only.
  std::array<LatencyHistogram::Snapshot, static_cast<size_t>(kLastOp) + 1> latency;
};

class WorkerServer {
 public:
  // `service` must outlive the server.
  WorkerServer(WorkerService* service, WorkerServerOptions options);
  ~WorkerServer();

  // Binds and serves. Returns the bound endpoint.
  StatusOr<std::string> Start();
  // Stops accepting, finishes queued requests, replies, joins. Idempotent.
  void Stop();
  WorkerServerStats stats() const;

 private:
  struct Job;
  void OnMessage(Incoming&& in);
  void Handle(Job&& job);
  // A learn: its reply is sent by the callback of its last push (no thread waits), and
  // its session's later requests wait in parked_ until then.
  void HandleLearn(Job&& job, nlohmann::json body);
  // The request that held `session`'s turn is answered: its next parked one goes to its
  // lane (or the session is free again).
  void NextOfSession(const std::string& session);
  void Reply(const std::string& peer, const Header& reply, const std::string& body);
  // Replies to `job` with `out` (an error, or the body encoded).
  void Answer(const Job& job, const StatusOr<nlohmann::json>& out);

  WorkerService* const service_;
  const WorkerServerOptions options_;
  std::unique_ptr<ServerTransport> transport_;
  std::unique_ptr<HandlerPool<Job>> pool_;
  // Requests waiting for a handler hold at most this many times --max-request-bytes;
  // more are refused (RESOURCE_EXHAUSTED), so a burst of large requests cannot queue
  // without bound.
  static constexpr size_t kQueuedRequests = 4;

  std::atomic<uint64_t> requests_{0}, errors_{0}, unsent_dropped_{0};
  size_t send_hwm_ = 0;  // set by Start
  std::array<LatencyHistogram, static_cast<size_t>(kLastOp) + 1> latency_;
  std::atomic<size_t> queued_bytes_{0};  // bodies of requests not yet decoded
  std::atomic<size_t> next_lane_{0};
  std::atomic<bool> stopping_{false};
  // Sessions whose learn is waiting for its pushes, each with its requests that came
  // after it (run in order once it is answered). At most max_queue x handler threads
  // requests in all (parked_count_); past it a request is refused as overloaded.
  Mutex parked_mu_;
  std::unordered_map<std::string, std::deque<Job>> parked_ GUARDED_BY(parked_mu_);
  size_t parked_count_ GUARDED_BY(parked_mu_) = 0;
  CondVar learns_cv_;
  size_t learns_in_flight_ GUARDED_BY(parked_mu_) = 0;  // LearnAsync calls not answered
};

}  // namespace onlineps::worker

#endif  // ONLINEPS_WORKER_WORKER_SERVER_H_
