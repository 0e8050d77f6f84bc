// Timed replay of a trace's tool calls against a running MCP bridge (onlineps_replay
// --bridge URL). Each recorded session becomes one MCP session per loop, its calls sent
// one at a time in recorded order; different sessions run concurrently on a bounded
// pool of connections. Calls keep their recorded arrival gaps (divided by --speed,
// capped at --max-gap-ms). The result reports latency, errors and the staleness the
// bridge reported, beside what the recording holds.
#ifndef ONLINEPS_REPLAY_BRIDGE_REPLAY_H_
#define ONLINEPS_REPLAY_BRIDGE_REPLAY_H_

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"
#include "replay/staleness_stats.h"
#include "replay/trace.h"

namespace onlineps::replay {

// One tool call to send.
struct BridgeCall {
  uint64_t seq = 0;       // the record's seq
  double arrival_ms = 0;  // when it reached the recording bridge (t_us - latency_us)
  std::string session;    // recorded routing key ("" : stateless)
  std::string tool;
  nlohmann::json arguments;
  bool recorded_error = false;
  int64_t recorded_tau = -1;
  int64_t recorded_latency_us = -1;
};

struct BridgeCalls {
  TraceHeader header;
  std::vector<BridgeCall> calls;  // by arrival time, then seq
  uint64_t records = 0;           // records read
  uint64_t skipped_by_ref = 0;    // learn/infer records whose payload is by reference
  uint64_t sessions = 0;          // distinct recorded sessions (stateless calls count as one)
  double span_ms = 0;             // first to last arrival
  bool truncated_tail = false;
};

// Reads the `call` records of `path` (and learn/infer records with inline arguments, as
// converters write them); pull/push records are not tool calls and are skipped.
// `limit` > 0 keeps the first `limit` calls. Errors name path:line.
StatusOr<BridgeCalls> LoadBridgeCalls(const std::string& path, uint64_t limit);

// How long a paced run of `calls` takes at `speed` with gaps capped at `max_gap_ms`
// (0: no cap), `loop` times over, in ms of wall time, if the bridge keeps up.
double PacedDurationMs(const BridgeCalls& calls, double speed, double max_gap_ms, uint32_t loop);

// When a paced event `ms` after `start` is due, both replay modes: at most ~30 years
// ahead, so that a trace's absurd times cannot overflow the clock (they wrapped into the
// past, and everything was sent at once).
inline std::chrono::steady_clock::time_point PacedAt(std::chrono::steady_clock::time_point start,
                                                     double ms) {
  return start + std::chrono::microseconds(static_cast<int64_t>(std::min(ms * 1000, 1e15)));
}

struct BridgeReplayOptions {
  std::string url;  // http://host:port/path
  std::string token;
  double speed = 1;
  double max_gap_ms = 0;
  uint32_t loop = 1;
  double duration_s = 0;                    // stop sending after this much wall time (0: no limit)
  int timeout_ms = 30000;                   // per call
  uint32_t connections = 16;                // concurrent calls at most
  uint64_t max_queued = 100000;             // calls due but not yet sent; beyond, sending waits
  const std::atomic<bool>* stop = nullptr;  // set (Ctrl-C): stop sending, finish in-flight
  std::string csv_path;                     // one row per call ("" : none)
  std::function<void(uint64_t done, uint64_t total)> progress;
};

// Latency in microseconds on 2% log buckets: bounded, quantiles within 2%.
class LatencyStats {
 public:
  void Add(double us);
  uint64_t count() const { return count_; }
  double Quantile(double q) const;
  double Mean() const { return count_ ? sum_ / static_cast<double>(count_) : 0; }
  double Max() const { return max_; }
  nlohmann::json ToJson() const;  // {"count","mean_us","p50_us","p90_us","p99_us","max_us"}

 private:
  std::vector<uint64_t> hist_;
  uint64_t count_ = 0;
  double sum_ = 0, max_ = 0;
};

struct ToolStats {
  uint64_t calls = 0, ok = 0;
  uint64_t tool_errors = 0;      // the bridge answered isError
  uint64_t failures = 0;         // no MCP reply (transport, HTTP, JSON-RPC error)
  uint64_t new_errors = 0;       // errors (either kind) where the recording has none
  uint64_t recorded_errors = 0;  // errors in the recording
  LatencyStats latency, recorded_latency;
};

struct BridgeReplayResult {
  std::map<std::string, ToolStats> tools;
  ToolStats all;
  StalenessStats tau, recorded_tau;  // learn calls
  LatencyStats lag;                  // how late calls were sent (us behind schedule)
  uint64_t sent = 0, not_sent = 0;   // not_sent: stopped (duration, Ctrl-C) before sending
  uint64_t sessions_opened = 0, reinitialized = 0;
  double wall_s = 0, paced_s = 0;         // measured; what the pacing alone would take
  std::vector<std::string> first_errors;  // up to 5 distinct messages
  nlohmann::json ToJson() const;
};

// Sends the calls; returns once every sent call has its answer. Fails only when the
// bridge cannot be reached at all (first initialize) or the CSV cannot be written.
StatusOr<BridgeReplayResult> ReplayOnBridge(const BridgeCalls& calls,
                                            const BridgeReplayOptions& options);

}  // namespace onlineps::replay

#endif  // ONLINEPS_REPLAY_BRIDGE_REPLAY_H_
