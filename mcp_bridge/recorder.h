// Recorder: writes every tools/call to a trace file (docs/trace.md): one JSON object
// per line, a header line first. Bounded: stops writing (and says so once) past
// max_bytes. Thread-safe; a write error disables recording, never the bridge.
#ifndef ONLINEPS_MCP_BRIDGE_RECORDER_H_
#define ONLINEPS_MCP_BRIDGE_RECORDER_H_

#include <cstdint>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>

#include "common/mutex.h"
#include "common/status.h"

namespace onlineps::bridge {

struct TraceRecord {
  std::string session, tool, worker, summary;
  nlohmann::json arguments;
  bool is_error = false;
  int64_t version = -1, tau = -1;
  int64_t latency_us = 0;
  int64_t wait_us = 0;        // of latency_us: waiting for the session's earlier calls
  int64_t run_us = 0;         // of latency_us: the tool's own work, holding the session
  int64_t end_steady_us = 0;  // when the call ended (steady clock, us); 0: now
};

class Recorder {
 public:
  // Opens (truncates) `path` and writes the header. kUnavailable when it cannot.
  static StatusOr<std::unique_ptr<Recorder>> Open(const std::string& path, uint64_t max_bytes,
                                                  const nlohmann::json& header_fields);
  ~Recorder();
  void Record(const TraceRecord& r);
  uint64_t records() const;

 private:
  Recorder(std::FILE* f, std::string path, uint64_t max_bytes);
  bool WriteLine(const std::string& line) REQUIRES(mu_);

  const std::string path_;
  const uint64_t max_bytes_;
  mutable Mutex mu_;
  std::FILE* file_ GUARDED_BY(mu_);  // null once disabled
  uint64_t bytes_ GUARDED_BY(mu_) = 0;
  uint64_t seq_ GUARDED_BY(mu_) = 0;
  int64_t start_us_ = 0;  // immutable after Open
};

}  // namespace onlineps::bridge

#endif  // ONLINEPS_MCP_BRIDGE_RECORDER_H_
